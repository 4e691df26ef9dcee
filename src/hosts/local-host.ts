import {openSync, closeSync} from 'node:fs'
import {type ChildProcessWithoutNullStreams, spawn} from 'node:child_process'

import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {stoppedError} from '../util/stop.js'
import {within} from '../util/time.js'
import {
  DETACH_SCRIPT,
  UPLOAD_SCRIPT,
  buildArgv,
  checkTimeout,
  envPrefix,
  modeString,
  sudoPrefix,
  type DetachedOptions,
  type Host,
  type RunOptions,
  type RunResult,
  type SudoPolicy,
  type UploadOptions,
} from './host.js'
import {describeArgv} from './quote.js'

/** After a kill, how long to wait for the pipes to close before giving up on the process's output. */
const REAP_MS = 2000
/** The most output kept of one command (each stream); more is dropped, as no remote read needs it. */
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024

/** This machine as a Host: argv is exec'd directly (no shell), each command in its own process group. */
export class LocalHost implements Host {
  private readonly isRoot = typeof process.getuid === 'function' && process.getuid() === 0

  constructor(private readonly sudoPolicy: SudoPolicy = 'never') {}

  describe(): string {
    return 'local'
  }

  async run(argv: string[], opts: RunOptions): Promise<RunResult> {
    checkTimeout(opts.timeoutMs)
    const full = buildArgv(argv, opts, this.sudoPolicy, this.isRoot)
    const started = performance.now()
    // node:child_process, not a wrapper: a run makes a hundred of these, and each costs the CLI's own CPU.
    // detached: the child leads its own process group, so a timeout kills everything it started.
    let child: ChildProcessWithoutNullStreams
    try {
      child = spawn(full[0]!, full.slice(1), {detached: true, stdio: ['pipe', 'pipe', 'pipe']})
    } catch (error) {
      // Refused before it ran (an argument list the kernel will not take: E2BIG): a result, as a shell would say.
      const errno = (error as NodeJS.ErrnoException).code ?? 'EINVAL'
      return {
        code: errno === 'ENOENT' ? 127 : 126,
        stdout: '',
        stderr: `pdchaos: ${full[0]}: ${errno}\n`,
        durationMs: performance.now() - started,
      }
    }
    const out = collect(child.stdout)
    const err = collect(child.stderr)
    child.stdin.on('error', () => undefined) // a command that does not read its input closes it early
    child.stdin.end(opts.stdin ?? '')
    const ended = new Promise<{code: number | null; signal: NodeJS.Signals | null; errno?: string}>(resolve => {
      child.once('error', (e: NodeJS.ErrnoException) => resolve({code: null, signal: null, errno: e.code ?? 'EIO'}))
      child.once('close', (code, signal) => resolve({code, signal}))
    })
    let timer: NodeJS.Timeout | undefined
    let onAbort: (() => void) | undefined
    const expired = new Promise<'timeout' | 'stopped'>(resolve => {
      timer = setTimeout(() => {
        killGroup(child.pid)
        resolve('timeout')
      }, opts.timeoutMs)
      // Stopped (SIGINT): the command's group is killed as at its deadline, and nothing it started is left running.
      onAbort = () => {
        killGroup(child.pid)
        resolve('stopped')
      }
      if (opts.signal?.aborted) onAbort()
      else opts.signal?.addEventListener('abort', onAbort, {once: true})
    })
    try {
      const result = await Promise.race([ended, expired])
      if (result === 'stopped') {
        await within(ended, REAP_MS)
        throw stoppedError(opts.signal!, `\`${describeArgv(argv)}\` on local (its process group was killed)`)
      }
      if (result === 'timeout') {
        await within(ended, REAP_MS)
        throw new PdError(
          `\`${describeArgv(argv)}\` timed out after ${opts.timeoutMs} ms on local; its process group was killed`,
          {
            exit: ExitCode.unreachable,
            suggestion: 'raise the timeout or find out why the command hangs',
          },
        )
      }
      const durationMs = performance.now() - started
      if (result.errno !== undefined) {
        // exec itself failed (ENOENT, EACCES): report it the way a shell would, as a result.
        return {
          code: result.errno === 'ENOENT' ? 127 : 126,
          stdout: '',
          stderr: `pdchaos: ${full[0]}: ${result.errno}\n`,
          durationMs,
        }
      }
      return {
        code: result.code,
        ...(result.signal ? {signal: result.signal} : {}),
        stdout: out.text(),
        stderr: err.text(),
        durationMs,
      }
    } finally {
      clearTimeout(timer)
      if (onAbort) opts.signal?.removeEventListener('abort', onAbort)
    }
  }

