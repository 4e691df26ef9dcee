import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'
import {
  launchPair,
  metric,
  nextRoom,
  pdBody,
  post,
  waitFor,
  firstEvent,
  eventsOf,
  internalState,
  pinTransferring,
  abortRid,
  signalRank,
  type Pair,
  type PairOptions,
  type Pin,
} from './launch-pair.js'

function pairFor(opts: PairOptions): {get: () => Pair; pins: Pin[]} {
  let pair: Pair
  const pins: Pin[] = []
  beforeAll(async () => {
    pair = await launchPair({
      prefillTp: 2,
      decodeTp: 2,
      watchdog: {scope: 'off'},
      timing: {forwardMsPerKToken: 500},
      ...opts,
    })
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

const settledFlag = (p: Promise<unknown>) => {
  const s = {done: false}
  void p.then(
    () => {
      s.done = true
    },
    () => {
      s.done = true
    },
  )
  return s
}

describe('abort in Transferring (NIXL after #24522)', () => {
  const ctx = pairFor({})
  it('releases the pin at the next poll as a transfer failure (500, transfer_failed)', async () => {
    const pair = ctx.get()
    const pin = await pinTransferring(pair, 'abort-xfer-1')
    ctx.pins.push(pin)
    const before = await metric(pair.prefillUrl, 'sglang:num_transfer_failed_reqs_total')
    const t0 = Date.now()
    expect(await abortRid(pair.prefillUrl, 'abort-xfer')).toBe(200) // prefix match, as SGLang's scheduler does
    const res = await pin.prefill
    expect(res.status).toBe(500)
    expect(res.at - t0).toBeLessThan(1000)
    expect(await metric(pair.prefillUrl, 'sglang:num_transfer_failed_reqs_total')).toBe(before + 1)
    expect(await metric(pair.prefillUrl, 'sglang:num_aborted_requests_total')).toBeGreaterThanOrEqual(1)
    expect(pair.log('prefill')).toContain(
      `Prefill transfer failed for request rank=0 req.rid='abort-xfer-1' req.bootstrap_room=${pin.room}`,
    )
    expect((await internalState(pair.prefillUrl)).token_usage).toBe(0)
    // The stale gauge: it was written when the batch ran and stays 1 while nothing new is batched.
    expect(await metric(pair.prefillUrl, 'sglang:num_prefill_inflight_queue_reqs')).toBe(1)
  })
})

describe('one-sided KV WRITE (TCP data path)', () => {
  const ctx = pairFor({timeouts: {waitingS: 2}})
  it(
    'a stopped decode rank does not hold prefill: 200 as soon as the bytes are acknowledged; decode holds the ' +
      'request until its waiting timeout',
    async () => {
      const pair = ctx.get()
      const fp = (enabled: boolean) =>
        fetch(`${pair.prefillUrl}/_pdchaos/twin/failpoint`, {
          method: 'POST',
          body: JSON.stringify({name: 'stall-kv', enabled, tpRanks: [0]}),
        })
      // Hold prefill rank 0's WRITE until decode rank 0 (its peer) is stopped, then let it go.
      await fp(true)
      await fetch(`${pair.prefillUrl}/health`) // one loop iteration: the failure point reached the rank
      const rid = 'one-sided-1'
      // 32 KiB per rank: less than a stopped peer's kernel takes (~128 KiB)
      const body = pdBody(pair, rid, nextRoom(), {tokens: 16})
      const prefill = post(pair.prefillUrl, body)
      const decode = post(pair.decodeUrl, body)
      decode.catch(() => undefined)
      await waitFor('prefill Transferring', () =>
        eventsOf(pair, 'prefill', rid).find(e => e.event === 'state' && e.state === 'KVPoll.Transferring'),
      )
      const metadataAt = Number(firstEvent(pair, 'decode', rid, 'enter', 'transfer')!.t)
      const stopped = signalRank(pair, 'decode', 0, 'SIGSTOP')
      ctx.pins.push({rid, room: '', prefill, decode, stoppedPid: stopped})
      const decodeDone = settledFlag(decode)
      await fp(false)
      const p = await prefill
      expect(p.status).toBe(200)
      expect(decodeDone.done).toBe(false)
      // Decode learns only from notifications its stopped rank cannot read: it holds the request past its waiting
      // timeout, and its first poll after SIGCONT times it out (the check comes before the notifications are drained).
      await new Promise(r => setTimeout(r, Math.max(0, metadataAt + 2300 - Date.now())))
      expect(decodeDone.done).toBe(false)
      const resumedAt = Date.now()
      process.kill(stopped, 'SIGCONT')
      const d = await decode
      expect(d.status).toBe(500)
      const held = Number(/timed out after (\d+\.\d)s in KVPoll\.WaitingForInput/.exec(d.body)?.[1])
      expect(held).toBeGreaterThanOrEqual(2)
      expect(pair.log('decode')).toMatch(
        new RegExp(
          `Decode transfer failed for request rank=\\d+ decode_req\\.req\\.rid='${rid}' ` +
            `decode_req\\.req\\.bootstrap_room=(\\d+) with exception KVTransferError\\(bootstrap_room=\\1\\): ` +
            `Request \\1 timed out after \\d+\\.\\ds in KVPoll\\.WaitingForInput`,
        ),
      )
      expect(Number(firstEvent(pair, 'prefill', rid, 'completed')!.t)).toBeLessThan(resumedAt)
      // decode's late ABORT finds the room gone
      expect(firstEvent(pair, 'prefill', rid, 'transfer_failed')).toBeUndefined()
    },
  )
})

describe('defect abort-race', () => {
  const ctx = pairFor({bugs: ['abort-race']})
  it('loses an abort of a Transferring request: the pin stays until the transfer moves again', async () => {
    const pair = ctx.get()
    const pin = await pinTransferring(pair, 'race-1')
    ctx.pins.push(pin)
    const before = await metric(pair.prefillUrl, 'sglang:num_transfer_failed_reqs_total')
    const settled = settledFlag(pin.prefill)
    expect(await abortRid(pair.prefillUrl, 'race-1')).toBe(200)
    await new Promise(r => setTimeout(r, 1500))
    expect(settled.done).toBe(false)
    expect((await internalState(pair.prefillUrl)).inflight).toBe(1)
    expect(await metric(pair.prefillUrl, 'sglang:num_transfer_failed_reqs_total')).toBe(before)
    process.kill(pin.stoppedPid, 'SIGCONT')
    expect((await pin.prefill).status).toBe(200)
  })
})

describe('decode waiting timeout and ABORT', () => {
  const ctx = pairFor({timeouts: {waitingS: 1.5}})
  it('times out 1.5 s after send_metadata, answers 500 and sends ABORT, which fails the prefill request', async () => {
    const pair = ctx.get()
    const rid = 'wait-to-1'
    const body = pdBody(pair, rid, nextRoom(), {tokens: 6000}) // a 3 s forward: the transfer cannot finish in time
    const [p, d] = await Promise.all([post(pair.prefillUrl, body), post(pair.decodeUrl, body)])
    expect(d.status).toBe(500)
    const sent = Number(firstEvent(pair, 'decode', rid, 'enter', 'transfer')!.t)
    const failed = Number(firstEvent(pair, 'decode', rid, 'transfer_failed')!.t)
    expect(failed - sent).toBeGreaterThanOrEqual(1500)
    // SGLang's words on both sides (decode.py pop_transferred; nixl/conn.py's ABORT handler): the rid in both lines.
    expect(pair.log('decode')).toMatch(
      new RegExp(
        `Decode transfer failed for request rank=\\d+ decode_req\\.req\\.rid='${rid}' ` +
          `decode_req\\.req\\.bootstrap_room=(\\d+) with exception KVTransferError\\(bootstrap_room=\\1\\): ` +
          `Request \\1 timed out after 1\\.\\ds in KVPoll\\.WaitingForInput`,
      ),
    )
    expect(p.status).toBe(500)
    expect(pair.log('prefill')).toMatch(
      new RegExp(
        `Prefill transfer failed for request rank=\\d+ req\\.rid='${rid}' req\\.bootstrap_room=(\\d+) with ` +
          `exception KVTransferError\\(bootstrap_room=\\1\\): Request \\1 was aborted by decode\\.`,
      ),
    )
    expect(p.body).toMatch(/was aborted by decode\./)
    expect(firstEvent(pair, 'prefill', rid, 'transfer_failed')).toBeDefined()
  })

  it('a decode-side abort also sends ABORT to prefill', async () => {
    const pair = ctx.get()
    const rid = 'dec-abort-1'
    const body = pdBody(pair, rid, nextRoom(), {tokens: 4000})
    const p = post(pair.prefillUrl, body)
    const d = post(pair.decodeUrl, body)
    await waitFor('decode transfer queue', () => firstEvent(pair, 'decode', rid, 'enter', 'transfer'))
    expect(await abortRid(pair.decodeUrl, rid)).toBe(200)
    expect((await d).status).toBe(500)
    expect((await p).status).toBe(500)
    expect(firstEvent(pair, 'prefill', rid, 'completed')).toBeUndefined()
  })
})

describe('decode heartbeat and NIXL without a prefill bootstrap timeout', () => {
  const ctx = pairFor({timeouts: {heartbeatIntervalS: 2, heartbeatMaxFailure: 1, bootstrapS: 1}})

  it('NIXL: a request with no destination info is never timed out by prefill', async () => {
    const pair = ctx.get()
    const answer = post(pair.prefillUrl, pdBody(pair, 'nixl-boot-1', nextRoom()))
    const settled = settledFlag(answer)
    await new Promise(r => setTimeout(r, 2000))
    expect(settled.done).toBe(false)
    expect(await metric(pair.prefillUrl, 'sglang:num_bootstrap_failed_reqs_total')).toBe(0)
    await abortRid(pair.prefillUrl, 'nixl-boot-1')
    expect((await answer).status).toBe(500)
  })

  it('marks the rooms of a prefill that went away Failed after the heartbeat misses', async () => {
    const pair = ctx.get()
    // Decode alone: it resolves /route, sends its destination info and waits in the transfer queue.
    const d = post(pair.decodeUrl, pdBody(pair, 'hb-1', nextRoom()))
    await waitFor('decode transfer queue', () => firstEvent(pair, 'decode', 'hb-1', 'enter', 'transfer'))
    const t0 = Date.now()
    await pair.stopRole('prefill')
    const res = await d
    expect(res.status).toBe(500)
    // The 500 carries the reason _handle_node_failure records (common/conn.py): kill-prefill's check reads the path.
    expect(res.body).toMatch(/Decode transfer failed .*Lost connection with prefill instance \(bootstrap_addr: /)
    expect(res.at - t0).toBeLessThan(2000 + 667 + 1500)
    expect(pair.log('decode')).toMatch(
      /Lost connection with prefill instance \(bootstrap_addr: 127\.0\.0\.1:\d+\).*1 requests affected/,
    )
    await pair.start('prefill')
  })
})

describe('mooncake prefill bootstrap timeout', () => {
  const ctx = pairFor({backend: 'mooncake', timeouts: {bootstrapS: 1.5}})
  it('fails a request stuck in Bootstrapping after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT', async () => {
    const pair = ctx.get()
    const res = await post(pair.prefillUrl, pdBody(pair, 'mc-boot-1', nextRoom()))
    expect(res.status).toBe(500)
    expect(res.body).toContain('Prefill bootstrap failed')
    expect(await metric(pair.prefillUrl, 'sglang:num_bootstrap_failed_reqs_total')).toBe(1)
    expect(pair.log('prefill')).toMatch(/timed out after 1\.\ds in KVPoll\.Bootstrapping/)
    const entered = Number(firstEvent(pair, 'prefill', 'mc-boot-1', 'enter', 'bootstrap')!.t)
    expect(Number(firstEvent(pair, 'prefill', 'mc-boot-1', 'bootstrap_failed')!.t) - entered).toBeGreaterThanOrEqual(
      1500,
    )
  })
})

describe('prefill restart behind the same address', () => {
  describe('with the fix (PR #36029): a changed instance id is a node failure at once', () => {
    const ctx = pairFor({timeouts: {heartbeatIntervalS: 2, heartbeatMaxFailure: 3}, timing: {forwardMsPerKToken: 5}})
    it('refreshes the cached ports and serves again', async () => {
      const pair = ctx.get()
      const b1 = pdBody(pair, 'fix-1', nextRoom())
      expect((await Promise.all([post(pair.prefillUrl, b1), post(pair.decodeUrl, b1)])).map(a => a.status)).toEqual([
        200, 200,
      ])
      await pair.stopRole('prefill')
      await pair.start('prefill')
      await waitFor(
        'instance change noticed',
        () => /prefill bootstrap instance changed/.test(pair.log('decode')),
        8000,
      )
      const b2 = pdBody(pair, 'fix-2', nextRoom())
      expect((await Promise.all([post(pair.prefillUrl, b2), post(pair.decodeUrl, b2)])).map(a => a.status)).toEqual([
        200, 200,
      ])
    })
  })

  describe('defect stale-prefill-ports', () => {
    const ctx = pairFor({
      bugs: ['stale-prefill-ports'],
      timeouts: {heartbeatIntervalS: 5, heartbeatMaxFailure: 2},
      timing: {forwardMsPerKToken: 5},
    })
    it('keeps pushing destination info to the dead ports: the new request pins in Bootstrapping', async () => {
      const pair = ctx.get()
      const b1 = pdBody(pair, 'stale-1', nextRoom())
      expect((await Promise.all([post(pair.prefillUrl, b1), post(pair.decodeUrl, b1)])).map(a => a.status)).toEqual([
        200, 200,
      ])
      const oldPorts = pair.service('prefill').rankPorts.map(r => r.zmqPort)
      await pair.stopRole('prefill')
      await pair.start('prefill')
      expect(pair.service('prefill').rankPorts.map(r => r.zmqPort)).not.toEqual(oldPorts)
      const b2 = pdBody(pair, 'stale-2', nextRoom())
      const p = post(pair.prefillUrl, b2)
      const d = post(pair.decodeUrl, b2)
      const settled = settledFlag(Promise.race([p, d]))
      await waitFor('decode sent its destination info', () =>
        firstEvent(pair, 'decode', 'stale-2', 'enter', 'transfer'),
      )
      await new Promise(r => setTimeout(r, 1500))
      expect(settled.done).toBe(false)
      expect(firstEvent(pair, 'prefill', 'stale-2', 'exit', 'bootstrap')).toBeUndefined()
      await abortRid(pair.prefillUrl, 'stale-2')
      await abortRid(pair.decodeUrl, 'stale-2')
      expect((await p).status).toBe(500)
      expect((await d).status).toBe(500)
    })
  })
})
