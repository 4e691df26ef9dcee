import {spawn} from 'node:child_process'
import {existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {entryArgv} from '../../src/sim/entry.js'
import {simPaths, type SimConfig} from '../../src/sim/sim-config.js'
import {
  freePort,
  simEnv,
  launchPair,
  metric,
  nextRoom,
  pdBody,
  post,
  waitFor,
  eventsOf,
  abortRid,
  signalRank,
  firstEvent,
  internalState,
  type Pair,
} from './launch-pair.js'

describe('twin servers: a healthy PD pair', () => {
  let pair: Pair
  beforeAll(async () => {
    pair = await launchPair({prefillTp: 2, decodeTp: 2})
  })
  afterAll(async () => {
    await pair?.stop()
  })

  it('serves a PD request end to end and keeps the 63-bit room exact', async () => {
    const room = '9223372036854775807'
    const body = pdBody(pair, 'basic-1', room, {maxNewTokens: 5})
    const [p, d] = await Promise.all([post(pair.prefillUrl, body), post(pair.decodeUrl, body)])
    expect(p.status).toBe(200)
    expect(d.status).toBe(200)
    expect(p.body).toContain(`"bootstrap_room":${room}`)
    const out = JSON.parse(d.body) as {
      meta_info: {id: string; completion_tokens: number; prompt_tokens: number; finish_reason: {type: string}}
    }
    expect(out.meta_info).toMatchObject({
      id: 'basic-1',
      completion_tokens: 5,
      prompt_tokens: 128,
      finish_reason: {type: 'length'},
    })
    const pe = eventsOf(pair, 'prefill', 'basic-1').map(e => `${e.event}:${e.queue ?? ''}`)
    expect(pe).toEqual(
      expect.arrayContaining([
        'enter:bootstrap',
        'exit:bootstrap',
        'enter:waiting',
        'enter:inflight',
        'exit:inflight',
        'completed:',
      ]),
    )
    expect(eventsOf(pair, 'prefill', 'basic-1').every(e => e.room === room)).toBe(true)
    expect(eventsOf(pair, 'decode', 'basic-1').some(e => e.event === 'completed')).toBe(true)
  })

  it('streams SSE lines ending in [DONE]', async () => {
    const body = pdBody(pair, 'stream-1', nextRoom(), {stream: true, maxNewTokens: 200})
    const [p, d] = await Promise.all([post(pair.prefillUrl, body), post(pair.decodeUrl, body)])
    expect(p.status).toBe(200)
    expect(d.status).toBe(200)
    const events = d.body.split('\n\n').filter(Boolean)
    expect(events.at(-1)).toBe('data: [DONE]')
    const chunks = events
      .slice(0, -1)
      .map(
        e => JSON.parse(e.replace(/^data: /, '')) as {meta_info: {completion_tokens: number; finish_reason: unknown}},
      )
    expect(chunks.length).toBeGreaterThan(1)
    expect(chunks.at(-1)!.meta_info).toMatchObject({completion_tokens: 200, finish_reason: {type: 'length'}})
    const counts = chunks.map(c => c.meta_info.completion_tokens)
    expect([...counts].sort((a, b) => a - b)).toEqual(counts)
  })

  it('writes service and GPU files and titles each rank like SGLang', () => {
    const paths = simPaths(pair.stateDir)
    const p = pair.service('prefill')
    const d = pair.service('decode')
    expect(p.rankPids).toHaveLength(2)
    expect(p.bootstrapUrl).toBe(pair.bootstrapUrl)
    expect(d.rankPorts.every(r => typeof r.dataPort === 'number')).toBe(true)
    for (const [i, pid] of [...p.rankPids, ...d.rankPids].entries()) {
      const gpu = JSON.parse(readFileSync(paths.gpu(i), 'utf8')) as {pid: number; role: string; tpRank: number}
      expect(gpu.pid).toBe(pid)
      expect(gpu.tpRank).toBe(i % 2)
      expect(readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]).toBe(`sglang::scheduler_TP${i % 2}`)
      expect(readFileSync(`/proc/${pid}/environ`, 'utf8')).toContain('SGLANG_DISAGGREGATION_WATCHDOG_SCOPE=all')
    }
  })

  it('answers the bootstrap /route and /health as SGLang does', async () => {
    const info = (await (
      await fetch(
        `${pair.bootstrapUrl}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`,
      )
    ).json()) as Record<string, unknown>
    expect(info).toMatchObject({attn_tp_size: 2, follow_bootstrap_room: true})
    expect(typeof info.bootstrap_instance_id).toBe('string')
    const r1 = (await (
      await fetch(`${pair.bootstrapUrl}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0`)
    ).json()) as Record<string, unknown>
    expect(r1).toEqual({rank_ip: '127.0.0.1', rank_port: pair.service('prefill').rankPorts[1]!.zmqPort})
    expect(await (await fetch(`${pair.bootstrapUrl}/health`)).text()).toBe('OK')
  })

  it('exposes server_info, /v1/loads and /metrics with SGLang names', async () => {
    const info = (await (await fetch(`${pair.prefillUrl}/server_info`)).json()) as Record<string, unknown>
    expect(info).toMatchObject({
      disaggregation_mode: 'prefill',
      tp_size: 2,
      disaggregation_transfer_backend: 'nixl',
      disaggregation_watchdog_scope: 'all',
    })
    const prom = await (await fetch(`${pair.prefillUrl}/v1/loads?include=disagg&format=prometheus`)).text()
    expect(prom).toMatch(/^sglang_disagg_prefill_inflight_queue_reqs\{dp_rank="0"\} \d+$/m)
    const text = await (await fetch(`${pair.prefillUrl}/metrics`)).text()
    expect(text).toMatch(
      /^sglang:num_prefill_inflight_queue_reqs\{engine_type="prefill",model_name="[^"]+",moe_ep_rank="0",pp_rank="0",tp_rank="0"\} \d+\.\d+$/m,
    )
    expect(await metric(pair.prefillUrl, 'sglang:kv_transfer_latency_ms_count')).toBeGreaterThanOrEqual(1)
  })

  it('flush_cache refuses while requests are queued and abort_request is always 200', async () => {
    expect((await fetch(`${pair.prefillUrl}/flush_cache`, {method: 'POST'})).status).toBe(200)
    expect(await abortRid(pair.prefillUrl, 'no-such-rid')).toBe(200)
    expect(await abortRid(pair.prefillUrl, '')).toBe(200)
  })

  it('aborts a request whose client went away after the request-state wait (4 s)', async () => {
    // Prefill alone: no decode sends destination info, so it waits in the bootstrap queue.
    const ctl = new AbortController()
    const pending = post(pair.prefillUrl, pdBody(pair, 'gone-1', nextRoom()), ctl.signal).catch(() => undefined)
    await waitFor('bootstrap entry', () => firstEvent(pair, 'prefill', 'gone-1', 'enter', 'bootstrap'))
    const t0 = Date.now()
    ctl.abort()
    await pending
    const done = await waitFor(
      'abort of the gone client',
      () => firstEvent(pair, 'prefill', 'gone-1', 'bootstrap_failed'),
      10_000,
    )
    expect(Number(done.t) - t0).toBeGreaterThanOrEqual(3900)
    expect(await metric(pair.prefillUrl, 'sglang:num_aborted_requests_total')).toBeGreaterThanOrEqual(1)
  })

  it('cleans up its files when stopped', async () => {
    const paths = simPaths(pair.stateDir)
    const rankPids = pair.service('decode').rankPids
    const code = await pair.stopRole('decode')
    expect(code).toBe(0)
    expect(existsSync(paths.service('decode'))).toBe(false)
    expect(existsSync(paths.gpu(2))).toBe(false)
    for (const pid of rankPids) expect(() => process.kill(pid, 0)).toThrow()
    await pair.start('decode')
    expect(pair.service('decode').rankPids).not.toEqual(rankPids)
  })

  it('wedges when one prefill rank is stopped (gloo all-reduce) and recovers on SIGCONT', async () => {
    signalRank(pair, 'prefill', 1, 'SIGSTOP')
    try {
      const t0 = Date.now()
      const res = await fetch(`${pair.prefillUrl}/health_generate`)
      expect(res.status).toBe(503)
      expect(Date.now() - t0).toBeGreaterThanOrEqual(1900)
      // The bootstrap thread lives in the HTTP process: it still answers (SGLang's blind spot).
      expect(await (await fetch(`${pair.bootstrapUrl}/health`)).text()).toBe('OK')
    } finally {
      signalRank(pair, 'prefill', 1, 'SIGCONT')
    }
    expect((await fetch(`${pair.prefillUrl}/health`)).status).toBe(200)
    expect((await internalState(pair.prefillUrl)).status).toBe('running')
  })
})

