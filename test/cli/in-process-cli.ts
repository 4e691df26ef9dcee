import {createRequire} from 'node:module'

import type {CliResult} from '../e2e/cli.js'

/**
 * The built CLI's main run inside this test process: the same argv, environment, stdout, stderr and exit code a
 * subprocess gives, without its start-up (about 0.6 CPU-s of node, oclif, zod and yaml loading per run). For tables of
 * inputs whose process boundary a sample of subprocess runs already covers. Runs one at a time: stdout, stderr, the
 * environment and the exit code are the process's own.
 */

/**
 * Loaded by node itself, not by the test runner, which would load dist/ as a second copy of every module (node 20.19
 * and later require() an ES module without top-level await).
 */
const entry = (): {runMain(argv: string[]): Promise<void>} =>
  createRequire(import.meta.url)('./in-process-entry.mjs') as {runMain(argv: string[]): Promise<void>}

let queue: Promise<unknown> = Promise.resolve()

export function runCliInProcess(
  args: string[],
  opts: {env?: NodeJS.ProcessEnv; timeoutMs?: number} = {},
): Promise<CliResult> {
  const run = queue.then(() => once(args, opts))
  queue = run.catch(() => undefined)
  return run
}

async function once(args: string[], opts: {env?: NodeJS.ProcessEnv; timeoutMs?: number}): Promise<CliResult> {
  const {runMain} = entry()
  const env = {OCLIF_SKIP_NEW_VERSION_CHECK: '1', ...opts.env}
  const savedEnv = Object.fromEntries(Object.keys(env).map(k => [k, process.env[k]]))
  const writes = {stdout: process.stdout.write, stderr: process.stderr.write}
  const out = {stdout: '', stderr: ''}
  const capture = (name: 'stdout' | 'stderr') =>
    ((chunk: string | Uint8Array, ...rest: unknown[]): boolean => {
      out[name] += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString()
      const cb = rest.find(r => typeof r === 'function') as (() => void) | undefined
      cb?.()
      return true
    }) as typeof process.stdout.write
  const savedExit = process.exitCode
  process.exitCode = undefined
  Object.assign(process.env, env)
  process.stdout.write = capture('stdout')
  process.stderr.write = capture('stderr')
  // oclif's flush() leaves a 'drain' listener on stdout each run (a process runs it once): take back what a run adds.
  const drains = new Set(process.stdout.listeners('drain'))
  const started = performance.now()
  let timer: NodeJS.Timeout | undefined
  try {
    await Promise.race([
      runMain(args),
      new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`pdchaos ${args.join(' ')} did not finish within ${opts.timeoutMs} ms`)),
          opts.timeoutMs ?? 60_000,
        )
      }),
    ])
    const code = typeof process.exitCode === 'number' ? process.exitCode : Number(process.exitCode ?? 0)
    return {code, signal: null, stdout: out.stdout, stderr: out.stderr, ms: performance.now() - started}
  } finally {
    clearTimeout(timer)
    process.stdout.write = writes.stdout
    process.stderr.write = writes.stderr
    for (const l of process.stdout.listeners('drain')) if (!drains.has(l)) process.stdout.off('drain', l as () => void)
    process.exitCode = savedExit
    for (const [k, v] of Object.entries(savedEnv)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  }
}
