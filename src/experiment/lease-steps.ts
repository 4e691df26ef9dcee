import {oneLine} from '../errors.js'
import {type FaultPlan, runProbes} from '../faults/fault.js'
import type {LeaseGuard} from '../faults/lease/lease-guard.js'
import type {LeaseRecord} from '../model/run.js'
import {now, type Recorder} from '../workload/recorder.js'

/**
 * The two effectful steps of a fault, each proven from the host's state: inject under a fresh lease and verify it
 * took; revert and verify clean. Each records what it did on the timeline and in the lease record.
 */

export async function injectUnderLease(
  guard: LeaseGuard,
  plan: FaultPlan,
  rec: Recorder,
  ttlMs: number,
  probeMs: number,
  say: (l: string) => void,
): Promise<LeaseRecord> {
  const lease = await guard.create({
    id: plan.leaseId,
    fault: plan.fault,
    params: {mechanism: plan.mechanism, targets: plan.targets},
    ttlMs,
    // A lease needs a revert; a fault that changes nothing on the host leaves a harmless one.
    revert: plan.revert.length > 0 ? plan.revert : [['true']],
    command: `inject ${plan.fault}`,
  })
  const record: LeaseRecord = {
    id: lease.id,
    fault: plan.fault,
    mechanism: plan.mechanism,
    injectedAt: null,
    revertedAt: null,
    verifiedInjected: false,
    verifiedClean: false,
    expiresAt: lease.expiresAt,
    evidence: {injected: [], clean: []},
  }
  say(`injecting ${plan.fault} (${plan.mechanism}) under lease ${lease.id}`)
  // The fault may act from the moment its first command starts: the window opens then, not when the command returns.
  const startedAt = now()
  for (const argv of plan.inject) {
    const r = await guard.host.run(argv, {timeoutMs: probeMs, sudo: plan.sudo})
    if (r.code !== 0)
      record.evidence.injected.push(`\`${argv.join(' ')}\` exited ${r.code}: ${oneLine(r.stderr).slice(0, 200)}`)
  }
  record.injectedAt = startedAt
  const v = await runProbes(guard.host, plan.verifyInjected, probeMs)
  record.verifiedInjected = v.ok && record.evidence.injected.length === 0
  record.evidence.injected.push(...v.results.map(x => x.evidence))
  rec.add({
    kind: 'fault-injected',
    t: record.injectedAt,
    fault: plan.fault,
    leaseId: lease.id,
    verified: record.verifiedInjected,
    evidence: record.evidence.injected.join('; '),
  })
  say(
    record.verifiedInjected
      ? `in place: ${record.evidence.injected.join('; ') || 'client-side fault'}`
      : `NOT in place: ${record.evidence.injected.join('; ')}`,
  )
  return record
}

export async function revertAndVerify(
  guard: LeaseGuard,
  plan: FaultPlan,
  rec: Recorder,
  record: LeaseRecord,
  probeMs: number,
  say: (l: string) => void,
): Promise<void> {
  // What the fault did while in place (its rules' match counters, the stopped process): read once more before it goes.
  if (record.verifiedInjected && plan.verifyInjected.length > 0) {
    const held = await runProbes(guard.host, plan.verifyInjected, probeMs)
    record.evidence.injected.push(...held.results.map(x => `at revert: ${x.evidence}`))
    // A packet filter's match count, as a number on the timeline (abort trials need it to show the widening held).
    const counted = held.results.filter(x => x.ok && x.matchedPackets !== undefined)
    if (counted.length > 0) {
      rec.add({
        kind: 'filter-matched',
        t: now(),
        leaseId: record.id,
        packets: counted.reduce((n, x) => n + x.matchedPackets!, 0),
        evidence: counted.map(x => x.evidence).join('; '),
      })
    }
  }
  say(`reverting lease ${record.id}`)
  const r = await guard.revert(record.id)
  record.revertedAt = now()
  const v = await runProbes(guard.host, plan.verifyClean, probeMs)
  record.verifiedClean = v.ok && (r.exitCode === 0 || r.status === 'already-reverted')
  record.evidence.clean.push(
    `revert ${r.status} by ${r.byWhom ?? '?'} (exit ${r.exitCode})`,
    ...v.results.map(x => x.evidence),
  )
  rec.add({
    kind: 'fault-reverted',
    t: record.revertedAt,
    fault: plan.fault,
    leaseId: record.id,
    verifiedClean: record.verifiedClean,
    evidence: record.evidence.clean.join('; '),
  })
  say(record.verifiedClean ? 'verified clean' : `NOT verified clean: ${record.evidence.clean.join('; ')}`)
}
