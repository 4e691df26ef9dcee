import {LOADS_DECODE_PREALLOC_QUEUE, LOADS_DECODE_TRANSFER_QUEUE} from '../engines/sglang/sglang-metrics.js'
import {type DecodeReleasePath, SGLANG_DECODE_RELEASE_PATHS} from '../engines/sglang/release-texts.js'
import type {Observation, Timeline} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * Decode's half of a pin (SGLang issue 30, item 2): a request whose decode half sits in decode's transfer queue
 * (KVPoll.WaitingForInput after send_metadata) when its prefill dies. Prefill never sends its KV, so only decode can
 * let go of it, by one of three paths (python/sglang/srt/disaggregation/):
 * - the heartbeat: common/conn.py CommonKVManager._start_heartbeat_checker_thread probes prefill's bootstrap /health
 *   every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL s; after SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE misses,
 *   _handle_node_failure records "Lost connection with prefill instance (bootstrap_addr: …)" for every room of that
 *   prefill not yet Success and sets it Failed;
 * - the waiting timeout: CommonKVReceiver._check_waiting_timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s from
 *   send_metadata): "Request R timed out after Xs in KVPoll.WaitingForInput", then ABORT to prefill;
 * - a decode-side watchdog, where the deployment has one (its own log words).
 * Whichever fires, decode.py DecodeTransferQueue.pop_transferred logs "Decode transfer failed for request rank=…
 * with exception …" and answers the same text with HTTP 500 (prepare_abort), in the same scheduler iteration: the
 * 500's arrival is the clock, and its text names the path.
 */

export interface DecodeReleaseExpectation {
  kind: 'decode-release'
  /** What happened to prefill: killed (kill-prefill). */
  cause: string
  /** Decode's heartbeat as discovery read it; absent: the bound is unknown (the verdicts are unverified). */
  heartbeat?: {intervalSeconds: number; maxFailure: number; boundSeconds: number; source: string}
  /** Decode's waiting timeout as discovery read it. */
  waiting?: {seconds: number; source: string}
  /** Allowed past the bound, and why. */
  epsilonSeconds: number
  epsilonWhy: string
  /** Decode halves sent before the kill. */
  pins: number
  /** How long the runner waits for the releases, from the kill. */
  waitSeconds: number
  why: string
}

export type ReleasePath = DecodeReleasePath

/** Which of decode's paths an answer's text names (SGLang's own words, engines/sglang/release-texts.ts). */
export function releasePath(
  text: string | undefined,
  paths: typeof SGLANG_DECODE_RELEASE_PATHS = SGLANG_DECODE_RELEASE_PATHS,
): {path: ReleasePath; words: string} {
  const hit = paths.find(p => p.re.test(text ?? ''))
  return hit ? {path: hit.path, words: hit.words} : {path: 'unknown', words: 'no path named'}
}

type Sent = Extract<Observation, {kind: 'request-sent'}>

const S = (ms: number): string => (ms / 1000).toFixed(2)

/** Decode's prealloc + transfer queue at its last fresh /v1/loads reading before the kill (undefined: none read). */
function heldBeforeKill(tl: Timeline, killedAt: number): {reqs: number; t: number} | undefined {
  const byT = new Map<number, number>()
  for (const o of tl.observations) {
    if (o.kind !== 'metric' || o.service !== 'decode' || o.t > killedAt) continue
    if (o.name !== LOADS_DECODE_PREALLOC_QUEUE && o.name !== LOADS_DECODE_TRANSFER_QUEUE) continue
    byT.set(o.t, (byT.get(o.t) ?? 0) + o.value)
  }
  const last = [...byT].sort((a, b) => a[0] - b[0]).at(-1)
  return last ? {t: last[0], reqs: last[1]} : undefined
}

/**
 * One verdict per decode half: released by a named path within its bound (pass), late or never (fail), or unverified.
 */
export function checkDecodeRelease(tl: Timeline, x: DecodeReleaseExpectation | undefined): Verdict[] {
  const halves = tl.observations.filter((o): o is Sent => o.kind === 'request-sent' && o.path === 'decode-half')
  if (!x)
    return [
      unverified('decode-release', "decode's half", 'no decode-release expectation in the plan', {
        why: 'the plan carried no heartbeat or waiting-timeout settings',
        toVerify: 'plan kill-prefill again',
      }),
    ]
  const killed = tl.observations.find(o => o.kind === 'fault-injected' && o.verified)
  if (!killed) return []
  if (halves.length === 0)
    return [
      unverified('decode-release', "decode's half", 'no decode half was sent before the kill', {
        why: 'the run stopped or could not send',
        toVerify: 'run again',
      }),
    ]
  const held = heldBeforeKill(tl, killed.t)
  return halves.map(h => judgeHalf(tl, x, h, killed.t, held))
}

