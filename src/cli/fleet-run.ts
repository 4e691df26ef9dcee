import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {assertMayDisturb} from '../deployment/protection.js'
import type {FleetRun} from '../model/fleet.js'
import {entryDeploymentName, type FleetPlan} from '../suite/fleet-file.js'
import {runFleet} from '../suite/fleet.js'
import {type ChildOptions, journalPath, runMemberChild} from './fleet-member.js'
import {checkOutputFile} from './outputs.js'
import type {Progress} from './progress.js'
import {withStopSignal} from './stop-signal.js'

/**
 * `suite --fleet` on this machine: every deployment as its own pdchaos process (cli/fleet-member.ts says why), at most
 * maxParallel at once, their progress lines prefixed with the deployment's name. SIGINT or SIGTERM stops the fleet:
 * each running deployment gets one SIGINT (it reverts its faults, writes its journal and exits 3), none starts after.
 */

export interface FleetHereOptions {
  maxParallel?: number
  /** Keep each deployment's journal here as NAME.json; without it they go to a temporary directory. */
  journalDir?: string
  runId: string
  pass: ChildOptions['pass']
  progress: Progress
  /** How to start pdchaos (default: this process's node, its flags and its entry script). */
  cli?: string[]
  /** Tests: shorter deadlines, another environment. */
  child?: Partial<Pick<ChildOptions, 'deadlineMs' | 'killGraceMs' | 'env'>>
}

/**
 * Checks before anything runs (exit 2): production deployments need --allow-production; every journal can be written.
 */
export function checkFleet(plan: FleetPlan, o: {allowProduction: boolean; journalDir?: string}): void {
  for (const e of plan.entries) {
    const d =
      e.engine === 'vllm' ? ({name: entryDeploymentName(e), labels: e.deployment.labels ?? {}} as never) : e.deployment
    assertMayDisturb(d, o.allowProduction, `run fleet ${plan.name} (deployment ${e.name}) against`)
    if (o.journalDir !== undefined) checkOutputFile('--journal-dir', journalPath(o.journalDir, e.name))
  }
}

export async function runFleetHere(plan: FleetPlan, o: FleetHereOptions): Promise<FleetRun> {
  const dir = o.journalDir ?? mkdtempSync(join(tmpdir(), 'pdchaos-fleet-'))
  const {progress} = o
  const running = new Set<string>()
  let done = 0
  const phase = () =>
    progress.setPhase(
      `fleet ${plan.name}: ${running.size} running (${[...running].join(', ')}), ${done}/${plan.entries.length} done`,
    )
  const onSignal = (signal: NodeJS.Signals, again: boolean) => {
    if (again) {
      return progress.say(`${signal} again: waiting for ${running.size} deployment(s) to revert their faults and stop`)
    }
    progress.say(`${signal}: stopping the fleet; each running deployment reverts its faults and stops, no other starts`)
  }
  try {
    return await withStopSignal(
      ({signal}) =>
        runFleet(plan, {
          ...(o.maxParallel ? {maxParallel: o.maxParallel} : {}),
          runId: o.runId,
          signal,
          runMember: (e, ctx) =>
            runMemberChild(
              e,
              {
                cli: o.cli ?? [process.execPath, ...process.execArgv, process.argv[1]!],
                journalDir: dir,
                keepJournal: o.journalDir !== undefined,
                runId: o.runId,
                pass: o.pass,
                say: line => progress.say(`[${e.name}] ${line}`),
                ...o.child,
              },
              ctx,
            ),
          onStart: e => {
            running.add(e.name)
            const engine = e.engine === 'vllm' ? ' (engine vllm)' : ''
            progress.say(`[${e.name}] starting: deployment ${entryDeploymentName(e)}${engine}, suite ${e.suite.name}`)
            phase()
          },
          onEnd: m => {
            running.delete(m.name)
            done++
            progress.print([
              `[${m.name}] ${m.status.toUpperCase()} (exit ${m.exitCode})${m.reason ? `: ${m.reason}` : ''}`,
            ])
            phase()
          },
        }),
      {onSignal},
    )
  } finally {
    if (o.journalDir === undefined) rmSync(dir, {recursive: true, force: true})
  }
}
