import {vllmCoRestart} from '../../../restart/vllm-co-restart.js'
import type {Probe} from '../../../faults/fault.js'
import type {Verdict} from '../../../model/verdict.js'
import {
  killTargets,
  renderVllmKillDecodePlan,
  VLLM_KILL_DECODE_FAULT,
  type VllmKillDecodePlan,
  vllmKillDecodePlan,
} from '../faults/kill-decode.js'
import type {ReadStallPlan} from '../faults/read-stall.js'
import type {VllmContext, VllmExperiment, VllmFaultOptions} from './experiment.js'
import {
  decodeHealth,
  decodeTree,
  injectUnder,
  planStall,
  revertUnder,
  runStop,
  type StopFault,
  startTicksOf,
} from './heartbeat-stop.js'

/**
 * kill-decode on vLLM: D's READs held (the READ stall), D's API server, engine core and workers SIGKILLed by
 * identity under a fault lease, P's releases judged (checks/kv-wedge.ts), then D restarted by its restart command
 * behind its /health gate (restart/vllm-co-restart.ts with D alone, no canaries), as SGLang's kill-prefill restarts
 * prefill. The plan is faults/kill-decode.ts (pure; no restart command: refused).
 */

/** Restart gate and command deadlines (the twin is healthy in under a second; a real vLLM loads its model). */
const RESTART = {healthTimeoutS: 600, commandTimeoutS: 600}

async function prepare(ctx: VllmContext, opts: VllmFaultOptions) {
  const d = ctx.deployment
  const servers = ctx.discovery.servers
  const tree = await decodeTree(ctx)
  const found = killTargets(tree)
  const targets = found
    ? await Promise.all(
        found.map(async t => {
          const ticks = await startTicksOf(ctx, t.pid)
          return ticks === undefined ? t : {...t, startTicks: ticks}
        }),
      )
    : undefined
  const plan = vllmKillDecodePlan({
    targets,
    restart: d.services.decode.restart,
    port: Number(new URL(d.services.decode.url).port || 80),
    p: servers.find(s => s.role === 'prefill')?.lease,
    d: servers.find(s => s.role === 'decode')?.lease,
    requests: opts.requests ?? 2,
    ...(opts.ttlS === undefined ? {} : {ttlS: opts.ttlS}),
    logFile: d.services.prefill.logs?.file,
  })
  if ('refusal' in plan) return plan
  const stall = await planStall(ctx, VLLM_KILL_DECODE_FAULT, plan.leaseTtlMs)
  if ('refusal' in stall) return stall
  return {
    lines: [...renderVllmKillDecodePlan(plan), ...stall.lines],
    plan: {kill: {...plan, verifyKilled: plan.verifyKilled.name}, readStall: {...stall, filter: stall.filter.summary}},
    run: () => runStop(ctx, stopFault(ctx, plan), stall as ReadStallPlan),
  }
}

/** Probe: D's port has a listener (it was restarted); the gate over HTTP is the restart's. */
function servingProbe(port: number): Probe {
  return {
    name: `D listens on port ${port}`,
    argv: ['ss', '-Hltn', `sport = :${port}`],
    sudo: false,
    judge: (stdout, code) =>
      code === 0 && stdout.trim()
        ? {ok: true, evidence: `ss: a listener on port ${port} (D restarted)`}
        : {ok: false, evidence: `ss: nothing listens on port ${port}${code === 0 ? '' : ` (ss exit ${code})`}`},
  }
}

function stopFault(ctx: VllmContext, plan: VllmKillDecodePlan): StopFault {
  const what = `SIGKILL of D (${plan.targets.map(t => `pid ${t.pid}`).join(', ')})`
  return {
    fault: VLLM_KILL_DECODE_FAULT,
    mechanism: 'sigkill',
    description:
      `engine vllm: ${what} while D holds requests in WAITING_FOR_REMOTE_KVS; D's heartbeats stop with it, and P ` +
      'must free the blocks at max(grant + duration, last renewal + extension) + one step + the reaper; then D is ' +
      'restarted behind its /health gate',
    what,
    timing: plan.timing,
    settings: plan.settings,
    sources: plan.sources,
    leaseTtlMs: plan.leaseTtlMs,
    stop: guard =>
      injectUnder(guard, {
        fault: VLLM_KILL_DECODE_FAULT,
        mechanism: 'sigkill',
        ttlMs: plan.leaseTtlMs,
        inject: [plan.kill],
        revert: [plan.revert],
        verify: plan.verifyKilled,
      }),
    revert: (guard, record) => restartDecode(ctx, plan, guard, record),
  }
}

/** D's restart command behind its /health gate, then the lease's revert (a no-op once D listens), then D's health. */
async function restartDecode(
  ctx: VllmContext,
  plan: VllmKillDecodePlan,
  guard: Parameters<StopFault['revert']>[0],
  record: Parameters<StopFault['revert']>[1],
): Promise<Verdict[]> {
  ctx.progress(`restarting D: ${plan.restart.join(' ')} (behind its /health gate)`)
  // Not the run's stop: a Ctrl-C must still bring D back (the lease's revert below restarts it if this did not).
  const r = await vllmCoRestart(
    ctx.deployment,
    ctx.host,
    {...RESTART, canaries: 0, settleS: 0, canaryTimeoutS: 10, onProgress: ctx.progress},
    ['decode'],
  ).catch((e: unknown) => ({steps: [], error: String(e)}))
  await revertUnder(guard, record, servingProbe(plan.port))
  const h = await decodeHealth(ctx)
  const tree = await decodeTree(ctx).catch(() => undefined)
  const step = r.steps[0]
  const fresh = tree !== undefined && !plan.targets.some(t => t.pid === tree.server.pid)
  const ok = h.ok && fresh && record.verifiedClean
  return [
    {
      check: 'restart',
      subject: 'decode',
      verdict: ok ? 'pass' : 'fail',
      summary: ok
        ? `D restarted (pid ${tree!.server.pid}) and healthy behind its /health gate`
        : 'D not shown restarted and healthy',
      evidence: {
        step: step ?? ('error' in r ? r.error : 'no step ran'),
        health: h.detail,
        pid: tree?.server.pid ?? null,
        killed: record.evidence.injected,
        lease: record.evidence.clean,
      },
    },
  ]
}

export const vllmKillDecode: VllmExperiment = {
  fault: VLLM_KILL_DECODE_FAULT,
  summary:
    "SIGKILL of D's server, engine core and workers while it holds requests: P must free the blocks at lease " +
    'expiry; D restarted by its restart command behind /health',
  takes: ['requests', 'ttlS'],
  prepare,
}