  async upload(path: string, content: string | Buffer, mode = 0o644, opts: UploadOptions = {}): Promise<void> {
    const argv = [
      ...sudoPrefix(opts.sudo, this.sudoPolicy, this.isRoot),
      'sh',
      '-c',
      UPLOAD_SCRIPT,
      'sh',
      path,
      modeString(mode),
    ]
    const res = await this.run(argv, {timeoutMs: opts.timeoutMs ?? 30_000, stdin: content})
    if (res.code !== 0) {
      throw new PdError(`cannot write ${path} on local: ${res.stderr.trim() || `exit ${res.code}`}`, {
        exit: ExitCode.unreachable,
        suggestion: 'check the directory exists and is writable (or use sudo)',
      })
    }
  }

  async startDetached(argv: string[], opts: DetachedOptions = {}): Promise<{pid: number}> {
    if (opts.sudo && !this.isRoot && this.sudoPolicy === 'passwordless') {
      // Through sudo the session must be made on the far side of sudo: reuse the shell recipe.
      const res = await this.run(
        ['sh', '-c', DETACH_SCRIPT, 'sh', opts.logFile ?? '/dev/null', ...envPrefix(opts.env), ...argv],
        {
          timeoutMs: opts.timeoutMs ?? 30_000,
          sudo: true,
        },
      )
      return {pid: parsePid(res, argv, 'local')}
    }
    const full = [...envPrefix(opts.env), ...argv]
    const fd = openSync(opts.logFile ?? '/dev/null', 'a')
    try {
      const child = spawn(full[0]!, full.slice(1), {detached: true, stdio: ['ignore', fd, fd]})
      const pid = await new Promise<number>((resolve, reject) => {
        child.once('error', reject)
        child.once('spawn', () => resolve(child.pid!))
      }).catch((err: unknown) => {
        throw new PdError(`cannot start \`${describeArgv(argv)}\` on local: ${(err as Error).message}`, {
          exit: ExitCode.unreachable,
        })
      })
      child.unref()
      return {pid}
    } finally {
      closeSync(fd)
    }
  }

  async close(): Promise<void> {}
}

/** A stream's bytes as UTF-8 text, at most MAX_OUTPUT_BYTES of them. */
function collect(stream: NodeJS.ReadableStream): {text: () => string} {
  const chunks: Buffer[] = []
  let bytes = 0
  stream.on('data', (c: Buffer) => {
    if (bytes >= MAX_OUTPUT_BYTES) return
    chunks.push(c)
    bytes += c.length
  })
  return {text: () => Buffer.concat(chunks).toString('utf8')}
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return
  try {
    process.kill(-pid, 'SIGKILL')
  } catch {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {
      /* already gone */
    }
  }
}

export function parsePid(res: RunResult, argv: string[], where: string): number {
  const pid = Number.parseInt(res.stdout.trim(), 10)
  if (res.code !== 0 || !Number.isInteger(pid) || pid <= 0) {
    throw new PdError(
      `cannot start \`${describeArgv(argv)}\` on ${where}: ${res.stderr.trim() || `exit ${res.code}`}`,
      {
        exit: ExitCode.unreachable,
        suggestion: 'check that setsid and nohup exist on the host',
      },
    )
  }
  return pid
}
