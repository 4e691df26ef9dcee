import {Flags} from '@oclif/core'

import {badInput, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {RunSession} from '../experiment/session.js'
import {writeJournal} from '../report/journal.js'
import {renderRestart} from '../report/restart-text.js'
import {coRestart, type RestartResult, type ServiceName} from '../restart/co-restart.js'
import {ALONE_DEFAULTS, aloneProbePlan, restartAlone} from '../restart/role-restart.js'
import {vllmCoRestart, vllmRestartPlan, type VllmRestartOptions} from '../restart/vllm-co-restart.js'
import {loadVllmDeployment} from '../engines/vllm/deployment-file.js'
import {guardedVllmRun} from './vllm-suite.js'
import {openHost} from '../hosts/open-host.js'
import {isProduction} from '../deployment/protection.js'
import {checkOutputFile} from './outputs.js'
import {engineFlags} from './engine-target.js'
import {TargetCommand} from './target-command.js'
import {placementOf, restartTargetsOf} from './target.js'

/**
 * `pdchaos restart`'s flags and its two runs: the co-restart (restart/co-restart.ts) and a role alone (`--only`,
 * restart/role-restart.ts), each rendered, its exit code set, then its journal. commands/restart.ts holds its help.
 */
export abstract class RestartCommand extends TargetCommand<typeof RestartCommand> {
  static override flags = {
    ...TargetCommand.targetFlags,
    ...engineFlags,
    ...TargetCommand.disturbFlags,
    service: Flags.option({
      options: ['prefill', 'decode', 'router'] as const,
      multiple: true,
      summary: 'Restart only these services, in the order given (repeatable). Default: prefill, decode, router.',
    })(),
    'health-timeout': Flags.integer({
      summary: 'Seconds each service has to become healthy after its restart.',
      default: 300,
      min: 1,
      max: 3600,
    }),
    'command-timeout': Flags.integer({
      summary: 'Deadline of each restart command, in seconds.',
      default: 600,
      min: 1,
      max: 3600,
    }),
    canaries: Flags.integer({summary: 'Canary requests end to end after the restart.', default: 3, min: 0, max: 100}),
    watch: Flags.integer({summary: 'Seconds of pin watch after the canaries.', default: 60, min: 0, max: 86_400}),
    settle: Flags.integer({
      summary: 'Seconds to wait after the last health gate before the canaries (one decode heartbeat interval).',
      default: 5,
      min: 0,
      max: 600,
    }),
    sample: Flags.integer({summary: 'Seconds between pin-watch samples.', default: 1, min: 1, max: 60}),
    journal: Flags.string({summary: 'Write the run journal (JSON) to this file.'}),
    only: Flags.option({
      options: ['prefill', 'decode'] as const,
      exclusive: ['service'],
      summary:
        'Restart this role alone behind its health gate (a pod replaced behind its Service, SGLang #34289), then ' +
        "judge how long canaries fail against decode's heartbeat bound.",
    })(),
    'probe-interval': Flags.integer({
      summary: 'With --only: milliseconds between canary rounds (one through the router, one direct).',
      default: 500,
      min: 50,
      max: 10_000,
    }),
    'dry-run': Flags.boolean({
      summary:
        'With --only, or on a vLLM deployment: print the plan (restart commands, gates, canaries) and change nothing.',
    }),
  }

  /** The co-restart of `order` (each instance behind its gate), its verdicts, then its journal. */
  protected async coRestartRun(order: ServiceName[]): Promise<RestartResult> {
    const f = this.flags
    if (f.journal !== undefined) checkOutputFile('--journal', f.journal)
    let deployment = ''
    // Ctrl-C (or SIGTERM) in any phase ends the run within a second, exit 3: a restart command under way is killed
    // (its process group), a health gate or the watch stops waiting, and the message says what was restarted.
    const result = await this.withStopSignal(({signal}) =>
      this.withTarget(
        {
          disturb: 'restart',
          lock: t => ({
            command: `restart ${order.join(' ')}`,
            ttlMs:
              (restartTargetsOf(t, order).length * (f['health-timeout'] + f['command-timeout']) + f.watch + 120) * 1000,
          }),
        },
        t => {
          deployment = t.deployment.name
          // Every instance, where the file lists several: in its restartOrder:, else prefill[0], prefill[1], …
          // decode's, the router.
          return coRestart(t.deployment, t.host, {
            targets: restartTargetsOf(t, order),
            order,
            healthTimeoutS: f['health-timeout'],
            commandTimeoutS: f['command-timeout'],
            canaries: f.canaries,
            watchS: f.watch,
            sampleS: f.sample,
            settleS: f.settle,
            onProgress: l => this.progress(l),
            signal,
          })
        },
      ),
    )
    if (!this.jsonEnabled()) this.log(renderRestart(result))
    if (result.verdicts.some(v => v.verdict === 'fail')) process.exitCode = ExitCode.checkFailed
    // After the verdict: a journal that cannot be written is reported, the verdict and its exit code kept.
    if (f.journal) {
      try {
        writeJournal(f.journal, {command: 'restart', deployment, result})
      } catch (error) {
        process.stderr.write(
          `Error: could not write the journal to ${f.journal}: ${oneLine(error)} (the verdict above stands)\n`,
        )
        return {
          ...result,
          outputErrors: [`could not write the journal to ${f.journal}: ${oneLine(error)}`],
        } as RestartResult
      }
    }
    return result
  }

  /**
   * The co-restart of an `engine: vllm` file (restart/vllm-co-restart.ts): prefill, decode, proxy behind their gates,
   * then canaries through the proxy. `--dry-run` prints the steps; a stop (SIGINT) exits 3 as the SGLang one does.
   */
  protected async vllmRun(file: string): Promise<RestartResult | {plan: string[]}> {
    const f = this.flags
    if (f.journal !== undefined) checkOutputFile('--journal', f.journal)
    const d = await loadVllmDeployment(file)
    const opts: VllmRestartOptions = {
      healthTimeoutS: f['health-timeout'],
      commandTimeoutS: f['command-timeout'],
      canaries: f.canaries,
      settleS: f.settle,
      canaryTimeoutS: 60,
      onProgress: l => this.progress(l),
    }
    const plan = vllmRestartPlan(d, opts)
    if (f['dry-run']) {
      if (!this.jsonEnabled()) this.log(['plan (dry run: nothing changed):', ...plan.map(l => `  ${l}`)].join('\n'))
      return {plan}
    }
    if (isProduction(d.labels ?? {}) && !f['allow-production'])
      throw badInput(
        `refusing to restart deployment ${d.name ?? file}: it is labelled environment: production`,
        'pass --allow-production if you really mean to disturb production',
      )
    const result = await this.withStopSignal(async ({signal, stop}) => {
      const host = await openHost(d.host, {sudo: d.sudo})
      try {
        // Refused when halted (exit 2), stopped by a halt while it runs (exit 3), under the run lock: as SGLang's.
        const guard = {
          signal,
          stop,
          say: (l: string) => this.progress(l),
          command: 'restart (vllm)',
          ttlMs: (3 * (f['health-timeout'] + f['command-timeout']) + 180) * 1000,
        }
        return await guardedVllmRun(host, d, file, guard, () => {
          for (const l of plan) this.progress(l)
          return vllmCoRestart(d, host, {...opts, signal})
        })
      } finally {
        await host.close()
      }
    })
    if (!this.jsonEnabled()) this.log(`engine: vllm (${d.name ?? file})\n${renderRestart(result)}`)
    if (result.verdicts.some(v => v.verdict === 'fail')) process.exitCode = ExitCode.checkFailed
    if (f.journal) {
      try {
        writeJournal(f.journal, {command: 'restart', engine: 'vllm', deployment: d.name ?? file, result})
      } catch (error) {
        process.stderr.write(
          `Error: could not write the journal to ${f.journal}: ${oneLine(error)} (the verdict above stands)\n`,
        )
      }
    }
    return {...result, engine: 'vllm'} as RestartResult
  }

  /** `--only ROLE`: the role alone, canaries judged against decode's heartbeat bound (restart/role-restart.ts). */
  protected async runAlone(role: 'prefill' | 'decode'): Promise<RestartResult | {plan: string[]}> {
    const f = this.flags
    if (f.journal !== undefined) checkOutputFile('--journal', f.journal)
    let deployment = ''
    // SIGINT or SIGTERM stops the restart (its command's process group killed, a gate stops waiting); the result so
    // far is rendered and the exit is 3.
    return this.withStopSignal(async stop => {
      const out = await this.withTarget(
        {
          disturb: 'restart',
          // The role, perhaps the repair's three, and the canaries: each behind its gate and command deadline.
          ...(f['dry-run']
            ? {}
            : {
                lock: () => ({
                  command: `restart --only ${role}`,
                  ttlMs: (4 * (f['health-timeout'] + f['command-timeout']) + 600) * 1000,
                }),
              }),
        },
        async t => {
          deployment = t.deployment.name
          // The bound from decode's environment, read before the restart (decode keeps it; a restarted decode is
          // started by the same command). Discovery hears the stop (issue 28).
          const d = await new RunSession(t.deployment, placementOf(t)).discovery(l => this.progress(l), stop.signal)
          const shape = {
            ...ALONE_DEFAULTS,
            role,
            ...(d.heartbeat ? {heartbeat: d.heartbeat} : {}),
            probeIntervalMs: f['probe-interval'],
          }
          const plan = aloneProbePlan(shape)
          if (f['dry-run']) return {plan}
          for (const l of plan) this.progress(l)
          return restartAlone(t.deployment, t.host, {
            ...shape,
            targets: restartTargetsOf(t, [role]),
            repairTargets: restartTargetsOf(t, ['prefill', 'decode', 'router']),
            healthTimeoutS: f['health-timeout'],
            commandTimeoutS: f['command-timeout'],
            onProgress: l => this.progress(l),
            signal: stop.signal,
          })
        },
      )
      if ('plan' in out) {
        if (!this.jsonEnabled())
          this.log(['plan (dry run: nothing changed):', ...out.plan.map(l => `  ${l}`)].join('\n'))
        return out
      }
      if (!this.jsonEnabled()) this.log(renderRestart(out))
      if (out.verdicts.some(v => v.verdict === 'fail')) process.exitCode = ExitCode.checkFailed
      else if (stop.signal.aborted) process.exitCode = ExitCode.stopped
      if (f.journal) {
        try {
          writeJournal(f.journal, {command: `restart --only ${role}`, deployment, result: out})
        } catch (error) {
          process.stderr.write(
            `Error: could not write the journal to ${f.journal}: ${oneLine(error)} (the verdict above stands)\n`,
          )
        }
      }
      return out
    })
  }
}
