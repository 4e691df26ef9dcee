/**
 * How the twin's gateway picks one worker of a role, modelled on sgl-model-gateway's policies
 * (sgl-model-gateway/src/policies/: round_robin.rs, random.rs, cache_aware.rs; docs/twin.md, "Router"). The PD router
 * picks the prefill and the decode worker independently, each among the workers of its role that are healthy and
 * whose breaker lets requests through (pd_router/selection.rs, select_pd_pair → pick_worker_by_policy_arc).
 */

export const POLICY_NAMES = ['cache_aware', 'round_robin', 'random'] as const
export type PolicyName = (typeof POLICY_NAMES)[number]

/**
 * cache_aware's settings (--cache-threshold, --balance-abs-threshold, --balance-rel-threshold; upstream's defaults).
 */
export interface CacheAwareSettings {
  cacheThreshold: number
  balanceAbsThreshold: number
  balanceRelThreshold: number
}
export const CACHE_AWARE_DEFAULTS: CacheAwareSettings = {
  cacheThreshold: 0.3,
  balanceAbsThreshold: 64,
  balanceRelThreshold: 1.5,
}

export interface Candidate {
  url: string
  /** Requests this router has in flight on the worker (upstream's WorkerLoadGuard count). */
  load: number
}

export interface Policy {
  readonly name: PolicyName
  /** Index into `available` (never empty). `text` is the request's text, for cache affinity. */
  select(available: readonly Candidate[], text: string): number
}

/** Texts remembered per worker: the approximate tree's stand-in, bounded (upstream evicts by size every 60 s). */
const REMEMBERED_TEXTS = 256

export function makePolicy(
  name: PolicyName,
  random: () => number = Math.random,
  cache: CacheAwareSettings = CACHE_AWARE_DEFAULTS,
): Policy {
  switch (name) {
    case 'round_robin': {
      // One counter over the calls; the index is taken among the workers available now.
      let counter = 0
      return {name, select: available => counter++ % available.length}
    }
    case 'random':
      return {name, select: available => Math.min(available.length - 1, Math.floor(random() * available.length))}
    case 'cache_aware': {
      const seen = new Map<string, string[]>()
      const remember = (url: string, text: string): void => {
        const texts = seen.get(url) ?? []
        texts.push(text)
        if (texts.length > REMEMBERED_TEXTS) texts.shift()
        seen.set(url, texts)
      }
      return {
        name,
        select(available, text) {
          const loads = available.map(c => c.load)
          const [min, max] = [Math.min(...loads), Math.max(...loads)]
          const minLoad = loads.indexOf(min)
          // Imbalanced (both thresholds): the shortest queue.
          if (max - min > cache.balanceAbsThreshold && max > min * cache.balanceRelThreshold) {
            remember(available[minLoad]!.url, text)
            return minLoad
          }
          // Balanced: the worker whose past requests share the longest prefix with this one, when the match is
          // long enough; else the least loaded.
          let best = -1
          let bestMatch = 0
          for (const [i, c] of available.entries()) {
            for (const t of seen.get(c.url) ?? []) {
              const m = commonPrefix(t, text)
              if (m > bestMatch) [best, bestMatch] = [i, m]
            }
          }
          const rate = text.length === 0 ? 0 : bestMatch / text.length
          const chosen = best >= 0 && rate > cache.cacheThreshold ? best : minLoad
          remember(available[chosen]!.url, text)
          return chosen
        },
      }
    }
  }
}

function commonPrefix(a: string, b: string): number {
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++
  return i
}
