import {z} from 'zod'

import type {WedgeExpectation} from '../checks/expectation.js'
import type {RankInfo} from '../engines/sglang/discovery/discover.js'
import {HEALTH_CHECK_GRANULARITY_S, healthCheckFromEnv} from '../engines/sglang/discovery/transport-env.js'
import {badInput} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {checkLeaseId, describeRank, type Fault, type FaultContext, type FaultPlan, type HostFacts} from './fault.js'
import {pairedRanks, parseSsConnections, rankOnGpu, SS_ARGV} from './mechanisms/data-path.js'
import {checkIdentity} from './mechanisms/proc-identity.js'
import {buildSigstop} from './mechanisms/signals.js'

/**
 * wedge-rank --gpu N [--side prefill|decode]: SIGSTOP one scheduler rank, by pid and start time. Every rank of its
 * instance then waits for it in the next collective, so the whole instance wedges, its watchdog included (the
 * watchdog runs in the scheduler loop). No request is pinned for a watchdog to find: the expected outcome is a
 * wedged instance, and what is judged is whether the deployment notices (its /health goes red within its own
 * health-check bound) and recovers after SIGCONT. It never judges the watchdog.
 */

const Params = z
  .object({
    gpu: z.number().int().min(0).max(1023).optional().describe('wedge-rank: the GPU whose rank is stopped (required).'),
    side: z
      .enum(['prefill', 'decode'])
      .optional()
      .describe("wedge-rank: stop the GPU's own rank (default), or its KV peer on the other side (prefill or decode)."),
  })
  .strict()

export type WedgeRankParams = z.infer<typeof Params>

/** How often the runner samples each service's /health while the wedge is held and after the revert. */
export const HEALTH_SAMPLE_INTERVAL_MS = 250
export const NOT_THE_WATCHDOG =
  'a wedged instance cannot run its watchdog: this experiment judges detection and recovery only'

export const wedgeRank: Fault<WedgeRankParams> = {
  name: 'wedge-rank',
  summary:
    'SIGSTOP one scheduler rank: its instance wedges; judged on detection (/health goes red) and recovery after ' +
    'SIGCONT',
  params: Params,
  mechanisms: ['sigstop'],
  observe: 'health',
  // No pins: a wedged instance holds whatever is in flight, and nothing evicts it (its watchdog is stopped too).

  refine(p, label) {
    return p.gpu === undefined
      ? {key: 'gpu', why: `needs ${label('gpu')} N (pick the GPU from \`pdchaos status\`)`}
      : undefined
  },

  footprint(p) {
    return {
      exclusive: `SIGSTOP wedges the ${p.side ?? 'own'} instance of GPU ${p.gpu}: every request through it stalls`,
      gpus: [p.gpu!],
      ports: [],
      queue: 'inflight',
    }
  },

  async gather(host: Host, discovery, params, opts = {}): Promise<HostFacts> {
    const own = discovery.ranks.find(r => r.gpu === params.gpu)
    if (!params.side || own?.service === params.side) return {}
    // The peer on the other side: observed KV connections first (equal TP sizes otherwise).
    const ss = await host.run(SS_ARGV, {timeoutMs: opts.timeoutMs ?? 5000, sudo: true}).catch(() => undefined)
    return ss?.code === 0 ? {connections: parseSsConnections(ss.stdout)} : {}
  },

  plan(ctx: FaultContext<WedgeRankParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const rank = rankOnGpu(ctx.discovery, ctx.params.gpu!)
    const side = ctx.params.side ?? rank.service
    let target: RankInfo = rank
    const notes: string[] = []
    if (rank.service !== side) {
      const paired = pairedRanks(rank, ctx.discovery, ctx.facts.connections)
      if (paired.ranks.length === 0)
        throw badInput(
          `cannot tell which ${side} rank is paired with ${describeRank(rank)}: ${paired.evidence}`,
          `send one request first, or pick --gpu of a ${side} rank`,
        )
      if (paired.ranks.length > 1) {
        throw badInput(
          `${describeRank(rank)} is paired with ${paired.ranks.length} ${side} ranks ` +
            `(${paired.ranks.map(describeRank).join(', ')}): ambiguous target`,
          `pick --gpu of one of those ${side} ranks`,
        )
      }
      target = paired.ranks[0]!
      notes.push(`pairing: ${paired.evidence}`)
    }
    const label = describeRank(target)
    const id = checkIdentity(target, label)
    const stop = buildSigstop(id, label)
    const expected = wedgeExpectation(ctx, target.service)
    return {
      fault: 'wedge-rank',
      mechanism: 'sigstop',
      leaseId: ctx.leaseId,
      targets: [
        {
          service: target.service,
          tpRank: target.tpRank,
          pid: id.pid,
          startTicks: id.startTicks,
          ...(target.gpu === undefined ? {} : {gpu: target.gpu}),
        },
      ],
      inject: stop.inject,
      revert: stop.revert,
      sudo: true,
      verifyInjected: [stop.verifyInjected],
      verifyClean: [stop.verifyClean],
      readOnlyProbes: stop.readOnlyProbes,
      description:
        `${stop.summary}. The ${target.service} instance wedges in its next collective (every rank waits for the ` +
        `stopped one): ` +
        `its ${expected.probePath} must go red within ${expected.detectWithinSeconds} s and come back ` +
        `within ${expected.resumeWithinSeconds} s of SIGCONT. ${NOT_THE_WATCHDOG}.`,
      notes: [
        ...notes,
        `expected outcome: a wedged ${target.service} instance — ${expected.why}`,
        "hold it well under the collectives' own timeouts (gloo/NCCL, minutes): past them the instance crashes " +
          'instead of resuming',
        ...(target.service === 'prefill'
          ? [
              "decode's heartbeat probes the prefill bootstrap server, which runs in the HTTP process, not the " +
                'stopped scheduler: it stays green',
            ]
          : []),
      ],
      expected,
    }
  },
}

