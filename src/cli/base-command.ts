import {Command, Flags, type Interfaces} from '@oclif/core'

import {errorDocument, isExitRequest, writeError} from './error-output.js'
import {spinnable, startSpinner} from './spinner.js'
import {type StopSignal, type StopSignalOptions, withStopSignal} from './stop-signal.js'

export type BaseFlags<T extends typeof Command> = Interfaces.InferredFlags<
  (typeof BaseCommand)['baseFlags'] & T['flags']
>
export type BaseArgs<T extends typeof Command> = Interfaces.InferredArgs<T['args']>

/**
 * Every pdchaos command: --json discipline (stdout holds one JSON document and nothing else),
 * the README's exit codes also under --json, one-line errors with a suggestion, spinners on a TTY only.
 */
export abstract class BaseCommand<T extends typeof Command> extends Command {
  static override enableJsonFlag = true

  static override baseFlags = {
    verbose: Flags.boolean({helpGroup: 'GLOBAL', summary: 'Show stack traces and debug detail on errors.'}),
  }

  protected flags!: BaseFlags<T>
  protected args!: BaseArgs<T>
  /** Every positional argument, in order (a command with `strict = false` takes any number, `report JOURNAL...`). */
  protected positionals: string[] = []

  public override async init(): Promise<void> {
    await super.init()
    const {args, argv, flags} = await this.parse({
      args: this.ctor.args,
      baseFlags: (super.ctor as typeof BaseCommand).baseFlags,
      enableJsonFlag: this.ctor.enableJsonFlag,
      flags: this.ctor.flags,
      strict: this.ctor.strict,
    })
    this.flags = flags as BaseFlags<T>
    this.args = args as BaseArgs<T>
    this.positionals = argv as string[]
  }

  /** The run's stop while inside withStopSignal: every phase of the command honours it (withTarget passes it on). */
  protected stopSignal?: AbortSignal
  /** Its stop from another source than a signal (a halt noticed on a host: src/halt/watch.ts). */
  protected stopRun?: (reason: string) => void

  /**
   * Run fn with SIGINT and SIGTERM stopping it (cli/stop-signal.ts): its signal is `this.stopSignal` meanwhile, so
   * resolving the target, the health checks and the run all end within a second of it (exit 3).
   */
  protected async withStopSignal<R>(fn: (stop: StopSignal) => Promise<R>, o: StopSignalOptions = {}): Promise<R> {
    return withStopSignal(async stop => {
      this.stopSignal = stop.signal
      this.stopRun = stop.stop
      try {
        return await fn(stop)
      } finally {
        this.stopSignal = undefined
        this.stopRun = undefined
      }
    }, o)
  }

  /** A spinner on stderr when it is a TTY and not --json; undefined otherwise. */
  protected spinner(text: string): {stop(): void} | undefined {
    return spinnable() && !this.jsonEnabled() ? startSpinner(text) : undefined
  }

  /** A progress line on stderr (never stdout, which belongs to results). Quiet under --json. */
  protected progress(line: string): void {
    if (!this.jsonEnabled()) process.stderr.write(line + '\n')
  }

  protected override async catch(
    err: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string},
  ): Promise<unknown> {
    // this.exit(n) is a request, not an error: oclif turns it into the exit code.
    if (isExitRequest(err)) return super.catch(err)
    // Every other error, PdError or oclif's own (a parse error) or unexpected (exit 5), the same way: one line, a
    // suggestion, --json's document with a code, the stack only with --verbose.
    writeError(errorDocument(err, this.id?.replaceAll(':', ' ')), {
      json: this.jsonEnabled(),
      verbose: Boolean(this.flags?.verbose),
      stack: err.stack,
    })
    // A parse error was reported above: oclif must not also warn that the command never parsed its arguments.
    this.parsed = true
    return undefined
  }

  protected override toErrorJson(err: unknown): unknown {
    return errorDocument(err, this.id?.replaceAll(':', ' '))
  }
}
