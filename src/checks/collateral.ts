import {round} from './eviction.js'
import {answerOf, faultWindows, requestsOf, type Timeline} from '../model/timeline.js'
import {fail, pass, type Verdict} from '../model/verdict.js'

/**
 * The light steady load that runs beside every experiment: requests outside the fault's reach must all succeed.
 * A request is within reach when it was in flight at any moment of a fault window (every PD request spans all TP
 * ranks, so a fault on one rank reaches every request in flight across it); those are reported, not judged here.
 * While the gateway's circuit breaker stays open after a fault (markers router-breaker-open/closed), the fault still
 * reaches every request through the router: those are in reach too.
 */
export function checkCollateral(tl: Timeline): Verdict {
  const end = Math.max(...tl.observations.map(o => o.t))
  const windows: Array<{from: number; to?: number}> = [...faultWindows(tl), ...breakerWindows(tl, end)]
  const lost: Array<{rid: string; status?: number; detail?: string; sentAt: number}> = []
  const inReach: string[] = []
  let ok = 0
  for (const sent of requestsOf(tl, 'load')) {
    const answer = answerOf(tl, sent.rid)
    const doneAt = answer?.t ?? end
    const overlaps = windows.some(w => sent.t <= (w.to ?? end) && doneAt >= w.from)
    if (overlaps) {
      inReach.push(sent.rid)
      continue
    }
    if (answer && answer.status >= 200 && answer.status < 300) ok++
    else lost.push({rid: sent.rid, status: answer?.status, detail: answer?.detail, sentAt: round(sent.t)})
  }
  const evidence = {
    judged: ok + lost.length,
    succeeded: ok,
    lost,
    inFaultReach: inReach.length,
    inFaultReachRids: inReach.slice(0, 50),
  }
  if (lost.length > 0) {
    return fail(
      'collateral',
      'steady load',
      `${lost.length} of ${ok + lost.length} requests outside the fault's reach failed: ${lost
        .slice(0, 5)
        .map(l => `${l.rid} (${l.status ?? 'no answer'})`)
        .join(', ')}${lost.length > 5 ? ', …' : ''}`,
      evidence,
    )
  }
  return pass(
    'collateral',
    'steady load',
    `${ok} of ${ok} requests outside the fault's reach succeeded (${inReach.length} in reach, not judged)`,
    evidence,
  )
}

/**
 * While the gateway's breaker was found open: the first window from the fault's revert (the breaker opened during the
 * fault) until it closed, each later one (it opened after the wait, marked when the canaries met it) from the last
 * request that saw it closed; each until it closed again (or the end).
 */
export function breakerWindows(tl: Timeline, end: number): Array<{from: number; to: number}> {
  const markers = tl.observations.filter(
    o => o.kind === 'marker' && (o.name === 'router-breaker-open' || o.name === 'router-breaker-closed'),
  )
  const reverted = faultWindows(tl)
    .map(w => w.to)
    .filter((t): t is number => t !== undefined)
  const out: Array<{from: number; to: number}> = []
  let prevClose: number | undefined
  markers.forEach((o, i) => {
    if (o.kind !== 'marker' || o.name !== 'router-breaker-open') return
    const next = markers[i + 1]
    const to = next && next.kind === 'marker' && next.name === 'router-breaker-closed' ? next.t : end
    out.push({from: Math.min(o.t, ...(prevClose === undefined ? reverted : [prevClose])), to})
    prevClose = to
  })
  return out
}
