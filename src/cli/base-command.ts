import {Command, Flags, Interfaces} from '@oclif/core'
import ora, {type Ora} from 'ora'

import {PdError, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'

export type BaseFlags<T extends typeof Command> = Interfaces.InferredFlags<(typeof BaseCommand)['baseFlags'] & T['flags']>
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

  public override async init(): Promise<void> {
    await super.init()
    const {args, flags} = await this.parse({
      args: this.ctor.args,
      baseFlags: (super.ctor as typeof BaseCommand).baseFlags,
      enableJsonFlag: this.ctor.enableJsonFlag,
      flags: this.ctor.flags,
      strict: this.ctor.strict,
    })
    this.flags = flags as BaseFlags<T>
    this.args = args as BaseArgs<T>
  }

  /** A spinner on stderr when it is a TTY and not --json; silent otherwise. */
  protected spinner(text: string): Ora {
    const live = Boolean(process.stderr.isTTY) && !this.jsonEnabled()
    return ora({text, stream: process.stderr, isSilent: !live, isEnabled: live}).start()
  }

  /** A progress line on stderr (never stdout, which belongs to results). Quiet under --json. */
  protected progress(line: string): void {
    if (!this.jsonEnabled()) process.stderr.write(line + '\n')
  }

  protected override async catch(err: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    if (err instanceof PdError) {
      process.exitCode = err.exitCode
      if (this.jsonEnabled()) {
        this.logJson(this.toErrorJson(err))
      } else {
        process.stderr.write(`Error: ${oneLine(err)}\n`)
        if (err.suggestion) process.stderr.write(`Try this: ${err.suggestion}\n`)
        if (this.flags?.verbose && err.stack) process.stderr.write(err.stack + '\n')
      }
      return
    }
    // oclif's own errors (parse errors, this.error) carry their exit in err.oclif.exit.
    if (err.exitCode === undefined && err.oclif?.exit !== undefined) err.exitCode = err.oclif.exit
    const known = err.oclif?.exit !== undefined
    if (!known) {
      // An unexpected failure is infrastructure, not a verdict: exit 5, one line, stack only with --verbose.
      process.exitCode = ExitCode.unreachable
      if (this.jsonEnabled()) {
        this.logJson({error: {code: 'E_INTERNAL', exitCode: ExitCode.unreachable, message: oneLine(err), name: err.name}})
      } else {
        process.stderr.write(`Error: ${oneLine(err)}\n`)
        if (this.flags?.verbose && err.stack) process.stderr.write(err.stack + '\n')
        else process.stderr.write('Try this: re-run with --verbose for details.\n')
      }
      return
    }
    return super.catch(err)
  }

  protected override toErrorJson(err: unknown): unknown {
    const e = err as {code?: string; exitCode?: number; message?: string; name?: string; suggestion?: string; oclif?: {exit?: number}; suggestions?: string[]}
    return {
      error: {
        code: e.code,
        exitCode: e.exitCode ?? e.oclif?.exit ?? 1,
        message: oneLine(e.message ?? String(err)),
        name: e.name,
        suggestions: e.suggestion ? [e.suggestion] : e.suggestions,
      },
    }
  }
}