/**
 * The health bounds, from the wedged server's own health-check timeout T (SGLANG_HEALTH_CHECK_TIMEOUT, or what the
 * twin states, or SGLang's 20 s): a probe started after the wedge answers 503 after T plus up to one 1 s tick of
 * SGLang's health loop; the probe in flight at the wedge may still answer 200 up to one tick later; plus one sample
 * interval. The same bound holds for resumption: the probe in flight at SIGCONT ends within T + 1 s, the next sees
 * the resumed scheduler within a tick.
 */
export function wedgeExpectation(
  ctx: Pick<FaultContext<WedgeRankParams>, 'discovery'>,
  service: 'prefill' | 'decode',
): WedgeExpectation {
  const hc = ctx.discovery.health?.[service] ?? healthCheckFromEnv(undefined)
  const t = hc.timeoutSeconds
  const sample = HEALTH_SAMPLE_INTERVAL_MS / 1000
  const bound = Math.round((t + 2 * HEALTH_CHECK_GRANULARITY_S + sample) * 1000) / 1000
  const probePath = hc.generates ? '/health' : '/health_generate'
  return {
    kind: 'wedge',
    service,
    healthTimeoutSeconds: t,
    healthTimeoutSource: hc.source,
    detectWithinSeconds: bound,
    resumeWithinSeconds: bound,
    probePath,
    sampleIntervalMs: HEALTH_SAMPLE_INTERVAL_MS,
    holdSeconds: Math.ceil(bound + Math.max(3, t * 0.25)),
    why:
      `${service}'s ${probePath} answers 503 once no scheduler output arrives for ${t} s (${hc.source}), checked ` +
      `once a second: red within ${t} + 2 × 1 s + ${sample} s sampling = ${bound} s` +
      `${
        hc.generates
          ? ''
          : '; /health does not generate here (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false), ' +
            'so /health_generate is probed'
      }`,
  }
}
