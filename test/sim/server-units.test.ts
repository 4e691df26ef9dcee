import {describe, expect, it} from 'vitest'
import {normalizeRoom, parseRoomJson, randomRoom, stringifyRoomJson} from '../../src/sim/server/json-room.js'
import {evictionThresholdS, shouldEvict} from '../../src/sim/server/watchdog.js'
import {nextStatus, KVPoll} from '../../src/sim/server/kvpoll.js'
import {BootstrapServer} from '../../src/sim/server/bootstrap-server.js'
import {FrameReader, FrameType, kvFrames, CHUNK_BYTES} from '../../src/sim/server/data-frames.js'
import type {SimConfig} from '../../src/sim/sim-config.js'
import {freePort} from './launch-pair.js'

describe('json-room', () => {
  it('keeps 63/64-bit rooms exact through parse and stringify, and leaves look-alikes in strings alone', () => {
    const text = '{"text":"a \\"bootstrap_room\\": 7","bootstrap_room": 9223372036854775807,"batch":{"bootstrap_room":[1, 18446744073709551615]},"bootstrap_port":null}'
    const o = parseRoomJson(text) as Record<string, unknown>
    expect(o.bootstrap_room).toBe('9223372036854775807')
    expect(o.text).toBe('a "bootstrap_room": 7')
    expect((o.batch as Record<string, unknown>).bootstrap_room).toEqual(['1', '18446744073709551615'])
    expect(stringifyRoomJson(o)).toBe('{"text":"a \\"bootstrap_room\\": 7","bootstrap_room":9223372036854775807,"batch":{"bootstrap_room":[1,18446744073709551615]},"bootstrap_port":null}')
    expect(stringifyRoomJson({bootstrap_room: 5n, text: '\u0000room'})).toBe('{"bootstrap_room":5,"text":"\\u0000room"}')
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
    const reader = new FrameReader((h) => seen.push(`${h.type}:${h.room}:${h.prefillRank}:${h.chunk}:${h.isLast}:${h.length}`))
    for (let off = 0; off < wire.length; off += 7777) reader.push(wire.subarray(off, off + 7777))
    expect(seen).toEqual([
      `${FrameType.kv}:9223372036854775807:3:0:false:${CHUNK_BYTES}`,
      `${FrameType.kv}:9223372036854775807:3:1:true:10`,
      `${FrameType.aux}:9223372036854775807:3:0:true:64`,
    ])
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
      const put = (k: number) => fetch(`${url}/route`, {method: 'PUT', body: JSON.stringify({attn_tp_rank: k, rank_ip: '127.0.0.1', rank_port: 5000 + k, page_size: 1, kv_cache_dtype: 'auto'})})
      expect((await fetch(all)).status).toBe(503)
      expect((await put(0)).status).toBe(200)
      expect((await fetch(all)).status).toBe(503)
      expect((await put(1)).status).toBe(200)
      const info = await (await fetch(all)).json() as Record<string, unknown>
      expect(info).toMatchObject({attn_tp_size: 2, bootstrap_instance_id: server.instanceId})
      expect(await (await fetch(`${url}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0`)).json()).toEqual({rank_ip: '127.0.0.1', rank_port: 5001})
      expect(await (await fetch(`${url}/health`)).text()).toBe('OK')
    } finally {
      server.close()
    }
  })
})
