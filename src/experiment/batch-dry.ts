import {oneLine} from '../errors.js'
import {renderPlan} from '../faults/fault.js'
import type {ScenarioRun} from '../model/run.js'
import {now} from '../workload/recorder.js'
import type {Entry, EntryPart} from './entry.js'
import {scenarioShell} from './judge.js'
import type {PlacedHost} from './placement.js'
import {type Calibrated, PROBE_TIMEOUT_MS} from './session.js'

/**
 * The two batches that end without judging: a dry run (read-only probes) and a hold (the faults left to their leases).
 */

/**
 * The read-only probes of every planned scenario, on each host it would act on; a failed one is a fault-effect fail.
 */
export async function dryRun(
  entries: Entry[],
  hostOf: Map<Entry, PlacedHost>,
  partHost: Map<EntryPart, PlacedHost>,
  calibration: Calibrated | undefined,
  contract: ScenarioRun['contract'],
): Promise<ScenarioRun[]> {
  return Promise.all(
    entries.map(async e => {
      const run = scenarioShell(e, contract, calibration, now())
      if (!e.plan) return run
      const probes = []
      // The probes of each node it would act on, on that node's host.
      const units = [
        {plan: e.plan, host: hostOf.get(e)!},
        ...(e.parts ?? []).map(x => ({plan: x.plan, host: partHost.get(x)!})),
      ]
      for (const {plan, host} of units)
        for (const argv of plan.readOnlyProbes) {
          const shown = renderPlan({...plan, readOnlyProbes: [argv]}).readOnlyProbes[0]!
          try {
            const r = await host.host.run(argv, {timeoutMs: PROBE_TIMEOUT_MS, sudo: plan.sudo})
            probes.push({argv: shown, code: r.code, stdout: r.stdout.slice(0, 2000), stderr: r.stderr.slice(0, 500)})
          } catch (error) {
            probes.push({argv: shown, code: null, stdout: '', stderr: oneLine(error)})
          }
        }
      run.dryRun = {probes}
      for (const p of probes)
        if (p.code !== 0)
          run.verdicts.push({
            check: 'fault-effect',
            subject: p.argv,
            verdict: 'fail',
            summary: `read-only probe failed: ${p.stderr || `exit ${p.code}`}`,
            evidence: {probe: p},
          })
      return run
    }),
  )
}

/** A hold: each scenario held (its lease armed), or its fault-effect fail where the fault did not take effect. */
export function heldScenarios(
  entries: Entry[],
  contract: ScenarioRun['contract'],
  calibration: Calibrated | undefined,
): ScenarioRun[] {
  return entries.map(e => {
    const run = scenarioShell(e, contract, e.calibration ?? calibration, now())
    if (e.lease?.verifiedInjected)
      run.held = {leaseId: e.lease.id, expiresAt: new Date(e.lease.expiresAt).toISOString()}
    else if (e.lease)
      run.verdicts.push({
        check: 'fault-effect',
        subject: e.lease.id,
        verdict: 'fail',
        summary: `the fault did not take effect: ${e.lease.evidence.injected.join('; ')}`,
        evidence: {lease: e.lease},
      })
    return run
  })
}
