import type {Deployment} from '../deployment/config.js'
import type {InjectResult} from '../experiment/inject.js'

/** The journal of one inject run, with the fields DESIGN.md promises scripts (pins and the fault's lease). */
export function injectJournal(deployment: Deployment, r: InjectResult) {
  return {
    deployment: deployment.name,
    contract: deployment.watchdog,
    fault: r.fault,
    mechanism: r.mechanism,
    description: r.description,
    plan: r.plan,
    ...(r.dryRun ? {dryRun: r.dryRun} : {}),
    ...(r.held ? {held: r.held} : {}),
    calibration: r.calibration,
    leases: r.lease ? [{
      id: r.lease.id, fault: r.lease.fault, mechanism: r.lease.mechanism, injectedAt: r.lease.injectedAt, revertedAt: r.lease.revertedAt,
      verifiedInjected: r.lease.verifiedInjected, verifiedClean: r.lease.verifiedClean, expiresAt: r.lease.expiresAt, evidence: r.lease.evidence,
    }] : [],
    pins: r.pins.map((p) => ({rid: p.rid, fault: p.fault, sentAt: p.sentAt, evictedAt: p.evictedAt, evictionSeconds: p.evictionSeconds, bounds: p.bounds, verdict: p.verdict, evidence: p.evidence})),
    verdicts: r.verdicts,
    summary: r.summary,
  }
}
