import * as dgram from 'node:dgram'
import * as net from 'node:net'
import {describe, expect, it} from 'vitest'
import {
  parseUcxTime,
  qpFabricTime,
  railOfGpu,
  railPlan,
  rcGiveUpS,
  ucxRcSettings,
} from '../../src/sim/server/rail-plan.js'
import {parseRailHeader, RailNicEngine, RailPkt, railHeader} from '../../src/sim/server/rail-nic.js'
import {procTcpEndpoint, txQueue} from '../../src/sim/server/tcp-acked.js'
import {normalizeRoom, parseRoomJson, randomRoom, stringifyRoomJson} from '../../src/sim/server/json-room.js'
import {evictionThresholdS, shouldEvict} from '../../src/sim/server/watchdog.js'
import {nextStatus, KVPoll} from '../../src/sim/server/kvpoll.js'
import {BootstrapServer} from '../../src/sim/server/bootstrap-server.js'
import {
  FrameReader,
  FrameType,
  kvFrames,
  CHUNK_BYTES,
  ReceiptReader,
  receipt,
} from '../../src/sim/server/data-frames.js'
import type {SimConfig} from '../../src/sim/sim-config.js'
import {freePort} from './launch-pair.js'

describe('json-room', () => {
  it('keeps 63/64-bit rooms exact through parse and stringify, and leaves look-alikes in strings alone', () => {
    const text =
      '{"text":"a \\"bootstrap_room\\": 7","bootstrap_room": 9223372036854775807,"batch":{"bootstrap_room":[1, ' +
      '18446744073709551615]},"bootstrap_port":null}'
    const o = parseRoomJson(text) as Record<string, unknown>
    expect(o.bootstrap_room).toBe('9223372036854775807')
    expect(o.text).toBe('a "bootstrap_room": 7')
    expect((o.batch as Record<string, unknown>).bootstrap_room).toEqual(['1', '18446744073709551615'])
    expect(stringifyRoomJson(o)).toBe(
      '{"text":"a \\"bootstrap_room\\": ' +
        '7","bootstrap_room":9223372036854775807,"batch":{"bootstrap_room":[1,18446744073709551615]},"bootstrap_port":null}',
    )
    expect(stringifyRoomJson({bootstrap_room: 5n, text: '\u0000room'})).toBe(
      '{"bootstrap_room":5,"text":"\\u0000room"}',
    )
  })

  it('normalizes and validates rooms', () => {
    expect(normalizeRoom('007')).toBe('7')
    expect(normalizeRoom(null)).toBeUndefined()
    expect(() => normalizeRoom('abc')).toThrow(/integer/)
    expect(() => normalizeRoom(1.5)).toThrow()
    expect(() => normalizeRoom('-1')).toThrow(/range/)
    for (let i = 0; i < 50; i++) expect(BigInt(randomRoom()) <= (1n << 63n) - 1n).toBe(true)
  })
})

describe('watchdog thresholds and KVPoll rules', () => {
  const base = {scope: 'all' as const, deadlineS: 10, pollS: 1, bugs: [] as const}
  it('evicts at the deadline, half of it (early-evict) or two polls late (late-evict)', () => {
    expect(evictionThresholdS(base)).toBe(10)
    expect(evictionThresholdS({...base, bugs: ['early-evict']})).toBe(5)
    expect(evictionThresholdS({...base, bugs: ['late-evict']})).toBe(12)
  })
  it('a watchdog made late (sim up --watchdog-late-ms) evicts that much past its deadline, still at a tick', () => {
    expect(evictionThresholdS({...base, lateMs: 300})).toBeCloseTo(10.3)
    const h = {queue: 'bootstrap' as const, bootstrapAt: 0}
    expect(shouldEvict({...base, lateMs: 300}, h, 10_200)).toBe(false)
    expect(shouldEvict({...base, lateMs: 300}, h, 10_300)).toBe(true)
  })
  it('counts from the watched queue entry', () => {
    const h = {queue: 'inflight' as const, bootstrapAt: 0, inflightAt: 5000}
    expect(shouldEvict(base, h, 10_000)).toBe(true)
    expect(shouldEvict({...base, scope: 'inflight'}, h, 10_000)).toBe(false)
    expect(shouldEvict({...base, scope: 'inflight'}, h, 15_000)).toBe(true)
    expect(shouldEvict({...base, scope: 'inflight'}, {queue: 'bootstrap', bootstrapAt: 0}, 1e9)).toBe(false)
    expect(shouldEvict({...base, scope: 'off'}, h, 1e9)).toBe(false)
  })
  it('keeps Failed sticky and states moving forward (NIXL update_status)', () => {
    expect(nextStatus(KVPoll.Failed, KVPoll.Success)).toBe(KVPoll.Failed)
    expect(nextStatus(KVPoll.Transferring, KVPoll.WaitingForInput)).toBe(KVPoll.Transferring)
    expect(nextStatus(undefined, KVPoll.Bootstrapping)).toBe(KVPoll.Bootstrapping)
  })
})

