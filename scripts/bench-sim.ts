/**
 * Benchmark of the twin (not a test): `node --import tsx scripts/bench-sim.ts`.
 * Measures `sim up` to healthy (median of 3), requests/s and latency of 128-token prompts through the
 * router (bounded: fixed count and a time cap), and the RSS of all twin processes with the default 8 ranks.
 * The load loop is also run against a bare Node HTTP echo server in the same run, as a baseline for this
 * noisy 2-core machine. Writes the `## Twin` section of BENCHMARKS.md (other sections are kept).
 *
 * The twin is measured as an installed pdchaos runs it, compiled to JavaScript: src/ is compiled with tsc into
 * node_modules/.cache/pdchaos-bench (never dist/, which others use). One extra `up` from the TypeScript sources
 * through tsx (as the tests run it) is measured for comparison.
 */
import {spawn} from 'node:child_process'
import {mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync} from 'node:fs'
import http from 'node:http'
import {cpus, tmpdir} from 'node:os'
import {join} from 'node:path'
import {performance} from 'node:perf_hooks'
import {fileURLToPath} from 'node:url'

import {execFileSync} from 'node:child_process'
import {mkdirSync} from 'node:fs'
import {pathToFileURL} from 'node:url'

import * as srcDown from '../src/sim/lifecycle/down.js'
import {freePort} from '../src/sim/lifecycle/ports.js'
import * as srcUp from '../src/sim/lifecycle/up.js'
import type {SimUpResult} from '../src/sim/lifecycle/up.js'
import {writeSection} from './bench-common.js'

type Twin = {simUp: typeof srcUp.simUp; simDown: typeof srcDown.simDown}

const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 2000)
const CONCURRENCY = 16
const TIME_CAP_MS = 60_000
const MAX_NEW_TOKENS = 8
const UP_RUNS = 3
const PROMPT = 'abcd'.repeat(128) // 512 chars = 128 tokens by the twin's ceil(len/4)

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}
const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]
}

interface LoadResult {
  ok: number
  failed: number
  elapsedMs: number
  rps: number
  p50: number
  p99: number
  capped: boolean
}

/** A fixed number of POST /generate with a fixed concurrency over keep-alive connections, capped in time. */
async function load(url: string, total = REQUESTS): Promise<LoadResult> {
  const agent = new http.Agent({keepAlive: true, maxSockets: CONCURRENCY})
  const target = new URL('/generate', url)
  const latencies: number[] = []
  let next = 0
  let ok = 0
  let failed = 0
  const t0 = performance.now()
  const deadline = t0 + TIME_CAP_MS
  const one = (i: number): Promise<void> =>
    new Promise(resolve => {
      const body = JSON.stringify({rid: `bench-${i}`, text: PROMPT, sampling_params: {max_new_tokens: MAX_NEW_TOKENS}})
      const start = performance.now()
      const req = http.request(
        target,
        {
          method: 'POST',
          agent,
          headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(body)},
          timeout: 30_000,
        },
        res => {
          res.resume()
          res.on('end', () => {
            latencies.push(performance.now() - start)
            if (res.statusCode === 200) ok++
            else failed++
            resolve()
          })
        },
      )
      req.on('timeout', () => req.destroy(new Error('timeout')))
      req.on('error', () => {
        failed++
        resolve()
      })
      req.end(body)
    })
  const worker = async (): Promise<void> => {
    while (next < total && performance.now() < deadline) await one(next++)
  }
  await Promise.all(Array.from({length: CONCURRENCY}, worker))
  const elapsedMs = performance.now() - t0
  agent.destroy()
  return {
    ok,
    failed,
    elapsedMs,
    rps: ((ok + failed) / elapsedMs) * 1000,
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
    capped: next < total,
  }
}

