import {freshnessOf, idleSnapshotReadings, readingsOf, settledAfter, writtenSince} from '../engines/sglang/freshness.js'
import {LOADS_USED_TOKENS, TOKEN_USAGE} from '../engines/sglang/sglang-metrics.js'
import type {Timeline} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * KV tokens back at their baseline after the fault: a leak holds its tokens for good. Judged only from readings that
 * their freshness row (engines/sglang/freshness.ts) says show the server's state at that moment:
 * - /v1/loads sglang_num_used_tokens read while the server was idle (fresh): a count above the idle baseline is a leak;
 * - otherwise the per-batch readings (sglang:token_usage, or loads snapshots taken while busy), which count whatever
 * was
 *   in flight at the last batch. A leak would show in every one written after the release, so the lowest of those at
 *   or below the lowest before the fault passes; above it is unverified, never a failure: it may be the share of
 *   requests in flight at that batch, whatever the pool size and the share per request.
 */

export interface KvTokensOptions {
  injectedAt: number
  revertedAt: number
  end: number
  /** Tokens in use (an idle /v1/loads snapshot) may differ from the baseline by this many. */
  usedTokensTolerance?: number
}

const TO_VERIFY =
  'serve /v1/loads?include=disagg (an SGLang that has it: sglang_num_used_tokens is fresh once the server is ' +
  'idle), or ' +
  'sample again after the server has been idle past its 30 s idle refresh, which rewrites sglang:token_usage'

/** Whose tokens are judged: the subject, its name in summaries and the instance label for the evidence. */
interface Who {
  who: string
  subject: string
  of: {instance?: string}
}

export function checkKvTokens(
  tl: Timeline,
  service: 'prefill' | 'decode',
  instance: string | undefined,
  o: KvTokensOptions,
): Verdict | undefined {
  const who = instance ?? service
  const w: Who = {who, subject: `${who} KV tokens`, of: instance === undefined ? {} : {instance}}
  const releasedAt = settledAfter(tl, o.revertedAt, o.end)
  return (
    fromIdleSnapshots(tl, service, instance, o, releasedAt, w) ??
    fromBatchReadings(tl, service, instance, o, releasedAt, w)
  )
}

/** 1. Fresh: the idle snapshots before the fault and after every request of it had ended. */
function fromIdleSnapshots(
  tl: Timeline,
  service: 'prefill' | 'decode',
  instance: string | undefined,
  o: KvTokensOptions,
  releasedAt: number,
  {who, subject, of}: Who,
): Verdict | undefined {
  const idle = idleSnapshotReadings(tl, service, LOADS_USED_TOKENS, instance)
  const before = idle.filter(r => r.t <= o.injectedAt).at(-1)
  const after = idle.filter(r => r.t >= releasedAt).at(-1)
  if (!before || !after) return undefined
  const tol = o.usedTokensTolerance ?? 0
  const evidence = {
    metric: LOADS_USED_TOKENS,
    baseline: before.value,
    after: after.value,
    tolerance: tol,
    readAt: {baseline: before.t, after: after.t},
    freshness: 'idle /v1/loads snapshots (nothing of pdchaos in flight, nothing running or queued)',
    ...of,
  }
  return after.value - before.value > tol
    ? fail(
        'recovery',
        subject,
        `${who} KV token usage did not return to its baseline: ${before.value} before the fault, ${after.value} ` +
          `after recovery, both read with the server idle (${LOADS_USED_TOKENS}) — a leak`,
        evidence,
      )
    : pass(
        'recovery',
        subject,
        `${who} KV token usage back at its baseline (${after.value} vs ${before.value}, read with the server idle)`,
        evidence,
      )
}

/** 2. Per batch: the loads snapshot taken while busy, else the /metrics gauge. */
function fromBatchReadings(
  tl: Timeline,
  service: 'prefill' | 'decode',
  instance: string | undefined,
  o: KvTokensOptions,
  releasedAt: number,
  {who, subject, of}: Who,
): Verdict | undefined {
  const name = readingsOf(tl, service, LOADS_USED_TOKENS, instance).length > 0 ? LOADS_USED_TOKENS : TOKEN_USAGE
  const readings = readingsOf(tl, service, name, instance)
  const pre = readings.filter(r => r.t <= o.injectedAt)
  if (pre.length === 0) return undefined
  const row = freshnessOf(name)
  const written = writtenSince(tl, service, name, releasedAt, instance)
  const post = written ? readings.filter(r => r.t >= written.at) : []
  const lowPre = Math.min(...pre.map(r => r.value))
  const base = {metric: name, refresh: row.refresh, rule: row.rule, upstream: row.upstream, releasedAt, ...of}
  if (post.length === 0) {
    return unverified(
      'recovery',
      subject,
      `${who} KV tokens unverified: no reading of ${name} was shown to be written after every request of the fault ` +
        `had ended`,
      {
        ...base,
        baseline: lowPre,
        writtenSince: written ?? null,
        why: `${name} is ${row.rule}; ${
          service === 'prefill'
            ? 'no request sent after the release succeeded ' + 'before the last sample'
            : 'it did not change after the release'
        }`,
        toVerify: TO_VERIFY,
      },
    )
  }
  const lowPost = Math.min(...post.map(r => r.value))
  const evidence = {
    ...base,
    baseline: lowPre,
    after: lowPost,
    writtenSince: written,
    readingsAfter: post.length,
    strict: lowPre === 0,
  }
  if (lowPost <= lowPre) {
    return pass(
      'recovery',
      subject,
      `${who} KV token usage back at its baseline: ${lowPost} at its lowest after recovery vs ${lowPre} before the ` +
        `fault (${name}, written per batch; a leak would show in every reading)`,
      evidence,
    )
  }
  return unverified(
    'recovery',
    subject,
    `${who} KV token usage ${lowPost} after recovery vs ${lowPre} before the fault, shown only by ${name}, which ` +
      `counts what was in flight at the last batch: a leak is not shown`,
    {
      ...evidence,
      why:
        `${name} is ${row.rule}: the difference may be requests in flight at that batch, whatever the pool size ` +
        `and each request's share`,
      toVerify: TO_VERIFY,
    },
  )
}
