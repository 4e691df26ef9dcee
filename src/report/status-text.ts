import type {StatusReport} from '../engines/sglang/discovery/discover.js'
import type {DeploymentReport} from '../engines/sglang/discovery/discover-hosts.js'
import {type HaltRecord, haltLine} from '../model/halt.js'

/** `pdchaos status` for a person: one screen, the problems last and loud. */
export function renderStatus(r: StatusReport | DeploymentReport): string {
  // Over several hosts: each service and rank says which host it runs on, and each host its leases and lock.
  const across = 'hosts' in r ? r : undefined
  const on = (x: object): string => (across && 'host' in x ? `${String(x.host).padEnd(hostWidth(across))} ` : '')
  const out: string[] = [
    `deployment ${r.deployment.name} on ${r.deployment.host}  (backend ${r.transport.backend}, ` +
      `from ${r.transport.source})`,
    '',
    ...(across ? hostLines(across) : []),
    ...serviceLines(r, across, on),
    '',
    ...rankLines(r, on),
    '',
    ...watchdogLines(r),
    ...counterLines(r),
    ...haltLines(r),
    '',
    ...hostStateLines(r, across),
  ]
  if (r.warnings.length > 0) {
    out.push('')
    out.push('warnings')
    for (const line of r.warnings) out.push(`  ! ${line}`)
  }
  return out.join('\n')
}

/** Each host, what it runs (a multi-node instance's other node ranks run schedulers here: instance and node rank). */
function hostLines(across: DeploymentReport): string[] {
  const out = ['hosts']
  for (const h of across.hosts) {
    const nodes = (h.nodeRanks ?? []).map(n => `${n.path.replace(/^services\./, '')} node rank ${n.nodeRank}`)
    out.push(`  ${h.name.padEnd(hostWidth(across))} ${h.host.padEnd(28)} runs ${[...h.roles, ...nodes].join(', ')}`)
  }
  out.push('')
  return out
}

type On = (x: object) => string

/**
 * Each service (several instances of a role: each as the file states it, then the router), and the router's settings.
 */
function serviceLines(r: StatusReport | DeploymentReport, across: DeploymentReport | undefined, on: On): string[] {
  const out = ['services']
  const listed: Array<[string, (typeof r.services)[keyof typeof r.services]]> = across?.instances
    ? [
        ...across.instances.map(i => [i.path.replace(/^services\./, ''), i] as [string, typeof i]),
        ['router', r.services.router],
      ]
    : Object.entries(r.services)
  const labelWidth = Math.max(8, ...listed.map(([name]) => name.length))
  for (const [name, s] of listed) {
    const health = s.health.ok
      ? `healthy (${Math.round(s.health.ms)} ms)`
      : `UNHEALTHY: ${s.health.error ?? s.health.status}`
    const ready = s.readiness ? (s.readiness.ok ? ', ready' : ', NOT READY') : ''
    const extra = [
      s.version && `SGLang ${s.version}`,
      s.tpSize !== undefined && `tp ${s.tpSize}`,
      s.pid !== undefined && `pid ${s.pid}`,
    ]
      .filter(Boolean)
      .join(', ')
    out.push(`  ${name.padEnd(labelWidth)} ${on(s)}${s.url.padEnd(28)} ${health}${ready}${extra ? `  [${extra}]` : ''}`)
  }
  const rs = r.services.router.routerSettings
  if (rs) {
    out.push(
      `  router   retries: ${rs.retries.enabled ? `${rs.retries.attempts} attempts in all` : 'off'}; circuit ` +
        `breaker: ${
          rs.circuitBreaker.enabled
            ? `opens after ${rs.circuitBreaker.failureThreshold} failures, ` + `for ${rs.circuitBreaker.openSeconds} s`
            : 'off'
        }  (${rs.source})`,
    )
    for (const line of rs.underFaults) out.push(`           under a fault: ${line}`)
    out.push(
      '           (pdchaos sends its pins to prefill and decode directly, once each; load and canaries go through ' +
        'the router)',
    )
  }
  return out
}

