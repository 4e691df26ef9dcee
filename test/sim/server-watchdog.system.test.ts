import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {
  launchPair,
  metric,
  nextRoom,
  pdBody,
  post,
  waitFor,
  firstEvent,
  internalState,
  pinTransferring,
  type Pair,
  type PairOptions,
  type Pin,
} from './launch-pair.js'

/**
 * The watchdog under test and its defects, measured by the ground truth: deadline <= held <= deadline + poll,
 * held counted from bootstrap-queue entry (scope all) or inflight-queue entry (scope inflight).
 */
const DEADLINE = 1.5
const POLL = 0.5
const EPS_MS = 150 // one loop iteration plus process scheduling on a busy 2-core box

function pairFor(opts: PairOptions): {get: () => Pair; pins: Pin[]} {
  let pair: Pair
  const pins: Pin[] = []
  beforeAll(async () => {
    pair = await launchPair({prefillTp: 2, decodeTp: 2, timing: {forwardMsPerKToken: 500}, ...opts})
  })
  afterEach(async () => {
    for (const pin of pins.splice(0)) {
      try {
        process.kill(pin.stoppedPid, 'SIGCONT')
      } catch {
        /* gone */
      }
    }
  })
  afterAll(async () => {
    await pair?.stop()
  })
  return {get: () => pair, pins}
}

/** A request pinned in the bootstrap queue: prefill alone, decode never sends destination info. */
async function pinBootstrapping(pair: Pair, rid: string) {
  const answer = post(pair.prefillUrl, pdBody(pair, rid, nextRoom()))
  const entered = await waitFor('bootstrap entry', () => firstEvent(pair, 'prefill', rid, 'enter', 'bootstrap'))
  return {answer, enteredAt: Number(entered.t)}
}

describe('watchdog scope all', () => {
  const ctx = pairFor({watchdog: {scope: 'all', deadlineS: DEADLINE, pollS: POLL}})

  it('evicts a request pinned in Bootstrapping inside [deadline, deadline + poll]', async () => {
    const pair = ctx.get()
    const before = await metric(pair.prefillUrl, 'sglang:num_watchdog_evicted_reqs_total')
    const {answer, enteredAt} = await pinBootstrapping(pair, 'wd-all-boot')
    const res = await answer
    const ev = firstEvent(pair, 'prefill', 'wd-all-boot', 'evicted')!
    const held = Number(ev.t) - enteredAt
    expect(held).toBeGreaterThanOrEqual(DEADLINE * 1000)
    expect(held).toBeLessThanOrEqual((DEADLINE + POLL) * 1000 + EPS_MS)
    expect(ev).toMatchObject({queue: 'bootstrap', state: 'KVPoll.Bootstrapping'})
    expect(res.status).toBe(500)
    expect(res.body).toContain('watchdog')
    expect(await metric(pair.prefillUrl, 'sglang:num_watchdog_evicted_reqs_total')).toBe(before + 1)
    expect(pair.log('prefill')).toMatch(
      /watchdog evicted request rid='wd-all-boot' bootstrap_room=\d+ queue=bootstrap state=KVPoll.Bootstrapping held=/,
    )
  })

  it('counts a Transferring pin from its bootstrap-queue entry', async () => {
    const pair = ctx.get()
    const pin = await pinTransferring(pair, 'wd-all-xfer')
    ctx.pins.push(pin)
    const res = await pin.prefill
    const entered = Number(firstEvent(pair, 'prefill', pin.rid, 'enter', 'bootstrap')!.t)
    const ev = firstEvent(pair, 'prefill', pin.rid, 'evicted')!
    expect(ev).toMatchObject({queue: 'inflight', state: 'KVPoll.Transferring'})
    expect(Number(ev.t) - entered).toBeGreaterThanOrEqual(DEADLINE * 1000)
    // + the 1 s forward that blocks the loop
    expect(Number(ev.t) - entered).toBeLessThanOrEqual((DEADLINE + POLL) * 1000 + EPS_MS + 1000)
    expect(res.status).toBe(500)
    await waitFor('KV tokens freed', async () => (await internalState(pair.prefillUrl)).token_usage === 0)
  })
})

