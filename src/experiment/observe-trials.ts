import {checkAborts} from '../checks/abort.js'
import type {PlanOf} from '../faults/fault.js'
import {sleepUntil} from '../util/time.js'
import {now} from '../workload/recorder.js'
import type {WindowKind} from './observe-kind.js'

/**
 * `observe: 'trials'`: each scenario's plan carries abort trials (PlanOf<'trials'>): a request with pdchaos's own rid,
 * and the aborts fired at its offset inside the transfer window, all in the batch's shared window. The window is put
 * on the timeline first: the abort check judges each abort's landing by it.
 */
const trialsOf = (plan: unknown): PlanOf<'trials'> => plan as PlanOf<'trials'>

/** Where an abort trial's request is expected while it transfers. */
const TRANSFERRING = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}

export const observeTrials: WindowKind = {
  share: 'window',
  countsEvictions: false,
  sends: e => `${trialsOf(e.plan).trials.length} abort trials`,
  async send(e, o) {
    const plan = trialsOf(e.plan)
    const {rec} = o.ctx
    if (plan.transferWindow) {
      rec.add({
        kind: 'transfer-window',
        t: now(),
        scenario: e.s.name,
        leaseId: plan.leaseId,
        ...plan.transferWindow,
        trials: plan.trials.map(x => ({rid: x.rid, offsetMs: x.offsetMs})),
      })
    }
    await Promise.all(
      plan.trials.map(async trial => {
        const sent = o.send({expectedState: TRANSFERRING, rid: trial.rid})
        o.sent(sent)
        await sleepUntil(sent.sentAt + trial.offsetMs, now)
        await Promise.all(
          trial.aborts.map(async a => {
            const t = now()
            const r = await o.own[a.service].abort(a.body.rid).catch(() => undefined)
            rec.add({kind: 'abort-sent', t, rid: trial.rid, target: a.service, status: r?.status})
          }),
        )
      }),
    )
  },
  judge(run) {
    const ab = checkAborts(run.timeline!)
    run.verdicts.push(...ab.verdicts)
    run.aborts = ab.trials
    if (ab.coverage) run.abortCoverage = ab.coverage
  },
}