describe('data-plane framing', () => {
  it('reads frames split at any byte boundary', () => {
    const frames = [...kvFrames(2n ** 63n - 1n, 3, CHUNK_BYTES + 10)]
    const wire = Buffer.concat(frames)
    const seen: string[] = []
    const reader = new FrameReader(h =>
      seen.push(`${h.type}:${h.room}:${h.prefillRank}:${h.chunk}:${h.isLast}:${h.length}`),
    )
    for (let off = 0; off < wire.length; off += 7777) reader.push(wire.subarray(off, off + 7777))
    expect(seen).toEqual([
      `${FrameType.kv}:9223372036854775807:3:0:false:${CHUNK_BYTES}`,
      `${FrameType.kv}:9223372036854775807:3:1:true:10`,
      `${FrameType.aux}:9223372036854775807:3:0:true:64`,
    ])
  })

  it("reads decode's receipts split at any byte boundary, keeping the latest count", () => {
    const wire = Buffer.concat([receipt(20), receipt(262_164), receipt(2 ** 40 + 5)])
    const r = new ReceiptReader()
    const seen: number[] = []
    for (let off = 0; off < wire.length; off += 5) {
      r.push(wire.subarray(off, off + 5))
      seen.push(r.latest)
    }
    // 5-byte slices: a count is known only once its 8 bytes are in.
    expect(seen).toEqual([0, 20, 20, 262_164, 2 ** 40 + 5])
  })
})

describe('bootstrap server', () => {
  it('answers 503 until every prefill rank registered, then PrefillServerInfo and rank endpoints', async () => {
    const port = await freePort()
    const cfg = {host: '127.0.0.1', prefillTp: 2, ports: {bootstrap: port, prefill: 1}} as unknown as SimConfig
    const quiet = {info: () => undefined, warn: () => undefined, error: () => undefined}
    const server = new BootstrapServer(cfg, quiet)
    await server.listen()
    try {
      const url = `http://127.0.0.1:${port}`
      const all = `${url}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`
      const put = (k: number) =>
        fetch(`${url}/route`, {
          method: 'PUT',
          body: JSON.stringify({
            attn_tp_rank: k,
            rank_ip: '127.0.0.1',
            rank_port: 5000 + k,
            page_size: 1,
            kv_cache_dtype: 'auto',
          }),
        })
      expect((await fetch(all)).status).toBe(503)
      expect((await put(0)).status).toBe(200)
      expect((await fetch(all)).status).toBe(503)
      expect((await put(1)).status).toBe(200)
      const info = (await (await fetch(all)).json()) as Record<string, unknown>
      expect(info).toMatchObject({attn_tp_size: 2, bootstrap_instance_id: server.instanceId})
      expect(
        await (
          await fetch(`${url}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0`)
        ).json(),
      ).toEqual({rank_ip: '127.0.0.1', rank_port: 5001})
      expect(await (await fetch(`${url}/health`)).text()).toBe('OK')
    } finally {
      server.close()
    }
  })
})

