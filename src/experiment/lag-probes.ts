import type {SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {newRid, newRoom} from '../engines/sglang/deployment/sglang-client.js'
import type {MeasuredLags} from '../model/lags.js'
import {sleep, within} from '../util/time.js'
import {now} from '../workload/recorder.js'

/**
 * Entry and answer lag, measured the way pins will meet them, on SGLang's outside surface only. Held requests go to
 * prefill alone (no decode half: each waits in the bootstrap queue, Bootstrapping, as a pin held in the bootstrap queue
 * does), paced like the pins and as many at once. Entry: the first /v1/loads?include=disagg snapshot whose
 * prefill_bootstrap_queue_reqs counts the request (SGLang's prefill publishes that snapshot on every idle or prefill
 * iteration). Answer: all are aborted at once (POST /abort_request: the scheduler aborts the sender, the next poll
 * releases it, and the 500 takes the same way out as a watchdog eviction's); abort → answer read is the abort's own
 * way in plus the answer's way out, so the request's entry lag is taken off.
 */

export interface LagProbeOptions {
  /** Held requests in all (the pins' count, capped by the caller). */
  count: number
  /** Sent `burst` at a time, `gapMs` apart, as the pins are. */
  burst: number
  gapMs: number
  /** Abort by then at the latest (ms after the first send): well before the watchdog could evict a probe. */
  holdLimitMs: number
  /** How long to wait for the aborted probes' answers (a lost abort waits for the watchdog). */
  answerWaitMs: number
  text: string
  bootstrap: {host: string; port: number}
}

interface Probe {
  rid: string
  sentAt: number
  entryAt?: number
  abortAt?: number
  answeredAt?: number
  done: Promise<void>
  stop: AbortController
}

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] ?? 0
}

/** prefill_bootstrap_queue_reqs summed over DP ranks, or undefined when /v1/loads has no disagg section. */
export function bootstrapQueued(loads: unknown): number | undefined {
  const ranks = (loads as {loads?: unknown})?.loads
  if (!Array.isArray(ranks)) return undefined
  let sum: number | undefined
  for (const r of ranks) {
    const v = (r as {disagg?: {prefill_bootstrap_queue_reqs?: unknown}})?.disagg?.prefill_bootstrap_queue_reqs
    if (typeof v === 'number') sum = (sum ?? 0) + v
  }
  return sum
}

async function queued(prefill: SglangClient): Promise<number | undefined> {
  return bootstrapQueued(await prefill.loads().catch(() => undefined))
}

export async function measureLags(prefill: SglangClient, o: LagProbeOptions): Promise<MeasuredLags> {
  const notes: string[] = []
  const base = await queued(prefill)
  if (base === undefined)
    notes.push('/v1/loads?include=disagg has no disagg section: entry lag not separable, the answer lag includes it')
  const state: ProbeState = {probes: [], sending: true, abortBy: now() + o.holdLimitMs}
  const poll = pollEntries(prefill, base, state)
  await sendProbes(prefill, o, state)
  state.sending = false
  await poll
  const held = await abortHeld(prefill, o, state.probes, notes)
  return summarize(state.probes, held, base, notes)
}

interface ProbeState {
  probes: Probe[]
  /** Still sending: the poller waits for more. */
  sending: boolean
  abortBy: number
}

/** The poller: the k-th request counted is the k-th sent (one scheduler, requests taken in order). */
async function pollEntries(prefill: SglangClient, base: number | undefined, st: ProbeState): Promise<void> {
  if (base === undefined) return
  while (now() < st.abortBy) {
    const n = await queued(prefill)
    const at = now()
    if (n !== undefined) {
      const entered = Math.min(n - base, st.probes.length)
      for (let i = 0; i < entered; i++) st.probes[i]!.entryAt ??= at
    }
    if (!st.sending && st.probes.every(p => p.entryAt !== undefined)) return
    await sleep(1)
  }
}

/** The held requests, paced as the pins are; resolves once all are sent. */
async function sendProbes(prefill: SglangClient, o: LagProbeOptions, st: ProbeState): Promise<void> {
  for (let i = 0; i < o.count && now() < st.abortBy; i++) {
    if (i > 0 && i % Math.max(1, o.burst) === 0) await sleep(o.gapMs)
    const rid = newRid('pdchaos-lag')
    const stop = new AbortController()
    const p: Probe = {rid, sentAt: now(), stop, done: Promise.resolve()}
    p.done = prefill
      .generate(
        {
          rid,
          text: o.text,
          max_new_tokens: 1,
          bootstrap_host: o.bootstrap.host,
          bootstrap_port: o.bootstrap.port,
          bootstrap_room: newRoom(),
        },
        {timeoutMs: o.holdLimitMs + o.answerWaitMs + 10_000, signal: stop.signal},
      )
      .then(
        () => {
          p.answeredAt = now()
        },
        () => undefined,
      )
    st.probes.push(p)
  }
}

/**
 * Every probe still held aborted at once (as a watchdog tick releases many pins together); their answers waited for.
 */
async function abortHeld(
  prefill: SglangClient,
  o: LagProbeOptions,
  probes: Probe[],
  notes: string[],
): Promise<Probe[]> {
  const early = probes.filter(p => p.answeredAt !== undefined)
  if (early.length > 0) notes.push(`${early.length} held request(s) were released before their abort (not samples)`)
  const held = probes.filter(p => p.answeredAt === undefined)
  await Promise.all(
    held.map(async p => {
      p.abortAt = now()
      await prefill.abort(p.rid).catch(() => undefined)
    }),
  )
  await within(Promise.all(held.map(p => p.done)), o.answerWaitMs)
  const unanswered = held.filter(p => p.answeredAt === undefined)
  if (unanswered.length > 0)
    notes.push(
      `${unanswered.length} held request(s) not answered within ${Math.round(o.answerWaitMs / 1000)} s of their ` +
        `abort (not samples)`,
    )
  for (const p of probes) p.stop.abort()
  await Promise.all(probes.map(p => p.done))
  return held
}

/** Entry lags as counted, and answer lags with each request's own entry lag taken off where it was measured. */
function summarize(probes: Probe[], held: Probe[], base: number | undefined, notes: string[]): MeasuredLags {
  const answered = held.filter(p => p.answeredAt !== undefined)
  const entries = probes.filter(p => p.entryAt !== undefined).map(p => p.entryAt! - p.sentAt)
  if (base !== undefined && entries.length < probes.length)
    notes.push(`${probes.length - entries.length} held request(s) never counted in /v1/loads before the abort`)
  const entryMeasured = base !== undefined && entries.length > 0
  const answers = answered.map(p => {
    const total = p.answeredAt! - p.abortAt!
    if (!entryMeasured) return total
    // The abort's own way in is like the request's: this request's entry lag (or the median, if it was not seen).
    const entry = p.entryAt === undefined ? quantile(entries, 0.5) : p.entryAt - p.sentAt
    return Math.max(0, total - entry)
  })
  return {
    concurrency: probes.length,
    samples: answers.length,
    ...(entryMeasured
      ? {entry: {p50Ms: quantile(entries, 0.5), maxMs: Math.max(...entries), samples: entries.length}}
      : {}),
    answer: {
      p50Ms: quantile(answers, 0.5),
      maxMs: answers.length > 0 ? Math.max(...answers) : 0,
      includesEntry: !entryMeasured,
    },
    notes,
  }
}
