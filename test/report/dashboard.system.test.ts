import {type ChildProcess, spawn} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {runCli} from '../e2e/cli.js'
import {freePort, type Gateway, startPushgateway} from './gateway.js'
import {ensureTool} from './tools.js'

// Issue 32 item 3: the Grafana dashboard (docs/grafana/pdchaos.json) proven against a real Prometheus (Debian's) that
// scrapes the real Pushgateway, after a real suite on the twin pushed as the README's nightly runs push (the night's
// `pdchaos report JOURNAL --push`: every series labelled with its deployment), and the twin's own /metrics as it
// scrapes SGLang: every query of every panel returns series, each with the labels its legend and grouping use.
//
// Prometheus listens on 127.0.0.1 on a free port, keeps its TSDB in a temp dir, scrapes every second, and is killed on
// every path (afterAll, and the process's exit).

interface Panel {
  title: string
  targets: Array<{expr: string; legendFormat: string}>
}

/** What each panel's queries must return: the labels every series carries (by panel title, one list per target). */
const EXPECTED: Record<string, string[][]> = {
  'Runs passed': [['job', 'run_id', 'deployment']],
  'Deployments: exit code': [['deployment', 'run_id']],
  'Failed checks (latest run)': [['deployment', 'scenario', 'check']],
  'Unverified checks (latest run)': [['deployment', 'scenario', 'check']],
  'Eviction margin to each bound (latest run)': [['deployment', 'scenario', 'bound']],
  'Mean eviction seconds per run': [['deployment', 'run_id', 'scenario', 'fault']],
  'Abort trials in the transfer window': [['deployment', 'scenario', 'run_id']],
  'Faults left behind': [['deployment', 'run_id']],
  'Run duration': [['deployment', 'run_id']],
  'Prefill PD queues': [
    ['engine_type', 'instance', 'model_name'],
    ['engine_type', 'instance', 'model_name'],
  ],
  'Decode PD queues': [
    ['engine_type', 'instance', 'model_name'],
    ['engine_type', 'instance', 'model_name'],
  ],
  'Watchdog evictions': [['instance']],
  'Bootstrap and transfer failures': [
    ['instance', 'engine_type'],
    ['instance', 'engine_type'],
  ],
  'Aborted requests': [['instance', 'engine_type']],
  'KV transfer latency p99': [['instance']],
  'Running requests and KV usage': [
    ['engine_type', 'instance'],
    ['engine_type', 'instance'],
  ],
}

/** Labels a legend names ({{label}}): each must be on the series, or the legend shows a blank. */
const legendLabels = (legend: string) => [...legend.matchAll(/\{\{\s*(\w+)\s*\}\}/g)].map(m => m[1]!)

let dir: string
let gw: Gateway | undefined
let prom: ChildProcess | undefined
let promUrl: string
let twinDir: string
let twinUp = false
const dashboardFile = join(import.meta.dirname, '../../docs/grafana/pdchaos.json')
const dashboard = JSON.parse(readFileSync(dashboardFile, 'utf8')) as {panels: Panel[]}

function killProm(): void {
  if (prom && prom.exitCode === null && prom.signalCode === null) prom.kill('SIGKILL')
}

async function startPrometheus(targets: {gateway: string; sglang: string[]}): Promise<void> {
  const bin = ensureTool('prometheus', 'prometheus')
  const config = join(dir, 'prometheus.yml')
  writeFileSync(
    config,
    [
      'global: {scrape_interval: 1s, evaluation_interval: 1s}',
      'scrape_configs:',
      // honor_labels: the pushed job and run_id stay as pdchaos set them (docs/metrics.md says so too).
      `  - {job_name: pushgateway, honor_labels: true, static_configs: [{targets: ['${targets.gateway}']}]}`,
      `  - {job_name: sglang, static_configs: [{targets: [${targets.sglang.map(t => `'${t}'`).join(', ')}]}]}`,
      '',
    ].join('\n'),
  )
  let log = ''
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort()
    promUrl = `http://127.0.0.1:${port}`
    prom = spawn(
      bin,
      [
        `--config.file=${config}`,
        `--storage.tsdb.path=${join(dir, `tsdb-${attempt}`)}`,
        `--web.listen-address=127.0.0.1:${port}`,
        '--storage.tsdb.retention.time=1h',
        '--log.level=warn',
      ],
      {stdio: ['ignore', 'pipe', 'pipe']},
    )
    prom.stdout?.on('data', d => (log += d))
    prom.stderr?.on('data', d => (log += d))
    const deadline = Date.now() + 30_000
    while (Date.now() < deadline && prom.exitCode === null) {
      try {
        if ((await fetch(`${promUrl}/-/ready`, {signal: AbortSignal.timeout(2000)})).status === 200) return
      } catch {
        /* not up yet */
      }
      await new Promise(r => setTimeout(r, 100))
    }
    killProm()
  }
  throw new Error(`Prometheus did not become ready: ${log.slice(-800)}`)
}

