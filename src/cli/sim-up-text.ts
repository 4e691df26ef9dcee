import type {SimUpResult} from '../sim/lifecycle/index.js'

/** "TP 4", or with a layout "TP 2 DP 2 (attention) PP 1, 4 schedulers". */
function layoutText(c: SimUpResult['config'], role: 'prefill' | 'decode'): string {
  const l = c.layout?.[role]
  const n = role === 'prefill' ? c.prefillTp : c.decodeTp
  return l
    ? `TP ${l.tp} DP ${l.dp}${l.dpAttention ? ' (attention)' : ''} ` +
        `PP ${l.pp}${l.ep > 1 ? ` EP ${l.ep}` : ''}, ${n} schedulers`
    : `TP ${n}`
}

/** What `sim up` prints once the twin is healthy: its shape, its endpoints, its deployment file, how to stop it. */
export function simUpLines(result: SimUpResult): string[] {
  const {config, ...out} = result
  const rows: Array<[string, string]> = [
    ['router', out.endpoints.router],
    ['prefill', out.endpoints.prefill],
    ['bootstrap', out.endpoints.bootstrap],
    ['decode', out.endpoints.decode],
    ['router metrics', out.endpoints.routerMetrics],
  ]
  const dist = config.dist
    ? ` (node rank ${config.dist.nodeRank} of ${config.dist.nnodes}, dist-init-addr ${config.dist.distInitAddr})`
    : ''
  const node = config.node
    ? `, this node runs ${config.node.services.join(', ')}${dist}; ${Object.entries(config.node.peers)
        .map(([s, a]) => `${s} at ${(a ?? []).join(' and ')}`)
        .join(', ')}`
    : ''
  const wd = config.watchdog
  return [
    `Twin healthy in ${(out.healthyMs / 1000).toFixed(1)} s (prefill ${layoutText(config, 'prefill')}, ` +
      `decode ${layoutText(config, 'decode')}, ${config.backend}, ` +
      `watchdog ${wd.scope} ${wd.deadlineS}s/${wd.pollS}s${wd.lateMs ? ` +${wd.lateMs}ms late` : ''}` +
      `${config.bugs.length ? `, bugs: ${config.bugs.join(', ')}` : ''}${node})`,
    ...rows.map(([name, url]) => `  ${name.padEnd(15)} ${url}`),
    `  deployment file ${out.deploymentFile}`,
    `Stop it with: pdchaos sim down --state-dir ${out.stateDir}`,
  ]
}
