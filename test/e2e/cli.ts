import {spawn, type ChildProcess} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'

import {cliEntry} from '../harness/test-host.js'

/** pdchaos as a user runs it: a subprocess, its exit code, its stdout and stderr, with a deadline. */

export interface CliResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  ms: number
}

export function startCli(args: string[], env: NodeJS.ProcessEnv = {}, asUser?: number): {child: ChildProcess; done: Promise<CliResult>} {
  const started = performance.now()
  const child = spawn(process.execPath, [cliEntry(), ...args], {
    env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1', ...env}, stdio: ['ignore', 'pipe', 'pipe'],
    ...(asUser === undefined ? {} : {uid: asUser, gid: asUser}),
  })
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d: Buffer) => { stdout += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { stderr += d.toString() })
  const done = new Promise<CliResult>((resolve) => {
    child.on('close', (code, signal) => resolve({code, signal, stdout, stderr, ms: performance.now() - started}))
  })
  return {child, done}
}

export async function runCli(args: string[], opts: {timeoutMs?: number; env?: NodeJS.ProcessEnv; asUser?: number} = {}): Promise<CliResult> {
  const {child, done} = startCli(args, opts.env, opts.asUser)
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000)
  try {
    return await done
  } finally {
    clearTimeout(timer)
  }
}

/** The twin's ground truth: every JSON line of one service. */
export function truth(stateDir: string, service: 'prefill' | 'decode' | 'router'): Array<Record<string, unknown>> {
  try {
    return readFileSync(join(stateDir, 'truth', `${service}.jsonl`), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>)
  } catch {
    return []
  }
}
