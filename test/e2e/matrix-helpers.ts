import {existsSync, mkdtempSync, readFileSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterEach} from 'vitest'

import {createTestHost, type SimUpOptions, type TestHost} from '../harness/test-host.js'
import {runCli} from './cli.js'

/**
 * The mutation matrix's twin and experiments (mutation-matrix.system.test.ts: no defect; mutation-defects.system.test.ts and
 * mutation-defects-recovery.system.test.ts: one defect per row). Three files so that the system level's two lanes share them.
 */

export const DEADLINE = 1.5
export const POLL = 0.5
/**
 * The matrix twin's router: retries and circuit breaker as the gateway's defaults, except that an open breaker
 * half-opens after 10 s instead of 60 (a row whose fault fails the steady load opens it, and the next experiment
 * waits for it to close: the breaker is still there and still waited for, just not for a minute).
 */
export const TWIN_ARGS = ['--heartbeat-interval', '2', '--cb-timeout-duration-secs', '10']
/**
 * The matrix twin's layout: 4 GPUs, TP 2 prefill and TP 2 decode. Every defect here is per request, and two ranks per
 * instance keep what TP adds (the all-reduced poll, a GPU that is not rank 0: --gpu 1). Half the processes of the
 * 8-GPU default, whose layout over-ssh.system.test.ts and the README's suite cover.
 */
export const LAYOUT = {gpus: 4, prefillTp: 2, decodeTp: 2}

export interface Outcome {
  code: number | null
  failed: string[]
  unverified: string[]
  /** Every verdict as "check verdict: summary". */
  verdicts: string[]
  all: string
}

/**
 * Twins for one test file: each test's twin is destroyed after it. A twin has served one request (createTestHost
 * warms it): these tests are about verdicts, not cold starts.
 */
export function matrixTwins(): {twin(extra: SimUpOptions, warm?: boolean): Promise<TestHost>; forget(): void} {
  let host: TestHost | undefined
  afterEach(async () => {
    await host?.destroy()
    host = undefined
  }, 60_000)
  return {
    async twin(extra, warm = true) {
      host = await createTestHost({
        twin: {...LAYOUT, deadlineSeconds: DEADLINE, pollSeconds: POLL, args: TWIN_ARGS, ...extra},
        warm,
      })
      return host
    },
    forget() {
      host = undefined
    },
  }
}

export async function inject(h: TestHost, args: string[], deploymentFile = h.deploymentFile): Promise<Outcome> {
  const r = await runCli(['inject', ...args, '-c', deploymentFile, '--json', '--pins', '2', '--load-interval', '400'], {
    timeoutMs: 120_000,
  })
  return outcome(h, r)
}

/** An inject that pdchaos refuses before any verdict: its exit code and its one-line error (with --json). */
export async function injectRefused(
  h: TestHost,
  args: string[],
): Promise<{code: number | null; message: string; suggestion: string}> {
  const r = await runCli(
    ['inject', ...args, '-c', h.deploymentFile, '--json', '--pins', '2', '--load-interval', '400'],
    {timeoutMs: 120_000},
  )
  let j: {error?: {message?: string; suggestions?: string[]}} = {}
  try {
    j = JSON.parse(r.stdout) as typeof j
  } catch {
    /* reported below */
  }
  return {
    code: r.code,
    message: j.error?.message ?? `${r.stdout.slice(0, 300)} ${r.stderr.slice(-300)}`,
    suggestion: (j.error?.suggestions ?? []).join(' '),
  }
}

/** The twin's deployment file without `logs:` (a deployment whose logs pdchaos cannot read), written beside it. */
export function withoutLogs(h: TestHost): string {
  const text = readFileSync(h.deploymentFile, 'utf8').replace(/^ {4}logs:\n {6}file: .*\n/gm, '')
  if (/logs:/.test(text)) throw new Error("the twin's deployment file still names logs")
  const file = join(h.stateDir, 'pdchaos-no-logs.yaml')
  writeFileSync(file, text)
  return file
}

