import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {simDown} from '../../src/sim/lifecycle/down.js'
import {readServiceFile} from '../../src/sim/lifecycle/files.js'
import {probeBind} from '../../src/sim/lifecycle/ports.js'
import {procStart} from '../../src/sim/lifecycle/procs.js'
import {simRestart} from '../../src/sim/lifecycle/restart.js'
import {simStatus} from '../../src/sim/lifecycle/status.js'
import {simUp, type SimUpResult} from '../../src/sim/lifecycle/up.js'
import {simPaths} from '../../src/sim/sim-config.js'
import {freeBasePort, readLines, sleep, sweep} from './lifecycle-helpers.js'

/**
 * One prefill instance (TP 4) over two nodes, SGLang's --nnodes 2 --node-rank K --dist-init-addr: node 0 on 127.0.0.1,
 * node 1 on 127.0.0.2, decode (TP 2) on a third "node" 127.0.0.3, each its own state dir, same ports (loopback's /8
 * gives each node its own address). Every wait is bounded.
 */
const N0 = '127.0.0.1'
const N1 = '127.0.0.2'
const ND = '127.0.0.3'
const DEADLINE = 1.5
const POLL = 0.5

const alive = (pid: number): boolean => procStart(pid) !== undefined
const cmdline = (pid: number): string => readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim()

async function get(url: string): Promise<{status: number; text: string}> {
  const r = await fetch(url, {signal: AbortSignal.timeout(5000)})
  return {status: r.status, text: await r.text()}
}

function generate(
  host: string,
  port: number,
  bootstrapPort: number,
  rid: string,
  room: number,
  signal?: AbortSignal,
): Promise<{status: number; text: string}> {
  const body = {
    rid,
    text: 'x'.repeat(400),
    sampling_params: {max_new_tokens: 4},
    bootstrap_host: N0,
    bootstrap_port: bootstrapPort,
    bootstrap_room: room,
  }
  return fetch(`http://${host}:${port}/generate`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: {'content-type': 'application/json'},
    signal: signal ?? AbortSignal.timeout(15_000),
  }).then(async r => ({status: r.status, text: await r.text()}))
}

async function waitUntil(what: string, check: () => boolean | Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await sleep(50)
  }
}