describe('rail plan and UCX RC settings (as UCX reads them)', () => {
  it('gives GPU g the NIC rail<g> at 198.18.<g>.1/24 with stable MACs', () => {
    const plan = railPlan(8)
    expect(plan.nics).toHaveLength(8)
    expect(plan.nics[3]).toEqual({
      gpu: 3,
      name: 'rail3',
      addr: '198.18.3.1',
      prefixLen: 24,
      mac: '02:00:c6:12:03:01',
      peer: 'rsw3',
      peerMac: '02:00:c6:12:03:02',
    })
    expect(railOfGpu(plan, 7)?.name).toBe('rail7')
    expect(railOfGpu(undefined, 0)).toBeUndefined()
  })

  it('parses UCX time values as ucs_config_sscanf_time does', () => {
    expect(parseUcxTime('1.0s')).toBe(1)
    expect(parseUcxTime('300ms')).toBeCloseTo(0.3)
    expect(parseUcxTime('250us')).toBeCloseTo(0.00025)
    expect(parseUcxTime('0.5')).toBe(0.5)
    expect(parseUcxTime('2m')).toBe(120) // minutes
    expect(parseUcxTime('1h')).toBeUndefined()
    expect(parseUcxTime('fast')).toBeUndefined()
  })

  it('rounds the timeout to the QP local ACK timeout, 4.096 us x 2^n (uct_ib_to_qp_fabric_time)', () => {
    expect(qpFabricTime(1)).toEqual({exponent: 18, seconds: 4.096e-6 * 2 ** 18}) // 1.07 s
    expect(qpFabricTime(0.3).exponent).toBe(16) // 268 ms
    expect(qpFabricTime(1e-9).exponent).toBe(1)
    expect(qpFabricTime(1e6)).toEqual({exponent: 0, seconds: Infinity}) // too large: no timeout at all
  })

  it("reads UCX_RC_TIMEOUT / RETRY_COUNT, overridden by the transport's own prefix; caps the retry count at 7", () => {
    expect(ucxRcSettings({})).toMatchObject({
      transport: 'rc_mlx5',
      timeoutText: '1.0s',
      timeoutFrom: 'default',
      retryCount: 7,
      retryCountFrom: 'default',
      warnings: [],
    })
    const a = ucxRcSettings({UCX_RC_TIMEOUT: '300ms', UCX_RC_RETRY_COUNT: '2'})
    expect(a).toMatchObject({timeoutFrom: 'UCX_RC_TIMEOUT', timeoutS: 0.3, qpTimeoutExponent: 16, retryCount: 2})
    expect(rcGiveUpS(a)).toBeCloseTo(3 * 4.096e-6 * 2 ** 16)
    expect(ucxRcSettings({UCX_RC_TIMEOUT: '300ms', UCX_RC_MLX5_TIMEOUT: '2s'})).toMatchObject({
      timeoutFrom: 'UCX_RC_MLX5_TIMEOUT',
      timeoutS: 2,
    })
    // rc_verbs only when UCX_TLS allows nothing but the verbs flavour
    const v = ucxRcSettings({UCX_TLS: 'rc_v,cuda_copy', UCX_RC_MLX5_TIMEOUT: '2s', UCX_RC_VERBS_TIMEOUT: '50ms'})
    expect(v).toMatchObject({transport: 'rc_verbs', timeoutFrom: 'UCX_RC_VERBS_TIMEOUT'})
    expect(ucxRcSettings({UCX_TLS: 'rc'}).transport).toBe('rc_mlx5')
    const capped = ucxRcSettings({UCX_RC_RETRY_COUNT: '12'})
    expect(capped.retryCount).toBe(7)
    expect(capped.warnings).toEqual(['using maximal value for RETRY_COUNT (7) instead of 12'])
    expect(ucxRcSettings({UCX_RC_TIMEOUT: 'soon'}).warnings[0]).toMatch(/Invalid value for UCX_RC_TIMEOUT: 'soon'/)
  })
})

