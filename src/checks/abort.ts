import {epsilonFor} from './epsilon.js'
import {round, secs} from './eviction.js'
import {releaseCauseOf} from './release-cause.js'
import {answerOf, type Observation, type Timeline} from '../model/timeline.js'
import {fail, pass, type Verdict} from '../model/verdict.js'

/**
 * Aborts fired inside the transfer window: an honoured abort releases the request within one poll (+ ε) of the
 * abort, and passes. A lost abort (the race) fails the abort check however the request ends: when the watchdog then
 * evicts it inside its window, that is the watchdog's pass (an eviction verdict of its own), not the abort's.
 */
export function checkAborts(tl: Timeline): Verdict[] {
  const verdicts: Verdict[] = []
  const aborts = tl.observations.filter((o): o is Extract<Observation, {kind: 'abort-sent'}> => o.kind === 'abort-sent')
  const byRid = new Map<string, number>()
  for (const a of aborts) byRid.set(a.rid, Math.min(byRid.get(a.rid) ?? Number.POSITIVE_INFINITY, a.t))
  const pollMs = tl.contract.pollSeconds * 1000
  const deadlineMs = tl.contract.deadlineSeconds * 1000
  const end = Math.max(...tl.observations.map((o) => o.t))

  for (const [rid, abortAt] of byRid) {
    const sent = tl.observations.find((o) => o.kind === 'request-sent' && o.rid === rid)
    if (!sent) continue
    const answer = answerOf(tl, rid)
    const eps = epsilonFor(tl, 'inflight', {sentAt: sent.t, answeredAt: answer?.t})
    const honourBy = abortAt + pollMs + eps.highMs
    const windowHigh = sent.t + eps.entryOffsetMs + deadlineMs + pollMs + eps.highMs
    const evidence = {
      clock: 'the request\'s own answer', abortOffsetMs: round(abortAt - sent.t), epsilonMs: round(eps.highMs), epsilonWhy: eps.why,
      status: answer?.status, detail: answer?.detail,
    }
    if (answer && answer.status >= 200 && answer.status < 300) {
      const before = answer.t <= abortAt
      verdicts.push(pass('abort', rid, before
        ? `completed before the abort (${secs(answer.t - sent.t)}): the abort missed the transfer window`
        : `completed with ${answer.status} ${secs(answer.t - abortAt)} after the abort: the transfer won the race`, evidence))
      continue
    }
    if (answer && answer.t <= honourBy) {
      verdicts.push(pass('abort', rid, `abort honoured: released ${secs(answer.t - abortAt)} after the abort (bound one poll + ε = ${secs(pollMs + eps.highMs)})`, {...evidence, outcome: 'honoured'}))
      continue
    }
    if (answer && answer.t <= windowHigh) {
      const low = sent.t + eps.entryOffsetMs + deadlineMs - eps.lowMs
      if (answer.t >= low) {
        const released = releaseCauseOf(answer.detail)
        const by = released.cause === 'watchdog' ? 'the watchdog' : 'something other than the abort'
        verdicts.push(fail('abort', rid, `abort lost; released by ${by} after ${secs(answer.t - sent.t)} (${secs(answer.t - abortAt)} after the abort, past one poll + ε = ${secs(pollMs + eps.highMs)})`, {
          ...evidence, outcome: 'lost-then-evicted', releasedBy: released.cause, releaseEvidence: released.evidence,
        }))
        verdicts.push(pass('eviction', rid, `evicted after ${secs(answer.t - sent.t)}, inside [${secs(low - sent.t)}, ${secs(windowHigh - sent.t)}], after its abort was lost`, {...evidence, releasedBy: released.cause}))
      } else {
        verdicts.push(fail('abort', rid, `released ${secs(answer.t - abortAt)} after the abort: later than one poll, earlier than the watchdog deadline — neither an honoured abort nor an eviction`, {...evidence, outcome: 'unexplained'}))
      }
      continue
    }
    const heldFor = (answer?.t ?? end) - sent.t
    verdicts.push(fail('abort', rid, answer
      ? `abort lost and the pin was released only after ${secs(heldFor)}, past deadline + poll + ε (${secs(windowHigh - sent.t)})`
      : `abort lost and the pin is still held after ${secs(heldFor)}: nothing released it`, {...evidence, outcome: answer ? 'late' : 'pinned', heldSeconds: round(heldFor / 1000, 3)}))
  }
  return verdicts
}