async function query(expr: string): Promise<Array<{metric: Record<string, string>; value: [number, string]}>> {
  const r = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`, {
    signal: AbortSignal.timeout(10_000),
  })
  type Series = {metric: Record<string, string>; value: [number, string]}
  const body = (await r.json()) as {status: string; error?: string; data: {resultType: string; result: Series[]}}
  if (body.status !== 'success') throw new Error(`${expr}: ${body.error}`)
  return body.data.result
}

async function until<T>(what: string, ms: number, f: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what} after ${ms} ms`)
    await new Promise(r => setTimeout(r, 500))
  }
}

beforeAll(async () => {
  process.on('exit', killProm)
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-dash-'))
  twinDir = join(dir, 'twin')
  gw = await startPushgateway()
  let up: {endpoints: {prefill: string; decode: string}} | undefined
  for (let attempt = 0; !up; attempt++) {
    const basePort = 20_000 + Math.floor(Math.random() * 400) * 100
    const r = await runCli(
      [
        'sim',
        'up',
        '--state-dir',
        twinDir,
        '--base-port',
        String(basePort),
        '--deadline',
        '1',
        '--poll',
        '0.5',
        '--wait',
        '60',
        '--json',
      ],
      {timeoutMs: 90_000},
    )
    if (r.code === 0) up = JSON.parse(r.stdout) as typeof up
    else if (attempt >= 5 || !/already in use/.test(r.stderr + r.stdout)) {
      throw new Error(`sim up failed (exit ${r.code}): ${r.stderr || r.stdout}`)
    }
  }
  twinUp = true
  const host = (u: string) => new URL(u).host
  await startPrometheus({gateway: host(gw.url), sglang: [host(up!.endpoints.prefill), host(up!.endpoints.decode)]})
  const suite = join(dir, 'suite.yaml')
  writeFileSync(
    suite,
    [
      'name: dashboard',
      'scenarios:',
      '  - {name: stall-kv gpu1, fault: stall-kv, params: {gpu: 1}, pins: 2}',
      '  - {name: abort gpu0, fault: abort-mid-transfer, params: {gpu: 0, trials: 3}}',
      'load: {intervalMs: 0}',
      'stop: {kernelXid: false}',
      '',
    ].join('\n'),
  )
  // As the README's nightly runs push: the suite writes its journal, the night's report pushes it labelled by
  // deployment.
  const journal = join(dir, 'twin-night.json')
  const r = await runCli(['suite', suite, '--sim', '--label', 'twin', '--journal', journal], {
    timeoutMs: 120_000,
    env: {PDCHAOS_SIM_DIR: twinDir},
  })
  expect([0, 1], r.stderr).toContain(r.code)
  const pushed = await runCli(['report', journal, '--push', gw.url, '--run-id', 'r-dashboard'], {timeoutMs: 60_000})
  expect(pushed.stderr).toMatch(/pushed \d+ series/)
  // Scraped after the push, and twice more, so that increase() and rate() over the twin's counters have two samples.
  await until('the pushed run in Prometheus', 30_000, async () =>
    (await query('pdchaos_run_passed')).length > 0 ? true : undefined,
  )
  await new Promise(r => setTimeout(r, 2500))
}, 300_000)

afterAll(async () => {
  killProm()
  process.off('exit', killProm)
  await gw?.stop()
  if (twinUp) await runCli(['sim', 'down', '--state-dir', twinDir], {timeoutMs: 60_000})
  if (dir) rmSync(dir, {recursive: true, force: true})
})

describe('the Grafana dashboard against a real Prometheus, Pushgateway and twin', () => {
  it('every panel is expected; every query returns series carrying the labels its panel uses', async () => {
    expect(dashboard.panels.map(p => p.title).sort()).toEqual(Object.keys(EXPECTED).sort())
    const report: string[] = []
    for (const panel of dashboard.panels) {
      expect(panel.targets).toHaveLength(EXPECTED[panel.title]!.length)
      for (const [i, target] of panel.targets.entries()) {
        const series = await query(target.expr)
        report.push(`${panel.title} [${i}]: ${series.length} series`)
        expect(series.length, `${panel.title}: ${target.expr}`).toBeGreaterThan(0)
        const want = new Set([...EXPECTED[panel.title]![i]!, ...legendLabels(target.legendFormat)])
        for (const s of series) {
          for (const label of want) {
            expect(s.metric, `${panel.title}: ${target.expr} lacks ${label}`).toHaveProperty(label)
          }
        }
      }
    }
    console.log(report.join('\n'))
  }, 120_000)

  it('the pushed run reads back as pdchaos computed it: the margin to each bound, the scenarios', async () => {
    const margins = await query('pdchaos_eviction_margin_seconds{job="pdchaos", run_id="r-dashboard"}')
    expect(margins.map(m => `${m.metric.deployment} ${m.metric.scenario} ${m.metric.bound}`).sort()).toEqual([
      'twin stall-kv gpu1 deadline',
      'twin stall-kv gpu1 deadline_plus_poll',
    ])
    // The two margins of one eviction sum to the poll (0.5 s); the smallest of each comes from possibly different pins.
    const sum = margins.reduce((a, m) => a + Number(m.value[1]), 0)
    expect(sum).toBeLessThanOrEqual(0.5 + 1e-6)
    const abort = await query('pdchaos_abort_trials{run_id="r-dashboard"}')
    expect(abort.map(m => [m.metric.scenario, m.value[1]])).toEqual([['abort gpu0', '3']])
  })
})
