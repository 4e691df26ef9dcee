import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {
  abortRid,
  firstEvent,
  launchPair,
  nextRoom,
  pdBody,
  post,
  waitFor,
  type Answer,
  type Pair,
} from './launch-pair.js'

/**
 * The twin's own lag options do what they say, measured by its ground truth: with --entry-lag-ms the scheduler takes
 * requests and aborts only at its receives (every N ms), and with --answer-lag-ms a released request's HTTP answer
 * comes N ± J ms after the release the truth records. One pair, a few requests.
 */
const ENTRY_MS = 300
const ANSWER = {ms: 400, jitterMs: 100}
const SLACK_MS = 150 // timers and process scheduling on a busy 2-core box

const t = (e: Record<string, unknown> | undefined): number => Number(e!.t)

describe('twin lag options', () => {
  let pair: Pair
  beforeAll(async () => {
    pair = await launchPair({lags: {entry: {ms: ENTRY_MS, jitterMs: 0}, answer: ANSWER}})
  })
  afterAll(async () => {
    await pair?.stop()
  })

  it(
    'entry lag: requests enter at the receives, together, and /v1/loads counts them after; an abort waits for a ' +
      'receive too; the answer waits out the answer lag',
    async () => {
      const rids = ['lag-a', 'lag-b', 'lag-c']
      const answers: Array<Promise<Answer>> = []
      for (const rid of rids) {
        answers.push(post(pair.prefillUrl, pdBody(pair, rid, nextRoom())))
        await new Promise(r => setTimeout(r, 30))
      }
      const entered = await waitFor(
        'all entered',
        () =>
          rids.every(r => firstEvent(pair, 'prefill', r, 'enter', 'bootstrap')) &&
          rids.map(r => t(firstEvent(pair, 'prefill', r, 'enter', 'bootstrap'))),
      )
      for (const rid of rids) {
        const gap =
          t(firstEvent(pair, 'prefill', rid, 'enter', 'bootstrap')) - t(firstEvent(pair, 'prefill', rid, 'received'))
        expect(gap).toBeGreaterThanOrEqual(0)
        expect(gap).toBeLessThanOrEqual(ENTRY_MS + SLACK_MS)
      }
      // Receives are ENTRY_MS apart: entries share one receive or are (about) a receive apart.
      const sorted = [...entered].sort((a, b) => a - b)
      for (let i = 1; i < sorted.length; i++) {
        const d = sorted[i]! - sorted[i - 1]!
        expect(d < 20 || d > ENTRY_MS - SLACK_MS).toBe(true)
      }
      // The live queue count (what pdchaos's lag probes read) shows them once they entered.
      await waitFor(
        'counted in /v1/loads',
        async () => {
          const j = (await (await fetch(`${pair.prefillUrl}/v1/loads?include=disagg`)).json()) as {
            loads: Array<{disagg: {prefill_bootstrap_queue_reqs: number}}>
          }
          return j.loads[0]!.disagg.prefill_bootstrap_queue_reqs >= rids.length
        },
        2000,
      )

      const abortAt = Date.now()
      expect(await abortRid(pair.prefillUrl, 'lag-a')).toBe(200)
      const res = await answers[0]!
      const abortSeen = t(firstEvent(pair, 'prefill', 'lag-a', 'abort'))
      expect(abortSeen - abortAt).toBeLessThanOrEqual(ENTRY_MS + SLACK_MS)
      const released = t(await waitFor('released', () => firstEvent(pair, 'prefill', 'lag-a', 'bootstrap_failed')))
      expect(res.status).toBe(500)
      expect(res.at - released).toBeGreaterThanOrEqual(ANSWER.ms - ANSWER.jitterMs - 5)
      expect(res.at - released).toBeLessThanOrEqual(ANSWER.ms + ANSWER.jitterMs + SLACK_MS)
      for (const rid of rids.slice(1)) await abortRid(pair.prefillUrl, rid)
      await Promise.all(answers)
    },
  )
})