describe('watchdog scope inflight', () => {
  const ctx = pairFor({watchdog: {scope: 'inflight', deadlineS: DEADLINE, pollS: POLL}})

  it(
    'evicts a Transferring pin inside [deadline, deadline + poll] of its inflight entry and frees ' + 'its KV',
    async () => {
      const pair = ctx.get()
      const pin = await pinTransferring(pair, 'wd-infl-xfer')
      ctx.pins.push(pin)
      const res = await pin.prefill
      const entered = Number(firstEvent(pair, 'prefill', pin.rid, 'enter', 'inflight')!.t)
      const ev = firstEvent(pair, 'prefill', pin.rid, 'evicted')!
      expect(Number(ev.t) - entered).toBeGreaterThanOrEqual(DEADLINE * 1000)
      expect(Number(ev.t) - entered).toBeLessThanOrEqual((DEADLINE + POLL) * 1000 + EPS_MS)
      expect(res.status).toBe(500)
      expect((await internalState(pair.prefillUrl)).token_usage).toBe(0)
    },
  )

  it('leaves a Bootstrapping pin alone (not watched)', async () => {
    const pair = ctx.get()
    const {answer} = await pinBootstrapping(pair, 'wd-infl-boot')
    let settled = false
    void answer.then(
      () => {
        settled = true
      },
      () => {
        settled = true
      },
    )
    await new Promise(r => setTimeout(r, (DEADLINE + 2 * POLL) * 1000 + 500))
    expect(settled).toBe(false)
    expect(firstEvent(pair, 'prefill', 'wd-infl-boot', 'evicted')).toBeUndefined()
    await fetch(`${pair.prefillUrl}/abort_request`, {method: 'POST', body: JSON.stringify({rid: 'wd-infl-boot'})})
    expect((await answer).status).toBe(500)
  })
})

describe('defect early-evict', () => {
  const ctx = pairFor({watchdog: {scope: 'all', deadlineS: DEADLINE, pollS: POLL}, bugs: ['early-evict']})
  it('evicts before the deadline (a false timeout)', async () => {
    const pair = ctx.get()
    const {answer, enteredAt} = await pinBootstrapping(pair, 'early-1')
    expect((await answer).status).toBe(500)
    const held = Number(firstEvent(pair, 'prefill', 'early-1', 'evicted')!.t) - enteredAt
    expect(held).toBeGreaterThanOrEqual((DEADLINE / 2) * 1000)
    expect(held).toBeLessThan(DEADLINE * 1000)
  })
})

describe('defect late-evict', () => {
  const ctx = pairFor({watchdog: {scope: 'all', deadlineS: DEADLINE, pollS: POLL}, bugs: ['late-evict']})
  it('evicts two polls after it should (past deadline + poll)', async () => {
    const pair = ctx.get()
    const {answer, enteredAt} = await pinBootstrapping(pair, 'late-1')
    expect((await answer).status).toBe(500)
    const held = Number(firstEvent(pair, 'prefill', 'late-1', 'evicted')!.t) - enteredAt
    expect(held).toBeGreaterThan((DEADLINE + POLL) * 1000 + EPS_MS)
    expect(held).toBeGreaterThanOrEqual((DEADLINE + 2 * POLL) * 1000)
  })
})

describe('defect leak-on-evict', () => {
  const ctx = pairFor({watchdog: {scope: 'inflight', deadlineS: DEADLINE, pollS: POLL}, bugs: ['leak-on-evict']})
  it('evicts but never frees the KV tokens of the evicted request', async () => {
    const pair = ctx.get()
    const pin = await pinTransferring(pair, 'leak-1')
    ctx.pins.push(pin)
    expect((await pin.prefill).status).toBe(500)
    expect(firstEvent(pair, 'prefill', 'leak-1', 'evicted')).toBeDefined()
    await new Promise(r => setTimeout(r, 300))
    expect(Number((await internalState(pair.prefillUrl)).token_usage)).toBeGreaterThan(0)
  })
})
