import type {ClientChannel, Client as ClientType} from 'ssh2'

import {PdError, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {stoppedError} from '../util/stop.js'
import type {RunOptions, RunResult} from './host.js'
import {describeArgv} from './quote.js'

/** Attempts at opening a channel that sshd refused for want of a free session. */
const OPEN_RETRIES = 5

/** One live ssh connection (and the jump connection under it, if any). */
export interface Connection {
  client: ClientType
  jump?: ClientType
  alive: boolean
  /** Called with the reason when the connection drops under running commands. */
  inflight: Set<(err: PdError) => void>
}

/** What one remote command needs of the SshHost it runs on. */
export interface ChannelHost {
  describe(): string
  /** The live connection, opened (again) when there is none. */
  connection(): Promise<Connection>
  /** A channel slot; the function returned gives it back. */
  acquireSlot(): Promise<() => void>
  /** Kill the command's process group on the host, bounded in time. */
  killRemote(pid: number, sudo: boolean | undefined): Promise<void>
}

/**
 * Run `line` (which prints the shell's pid first) on a channel of the host's connection: open the channel, stream
 * its output, and end it at its deadline or when stopped. useSlot=false skips the channel slots (for the kill).
 */
export function runOnChannel(
  host: ChannelHost,
  argv: string[],
  line: string,
  opts: RunOptions,
  useSlot: boolean,
): Promise<RunResult> {
  return new Promise<RunResult>((resolve, reject) => {
    new RemoteCommand(host, argv, line, opts, useSlot, resolve, reject).begin()
  })
}

/** One command's life on a channel: open (with retries), stream, deadline, abort/stop, settle once. */
class RemoteCommand {
  private settled = false
  private release: (() => void) | undefined
  private conn: Connection | undefined
  private channel: ClientChannel | undefined
  private pid: number | undefined
  private timedOut = false
  private timer: NodeJS.Timeout | undefined
  private readonly where: string
  private readonly started = performance.now()

  constructor(
    private readonly host: ChannelHost,
    private readonly argv: string[],
    private readonly line: string,
    private readonly opts: RunOptions,
    private readonly useSlot: boolean,
    private readonly resolve: (res: RunResult) => void,
    private readonly reject: (err: Error) => void,
  ) {
    this.where = host.describe()
  }

  begin(): void {
    this.timer = setTimeout(() => this.deadline(), this.opts.timeoutMs)
    const signal = this.opts.signal
    if (signal?.aborted) queueMicrotask(this.onAbort)
    else signal?.addEventListener('abort', this.onAbort, {once: true})
    this.start(0).catch((e: unknown) => this.finish(this.lostConnection(e)))
  }

  private readonly onDrop = (err: PdError): void =>
    this.finish(
      new PdError(`${err.message} while running \`${describeArgv(this.argv)}\``, {
        exit: ExitCode.unreachable,
        suggestion: err.suggestion,
      }),
    )

  private readonly onAbort = (): void => {
    this.timedOut = true
    const what = `\`${describeArgv(this.argv)}\` on ${this.where} (the remote command was killed)`
    this.end(stoppedError(this.opts.signal!, what))
  }

  private finish(err?: Error, res?: RunResult): void {
    if (this.settled) return
    this.settled = true
    clearTimeout(this.timer)
    this.opts.signal?.removeEventListener('abort', this.onAbort)
    this.release?.()
    this.conn?.inflight.delete(this.onDrop)
    if (err) this.reject(err)
    else this.resolve(res!)
  }

  /** At its deadline, or stopped (SIGINT): the remote group is killed, so nothing the command started runs on. */
  private end(err: PdError): void {
    const pid = this.pid
    const killing =
      pid !== undefined && this.conn?.alive ? this.host.killRemote(pid, this.opts.sudo) : Promise.resolve()
    killing.finally(() => {
      try {
        this.channel?.close()
      } catch {
        /* already closed */
      }
      this.finish(err)
    })
  }

  private deadline(): void {
    this.timedOut = true
    const what = `\`${describeArgv(this.argv)}\` timed out after ${this.opts.timeoutMs} ms on ${this.where}`
    const err = this.channel
      ? new PdError(`${what}; the remote command was killed`, {
          exit: ExitCode.unreachable,
          suggestion: 'raise the timeout or find out why the command hangs on the host',
        })
      : new PdError(`${what} before it started (connecting or queued behind other commands)`, {
          exit: ExitCode.unreachable,
          suggestion: 'raise the timeout, or check the network path and how many commands run at once',
        })
    this.end(err)
  }

  private async start(attempt: number): Promise<void> {
    const conn = await this.host.connection()
    this.conn = conn
    if (!this.release) this.release = this.useSlot ? await this.host.acquireSlot() : () => undefined
    if (this.settled) {
      this.release()
      return
    }
    conn.inflight.add(this.onDrop)
    conn.client.exec(this.line, (err, ch) => {
      if (this.settled) {
        ch?.close()
        return
      }
      if (err) this.openFailed(conn, attempt, err)
      else this.stream(ch)
    })
  }

  /** The channel did not open: reconnect once, back off while sshd is short of sessions, or fail. */
  private openFailed(c: Connection, attempt: number, err: Error): void {
    c.inflight.delete(this.onDrop)
    // The command never started: when the connection died under us, open a new one once.
    if (!c.alive && attempt === 0) {
      this.start(1).catch((e: unknown) => this.finish(this.lostConnection(e)))
      return
    }
    // sshd refuses a session while it still counts ones just closed (MaxSessions): a short backoff, a few times.
    if (c.alive && attempt < OPEN_RETRIES && /open failed/i.test(err.message)) {
      this.release?.()
      this.release = undefined
      setTimeout(
        () => {
          this.start(attempt + 1).catch((e: unknown) => this.finish(this.lostConnection(e)))
        },
        25 * 2 ** attempt,
      )
      return
    }
    this.finish(
      new PdError(`cannot open a channel on ${this.where}: ${oneLine(err)}`, {
        exit: ExitCode.unreachable,
        suggestion: "check MaxSessions in sshd_config and the host's load",
      }),
    )
  }

  /** Collect stdout (after the pid line) and stderr; settle with the exit status when the channel closes. */
  private stream(ch: ClientChannel): void {
    this.channel = ch
    const out: Buffer[] = []
    const errChunks: Buffer[] = []
    let head = Buffer.alloc(0)
    let code: number | null = null
    let signal: string | undefined
    ch.on('data', (chunk: Buffer) => {
      if (this.pid !== undefined) {
        out.push(chunk)
        return
      }
      head = Buffer.concat([head, chunk])
      const nl = head.indexOf(10)
      if (nl < 0) return
      this.pid = Number.parseInt(head.subarray(0, nl).toString('latin1'), 10)
      out.push(head.subarray(nl + 1))
    })
    ch.stderr.on('data', (chunk: Buffer) => errChunks.push(chunk))
    ch.on('exit', (exitCode: number | null, sig?: string) => {
      code = typeof exitCode === 'number' ? exitCode : null
      if (sig) signal = sig.startsWith('SIG') ? sig : `SIG${sig}`
    })
    ch.on(
      'close',
      () =>
        this.timedOut ||
        this.finish(undefined, {
          code,
          ...(signal ? {signal} : {}),
          stdout: Buffer.concat(out).toString('utf8'),
          stderr: Buffer.concat(errChunks).toString('utf8'),
          durationMs: performance.now() - this.started,
        }),
    )
    ch.on('error', (e: Error) =>
      this.finish(new PdError(`channel error on ${this.where}: ${oneLine(e)}`, {exit: ExitCode.unreachable})),
    )
    if (this.opts.stdin !== undefined) ch.end(this.opts.stdin)
    else ch.end()
  }

  /** ssh2 throws synchronously ("Not connected") when the connection died between commands: still exit 5, one line. */
  private lostConnection(e: unknown): Error {
    if (e instanceof PdError) return e
    const what = `\`${describeArgv(this.argv)}\``
    return new PdError(`lost the connection to ${this.where} before ${what} could start: ${oneLine(e)}`, {
      exit: ExitCode.unreachable,
      suggestion: 'check that sshd on the host is up and reachable',
    })
  }
}