describe('one prefill instance over two nodes (--nnodes 2)', () => {
  const dirs = {
    n0: mkdtempSync(join(tmpdir(), 'pdchaos-mn0-')),
    n1: mkdtempSync(join(tmpdir(), 'pdchaos-mn1-')),
    dec: mkdtempSync(join(tmpdir(), 'pdchaos-mnd-')),
  }
  let base = 0
  let distPort = 0
  let up: {n0: SimUpResult; n1: SimUpResult; dec: SimUpResult}
  const ports = () => up.n0.config.ports

  beforeAll(async () => {
    for (let i = 0; ; i++) {
      base = await freeBasePort()
      distPort = base + 700
      const free = await Promise.all(
        [
          [N0, distPort],
          [N1, base + 100],
          [ND, base + 200],
        ].map(([h, p]) => probeBind(h as string, p as number)),
      )
      if (free.every(c => c === undefined)) break
      if (i > 10) throw new Error('no free ports')
    }
    const common = {basePort: base, prefillTp: 4, decodeTp: 2, deadlineS: DEADLINE, pollS: POLL, waitS: 25}
    const prefill = {
      ...common,
      only: ['prefill'],
      peers: {decode: ND, router: ND},
      nnodes: 2,
      distInitAddr: `${N0}:${distPort}`,
    }
    // The nodes start together, as an operator starts them: node 0 waits for node 1, node 1 retries until node 0
    // listens.
    const [n0, n1, dec] = await Promise.all([
      simUp({...prefill, stateDir: dirs.n0, host: N0, nodeRank: 0}),
      simUp({...prefill, stateDir: dirs.n1, host: N1, nodeRank: 1}),
      simUp({...common, stateDir: dirs.dec, host: ND, only: ['decode'], peers: {prefill: N0, router: ND}}),
    ])
    up = {n0, n1, dec}
  })

  afterAll(async () => {
    for (const dir of Object.values(dirs)) {
      try {
        for (const pid of readServiceFile(dir, 'prefill')?.rankPids ?? []) process.kill(pid, 'SIGCONT')
      } catch {
        /* gone */
      }
    }
    await Promise.all(Object.values(dirs).map(d => simDown(d).catch(() => undefined)))
    for (const dir of Object.values(dirs)) {
      sweep(dir)
      rmSync(dir, {recursive: true, force: true})
    }
  })

  it(
    "registers every rank at node 0's bootstrap server, each with its own node's address; node 1 runs TP2-3 on " +
      'its GPUs 0-1',
    async () => {
      const b = `http://${N0}:${ports().bootstrap}`
      const info = JSON.parse(
        (await get(`${b}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`)).text,
      ) as Record<string, unknown>
      expect(info.attn_tp_size).toBe(4)
      const ips: string[] = []
      for (let k = 0; k < 4; k++) {
        const r = await get(`${b}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=${k}&target_pp_rank=0`)
        expect(r.status).toBe(200)
        ips.push((JSON.parse(r.text) as {rank_ip: string}).rank_ip)
      }
      expect(ips).toEqual([N0, N0, N1, N1])

      // Node 1: the same title shape and launch flags as node 0; its ranks keep their global TP rank; its GPUs 0 and 1.
      const f = readServiceFile(dirs.n1, 'prefill')!
      expect(cmdline(f.pid)).toMatch(
        new RegExp(
          `^sglang::prefill_server .*--tp-size 4 .*--dist-init-addr ${N0}:${distPort} --nnodes 2 --node-rank 1`,
        ),
      )
      expect(f.rankPids.map(cmdline)).toEqual(['sglang::scheduler_TP2', 'sglang::scheduler_TP3'])
      expect(readServiceFile(dirs.n0, 'prefill')!.rankPids.map(cmdline)).toEqual([
        'sglang::scheduler_TP0',
        'sglang::scheduler_TP1',
      ])
      const st = await simStatus(dirs.n1)
      expect(st.services).toMatchObject([
        {service: 'prefill', running: true, health: 200, url: `http://${N0}:${ports().prefill}`},
      ])
      expect(st.services[0]!.ranks.map(r => [r.tpRank, r.pid, r.gpu])).toEqual([
        [2, f.rankPids[0], 0],
        [3, f.rankPids[1], 1],
      ])
      expect(st.gpus.slice(0, 3).map(g => [g.pid, g.tpRank ?? null])).toEqual([
        [f.rankPids[0], 2],
        [f.rankPids[1], 3],
        [null, null],
      ])

      // Node 1 has no API: only the stand-in health check; node 0's server_info states the multi-node args.
      expect((await get(`http://${N1}:${ports().prefill}/health`)).status).toBe(200)
      expect((await get(`http://${N1}:${ports().prefill}/health_generate`)).status).toBe(200)
      expect((await get(`http://${N1}:${ports().prefill}/server_info`)).status).toBe(404)
      expect(await probeBind(N1, ports().bootstrap)).toBeUndefined() // no bootstrap server on node 1
      const si = JSON.parse((await get(`http://${N0}:${ports().prefill}/server_info`)).text) as Record<string, unknown>
      expect(si).toMatchObject({tp_size: 4, nnodes: 2, node_rank: 0, dist_init_addr: `${N0}:${distPort}`})
      // `sim up` on node 1 names node 0's API.
      expect(up.n1.endpoints).toMatchObject({
        prefill: `http://${N0}:${ports().prefill}`,
        bootstrap: `http://${N0}:${ports().bootstrap}`,
      })
    },
  )

  it('serves a request end to end: prefill over two nodes, KV to decode', async () => {
    const room = 4242
    const [p, d] = await Promise.all([
      generate(N0, ports().prefill, ports().bootstrap, 'mn-ok', room),
      generate(ND, ports().decode, ports().bootstrap, 'mn-ok', room),
    ])
    expect(p.status).toBe(200)
    expect(d.status).toBe(200)
    expect(JSON.parse(d.text)).toMatchObject({meta_info: {id: 'mn-ok', finish_reason: {type: 'length'}}})
  })

  it(
    "a stopped rank on node 1 blocks node 0's all-reduce: the request pins, and the watchdog evicts it once the " +
      'rank runs',
    async () => {
      const pid = readServiceFile(dirs.n1, 'prefill')!.rankPids[1]!
      process.kill(pid, 'SIGSTOP')
      let answer: {status: number; text: string} | undefined
      const pending = generate(N0, ports().prefill, ports().bootstrap, 'mn-pin', 4343).then(a => {
        answer = a
        return a
      })
      try {
        await sleep((DEADLINE + POLL) * 1000 + 1000)
        expect(answer).toBeUndefined()
        const truth = readLines(simPaths(dirs.n0).truth('prefill')).filter(e => e.rid === 'mn-pin')
        expect(truth.some(e => e.event === 'evicted')).toBe(false)
      } finally {
        process.kill(pid, 'SIGCONT')
      }
      const res = await pending
      expect(res.status).toBe(500)
      expect(res.text).toContain('watchdog')
      await waitUntil(
        'evicted event',
        () => readLines(simPaths(dirs.n0).truth('prefill')).some(e => e.rid === 'mn-pin' && e.event === 'evicted'),
        3000,
      )
      // Held past deadline + poll by the watchdog's own clock: the loop could not evict while the remote rank was
      // stopped.
      const held = Number(
        /evicted request rid='mn-pin'.* held=([0-9.]+)s/.exec(
          readFileSync(simPaths(dirs.n0).log('prefill'), 'utf8'),
        )?.[1],
      )
      expect(held).toBeGreaterThan(DEADLINE + POLL + 0.9)
    },
  )

  it('killing node 1 ends node 0 (a lost node breaks the group), with a log line saying why', async () => {
    const n1 = readServiceFile(dirs.n1, 'prefill')!
    const n0 = readServiceFile(dirs.n0, 'prefill')!
    process.kill(n1.pid, 'SIGKILL')
    await waitUntil('node 0 to exit', () => !alive(n0.pid), 10_000)
    await waitUntil("node 1's ranks to exit", () => n1.rankPids.every(p => !alive(p)), 5000)
    await waitUntil("node 0's ranks to exit", () => n0.rankPids.every(p => !alive(p)), 5000)
    expect(readFileSync(simPaths(dirs.n0).log('prefill'), 'utf8')).toMatch(
      /Distributed group broken: lost the link to node rank 1 .*\n.*Shutting down prefill server: a node of the instance was lost/,
    )
  })

  it('sim restart on both nodes (run together) rejoins them; node 1 shuts down when it loses node 0', async () => {
    const [r0, r1] = await Promise.all([simRestart(dirs.n0, 'prefill', 25), simRestart(dirs.n1, 'prefill', 25)])
    expect(r0.rankPids).toHaveLength(2)
    expect(r1.rankPids).toHaveLength(2)
    const r = await get(
      `http://${N0}:${ports().bootstrap}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=3&target_pp_rank=0`,
    )
    expect(JSON.parse(r.text)).toMatchObject({rank_ip: N1, rank_port: r1.rankPorts[1]!.zmqPort})
    process.kill(r0.pid, 'SIGKILL')
    await waitUntil('node 1 to exit', () => !alive(r1.pid), 10_000)
    await waitUntil("node 1's ranks to exit", () => r1.rankPids.every(p => !alive(p)), 5000)
    expect(readFileSync(simPaths(dirs.n1).log('prefill'), 'utf8')).toMatch(
      new RegExp(
        `Lost the link to node rank 0 at ${N0}:${distPort}: .*\\n.*Shutting down prefill server \\(node rank 1\\): ` +
          `lost the link to node rank 0`,
      ),
    )
  })
})