/** The twin's own account of the last moments (its server logs, minus the health and metrics polling). */
function twinLogTail(h: TestHost): string {
  return (['prefill', 'decode'] as const)
    .map(role => {
      const file = join(h.stateDir, 'logs', `${role}.log`)
      const lines = existsSync(file)
        ? readFileSync(file, 'utf8')
            .split('\n')
            .filter(l => l && !/GET \/(health|metrics|v1\/loads)/.test(l))
        : []
      return `${role}.log: ${lines.slice(-6).join(' | ')}`
    })
    .join('\n')
}

function outcome(h: TestHost, r: {code: number | null; stdout: string; stderr: string}): Outcome {
  let j: {verdicts?: Array<{verdict: string; check: string; summary: string}>; error?: {message: string}} = {}
  try {
    j = JSON.parse(r.stdout) as typeof j
  } catch {
    /* not JSON: reported below */
  }
  // An error instead of verdicts is not a verdict: fail the test with what pdchaos said, and what the twin saw.
  if (!j.verdicts)
    throw new Error(
      `pdchaos exited ${r.code} without ` +
        `verdicts: ${j.error?.message ?? r.stdout.slice(0, 300)} ${r.stderr.slice(-300)}\n${twinLogTail(h)}`,
    )
  const of = (want: string) => j.verdicts!.filter(v => v.verdict === want).map(v => `${v.check}: ${v.summary}`)
  return {
    code: r.code,
    failed: of('fail'),
    unverified: of('unverified'),
    verdicts: j.verdicts.map(v => `${v.check} ${v.verdict}: ${v.summary}`),
    all: r.stdout,
  }
}

export async function restart(h: TestHost, services: string[] = []): Promise<Outcome> {
  const r = await runCli(
    [
      'restart',
      '-c',
      h.deploymentFile,
      '--json',
      '--watch',
      '3',
      '--settle',
      '3',
      '--health-timeout',
      '60',
      ...services.flatMap(s => ['--service', s]),
    ],
    {timeoutMs: 180_000},
  )
  return outcome(h, r)
}

/** One scenario of a suite run: its verdicts ("check verdict: summary") and its abort trials (the journal's). */
export interface SuiteScenarioOutcome {
  failed: string[]
  unverified: string[]
  verdicts: string[]
  aborts: Array<{rid: string; outcome: string; inWindow: boolean; releasedBy?: {path: string}; entry?: {shown: string}}>
}

/** A suite of the given scenarios (YAML `scenarios:` entries) against the twin; each scenario's outcome, by name. */
export async function suite(
  h: TestHost,
  scenarios: Array<Record<string, unknown>>,
): Promise<{code: number | null; scenarios: Record<string, SuiteScenarioOutcome>}> {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-matrix-suite-'))
  const file = join(dir, 'suite.json')
  const journal = join(dir, 'journal.json')
  // JSON is YAML: the suite file as the schema takes it, steady load as inject's rows send it.
  writeFileSync(file, JSON.stringify({name: 'matrix', scenarios, load: {intervalMs: 400}}))
  const r = await runCli(['suite', file, '-c', h.deploymentFile, '--json', '--journal', journal], {timeoutMs: 300_000})
  if (!existsSync(journal))
    throw new Error(
      `pdchaos suite exited ${r.code} without a ` +
        `journal: ${r.stdout.slice(0, 300)} ${r.stderr.slice(-300)}\n${twinLogTail(h)}`,
    )
  const j = JSON.parse(readFileSync(journal, 'utf8')) as {
    scenarios: Array<{
      name: string
      verdicts: Array<{verdict: string; check: string; summary: string}>
      aborts?: SuiteScenarioOutcome['aborts']
    }>
  }
  const out: Record<string, SuiteScenarioOutcome> = {}
  for (const s of j.scenarios) {
    const of = (want: string) => s.verdicts.filter(v => v.verdict === want).map(v => `${v.check}: ${v.summary}`)
    out[s.name] = {
      failed: of('fail'),
      unverified: of('unverified'),
      verdicts: s.verdicts.map(v => `${v.check} ${v.verdict}: ${v.summary}`),
      aborts: s.aborts ?? [],
    }
  }
  return {code: r.code, scenarios: out}
}