describe('twin servers: process lifecycle', () => {
  let pair: Pair
  beforeAll(async () => {
    pair = await launchPair({prefillTp: 2, decodeTp: 2})
  })
  afterAll(async () => {
    await pair?.stop()
  })

  const gone = (pid: number) => {
    try {
      process.kill(pid, 0)
      return false
    } catch {
      return true
    }
  }

  it('exits 0 within 2 s on SIGTERM, even with a SIGSTOPped rank', async () => {
    const ranks = pair.service('decode').rankPids
    process.kill(ranks[1]!, 'SIGSTOP')
    const t0 = Date.now()
    expect(await pair.stopRole('decode')).toBe(0)
    expect(Date.now() - t0).toBeLessThan(2000)
    await waitFor('ranks gone', () => ranks.every(gone), 2000)
    await pair.start('decode')
  })

  it('ranks never outlive their server (IPC disconnect), and a dead rank takes its server down', async () => {
    const svc = pair.service('decode')
    process.kill(svc.pid, 'SIGKILL')
    await waitFor('orphaned ranks exit', () => svc.rankPids.every(gone), 3000)
    expect(existsSync(simPaths(pair.stateDir).gpu(2))).toBe(false)
    await pair.start('decode')

    const exited = new Promise<number | null>(resolve => pair.procs.decode.once('exit', code => resolve(code)))
    process.kill(pair.service('decode').rankPids[0]!, 'SIGKILL')
    expect(await exited).not.toBe(0)
    expect(pair.log('decode')).toMatch(/Scheduler TP0 \(rank process\) died unexpectedly/)
    expect(existsSync(simPaths(pair.stateDir).service('decode'))).toBe(false)
    await pair.start('decode')
  })
})

