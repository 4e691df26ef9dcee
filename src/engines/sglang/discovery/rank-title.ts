/** SGLang's scheduler process title: which ranks a scheduler holds (moved here from discovery/proc.ts, unchanged). */

export interface RankTitle {
  tpRank: number
  dpRank?: number
  ppRank?: number
  attnCpRank?: number
  moeDpRank?: number
  epRank?: number
}

const TITLE_SEGMENTS = {
  DP: 'dpRank',
  PP: 'ppRank',
  ATTN_CP: 'attnCpRank',
  MOE_DP: 'moeDpRank',
  TP: 'tpRank',
  EP: 'epRank',
} as const

/**
 * SGLang's scheduler title (managers/scheduler.py, configure_scheduler_process): `sglang::scheduler`, then `_DP<d>`
 * when a DP rank is set, `_PP<p>` (pp > 1), `_ATTN_CP<c>` (attn cp > 1), `_MOE_DP<m>` (moe dp > 1), `_TP<t>` only when
 * tp > 1, `_EP<e>` (ep > 1), in that order. A TP-1 scheduler is plain `sglang::scheduler`: its TP rank is 0.
 */
export function parseRankTitle(args: string): RankTitle | undefined {
  const m = /^sglang::scheduler((?:_(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)(?=\s|$)/.exec(args)
  if (!m) return undefined
  const out: RankTitle = {tpRank: 0}
  let last = -1
  for (const seg of m[1]!.matchAll(/_(ATTN_CP|MOE_DP|DP|PP|TP|EP)(\d+)/g)) {
    const order = Object.keys(TITLE_SEGMENTS).indexOf(seg[1]!)
    // Out of SGLang's order (or repeated): not a title SGLang writes.
    if (order <= last) return undefined
    last = order
    out[TITLE_SEGMENTS[seg[1] as keyof typeof TITLE_SEGMENTS]] = Number(seg[2])
  }
  return out
}
