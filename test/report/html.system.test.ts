import {spawnSync} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {pathToFileURL} from 'node:url'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {checkEvictions} from '../../src/checks/eviction.js'
import type {Observation} from '../../src/model/timeline.js'
import {renderHtml} from '../../src/report/html.js'
import type {SuiteRun} from '../../src/model/run.js'
import {decodePng, distinctColours, inkShare, pixelsNear, type Image} from './png.js'
import {syntheticRun, T0} from './synthetic-run.js'
import {TIMEOUTS_READ} from '../checks/synthetic.js'
import {ensureTool} from './tools.js'

const RED: [number, number, number] = [0xd6, 0x27, 0x28]
const GREEN: [number, number, number] = [0x2c, 0xa0, 0x2c]
let dir: string
let chromium: string

beforeAll(() => {
  chromium = ensureTool('chromium', 'chromium')
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-html-'))
}, 300_000)
afterAll(() => {
  if (dir) rmSync(dir, {recursive: true, force: true})
})

/** Render a page in real headless Chromium (a fresh profile each time) and decode the screenshot. */
function screenshot(html: string, name: string): Image {
  const page = join(dir, `${name}.html`)
  const png = join(dir, `${name}.png`)
  writeFileSync(page, html)
  const r = spawnSync(
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
      `--screenshot=${png}`,
      '--window-size=1400,2000',
      pathToFileURL(page).href,
    ],
    {encoding: 'utf8', timeout: 60_000, killSignal: 'SIGKILL'},
  )
  if (!existsSync(png))
    throw new Error(`chromium wrote no screenshot (exit ${r.status}, signal ${r.signal}): ${r.stderr.slice(-500)}`)
  return decodePng(readFileSync(png))
}

describe('renderHtml', () => {
  it('is self-contained: no external resource, no script, every verdict with its evidence folded', () => {
    const run = syntheticRun({failing: true})
    const html = renderHtml(run)
    // The only URL is the SVG namespace, which is a name, not a fetch.
    const urls = [...html.matchAll(/(?:https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}[^"'\s<)]*/gi)].map(m => m[0])
    expect(urls.every(u => u === 'http://www.w3.org/2000/svg')).toBe(true)
    expect(html).not.toMatch(/<script|<link|<img|<iframe|src=|@import|url\(/i)
    expect(html).not.toContain('\u0001')
    expect(html).toContain('rid &lt;script&gt;alert("x")&lt;/script&gt; &amp;')
    const verdicts = run.scenarios.reduce((n, s) => n + s.verdicts.length, 0)
    expect(html.match(/<details>/g)?.length).toBe(verdicts)
    expect(html.match(/<svg /g)?.length).toBe(3)
    // The header names the failed check with its summary.
    expect(html).toMatch(
      /Failed checks \(1\)<\/h2><ul class="failed"><li><b>drop-dest-info<\/b> · eviction · .*never evicted: still held after 3\.800s/,
    )
  })

  it('renders in headless Chromium: a failing pin shows red where an all-passing run shows almost none', () => {
    const failing = screenshot(renderHtml(syntheticRun({failing: true})), 'failing')
    const passing = screenshot(renderHtml(syntheticRun({failing: false})), 'passing')
    for (const img of [failing, passing]) {
      expect([img.width, img.height]).toEqual([1400, 2000])
      expect(distinctColours(img)).toBeGreaterThan(50)
      const ink = inkShare(img)
      expect(ink).toBeGreaterThan(0.05)
      expect(ink).toBeLessThan(0.6)
      // Green pins are drawn in both.
      expect(pixelsNear(img, GREEN)).toBeGreaterThan(3000)
    }
    const redFailing = pixelsNear(failing, RED)
    const redPassing = pixelsNear(passing, RED)
    console.log(
      `red pixels: failing ${redFailing}, passing ${redPassing}; ` +
        `colours ${distinctColours(failing)}/${distinctColours(passing)}`,
    )
    // The passing run carries red only in the legend swatches; the failing one adds the never-evicted bar, its arrow,
    // the badges.
    expect(redFailing).toBeGreaterThan(3 * redPassing + 3000)
  }, 150_000)

  it(
    'a scenario of 1,000 pins stays bounded: failures drawn first, the rest counted, every verdict in the ' + 'table',
    () => {
      const contract = {scope: 'all' as const, deadlineSeconds: 2, pollSeconds: 0.5}
      const obs: Observation[] = [
        {kind: 'fault-injected', t: T0, fault: 'drop-dest-info', leaseId: 'L', verified: true, evidence: ''},
      ]
      for (let i = 0; i < 1000; i++) {
        const t = T0 + 100 + i
        obs.push({
          kind: 'request-sent',
          t,
          rid: `pin-${i}`,
          role: 'pin',
          fault: 'drop-dest-info',
          expectedState: {queue: 'bootstrap', kvPoll: 'Bootstrapping'},
        })
        if (i % 250 !== 7) obs.push({kind: 'request-answered', t: t + 2100, rid: `pin-${i}`, status: 500})
      }
      obs.push({
        kind: 'fault-reverted',
        t: T0 + 4000,
        fault: 'drop-dest-info',
        leaseId: 'L',
        verifiedClean: true,
        evidence: '',
      })
      obs.sort((a, b) => a.t - b.t)
      const timeline = {
        contract,
        calibration: {prefillMs: 40, prefillSpreadMs: 6, observeMs: 3, samples: 20},
        observations: obs,
      }
      const {verdicts, pins} = checkEvictions(timeline, TIMEOUTS_READ)
      expect(pins.filter(p => p.verdict === 'fail')).toHaveLength(4)
      const run: SuiteRun = {
        name: 'big',
        startedAt: T0,
        finishedAt: T0 + 5000,
        deployment: 'twin',
        scenarios: [
          {
            name: 'many pins',
            kind: 'inject',
            fault: 'drop-dest-info',
            startedAt: T0,
            finishedAt: T0 + 5000,
            verdicts,
            pins,
            leases: [],
            timeline,
            contract,
          },
        ],
      }
      const html = renderHtml(run, {maxPinRows: 120})
      expect(html.match(/<g class="pin /g)?.length).toBe(120)
      expect(html.match(/<g class="pin fail"/g)?.length).toBe(4)
      expect(html).toContain('880 more passing pins not drawn')
      expect(html.match(/<details>/g)?.length).toBe(1000)
      expect(html.length).toBeLessThan(3_000_000)
    },
  )
})
