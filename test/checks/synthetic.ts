import type {CompetingTimeout} from '../../src/model/competing.js'
import type {Observation, PinState, Timeline} from '../../src/model/timeline.js'

/** A synthetic timeline builder: times are ms after t0, so a test reads like the experiment it describes. */
export class TimelineBuilder {
  readonly t0 = 1_800_000_000_000
  readonly observations: Observation[] = []

  constructor(
    readonly contract: Timeline['contract'] = {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5},
    readonly calibration: Timeline['calibration'] = {prefillMs: 40, prefillSpreadMs: 6, observeMs: 3, samples: 20},
  ) {}

  at(ms: number): number {
    return this.t0 + ms
  }

  pin(
    rid: string,
    sentMs: number,
    answer?: {ms: number; status: number; detail?: string},
    expectedState: PinState = {queue: 'bootstrap', kvPoll: 'Bootstrapping'},
  ): this {
    this.observations.push({
      kind: 'request-sent',
      t: this.at(sentMs),
      rid,
      role: 'pin',
      fault: 'drop-dest-info',
      expectedState,
    })
    if (answer)
      this.observations.push({
        kind: 'request-answered',
        t: this.at(answer.ms),
        rid,
        status: answer.status,
        ...(answer.detail === undefined ? {} : {detail: answer.detail}),
      })
    return this
  }

  /** One health probe of a service that answered at `atMs` after taking `tookMs` (status null: it got no answer). */
  health(
    service: 'prefill' | 'decode' | 'router',
    atMs: number,
    ok: boolean,
    status: number | null = ok ? 200 : 503,
    tookMs = 5,
  ): this {
    this.observations.push({
      kind: 'health',
      t: this.at(atMs),
      service,
      ok,
      ...(status === null ? {} : {status}),
      ms: tookMs,
    })
    return this
  }

  request(
    rid: string,
    role: 'load' | 'canary',
    sentMs: number,
    answer?: {ms: number; status: number; detail?: string},
  ): this {
    this.observations.push({kind: 'request-sent', t: this.at(sentMs), rid, role})
    if (answer)
      this.observations.push({
        kind: 'request-answered',
        t: this.at(answer.ms),
        rid,
        status: answer.status,
        ...(answer.detail === undefined ? {} : {detail: answer.detail}),
      })
    return this
  }

  fault(fromMs: number, toMs: number, leaseId = 'L1'): this {
    this.observations.push({
      kind: 'fault-injected',
      t: this.at(fromMs),
      fault: 'drop-dest-info',
      leaseId,
      verified: true,
      evidence: 'rules listed',
    })
    this.observations.push({
      kind: 'fault-reverted',
      t: this.at(toMs),
      fault: 'drop-dest-info',
      leaseId,
      verifiedClean: true,
      evidence: 'table gone',
    })
    return this
  }

  /** An abort trial's aborts, on prefill alone unless told (`both`: prefill and decode, as --side both fires them). */
  abort(rid: string, ms: number, side: 'prefill' | 'decode' | 'both' = 'prefill'): this {
    for (const target of side === 'both' ? (['prefill', 'decode'] as const) : [side])
      this.observations.push({kind: 'abort-sent', t: this.at(ms), rid, target, status: 200})
    return this
  }

  /** The window abort trials sweep, as the runner records it before sending them (offsets: ms after each send). */
  transferWindow(
    atMs: number,
    trials: Array<{rid: string; offsetMs: number}>,
    w: {startMs: number; endMs: number; widening?: 'packet-filter' | 'twin-failpoint' | 'none'; leaseId?: string},
  ): this {
    this.observations.push({
      kind: 'transfer-window',
      t: this.at(atMs),
      scenario: 'abort',
      leaseId: w.leaseId ?? 'L1',
      startMs: w.startMs,
      endMs: w.endMs,
      why: w.widening === 'none' ? 'around the calibrated prefill time' : 'held open by the widening',
      widening: w.widening ?? 'packet-filter',
      trials,
    })
    return this
  }

  /** The widening filter's match count, read just before the revert. */
  filterMatched(atMs: number, packets: number, leaseId = 'L1'): this {
    this.observations.push({
      kind: 'filter-matched',
      t: this.at(atMs),
      leaseId,
      packets,
      evidence: `nft table inet pdchaos_${leaseId}: 2 rule(s), ${packets} packet(s) matched so far`,
    })
    return this
  }

  /** instance: the server's path in the file, as a batch over several pairs labels its samples. */
  metric(service: 'prefill' | 'decode', name: string, ms: number, value: number, instance?: string): this {
    this.observations.push({
      kind: 'metric',
      t: this.at(ms),
      service,
      name,
      value,
      ...(instance === undefined ? {} : {instance}),
    })
    return this
  }

  /**
   * One /v1/loads?include=disagg sample of a server: its KV tokens in use, and its running, waiting and PD queue counts
   * (0 unless `busy` gives them), as the sampler records a snapshot.
   */
  loads(
    service: 'prefill' | 'decode',
    ms: number,
    usedTokens: number,
    busy: Record<string, number> = {},
    instance?: string,
  ): this {
    const queues =
      service === 'prefill'
        ? ['sglang_disagg_prefill_bootstrap_queue_reqs', 'sglang_disagg_prefill_inflight_queue_reqs']
        : ['sglang_disagg_decode_prealloc_queue_reqs', 'sglang_disagg_decode_transfer_queue_reqs']
    this.metric(service, 'sglang_num_used_tokens', ms, usedTokens, instance)
    for (const n of ['sglang_num_running_reqs', 'sglang_num_waiting_reqs', ...queues])
      this.metric(service, n, ms, busy[n] ?? 0, instance)
    return this
  }

  end(ms: number): this {
    this.observations.push({kind: 'marker', t: this.at(ms), name: 'end'})
    return this
  }

  build(): Timeline {
    return {
      contract: this.contract,
      calibration: this.calibration,
      observations: [...this.observations].sort((a, b) => a.t - b.t),
    }
  }
}

/**
 * SGLang's own timeouts as a run that read them finds them on a default deployment: decode's waiting timeout at 300 s,
 * read from decode's environment (unset there), so it fires long after any window here and is excluded.
 */
export const TIMEOUTS_READ: {competing: CompetingTimeout[]} = {
  competing: [
    {
      cause: 'waiting-timeout',
      name: "decode's waiting timeout",
      setting: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT',
      seconds: 300,
      source:
        "SGLang's default for version 0.5.15 (environ.py; unset in the environment of pid 4242 (decode scheduler TP0))",
      known: true,
    },
  ],
}
