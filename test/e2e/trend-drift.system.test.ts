import {spawnSync} from 'node:child_process'
import {existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {pathToFileURL} from 'node:url'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {ensureTool} from '../report/tools.js'
import {runCli} from './cli.js'

// Issue 32 item 2: ten nightly runs on the twin, its watchdog made later by 100 ms each night (`sim up
// --watchdog-late-ms`), then `pdchaos report --trend DIR` must name the late margin's fall, and its page must render
// in headless Chromium with every eviction drawn inside an axis fitted to the data.
//
// Cheap on purpose: one stall-kv scenario of two pins, deadline 1 s, poll 0.5 s, no steady load (about 6 s a night).
// The poll tick's phase moves each run's evictions by up to one poll (0.5 s) at random: lateness grows to 900 ms so
// that the fall stands well clear of that noise (runs late in the series fail: the drift crossed the bound).

const NIGHTS = 10
const STEP_MS = 100
const DEADLINE = 1
const POLL = 0.5

let dir: string
let journals: string
let twinDir: string
let twinUp = false
const started = Date.now()

async function simUp(lateMs: number): Promise<void> {
  for (let attempt = 0; ; attempt++) {
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
        String(DEADLINE),
        '--poll',
        String(POLL),
        '--watchdog-late-ms',
        String(lateMs),
        '--wait',
        '60',
        '--json',
      ],
      {timeoutMs: 90_000},
    )
    if (r.code === 0) {
      twinUp = true
      return
    }
    if (attempt < 5 && /already in use/.test(r.stderr + r.stdout)) continue
    throw new Error(`sim up failed (exit ${r.code}): ${r.stderr || r.stdout}`)
  }
}

async function simDown(): Promise<void> {
  if (!twinUp) return
  await runCli(['sim', 'down', '--state-dir', twinDir], {timeoutMs: 60_000})
  twinUp = false
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-trend-'))
  journals = join(dir, 'nightly')
  twinDir = join(dir, 'twin')
  mkdirSync(journals)
  const suite = join(dir, 'nightly.yaml')
  writeFileSync(
    suite,
    [
      'name: nightly',
      'scenarios:',
      '  - {name: stall-kv gpu1, fault: stall-kv, params: {gpu: 1}, pins: 2}',
      'load: {intervalMs: 0}',
      'stop: {kernelXid: false}',
      '',
    ].join('\n'),
  )
  for (let night = 0; night < NIGHTS; night++) {
    await simUp(night * STEP_MS)
    const journal = join(journals, `night-${String(night).padStart(2, '0')}.json`)
    const r = await runCli(['suite', suite, '--sim', '--journal', journal], {
      timeoutMs: 90_000,
      env: {PDCHAOS_SIM_DIR: twinDir},
    })
    // 0 while the evictions land in the window, 1 once the drift has crossed deadline + poll: both are nights to trend.
    expect([0, 1], r.stderr).toContain(r.code)
    await simDown()
  }
}, 600_000)

afterAll(async () => {
  await simDown()
  if (dir) rmSync(dir, {recursive: true, force: true})
})

