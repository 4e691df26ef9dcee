import {IDLE_REFRESH_S} from '../engines/sglang/freshness.js'
import type {SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {sleep, within} from '../util/time.js'
import {now, type Recorder} from '../workload/recorder.js'
import {type SampledServer, sampleOnce} from '../workload/sampler.js'
import {sendRequest, type Sent} from '../workload/send.js'
import {type LogMark, readLogs} from '../workload/service-log.js'
import type {SteadyLoad} from '../workload/steady-load.js'
import {drained, gaugesOnly, type PairInBatch} from './batch-pairs.js'
import type {BatchSettings} from './batch-settings.js'
import {openBreakers, PROBE_TIMEOUT_MS, type RunSession, untilBreakersClose} from './session.js'

/**
 * A batch after its revert: the pins' log lines read, what is still held let go of, the requests the fault held
 * through the gateway waited for, the breaker waited for, canaries, and the queues' drain (each wait bounded).
 */

/** Upper bound on the queue drain after recovery: decode lets go of a request whose client left only after
 * SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s), so this waits, with a deadline. */
export const DRAIN_WAIT_MS = 20_000

/** The services' log lines naming the pins (what released each, in the servers' words), once the window is over. */
export async function readPinLogs(
  p: PairInBatch,
  labelled: boolean,
  rec: Recorder,
  marks: LogMark[],
  rids: string[],
  say: (l: string) => void,
): Promise<void> {
  const {session} = p
  const read = await readLogs(role => session.placement.of(role).host, session.deployment, marks, rids, {
    timeoutMs: PROBE_TIMEOUT_MS,
    watchdogPattern: session.deployment.watchdog.logPattern,
  })
  // Over several pairs each read says whose log it was: a scenario's view keeps its own pair's reads.
  for (const o of read) rec.add(labelled && o.kind === 'log-read' ? {...o, instance: p.labels[o.service]} : o)
  const unread = read.flatMap(o =>
    o.kind === 'log-read' && !o.ok ? [`${labelled ? p.labels[o.service] : o.service}: ${o.detail}`] : [],
  )
  if (unread.length > 0)
    say(`service log not read (release causes then rest on the answers and counters): ${unread.join('; ')}`)
}

/** Nothing left behind: every request the faults held and nothing released is aborted on the servers it may be on. */
export async function releaseHeld(
  rec: Recorder,
  sent: Array<{sent: Sent; on: SglangClient[]}>,
  revertedAt: number,
): Promise<void> {
  const answered = new Set(
    rec.observations.filter(o => o.kind === 'request-answered').map(o => (o as {rid: string}).rid),
  )
  const held = sent.filter(({sent: s}) => s.sentAt <= (revertedAt || now()) && !answered.has(s.rid))
  await Promise.all(
    held.map(async ({sent: s, on}) => {
      await Promise.all(on.map(c => c.abort(s.rid).catch(() => undefined)))
      rec.marker('cleanup-abort', s.rid)
    }),
  )
}

/** Recovery: the next requests must succeed, then the queues must drain (with a deadline). */
export async function recover(
  session: RunSession,
  servers: SampledServer[],
  rec: Recorder,
  load: SteadyLoad,
  settings: BatchSettings,
  revertedAt: number,
  signal: AbortSignal,
  say: (l: string) => void,
): Promise<void> {
  await heldRequestsEnd(
    rec,
    load.sent.filter(s => s.sentAt <= revertedAt),
    signal,
    say,
  )
  await waitForBreakers(session, rec, signal, say)
  const canaries = (): Promise<Array<{status: number | null}>> =>
    Promise.all(
      Array.from(
        {length: settings.canaries},
        () =>
          sendRequest(session.router, rec, {role: 'canary', timeoutMs: 30_000, promptTokens: settings.promptTokens})
            .done,
      ),
    )
  const first = await canaries()
  // A breaker that opened after the wait (a failure the gateway counted late, or traffic that is not pdchaos's) refuses
  // the canaries without sending them to a worker: that is no proof the deployment failed to recover. Wait for it and
  // send them again, once; the recovery check judges the last round.
  if (!signal.aborted && first.some(a => a.status === 503) && ((await openBreakers(session.router))?.length ?? 0) > 0) {
    await waitForBreakers(session, rec, signal, say, 'after the canaries')
    rec.marker('canaries-again', 'the first canaries met an open circuit breaker')
    await canaries()
  }
  say('waiting for the queues to drain')
  await load.stopSending()
  // within() clears its timer: a pending 20 s timer would keep the process alive after the run.
  await within(Promise.all(load.sent.map(p => p.done)), DRAIN_WAIT_MS)
  const drainBy = now() + DRAIN_WAIT_MS
  // Without /v1/loads only the per-batch gauges tell the queues, and they read what was in flight at the last batch
  // until SGLang's idle refresh rewrites them: wait for that write (docs/freshness.md) rather than judge a stale one.
  const refreshedBy = now() + IDLE_REFRESH_S * 1000 + 2000
  do {
    await sampleOnce(rec, servers)
    if (drained(rec, servers)) break
    await sleep(250, signal)
  } while ((now() < drainBy || (gaugesOnly(rec) && now() < refreshedBy)) && !signal.aborted)
}

/**
 * A fault can make the gateway open a worker's circuit breaker (every request the fault failed counts); until it
 * closes, healthy requests get 503. Say so, mark it on the timeline (the checks report it, and requests refused
 * meanwhile are the fault's reach, not collateral), and wait for it before the canaries, with a deadline.
 */
async function waitForBreakers(
  session: RunSession,
  rec: Recorder,
  signal: AbortSignal,
  say: (l: string) => void,
  when = 'during the fault',
): Promise<void> {
  const {open, closed} = await untilBreakersClose(session.router, {
    signal,
    onOpen: workers => {
      rec.marker('router-breaker-open', workers.join(' '))
      say(
        `the router's circuit breaker opened ${when} (${workers.join(', ')}): waiting for it to close before the ` +
          `canaries`,
      )
    },
  })
  if (open.length > 0 && closed) rec.marker('router-breaker-closed', open.join(' '))
}

/**
 * The requests the fault held that went through the gateway: their failed attempts (evicted by the watchdog, or let
 * go of by the cleanup) reach the gateway's breaker only as they end, and the gateway sends them again. Until they
 * have ended the breaker's state is not final (one read of it would race them), and the path may still be stalled
 * (an RDMA queue pair waits out its retransmission timeout before it sends again). Wait for them, bounded.
 */
async function heldRequestsEnd(
  rec: Recorder,
  held: Sent[],
  signal: AbortSignal,
  say: (l: string) => void,
): Promise<void> {
  const answered = new Set(
    rec.observations.filter(o => o.kind === 'request-answered').map(o => (o as {rid: string}).rid),
  )
  const open = held.filter(s => !answered.has(s.rid))
  if (open.length === 0 || signal.aborted) return
  say(`waiting for ${open.length} request(s) the fault held to end (the gateway may send them again)`)
  let ended = false
  void Promise.all(open.map(s => s.done)).then(() => (ended = true))
  // Polled, so that a stop (the signal) ends the wait at once and no timer outlives it.
  const by = now() + DRAIN_WAIT_MS
  while (!ended && now() < by && !signal.aborted) await sleep(Math.min(100, by - now()), signal)
  rec.marker('held-requests-ended', ended ? `${open.length}` : `not all within ${DRAIN_WAIT_MS / 1000}s`)
}