function judgeHalf(
  tl: Timeline,
  x: DecodeReleaseExpectation,
  h: Sent,
  killedAt: number,
  held: {reqs: number; t: number} | undefined,
): Verdict {
  const answer = tl.observations.find(
    (o): o is Extract<Observation, {kind: 'request-answered'}> => o.kind === 'request-answered' && o.rid === h.rid,
  )
  const cleanup = tl.observations.find(o => o.kind === 'marker' && o.name === 'cleanup-abort' && o.detail === h.rid)
  const hb = x.heartbeat
  const base = {
    clock: "decode's 500 answer (decode.py pop_transferred logs and answers in the same iteration)",
    killedAt,
    sentAt: h.t,
    heartbeat: hb ?? null,
    waiting: x.waiting ?? null,
    epsilonSeconds: x.epsilonSeconds,
    epsilonWhy: x.epsilonWhy,
    heldBeforeKill: held
      ? `decode's prealloc + transfer queue read ${held.reqs} at ${S(killedAt - held.t)} s before the kill (/v1/loads)`
      : 'no fresh /v1/loads reading of decode before the kill: held is inferred from no answer before it',
  }
  if (answer && answer.t < killedAt)
    return unverified('decode-release', h.rid, `decode answered (${answer.status}) before the kill: it held nothing`, {
      ...base,
      why: 'decode let go of its half before prefill died',
      toVerify: 'check that prefill accepts destination info for a room it has no request for (the held half)',
    })
  const released = answer && !(cleanup && cleanup.t <= answer.t) ? answer : undefined
  if (released) return judgeReleased(x, h, released, killedAt, base)
  const boundText = hb
    ? `decode's heartbeat bound ${hb.intervalSeconds} s × ${hb.maxFailure} = ${hb.boundSeconds} s`
    : ''
  // The last moment pdchaos saw the half held: its own client giving up (abandoned) or its cleanup abort.
  const abandoned = tl.observations.find(o => o.kind === 'request-abandoned' && o.rid === h.rid)
  const seen = [abandoned?.t, cleanup?.t].filter((t): t is number => t !== undefined)
  const heldUntil = seen.length > 0 ? Math.min(...seen) : killedAt + x.waitSeconds * 1000
  const waited = S(heldUntil - killedAt)
  const ev = {...base, releasedAt: null, state: 'held in decode (prealloc or transfer queue, WaitingForInput)'}
  if (hb && heldUntil < killedAt + (hb.boundSeconds + x.epsilonSeconds) * 1000)
    return unverified('decode-release', h.rid, `still held ${waited} s after the kill, when pdchaos stopped watching`, {
      ...ev,
      why:
        `pdchaos stopped watching before ${boundText} + ε ${x.epsilonSeconds} s had passed: ` +
        'a release after that is unseen',
      toVerify: 'run again: the half must be watched (its request open) until the bound + ε after the kill',
    })
  if (!hb)
    return unverified('decode-release', h.rid, `still held in decode ${waited} s after the kill; bound unknown`, {
      ...ev,
      why: "decode's heartbeat settings were not read (its environment)",
      toVerify: "let pdchaos read decode's scheduler environment (privilege), or set the variables explicitly",
    })
  return fail(
    'decode-release',
    h.rid,
    `decode still held its half ${waited} s after the kill, past ${boundText} + ε ${x.epsilonSeconds} s: ` +
      `its heartbeat did not release it` +
      `${x.waiting ? ` (the waiting timeout would, after ${x.waiting.seconds} s)` : ''}`,
    ev,
  )
}

function judgeReleased(
  x: DecodeReleaseExpectation,
  h: Sent,
  answer: Extract<Observation, {kind: 'request-answered'}>,
  killedAt: number,
  base: Record<string, unknown>,
): Verdict {
  const hb = x.heartbeat
  const p = releasePath(answer.detail)
  const afterKill = answer.t - killedAt
  const ev = {
    ...base,
    releasedAt: answer.t,
    afterKillSeconds: Number(S(afterKill)),
    status: answer.status,
    path: p.path,
    text: (answer.detail ?? '').slice(0, 400),
  }
  const by = `released ${S(afterKill)} s after the kill (${answer.status}, ${p.words})`
  if (hb) {
    const upper = (hb.boundSeconds + x.epsilonSeconds) * 1000
    const bound = `decode's heartbeat bound ${hb.intervalSeconds} s × ${hb.maxFailure} = ${hb.boundSeconds} s`
    if (afterKill > upper) return fail('decode-release', h.rid, `${by}: past ${bound} + ε ${x.epsilonSeconds} s`, ev)
    if (p.path === 'unknown' || p.path === 'abort' || answer.status < 400)
      return unverified('decode-release', h.rid, `${by}: within ${bound}, but the answer names no release path`, {
        ...ev,
        why: "decode's answer does not carry SGLang's words for the heartbeat, the waiting timeout or a watchdog",
        toVerify: 'read decode\'s log for the rid\'s "Decode transfer failed" line',
      })
    return pass('decode-release', h.rid, `${by}: within ${bound} + ε ${x.epsilonSeconds} s`, ev)
  }
  // No heartbeat bound: only the waiting timeout can be judged, from the half's send (send_metadata follows it).
  const sinceSend = answer.t - h.t
  if (p.path === 'waiting-timeout' && x.waiting && sinceSend <= (x.waiting.seconds + x.epsilonSeconds) * 1000)
    return pass(
      'decode-release',
      h.rid,
      `${by}: within the waiting timeout ${x.waiting.seconds} s + ε of its send (${x.waiting.source})`,
      ev,
    )
  return unverified('decode-release', h.rid, `${by}; decode's heartbeat bound unknown`, {
    ...ev,
    why: "decode's heartbeat settings were not read (its environment)",
    toVerify: "let pdchaos read decode's scheduler environment (privilege), or set the variables explicitly",
  })
}