/** A bare Node HTTP server in its own process that answers every POST with a small JSON body. */
async function baseline(): Promise<LoadResult> {
  const port = await freePort()
  const code = `require('http').createServer((q,s)=>{q.resume();q.on('end',()=>{s.writeHead(200,{'content-type':'application/json'});s.end('{"text":" ok"}')})}).listen(${port},'127.0.0.1',()=>console.log('up'))`
  const child = spawn(process.execPath, ['-e', code], {stdio: ['ignore', 'pipe', 'inherit']})
  try {
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('baseline server did not start')), 10_000)
      child.stdout!.once('data', () => {
        clearTimeout(t)
        resolve()
      })
    })
    await load(`http://127.0.0.1:${port}`, 200) // warm-up
    return await load(`http://127.0.0.1:${port}`)
  } finally {
    child.kill('SIGKILL')
  }
}

/** VmRSS (KiB) of every process of the twin: servers, ranks, router. */
function twinRssKiB(up: SimUpResult): {total: number; count: number} {
  const pids = [...Object.values(up.pids), ...up.rankPids.prefill, ...up.rankPids.decode]
  let total = 0
  for (const pid of pids) {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
    total += m ? Number(m[1]) : 0
  }
  return {total, count: pids.length}
}

function pidsMentioning(dir: string): number[] {
  return readdirSync('/proc')
    .filter(d => /^\d+$/.test(d))
    .map(Number)
    .filter(pid => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(dir)
      } catch {
        return false
      }
    })
}

const repo = fileURLToPath(new URL('../', import.meta.url))

/** Compile src/ to a private out dir and load the lifecycle from there. */
async function compiledTwin(): Promise<Twin> {
  const out = join(repo, 'node_modules', '.cache', 'pdchaos-bench')
  rmSync(out, {recursive: true, force: true})
  mkdirSync(out, {recursive: true})
  writeFileSync(join(out, 'package.json'), '{"type": "module"}\n')
  try {
    execFileSync(
      join(repo, 'node_modules', '.bin', 'tsc'),
      ['-p', repo, '--outDir', join(out, 'dist'), '--declaration', 'false'],
      {stdio: 'pipe'},
    )
  } catch {
    // Type errors elsewhere in the tree (other work in progress) do not stop tsc from emitting.
  }
  const mod = (p: string) => pathToFileURL(join(out, 'dist', 'sim', 'lifecycle', p)).href
  if (!existsSync(fileURLToPath(mod('up.js')))) throw new Error('tsc emitted no lifecycle module')
  const up = (await import(mod('up.js'))) as typeof srcUp
  const down = (await import(mod('down.js'))) as typeof srcDown
  return {simUp: up.simUp, simDown: down.simDown}
}

async function upOnFreePorts(twin: Twin, stateDir: string): Promise<SimUpResult> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await twin.simUp({stateDir, basePort: 20_000 + Math.floor(Math.random() * 400) * 100, deadlineS: 300})
    } catch (error) {
      if (attempt < 5 && /already in use/.test((error as Error).message)) continue
      throw error
    }
  }
}

