import {z} from 'zod'

import type {DecodeReleaseExpectation} from '../checks/decode-release.js'
import type {RankInfo} from '../engines/sglang/discovery/discover.js'
import {badInput} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {
  checkLeaseId,
  describeRank,
  type Fault,
  type FaultContext,
  type FaultPlan,
  type HostFacts,
  type Judgement,
  type Probe,
} from './fault.js'
import {rankOnGpu} from './mechanisms/data-path.js'
import {checkIdentity, goneProbe, type ProcIdentity, parseProcStat} from './mechanisms/proc-identity.js'

/**
 * kill-prefill --gpu N | --instance: SIGKILL of the prefill server (its HTTP process, which also runs the bootstrap
 * server decode's heartbeat probes) and every one of its scheduler ranks, each by pid AND start time checked on the
 * host in the shell that sends the signal. Decode's halves of requests held in its transfer queue (WaitingForInput)
 * then wait for decode to notice: its heartbeat (interval × max failures) or its waiting timeout (SGLang issue 30,
 * item 2; checks/decode-release.ts). The revert is the deployment's restart command for prefill; the runner runs it
 * behind prefill's health gate (as `restart --only prefill` does), and the lease's reverter runs it too, guarded so
 * that a prefill already serving on its port is not restarted twice.
 */

const Params = z
  .object({
    gpu: z
      .number()
      .int()
      .min(0)
      .max(1023)
      .optional()
      .describe('kill-prefill: kill the prefill instance whose rank runs on this GPU.'),
    instance: z.boolean().optional().describe("kill-prefill: kill the pair's prefill instance."),
    halves: z
      .number()
      .int()
      .min(1)
      .max(32)
      .default(2)
      .describe("kill-prefill: decode halves held in decode's transfer queue when prefill is killed."),
  })
  .strict()

export type KillPrefillParams = z.infer<typeof Params>

/**
 * Past the heartbeat bound: a killed server refuses the probe at once (no 2 s connect timeout), then one decode
 * scheduler iteration and the 500's round trip.
 */
const EPSILON_S = 1
const EPSILON_WHY =
  "a killed server refuses decode's /health probe at once (no connect timeout); then one decode scheduler " +
  "iteration (pop_transferred) and the 500's round trip: 1 s"
/** Waited past the bound (+ ε) for the releases, so that a late one is seen as late rather than as never. */
const WAIT_MARGIN_S = 2
/** Without a readable bound the runner still waits SGLang's default (5 s × 2), so the report says what happened. */
const DEFAULT_BOUND_S = 10

/**
 * Kill each (pid, start time) given, after checking the start time on the host: a recycled pid is never signalled.
 * Exit 0 when at least one was killed (the others gone already), 3 when none was, 2 on bad arguments. It returns once
 * the killed processes have exited (or after 3 s).
 */
export const KILL_SCRIPT = [
  'set -f',
  'start_of() { r=${1##*")"}; set -- $r; echo "${20}"; }',
  'if [ $# -lt 2 ] || [ $(( $# % 2 )) -ne 0 ]; then echo "pdchaos-kill: bad arguments" >&2; exit 2; fi',
  'killed=0; pids=',
  'while [ $# -gt 0 ]; do',
  '  pid="$1"; want="$2"; shift 2',
  '  case "$pid:$want" in *[!0-9:]*|:*|*:) echo "pdchaos-kill: bad arguments" >&2; exit 2;; esac',
  '  if ! stat=$(cat "/proc/$pid/stat" 2>/dev/null); then echo "pdchaos-kill: pid $pid is gone"; continue; fi',
  '  start=$(start_of "$stat")',
  '  if [ "$start" != "$want" ]; then',
  '    echo "pdchaos-kill: pid $pid now has start time $start, not $want: another process, not signalled"',
  '    continue',
  '  fi',
  '  kill -s KILL "$pid" && killed=$((killed + 1)) && pids="$pids $pid" &&',
  '    echo "pdchaos-kill: SIGKILL sent to pid $pid (start $want)"',
  'done',
  '[ "$killed" -gt 0 ] || { echo "pdchaos-kill: nothing killed"; exit 3; }',
  // SIGKILL is delivered at once but a process takes a moment to exit (state D while its memory is freed): wait for
  // the killed ones (bounded, 3 s), so that the verification reads their end, not their last moments.
  'n=0',
  'while [ "$n" -lt 30 ]; do',
  '  n=$((n + 1))',
  '  left=0',
  '  for p in $pids; do',
  '    st=$(cat "/proc/$p/stat" 2>/dev/null) || continue',
  '    s=${st##*")"}; set -- $s',
  '    [ "$1" = Z ] || [ "$1" = X ] || left=$((left + 1))',
  '  done',
  '  [ "$left" -eq 0 ] && break',
  '  sleep 0.1 2>/dev/null || sleep 1',
  'done',
  'exit 0',
].join('\n')

