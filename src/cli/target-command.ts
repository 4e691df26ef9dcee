import {type Command, Flags} from '@oclif/core'

import type {Deployment} from '../deployment/config.js'
import type {DeploymentModel} from '../deployment/model.js'
import type {InstancePair} from '../deployment/single-host.js'
import {assertMayDisturb} from '../deployment/protection.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {runExitCode, runIdOf, type SuiteRun} from '../model/run.js'
import {renderHtml} from '../report/html.js'
import {writeJournal} from '../report/journal.js'
import {failureJournal, runJournal} from '../report/journal-fields.js'
import {renderJUnit} from '../report/junit.js'
import {pushRun} from '../report/push.js'
import {oneLine} from '../errors.js'
import {redactText} from '../util/redact.js'
import {BaseCommand} from './base-command.js'
import {errorDocument} from './error-output.js'
import {targetFlags} from './flags.js'
import {checkOutputFile, checkPushUrl, outputWriter} from './outputs.js'
import {preflight} from './preflight.js'
import type {TwinStart} from './sim-flags.js'
import {closeTarget, everyHostOf, resolveTarget, type Target} from './target.js'
import {onSignalExit} from '../faults/lease/lease-guard.js'
import {throwIfStopped} from '../util/stop.js'
import {type HaltGuard, guardRun} from '../halt/watch.js'
import {haltRecorded, resumeCommand} from './halt-hook.js'

/** Where a run's results go: files, and a Pushgateway URL. */
export interface RunOutputs {
  journal?: string
  junit?: string
  html?: string
  push?: string
}

/**
 * A command that acts on a deployment: it owns the target flags, resolving and closing the target, the production
 * guard, the host's run lock, writing the run's outputs and the exit-code policy, so each command reads as the
 * story of what it does.
 */
export abstract class TargetCommand<T extends typeof Command> extends BaseCommand<T> {
  static readonly targetFlags = {
    ...targetFlags,
    'accept-new-host-key': Flags.boolean({
      helpGroup: 'TARGET',
      summary: 'Trust and record the host key of a host not yet in known_hosts.',
    }),
  }

  /** For commands that change the deployment. */
  static readonly disturbFlags = {
    'allow-production': Flags.boolean({summary: 'Allow acting on a deployment labelled environment: production.'}),
  }

  /**
   * Resolve the target (starting the twin for --sim unless told not to), refuse production unless allowed when the
   * command disturbs it, hold the host's run lock when asked, run fn, and always close the target.
   */
  protected async withTarget<R>(
    opts: {
      startTwin?: boolean
      twin?: TwinStart
      /** What the command does to the deployment, for the production refusal ("inject a fault into"). */
      disturb?: string
      /** The run lock: its command line and TTL (`runLockTtlMs`); held until expiry for --hold. */
      lock?: (target: Target) => {command: string; ttlMs: number; untilExpiry?: boolean}
      say?: (line: string) => void
      /** Checks of the flags against the deployment file (a TTL against its watchdog), before the host is reached. */
      check?: (deployment: Deployment, model: DeploymentModel) => void
      /**
       * Every service must answer its health path within the deployment's probeTimeoutSeconds first (exit 5 naming it);
       * a function gives the views of the other instance pairs the run acts on, whose services are checked too.
       */
      preflight?: boolean | ((target: Target) => Deployment[])
      /** The instance pair a run acts on (--prefill-instance, --decode-instance). */
      pair?: InstancePair
    },
    fn: (target: Target) => Promise<R>,
  ): Promise<R> {
    const flags = this.flags as Record<string, unknown>
    const target = await resolveTarget(flags as never, {
      command: this.id ?? 'pdchaos',
      ...(opts.startTwin === undefined ? {} : {startTwin: opts.startTwin}),
      ...(opts.twin ? {twin: opts.twin} : {}),
      onProgress: opts.say ?? (l => this.progress(l)),
      ...(opts.check ? {check: opts.check} : {}),
      ...(opts.pair ? {pair: opts.pair} : {}),
      ...(this.stopSignal ? {signal: this.stopSignal} : {}),
    })
    const signal = this.stopSignal
    let halt: HaltGuard | undefined
    try {
      if (opts.disturb) assertMayDisturb(target.deployment, Boolean(flags['allow-production']), opts.disturb)
      // A halted deployment (`pdchaos halt`) refuses a run that changes it (exit 2); a halt while it runs stops it.
      if (opts.disturb)
        halt = await guardRun(everyHostOf(target).hosts, {
          resume: resumeCommand(flags, target.file),
          ...(this.stopRun ? {stop: this.stopRun} : {}),
          say: l => this.progress(l),
          ...(signal ? {signal} : {}),
        })
      const others = typeof opts.preflight === 'function' ? opts.preflight(target) : []
      if (opts.preflight) await preflight(target.deployment, others, undefined, signal)
      if (halt) fn = haltRecorded(fn, halt)
      if (!opts.lock) return await fn(target)
      const spec = opts.lock(target)
      // One run lock for the deployment: on every host it spans (each in its own state dir), taken in the file's
      // order, whichever instances the run acts on; one that is held elsewhere releases those already taken (exit 3
      // naming the holder).
      const hosts = everyHostOf(target).hosts
      const locks: Array<Awaited<ReturnType<typeof acquireHostLock>>> = []
      const release = (): Promise<unknown> => Promise.all(locks.map(l => l.release().catch(() => {})))
      // A signal ends the process from the lease guard, past this finally: release the locks there too.
      const off = spec.untilExpiry ? () => {} : onSignalExit(release)
      try {
        for (const h of hosts) locks.push(await acquireHostLock(h.host, h.stateDir, spec))
        // Taking a lock is short and is let finish, so that it is released below; a stop during it is heard here.
        throwIfStopped(signal, 'taking the run lock')
        return await fn(target)
      } finally {
        off()
        if (!spec.untilExpiry || locks.length < hosts.length) await release()
      }
    } finally {
      await halt?.close()
      await closeTarget(target)
    }
  }