describe('twin servers: TP rank mapping', () => {
  for (const [prefillTp, decodeTp] of [
    [1, 2],
    [4, 2],
  ] as const) {
    it(`serves with prefill TP ${prefillTp} and decode TP ${decodeTp} (dummy ranks / fan-in)`, async () => {
      const pair = await launchPair({prefillTp, decodeTp})
      try {
        const body = pdBody(pair, `map-${prefillTp}-${decodeTp}`, nextRoom())
        const [p, d] = await Promise.all([post(pair.prefillUrl, body), post(pair.decodeUrl, body)])
        expect([p.status, d.status]).toEqual([200, 200])
      } finally {
        await pair.stop()
      }
    })
  }
})

describe('twin servers: startup errors', () => {
  it('exits non-zero quickly, with a log line, when its HTTP port is taken', async () => {
    const blocker = createServer()
    await new Promise<void>(r => blocker.listen(0, '127.0.0.1', () => r()))
    const taken = (blocker.address() as {port: number}).port
    const dir = mkdtempSync(join(tmpdir(), 'pdchaos-port-'))
    try {
      const cfg: SimConfig = {
        stateDir: dir,
        host: '127.0.0.1',
        model: 'm',
        version: '0.5.15',
        gpus: 8,
        prefillTp: 1,
        decodeTp: 1,
        backend: 'nixl',
        watchdog: {scope: 'all', deadlineS: 300, pollS: 1},
        bugs: [],
        ports: {router: 0, routerMetrics: 0, prefill: taken, decode: await freePort(), bootstrap: await freePort()},
        timeouts: {bootstrapS: 300, waitingS: 300, heartbeatIntervalS: 5, heartbeatMaxFailure: 2},
        timing: {forwardMsPerKToken: 5, kvBytesPerToken: 1024, healthTimeoutS: 2, idleGaugeRefreshS: 30},
        kvPoolTokens: 100000,
      }
      mkdirSync(dir, {recursive: true})
      writeFileSync(simPaths(dir).config, JSON.stringify(cfg))
      const {command, args} = entryArgv(
        new URL('../../src/sim/server/server-main.ts', import.meta.url).href,
        '--role',
        'prefill',
        '--state-dir',
        dir,
      )
      const child = spawn(command, args, {stdio: ['ignore', 'pipe', 'pipe'], env: simEnv(cfg)})
      let out = ''
      child.stdout!.on('data', d => {
        out += d
      })
      child.stderr!.on('data', d => {
        out += d
      })
      const code = await new Promise<number | null>(resolve => child.once('exit', c => resolve(c)))
      expect(code).toBe(1)
      expect(out).toMatch(/Failed to start prefill server: .*EADDRINUSE/)
      expect(existsSync(simPaths(dir).service('prefill'))).toBe(false)
    } finally {
      blocker.close()
      rmSync(dir, {recursive: true, force: true})
    }
  })
})

describe('twin servers: an SGLang without /v1/loads, with a KV pool where one request is 0.34 %', () => {
  // 128 prompt tokens of 37 648: the share per request the issue's target showed (0.0034).
  let pair: Pair
  beforeAll(async () => {
    pair = await launchPair({bugs: ['no-loads'], kvPoolTokens: 37_648})
  })
  afterAll(async () => {
    await pair?.stop()
  })

  it(
    'answers /v1/loads 404, and its token_usage gauge keeps what the last batch held after the request has ' + 'ended',
    async () => {
      expect((await fetch(`${pair.prefillUrl}/v1/loads?include=disagg&format=prometheus`)).status).toBe(404)
      const body = pdBody(pair, 'share-1', nextRoom())
      const [p, d] = await Promise.all([post(pair.prefillUrl, body), post(pair.decodeUrl, body)])
      expect([p.status, d.status]).toEqual([200, 200])
      // Live: nothing held. The gauge, written with the batch (report_prefill_stats), still counts the request's share.
      expect((await internalState(pair.prefillUrl)).token_usage).toBe(0)
      expect(await metric(pair.prefillUrl, 'sglang:token_usage')).toBeCloseTo(128 / 37_648, 6)
    },
  )
})