/** The restart command, unless prefill's HTTP port already has a listener (then it is back: idempotent). */
export const RESTART_UNLESS_SERVING = [
  'set -f',
  'port="$1"; shift',
  'case "$port" in ""|*[!0-9]*) echo "pdchaos-restart: bad port" >&2; exit 2;; esac',
  'if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then',
  '  echo "pdchaos-restart: port $port has a listener: prefill is back, not restarted"; exit 0',
  'fi',
  'exec "$@"',
].join('\n')

/** Probe: prefill's HTTP port has a listener again (the health gate itself is the runner's, over HTTP). */
function servingProbe(port: number): Probe {
  return {
    name: `prefill listens on port ${port}`,
    argv: ['ss', '-Hltn', `sport = :${port}`],
    sudo: false,
    judge: (stdout, code): Judgement =>
      code === 0 && stdout.trim()
        ? {ok: true, evidence: `ss: a listener on port ${port} (prefill restarted)`}
        : {ok: false, evidence: `ss: nothing listens on port ${port}${code === 0 ? '' : ` (ss exit ${code})`}`},
  }
}

export const killPrefill: Fault<KillPrefillParams> = {
  name: 'kill-prefill',
  summary: "SIGKILL the prefill server and its ranks: decode's held halves must be released within its heartbeat bound",
  params: Params,
  mechanisms: ['sigkill'],
  observe: 'decode-pins',

  refine(p, label) {
    if ((p.gpu === undefined) === (p.instance !== true))
      return {key: 'gpu', why: `needs ${label('gpu')} N or ${label('instance')} (one of them)`}
    return undefined
  },

  footprint() {
    return {
      exclusive: 'kills the prefill instance: every request through it fails until it is restarted',
      gpus: [],
      ports: [],
    }
  },

  async gather(host: Host, discovery, _params, opts = {}): Promise<HostFacts> {
    const pid = discovery.prefillServer?.pid
    if (pid === undefined) return {}
    const r = await host.run(['cat', `/proc/${pid}/stat`], {timeoutMs: opts.timeoutMs ?? 5000}).catch(() => undefined)
    const s = r?.code === 0 ? parseProcStat(r.stdout.trim()) : undefined
    return s ? {processes: [{pid: s.pid, startTicks: s.startTicks, state: s.state}]} : {}
  },

  plan(ctx: FaultContext<KillPrefillParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const d = ctx.discovery
    const ranks = prefillRanks(ctx)
    const server = serverIdentity(ctx)
    const restart = d.restart?.prefill
    if (!restart || restart.length === 0)
      throw badInput(
        'kill-prefill needs a restart command for prefill: its revert restarts the killed instance',
        'add services.prefill.restart (an argv list) to the deployment file',
      )
    const port = d.prefillServer!.port
    const ids = [
      {...server, label: 'prefill server'},
      ...ranks.map(r => ({...checkIdentity(r, describeRank(r)), label: `prefill TP${r.tpRank}`})),
    ]
    const kill = ['sh', '-c', KILL_SCRIPT, 'pdchaos-kill', ...ids.flatMap(i => [String(i.pid), String(i.startTicks)])]
    const revert = ['sh', '-c', RESTART_UNLESS_SERVING, 'pdchaos-restart', String(port), ...restart]
    const expected = decodeReleaseExpectation(ctx)
    return {
      fault: 'kill-prefill',
      mechanism: 'sigkill',
      leaseId: ctx.leaseId,
      targets: ranks.map(r => ({
        service: 'prefill' as const,
        tpRank: r.tpRank,
        pid: r.pid,
        ...(r.startTicks === undefined ? {} : {startTicks: r.startTicks}),
        ...(r.gpu === undefined ? {} : {gpu: r.gpu}),
      })),
      inject: [kill],
      revert: [revert],
      sudo: true,
      verifyInjected: [goneProbe(ids, 'prefill')],
      verifyClean: [servingProbe(port)],
      readOnlyProbes: [
        ['sh', '-c', 'for p in "$@"; do cat "/proc/$p/stat"; done', 'pdchaos-stat', ...ids.map(i => String(i.pid))],
        ['sh', '-c', 'command -v kill ss'],
      ],
      description:
        `SIGKILL the prefill server (pid ${server.pid}) and its ${ranks.length} rank(s), each by pid and start time; ` +
        `${expected.pins} decode half(s) held in decode's transfer queue must be released ${expected.why}; ` +
        'then prefill is restarted by its restart command behind its health gate.',
      notes: [
        `decode's release: ${expected.why}`,
        'a decode half is a request sent to decode alone with a fresh bootstrap room: decode resolves the room, ' +
          'sends its destination info and waits in WaitingForInput for KV that the killed prefill never sends',
        `revert: ${restart.join(' ')} (skipped by the lease's reverter when port ${port} already has a listener)`,
      ],
      expected,
    }
  },
}

