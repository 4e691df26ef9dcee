import type {Verdict} from '../../../model/verdict.js'
import {
  renderVllmWedgePlan,
  VLLM_WEDGE_FAULT,
  type VllmWedgePlan,
  pickWedgeTarget,
  vllmWedgePlan,
} from '../faults/wedge-rank.js'
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
 * wedge-rank --side decode [--gpu N] on vLLM: D's READs held (the READ stall), D's TP worker N (or its engine core)
 * SIGSTOPped under a fault lease, P's releases judged (checks/kv-wedge.ts), SIGCONT, D proven running again. The
 * plan is faults/wedge-rank.ts (pure; `--side prefill` refused there with its reason).
 */

async function prepare(ctx: VllmContext, opts: VllmFaultOptions) {
  const d = ctx.deployment
  const servers = ctx.discovery.servers
  const tree = opts.side === 'prefill' ? undefined : await decodeTree(ctx)
  const picked = pickWedgeTarget(tree, opts.gpu)
  const target = 'refusal' in picked ? picked : {...picked, ...withTicks(await startTicksOf(ctx, picked.pid))}
  const plan = vllmWedgePlan({
    side: opts.side,
    target,
    p: servers.find(s => s.role === 'prefill')?.lease,
    d: servers.find(s => s.role === 'decode')?.lease,
    requests: opts.requests ?? 2,
    ...(opts.ttlS === undefined ? {} : {ttlS: opts.ttlS}),
    logFile: d.services.prefill.logs?.file,
  })
  if ('refusal' in plan) return plan
  const stall = await planStall(ctx, VLLM_WEDGE_FAULT, plan.leaseTtlMs)
  if ('refusal' in stall) return stall
  return {
    lines: [...renderVllmWedgePlan(plan), ...stall.lines],
    plan: {wedge: {...plan, sigstop: plan.sigstop.summary}, readStall: {...stall, filter: stall.filter.summary}},
    run: () => runStop(ctx, stopFault(ctx, plan), stall as ReadStallPlan),
  }
}

const withTicks = (t: number | undefined): {startTicks?: number} => (t === undefined ? {} : {startTicks: t})

function stopFault(ctx: VllmContext, plan: VllmWedgePlan): StopFault {
  const what = `SIGSTOP of D's ${plan.target.title} (pid ${plan.target.pid})`
  return {
    fault: VLLM_WEDGE_FAULT,
    mechanism: 'sigstop',
    description:
      `engine vllm: ${what} while D holds requests in WAITING_FOR_REMOTE_KVS; D's heartbeats stop, and P must ` +
      'free the blocks at max(grant + duration, last renewal + extension) + one step + the reaper',
    what,
    timing: plan.timing,
    settings: plan.settings,
    sources: plan.sources,
    leaseTtlMs: plan.leaseTtlMs,
    stop: guard =>
      injectUnder(guard, {
        fault: VLLM_WEDGE_FAULT,
        mechanism: 'sigstop',
        ttlMs: plan.leaseTtlMs,
        inject: plan.sigstop.inject,
        revert: plan.sigstop.revert,
        verify: plan.sigstop.verifyInjected,
      }),
    revert: async (guard, record) => {
      await revertUnder(guard, record, plan.sigstop.verifyClean)
      const h = await decodeHealth(ctx)
      const ok = record.verifiedClean && h.ok
      const v: Verdict = {
        check: 'cleanup',
        subject: `decode ${plan.target.title}`,
        verdict: ok ? 'pass' : 'fail',
        summary: ok ? `D resumed (SIGCONT) and healthy` : `D not shown resumed and healthy`,
        evidence: {injected: record.evidence.injected, clean: record.evidence.clean, health: h.detail},
      }
      return [v]
    },
  }
}

export const vllmWedgeRank: VllmExperiment = {
  fault: VLLM_WEDGE_FAULT,
  summary:
    "SIGSTOP of D's TP worker (--gpu N) or engine core while it holds requests: D's heartbeats stop and P must free " +
    'the blocks at lease expiry (--side prefill refused: nothing to judge)',
  takes: ['requests', 'gpu', 'side', 'ttlS'],
  prepare,
}