describe('rail NIC engine (RC over UDP)', () => {
  const rc = (timeout: string, retries: number) =>
    ucxRcSettings({UCX_RC_TIMEOUT: timeout, UCX_RC_RETRY_COUNT: String(retries)})
  const quiet = {info: () => undefined, warn: () => undefined, error: () => undefined}
  /** A wire between two NICs that drops everything while `dropping` (the netfilter DROP of the system tests). */
  async function wire(a: RailNicEngine, b: RailNicEngine) {
    const sock = dgram.createSocket('udp4')
    await new Promise<void>(r => sock.bind(0, '127.0.0.1', () => r()))
    const state = {dropping: false, dropWhile: undefined as (() => boolean) | undefined}
    // a sends to the wire; the wire relays to b; b answers the wire, which relays to a.
    sock.on('message', (msg, rinfo) => {
      if (state.dropping || state.dropWhile?.()) return
      sock.send(msg, rinfo.port === b.port ? a.port : b.port, '127.0.0.1')
    })
    return {state, dest: {addr: '127.0.0.1', port: sock.address().port}, close: () => sock.close()}
  }

  it('completes a WRITE once the responder acknowledged its last packet and hands over one notification', async () => {
    const a = new RailNicEngine({name: 'railA', addr: '127.0.0.1'}, rc('1s', 7), quiet, 0)
    const b = new RailNicEngine({name: 'railB', addr: '127.0.0.1'}, rc('1s', 7), quiet, 0)
    await a.bind()
    await b.bind()
    const notes: Array<[string, number]> = []
    b.onNotifyRank = (room, rank) => notes.push([room, rank])
    try {
      await a.post({
        dest: {addr: '127.0.0.1', port: b.port},
        room: '9223372036854775807',
        prefillRank: 3,
        bytes: 300_000,
        notify: false,
      })
      await a.post({
        dest: {addr: '127.0.0.1', port: b.port},
        room: '9223372036854775807',
        prefillRank: 3,
        bytes: 64,
        notify: true,
      })
      expect(notes).toEqual([['9223372036854775807', 3]])
      expect(a.counters.txPackets).toBe(Math.ceil(300_000 / 4096) + 1)
      expect(a.counters.errors).toBe(0)
    } finally {
      a.close()
      b.close()
    }
  })

  it(
    'waits out a stall shorter than timeout x retries, and fails the endpoint after timeout x ' + '(retries + 1)',
    async () => {
      // QP timeout 4.096 us x 2^14 = 67 ms
      const a = new RailNicEngine({name: 'railA', addr: '127.0.0.1'}, rc('50ms', 2), quiet, 0)
      const b = new RailNicEngine({name: 'railB', addr: '127.0.0.1'}, rc('50ms', 2), quiet, 0)
      await a.bind()
      await b.bind()
      const w = await wire(a, b)
      try {
        // The wire loses the first transmission and the first retransmission, whenever they come (by the engine's own
        // count, not a wall-clock guess that a loaded machine's late timer would miss): the second retransmission,
        // two QP timeouts after the post, gets through.
        w.state.dropWhile = () => a.counters.timeouts < 2
        const t0 = Date.now()
        await a.post({dest: w.dest, room: '1', prefillRank: 0, bytes: 20_000, notify: true})
        expect(Date.now() - t0).toBeGreaterThanOrEqual(2 * 67 - 5)
        expect(a.counters.timeouts).toBe(2)
        expect(a.counters.errors).toBe(0)
        w.state.dropWhile = undefined

        w.state.dropping = true
        const t1 = Date.now()
        const long = a.post({dest: w.dest, room: '2', prefillRank: 0, bytes: 20_000, notify: true})
        await expect(long).rejects.toThrow(/Transport retry count exceeded on railA:1\/RoCE.*3 transmissions/)
        const took = Date.now() - t1
        expect(took).toBeGreaterThanOrEqual(3 * 67 - 5)
        expect(took).toBeLessThan(3 * 67 + 400)
        expect(a.counters.errors).toBe(1)
        // The failed QP is gone; once the path is back a new one completes WRITEs again.
        w.state.dropping = false
        await a.post({dest: w.dest, room: '3', prefillRank: 0, bytes: 1000, notify: true})
      } finally {
        a.close()
        b.close()
        w.close()
      }
    },
  )

  it('round-trips the 24-byte header with a 64-bit room', () => {
    const h = {
      type: RailPkt.data,
      flags: 3,
      prefillRank: 7,
      qpn: 0xabcdef,
      psn: 123456,
      room: (1n << 63n) - 1n,
      length: 4096,
    }
    expect(parseRailHeader(railHeader(h))).toEqual(h)
    expect(parseRailHeader(Buffer.alloc(10))).toBeUndefined()
  })
})

describe('TCP acknowledged bytes (/proc/net/tcp tx_queue)', () => {
  it('names endpoints as /proc/net/tcp does', () => {
    expect(procTcpEndpoint('127.0.0.1', 8080)).toBe('0100007F:1F90')
    expect(procTcpEndpoint('::ffff:10.231.5.2', 1)).toBe('0205E70A:0001')
    expect(procTcpEndpoint('::1', 80)).toBe('00000000000000000000000001000000:0050')
  })

  it('an unread peer acknowledges only what its receive buffer holds: tx_queue keeps the rest', async () => {
    let peer: net.Socket | undefined
    const srv = net.createServer(s => {
      peer = s
      s.pause()
    })
    await new Promise<void>(r => srv.listen(0, '127.0.0.1', () => r()))
    const c = net.createConnection({host: '127.0.0.1', port: (srv.address() as net.AddressInfo).port})
    await new Promise<void>(r => c.on('connect', () => r()))
    try {
      let sent = 0
      const chunk = Buffer.alloc(64 * 1024)
      for (let i = 0; i < 32; i++)
        c.write(chunk, e => {
          if (!e) sent += chunk.length
        })
      await new Promise(r => setTimeout(r, 300))
      const txq = txQueue(c)!
      expect(txq).toBeGreaterThan(0)
      const acked = sent - txq
      expect(acked).toBeGreaterThan(0)
      expect(acked).toBeLessThan(1024 * 1024) // ~128 KB on this kernel: far less than what was written
      peer!.resume()
      await new Promise(r => setTimeout(r, 300))
      expect(txQueue(c)).toBe(0)
    } finally {
      c.destroy()
      srv.close()
    }
  })
})