  /** The run's output files and Pushgateway URL, checked before the run (exit 2 naming the flag). */
  protected checkRunOutputs(files: RunOutputs): void {
    for (const key of ['journal', 'junit', 'html'] as const) {
      const file = files[key]
      if (file !== undefined) checkOutputFile(`--${key}`, file)
    }
    if (files.push !== undefined) checkPushUrl('--push', files.push)
  }

  /**
   * The journal, JUnit, HTML and Pushgateway outputs of a run, each only when asked for; called after the summary is
   * printed and the exit code decided, so a failed write never loses the verdict: each failure is reported on stderr
   * (and returned, for --json) and the others are still written.
   */
  protected async writeRunOutputs(
    run: SuiteRun,
    command: string,
    files: RunOutputs,
    extra: Record<string, unknown> = {},
  ): Promise<{pushed?: unknown; outputErrors?: string[]}> {
    const {errors, attempt, write} = outputWriter()
    const {journal, junit, html, push} = files
    if (journal)
      await attempt(`the journal to ${journal}`, () => writeJournal(journal, runJournal(run, command, extra)))
    if (junit) await attempt(`JUnit to ${junit}`, () => write(junit, renderJUnit(run)))
    if (html) await attempt(`the HTML report to ${html}`, () => write(html, renderHtml(run)))
    let pushed: Awaited<ReturnType<typeof pushRun>> | undefined
    if (push) {
      pushed = (await attempt(`metrics to the Pushgateway at ${redactText(push)}`, () =>
        pushRun(push, run),
      )) as typeof pushed
      // The gateway URL may carry basic-auth credentials: never printed, never in the JSON result (issue 12, S4).
      if (pushed) pushed = {...pushed, url: redactText(pushed.url)}
      if (pushed) this.progress(`pushed ${pushed.series} series to ${pushed.url}`)
    }
    return {...(pushed ? {pushed} : {}), ...(errors.length ? {outputErrors: errors} : {})}
  }

  /**
   * A run that reached no verdict (its target unreachable, its lock held, cleanup unverified) still leaves a journal
   * when one was asked for: the error it ended with, so a combined report (`pdchaos report`) names this deployment and
   * why instead of missing it. Never throws: the error itself is what the user must see.
   */
  protected writeFailureJournal(
    file: string | undefined,
    command: string,
    fields: {name?: string; runId?: string; label?: string; config?: string; deployment?: string; startedAt: number},
    error: unknown,
  ): void {
    if (file === undefined) return
    // Said after the error (error-output.ts): where its journal is, or why there is none.
    let note: string
    try {
      writeJournal(
        file,
        failureJournal(command, {...fields, finishedAt: Date.now()}, errorDocument(error, command).error),
      )
      note = `the error is recorded in the journal ${file}`
    } catch (writeError) {
      note = `could not write the journal to ${file}: ${oneLine(writeError)}`
    }
    if (typeof error === 'object' && error !== null)
      Object.defineProperty(error, 'journalNote', {value: note, enumerable: false})
  }

  /** The README's exit codes for a run (model/run.ts runExitCode). */
  protected setRunExitCode(run: SuiteRun): void {
    process.exitCode = runExitCode(run)
  }

  protected runId(run: SuiteRun): string {
    return runIdOf(run)
  }
}
