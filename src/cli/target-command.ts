import {mkdirSync, writeFileSync} from 'node:fs'
import {dirname, resolve} from 'node:path'

import {type Command, Flags} from '@oclif/core'

import {assertMayDisturb} from '../deployment/protection.js'
import {ExitCode} from '../exit-codes.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {blockingUnverified, runCounts, runIdOf, type SuiteRun} from '../model/run.js'
import {renderHtml} from '../report/html.js'
import {writeJournal} from '../report/journal.js'
import {runJournal} from '../report/journal-fields.js'
import {renderJUnit} from '../report/junit.js'
import {pushRun} from '../report/push.js'
import {BaseCommand} from './base-command.js'
import {targetFlags} from './flags.js'
import {resolveTarget, type Target} from './target.js'

/**
 * A command that acts on a deployment: it owns the target flags, resolving and closing the target, the production
 * guard, the host's run lock, writing the run's outputs and the exit-code policy, so each command reads as the
 * story of what it does.
 */
export abstract class TargetCommand<T extends typeof Command> extends BaseCommand<T> {
  static readonly targetFlags = {
    ...targetFlags,
    'accept-new-host-key': Flags.boolean({helpGroup: 'TARGET', summary: 'Trust and record the host key of a host not yet in known_hosts.'}),
  }

  /** For commands that change the deployment. */
  static readonly disturbFlags = {
    'allow-production': Flags.boolean({summary: 'Allow acting on a deployment labelled environment: production.'}),
  }

  /**
   * Resolve the target (starting the twin for --sim unless told not to), refuse production unless allowed when the
   * command disturbs it, hold the host's run lock when asked, run fn, and always close the target.
   */
  protected async withTarget<R>(opts: {
    startTwin?: boolean
    twin?: {deadlineS: number; pollS: number}
    /** What the command does to the deployment, for the production refusal ("inject a fault into"). */
    disturb?: string
    /** The run lock: its command line and TTL (`runLockTtlMs`); held until expiry for --hold. */
    lock?: (target: Target) => {command: string; ttlMs: number; untilExpiry?: boolean}
    say?: (line: string) => void
  }, fn: (target: Target) => Promise<R>): Promise<R> {
    const flags = this.flags as Record<string, unknown>
    const target = await resolveTarget(flags as never, {
      ...(opts.startTwin === undefined ? {} : {startTwin: opts.startTwin}), ...(opts.twin ? {twin: opts.twin} : {}), onProgress: opts.say ?? ((l) => this.progress(l)),
    })
    try {
      if (opts.disturb) assertMayDisturb(target.deployment, Boolean(flags['allow-production']), opts.disturb)
      if (!opts.lock) return await fn(target)
      const spec = opts.lock(target)
      const lock = await acquireHostLock(target.host, target.deployment.stateDir, spec)
      try {
        return await fn(target)
      } finally {
        if (!spec.untilExpiry) await lock.release().catch(() => {})
      }
    } finally {
      await target.host.close()
    }
  }

  /** The journal, JUnit, HTML and Pushgateway outputs of a run, each only when asked for. */
  protected async writeRunOutputs(run: SuiteRun, command: string, files: {journal?: string; junit?: string; html?: string; push?: string}, extra: Record<string, unknown> = {}): Promise<unknown> {
    const write = (file: string, text: string) => {
      mkdirSync(dirname(resolve(file)), {recursive: true})
      writeFileSync(file, text)
    }
    if (files.journal) writeJournal(files.journal, runJournal(run, command, extra))
    if (files.junit) write(files.junit, renderJUnit(run))
    if (files.html) write(files.html, renderHtml(run))
    if (!files.push) return undefined
    const r = await pushRun(files.push, run)
    this.progress(`pushed ${r.series} series to ${r.url}`)
    return r
  }

  /** The README's exit codes for a run: stopped 3; a gate decides 0 or 1; a fault left behind 4; a failed check, a
   * blocking unverified one (the watchdog's eviction check by default) or a scenario without a verdict 1; else 0. */
  protected setRunExitCode(run: SuiteRun): void {
    const c = runCounts(run)
    if (run.stopped) process.exitCode = ExitCode.stopped
    else if (run.gate) process.exitCode = run.gate.passed ? ExitCode.ok : ExitCode.checkFailed
    else if (c.faultsLeftBehind > 0) process.exitCode = ExitCode.cleanupUnverified
    else if (c.failed > 0 || c.errored > 0 || blockingUnverified(run).length > 0) process.exitCode = ExitCode.checkFailed
  }

  protected runId(run: SuiteRun): string {
    return runIdOf(run)
  }
}