describe('report --trend over ten nights of a watchdog drifting late', () => {
  it('names the fall of the late margin, in text and JSON', async () => {
    console.log(`ten twin nights took ${((Date.now() - started) / 1000).toFixed(0)} s`)
    const text = await runCli(['report', '--trend', journals], {timeoutMs: 60_000})
    expect(text.code, text.stderr).toBe(0)
    console.log(text.stdout)
    const drift = /stall-kv gpu1: late margin fell from -?\d+ ms to -?\d+ ms over 10 runs/
    const line = text.stdout.split('\n').find(l => drift.test(l))
    expect(line, text.stdout).toBeDefined()
    const [, from, to] = /fell from (-?\d+) ms to (-?\d+) ms/.exec(line!)!
    // Ten steps of 100 ms: the fitted line falls by about 900 ms (the tick phase adds noise of up to a poll).
    expect(Number(from) - Number(to)).toBeGreaterThan(450)
    expect(Number(from) - Number(to)).toBeLessThan(1400)
    // A margin that grew (to the deadline) is not drift towards a bound.
    expect(text.stdout).not.toMatch(/early margin fell/)
    expect(text.stdout).toMatch(/stall-kv gpu1 eviction +[PFU]{10}/)

    const json = await runCli(['report', '--trend', journals, '--json'], {timeoutMs: 60_000})
    type Drifts = Array<{bound: string; scenario: string; fromMs: number; toMs: number}>
    const trend = (JSON.parse(json.stdout) as {trend: {runs: unknown[]; drifts: Drifts}}).trend
    expect(trend.runs).toHaveLength(NIGHTS)
    expect(trend.drifts.map(d => [d.scenario, d.bound])).toEqual([['stall-kv gpu1', 'late']])
  }, 120_000)

  it('renders in headless Chromium, no console error; every eviction a point inside the fitted axis', async () => {
    const page = join(dir, 'trend.html')
    const r = await runCli(['report', '--trend', journals, '--html', page], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(0)
    const html = readFileSync(page, 'utf8')
    expect(html).not.toMatch(/<script|<link|<img|<iframe|src=|@import|url\(/i)
    const chromium = ensureTool('chromium', 'chromium')
    const browse = (file: string, name: string) =>
      spawnSync(
        chromium,
        [
          '--headless',
          '--no-sandbox',
          '--disable-gpu',
          '--disable-quic',
          '--no-first-run',
          '--disable-background-networking',
          '--disable-component-update',
          '--disable-sync',
          `--user-data-dir=${join(dir, `profile-${name}`)}`,
          '--enable-logging=stderr',
          '--v=0',
          '--dump-dom',
          pathToFileURL(file).href,
        ],
        {encoding: 'utf8', timeout: 60_000, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024},
      )
    // The console check sees a console error where there is one (else "no error" would prove nothing).
    const control = join(dir, 'control.html')
    writeFileSync(control, '<!DOCTYPE html><html><body><script>console.error("control error")</script></body></html>')
    expect(browse(control, 'control').stderr).toMatch(/CONSOLE.*control error/)

    const b = browse(page, 'trend')
    expect(b.status, b.stderr.slice(-500)).toBe(0)
    expect(b.stderr).not.toMatch(/CONSOLE/)
    const dom = b.stdout
    // The DOM as Chromium parsed it: one plot, two points (early and late margin) per eviction, each inside the axis.
    const plots = [...dom.matchAll(/<svg[^>]*class="trend-plot"[^>]*>/g)].map(m => m[0])
    expect(plots).toHaveLength(1)
    const attrOf = (tag: string, name: string) => Number(new RegExp(`${name}="(-?[\\d.]+)"`).exec(tag)![1])
    const yMin = attrOf(plots[0]!, 'data-y-min')
    const yMax = attrOf(plots[0]!, 'data-y-max')
    const points = [...dom.matchAll(/<circle class="pt (early|late)"[^>]*>/g)].map(m => ({
      bound: m[1],
      run: attrOf(m[0], 'data-run'),
      ms: attrOf(m[0], 'data-ms'),
      cy: attrOf(m[0], 'cy'),
    }))
    const json = await runCli(['report', '--trend', journals, '--json'], {timeoutMs: 60_000})
    const evictions = JSON.parse(json.stdout).trend.margins[0].runs.reduce(
      (n: number, run: {margins: unknown[]}) => n + run.margins.length,
      0,
    ) as number
    expect(evictions).toBeGreaterThanOrEqual(NIGHTS)
    expect(points.filter(p => p.bound === 'late')).toHaveLength(evictions)
    expect(points.filter(p => p.bound === 'early')).toHaveLength(evictions)
    expect(new Set(points.map(p => p.run)).size).toBe(NIGHTS)
    const values = points.map(p => p.ms)
    const lo = Math.min(0, ...values)
    const hi = Math.max(0, ...values)
    // The axis holds every point and the bound, and is fitted to them: at most 10 % of the data's span more each side.
    expect(yMin).toBeLessThanOrEqual(lo)
    expect(yMax).toBeGreaterThanOrEqual(hi)
    expect(lo - yMin).toBeLessThanOrEqual(Math.max(10, (hi - lo) * 0.1))
    expect(yMax - hi).toBeLessThanOrEqual(Math.max(10, (hi - lo) * 0.1))
    // Drawn inside the plot's box (y from 30 to 250).
    for (const p of points) {
      expect(p.cy).toBeGreaterThanOrEqual(30)
      expect(p.cy).toBeLessThanOrEqual(250)
    }
    // The later a night, the lower its late points: the drift is visible (a smaller margin is lower: a larger cy).
    const meanCy = (run: number) => {
      const cys = points.filter(p => p.bound === 'late' && p.run === run).map(p => p.cy)
      return cys.reduce((a, c) => a + c, 0) / cys.length
    }
    expect(meanCy(NIGHTS - 1)).toBeGreaterThan(meanCy(0))
    expect(dom).toMatch(/late margin fell from/)
    expect(existsSync(page)).toBe(true)
  }, 180_000)

  it('refuses what a trend cannot use: exit 2, one line, a suggestion', async () => {
    const empty = join(dir, 'empty')
    mkdirSync(empty)
    const none = await runCli(['report', '--trend', empty], {timeoutMs: 30_000})
    expect(none.code).toBe(2)
    expect(none.stderr).toMatch(/holds no journal/)
    expect(none.stderr).toMatch(/Try this/i)
    expect(none.stderr).not.toMatch(/\n\s+at /)
    const junit = await runCli(['report', '--trend', journals, '--junit', join(dir, 'j.xml')], {timeoutMs: 30_000})
    expect(junit.code).toBe(2)
    expect(junit.stderr).toMatch(/--junit does not apply to --trend/)
  })
})
