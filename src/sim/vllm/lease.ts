/**
 * The KV lease on the prefill instance P (vLLM's NixlConnector after PR #41383), as pure arithmetic: no clock, no I/O.
 *
 * Upstream (vllm-project/vllm, docs/design/nixl_kv_cache_lease.md; nixl/base_scheduler.py `__init__`,
 * `build_connector_meta`; nixl/base_worker.py `_handle_heartbeat`, `_reap_expired_send_leases`):
 * - the heartbeat interval is `kv_lease_duration // 6` and each heartbeat extends to
 *   `max(old_expiry, now + kv_lease_duration * 2 // 3)` (Python floor division, kept here);
 * - `_reqs_to_send` is a dict in insertion order (grant order); a heartbeat changes an entry's deadline in place;
 * - the reaper sweeps every entry each step (the fix of #58222); before, it stopped at the first unexpired entry
 *   ("Sorted dict, oldest requests are put first so we can exit early"), the `reaper-head-block` bug.
 */

export interface LeaseParams {
  /** kv_lease_duration, seconds: the initial lease at grant. */
  durationS: number
  /** duration // 6: how often D sends a heartbeat (0: every scheduler step). */
  intervalS: number
  /** duration * 2 // 3: how far past its arrival a heartbeat pushes the deadline. */
  extensionS: number
}

/** Python's `a // b` for the non-negative numbers a lease has. */
const floorDiv = (a: number, b: number): number => Math.floor(a / b)

export function leaseParams(durationS: number): LeaseParams {
  return {durationS, intervalS: floorDiv(durationS, 6), extensionS: floorDiv(durationS * 2, 3)}
}

/** VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default: 480 s since PR #25897 (merged 2025-09-29), 120 s before. */
export function legacyAbortTimeoutDefaultS(releaseDate: string | undefined): number {
  return releaseDate !== undefined && releaseDate < '2025-09-29' ? 120 : 480
}

export interface Renewal {
  id: string
  fromMs: number
  toMs: number
}

export interface Expired {
  id: string
  expiryMs: number
}

export interface ReapOptions {
  /** #58222: stop at the first entry (in grant order) that has not expired. */
  headBlock?: boolean
  /** Not vLLM: nothing ever expires (`lease-never-expires`). */
  never?: boolean
}

/** P's `_reqs_to_send`: request id → expiry (ms, the engine's clock), in grant order. */
export class LeaseTable {
  private readonly entries = new Map<string, number>()

  get size(): number {
    return this.entries.size
  }

  has(id: string): boolean {
    return this.entries.has(id)
  }

  expiryOf(id: string): number | undefined {
    return this.entries.get(id)
  }

  ids(): string[] {
    return [...this.entries.keys()]
  }

  /** request_finished: pin the blocks until now + ttl. A second grant of the same id keeps its place. */
  grant(id: string, nowMs: number, ttlS: number): number {
    const expiry = nowMs + ttlS * 1000
    this.entries.set(id, expiry)
    return expiry
  }

  /**
   * `_handle_heartbeat`: every tracked id gets max(old, now + extension); unknown ids (already freed, or another
   * engine's) are ignored. Returns what changed (a renewal that moves nothing is still listed: from === to).
   */
  heartbeat(ids: readonly string[], nowMs: number, extensionS: number): Renewal[] {
    const out: Renewal[] = []
    const candidate = nowMs + extensionS * 1000
    for (const id of ids) {
      const old = this.entries.get(id)
      if (old === undefined) continue
      const to = Math.max(old, candidate)
      this.entries.set(id, to)
      out.push({id, fromMs: old, toMs: to})
    }
    return out
  }

  /** D's notification that it read the blocks (or gave up on them): free at once. True when it was pinned. */
  release(id: string): boolean {
    return this.entries.delete(id)
  }

  /** One sweep of the reaper at `nowMs`: removes and returns the expired entries (`now >= expiry`). */
  reap(nowMs: number, opts: ReapOptions = {}): Expired[] {
    if (opts.never) return []
    const out: Expired[] = []
    for (const [id, expiryMs] of this.entries) {
      if (nowMs < expiryMs) {
        if (opts.headBlock) break
        continue
      }
      out.push({id, expiryMs})
    }
    for (const e of out) this.entries.delete(e.id)
    return out
  }
}