function rankLines(r: StatusReport | DeploymentReport, on: On): string[] {
  const out = ['ranks']
  if (r.ranks.length === 0) out.push('  (none found)')
  for (const k of r.ranks) {
    const gpu = k.gpu === undefined ? 'gpu ?' : `gpu ${k.gpu}`
    const zmq = k.zmqPort === undefined ? '' : `  zmq ${k.zmqHost ?? ''}:${k.zmqPort}`
    const label = 'instance' in k && k.instance ? k.instance.replace(/^services\./, '') : k.service
    const node = 'nodeRank' in k && k.nodeRank !== undefined ? ` node ${k.nodeRank}` : ''
    out.push(
      `  ${`${label}${node}`.padEnd(8)} ${on(k)}TP${k.tpRank}  pid ${String(k.pid).padEnd(7)} ${gpu.padEnd(6)} ` +
        `state ${k.state}  ${k.title}${zmq}`,
    )
  }
  return out
}

/** The watchdog's contract (and prefill's environment), then SGLang's own timeouts. */
function watchdogLines(r: StatusReport | DeploymentReport): string[] {
  const w = r.watchdog
  const env = w.prefillEnv
  const out = [
    `watchdog  contract: scope ${w.contract.scope}, deadline ${w.contract.deadlineSeconds}s, ` +
      `poll ${w.contract.pollSeconds}s` +
      (env
        ? `;  prefill env: scope ${env.scope ?? '-'}, deadline ${env.deadlineSeconds ?? '-'}s, ` +
          `poll ${env.pollSeconds ?? '-'}s`
        : ''),
  ]
  const st = r.sglangTimeouts
  if (st) {
    out.push(
      `sglang    version ${st.version ?? 'unknown'} ` +
        `(${st.versionSource})${st.backend ? `, backend ${st.backend}` : ''}; its own timeouts:`,
    )
    const secs = (x: {seconds: number | null}) => (x.seconds === null ? 'none' : `${x.seconds} s`)
    out.push(`          prefill's bootstrap timeout ${secs(st.bootstrap)}: ${st.bootstrap.source}`)
    out.push(`          decode's waiting timeout ${secs(st.waiting)}: ${st.waiting.source}`)
    out.push(
      `          decode's heartbeat bound ${secs(st.heartbeat)} (${st.heartbeat.intervalSeconds} s ` +
        `x ${st.heartbeat.maxFailure}): ${st.heartbeat.source}`,
    )
  }
  return out
}

function counterLines(r: StatusReport | DeploymentReport): string[] {
  const out: string[] = []
  for (const role of ['prefill', 'decode'] as const) {
    const c = Object.entries(r.counters[role])
      .map(([k, v]) => `${k.replace(/^sglang:num_|_reqs_total$/g, '')}=${v}`)
      .join(' ')
    const g = Object.entries(r.gauges[role])
      .map(([k, v]) => `${k.replace(/^sglang:(num_)?|_reqs$/g, '')}=${v}`)
      .join(' ')
    out.push(`${role.padEnd(9)} counters: ${c || '-'}`)
    out.push(`${''.padEnd(9)} gauges (may be stale): ${g || '-'}`)
  }
  return out
}

/** Each host's leases and lock (one host: unnamed). */
function hostStateLines(r: StatusReport | DeploymentReport, across: DeploymentReport | undefined): string[] {
  const out: string[] = []
  for (const h of across?.hosts ?? [{name: '', hostState: r.hostState}]) {
    const {leases, lock} = h.hostState
    const where = h.name ? ` on ${h.name}` : ''
    const w = 10 + (across ? 4 + hostWidth(across) : 0)
    out.push(
      `${`leases${where}`.padEnd(w)}${
        leases.length === 0
          ? 'none'
          : leases.map(l => `${String(l.id ?? l.file)} ` + `(${String(l.fault ?? '?')})`).join(', ')
      }`,
    )
    out.push(
      `${`lock${where}`.padEnd(w)}${lock ? `held by ${String(lock.owner)} for ${String(lock.command)}` : 'free'}`,
    )
  }
  return out
}

function hostWidth(r: DeploymentReport): number {
  return Math.max(...r.hosts.map(h => h.name.length))
}

/** The halt (`pdchaos halt`), loud: no chaos run acts on the deployment until `pdchaos resume`. */
export function haltLines(r: object): string[] {
  const h = (r as {halt?: HaltRecord}).halt
  return h ? ['', `HALTED    ${haltLine(h)}`, '          no chaos run acts on it until `pdchaos resume`'] : []
}