/** The prefill instance's ranks: the one of --gpu N's rank (which must be prefill's), or the pair's. */
function prefillRanks(ctx: FaultContext<KillPrefillParams>): RankInfo[] {
  if (ctx.params.gpu !== undefined) {
    const rank = rankOnGpu(ctx.discovery, ctx.params.gpu)
    if (rank.service !== 'prefill')
      throw badInput(
        `GPU ${ctx.params.gpu} runs ${describeRank(rank)}, not a prefill rank`,
        'pick the GPU of a prefill rank (`pdchaos status`), or pass --instance',
      )
  }
  const ranks = ctx.discovery.ranks.filter(r => r.service === 'prefill')
  if (ranks.length === 0)
    throw badInput('discovery found no prefill rank to kill', 'check `pdchaos status` shows the prefill ranks')
  return ranks
}

function serverIdentity(ctx: FaultContext<KillPrefillParams>): ProcIdentity {
  const pid = ctx.discovery.prefillServer?.pid
  if (pid === undefined)
    throw badInput(
      "discovery could not tell the prefill server's process (the listener on its port)",
      "run pdchaos with the privilege to read the listener's pid (ss -p), then retry",
    )
  const seen = ctx.facts.processes?.find(p => p.pid === pid)
  return checkIdentity({pid, ...(seen ? {startTicks: seen.startTicks} : {})}, `prefill server (pid ${pid})`)
}

/** The window decode's release is judged by, from the settings discovery read (never SGLang's defaults silently). */
export function decodeReleaseExpectation(
  ctx: Pick<FaultContext<KillPrefillParams>, 'discovery' | 'params'>,
): DecodeReleaseExpectation {
  const hb = ctx.discovery.heartbeat
  const w = ctx.discovery.sglangTimeouts?.waiting
  const waiting = w && w.seconds !== null ? {seconds: w.seconds, source: w.source} : undefined
  const why = hb
    ? `within decode's heartbeat bound ${hb.intervalSeconds} s × ${hb.maxFailure} = ${hb.boundSeconds} s + ε ` +
      `${EPSILON_S} s of the kill (${hb.source})`
    : "by decode's heartbeat, whose bound could not be read (decode's environment): unverified"
  return {
    kind: 'decode-release',
    cause: 'prefill killed (SIGKILL)',
    ...(hb ? {heartbeat: {...hb}} : {}),
    ...(waiting ? {waiting} : {}),
    epsilonSeconds: EPSILON_S,
    epsilonWhy: EPSILON_WHY,
    pins: ctx.params.halves ?? 2,
    waitSeconds: (hb?.boundSeconds ?? DEFAULT_BOUND_S) + EPSILON_S + WAIT_MARGIN_S,
    why,
  }
}