const fmt = (n: number, d = 1): string => n.toFixed(d)

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-bench-'))
  const twinJs = await compiledTwin()
  const twinTs: Twin = {simUp: srcUp.simUp, simDown: srcDown.simDown}
  try {
    const upMs: number[] = []
    let up: SimUpResult | undefined
    for (let i = 0; i < UP_RUNS; i++) {
      const t0 = performance.now()
      up = await upOnFreePorts(twinJs, dir)
      upMs.push(performance.now() - t0)
      process.stderr.write(`up #${i + 1}: healthy in ${fmt(upMs[i], 0)} ms\n`)
      if (i < UP_RUNS - 1) await twinJs.simDown(dir)
    }
    const twin = up!
    await load(twin.endpoints.router, 200) // warm-up: decode resolves /route and registers once
    const idleRss = twinRssKiB(twin)
    const twinLoad = await load(twin.endpoints.router)
    const loadedRss = twinRssKiB(twin)
    process.stderr.write(
      `twin: ${fmt(twinLoad.rps)} req/s, p50 ${fmt(twinLoad.p50)} ms, p99 ${fmt(twinLoad.p99)} ` +
        `ms, ${twinLoad.failed} failed\n`,
    )
    await twinJs.simDown(dir)

    // The same twin from the TypeScript sources through tsx (how the tests run it): start-up and memory only.
    const t1 = performance.now()
    const upTs = await upOnFreePorts(twinTs, dir)
    const upTsMs = performance.now() - t1
    await load(upTs.endpoints.router, 200)
    const tsRss = twinRssKiB(upTs)
    await twinTs.simDown(dir)
    process.stderr.write(`tsx twin: healthy in ${fmt(upTsMs, 0)} ms, RSS ${fmt(tsRss.total / 1024, 0)} MiB\n`)

    const base = await baseline()
    process.stderr.write(`baseline: ${fmt(base.rps)} req/s, p50 ${fmt(base.p50)} ms, p99 ${fmt(base.p99)} ms\n`)

    const upMedian = median(upMs)
    const rssMiB = Math.max(idleRss.total, loadedRss.total) / 1024
    const verdict = (met: boolean): string => (met ? 'met' : '**not met**')
    const body = [
      `\`node --import tsx scripts/bench-sim.ts\`: the default twin (8 GPUs, prefill TP 4 + decode TP 4, nixl, 11 ` +
        `processes), compiled to`,
      `JavaScript as an installed pdchaos runs it (tsc into node_modules/.cache/pdchaos-bench). Load: ${REQUESTS} ` +
        `POST /generate through the router, ${CONCURRENCY} concurrent over keep-alive, 128-token prompts`,
      `(512 chars), max_new_tokens ${MAX_NEW_TOKENS}, capped at ${TIME_CAP_MS / 1000} s. Baseline: the same load ` +
        `loop against a bare Node HTTP server`,
      `answering a fixed JSON body, in the same run. Measured ${new Date().toISOString().slice(0, 10)} ` +
        `on ${cpus().length} cores with other work running.`,
      '',
      '| measure | twin | baseline | ratio | goal |',
      '|---|---|---|---|---|',
      `| \`sim up\` to healthy (median of ${UP_RUNS}) | ${fmt(upMedian / 1000, 2)} s ` +
        `(runs: ${upMs.map(m => fmt(m / 1000, 2)).join(', ')} s) | - | - | within 3 s: ${verdict(upMedian <= 3000)} |`,
      `| requests/s | ${fmt(twinLoad.rps)} (${twinLoad.ok} ok, ${twinLoad.failed} ` +
        `failed${twinLoad.capped ? ', time cap hit' : ''}) | ${fmt(base.rps)} ` +
        `| ${fmt(twinLoad.rps / base.rps, 3)}x of baseline | >= ` +
        `200: ${verdict(twinLoad.rps >= 200 && twinLoad.failed === 0)} |`,
      `| latency p50 | ${fmt(twinLoad.p50)} ms | ${fmt(base.p50, 2)} ms | ${fmt(twinLoad.p50 / base.p50)}x | - |`,
      `| latency p99 | ${fmt(twinLoad.p99)} ms | ${fmt(base.p99, 2)} ms | ${fmt(twinLoad.p99 / base.p99)}x | - |`,
      `| RSS of all twin processes (${loadedRss.count}) | ${fmt(rssMiB, 0)} MiB ` +
        `(idle ${fmt(idleRss.total / 1024, 0)}, after load ${fmt(loadedRss.total / 1024, 0)}) | - | - | < 1 ` +
        `GiB: ${verdict(rssMiB < 1024)} |`,
      '',
      `From the TypeScript sources through tsx (how the tests and \`bin/dev.js\` run it), one run: healthy ` +
        `in ${fmt(upTsMs / 1000, 2)} s,`,
      `RSS ${fmt(tsRss.total / 1024, 0)} MiB after a warm-up (tsx's loader adds ` +
        `about ${fmt((tsRss.total - idleRss.total) / 1024 / tsRss.count, 0)} MiB per process).`,
      '',
    ].join('\n')

    process.stdout.write(writeSection('Twin', body) + '\n')
  } finally {
    await srcDown.simDown(dir).catch(() => undefined)
    for (const pid of pidsMentioning(dir)) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {}
    }
    rmSync(dir, {recursive: true, force: true})
  }
}

await main()
