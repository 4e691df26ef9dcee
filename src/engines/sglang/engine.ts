import type {Engine} from '../engine.js'
import {parseRankTitle} from './discovery/rank-title.js'
import {SGLANG_PIN_STATES} from './pin-states.js'
import {CAUSE_NAMES, SGLANG_RELEASE_TEXTS} from './release-texts.js'
import {QUEUE_REQS, RUNNING_REQS, TOKEN_USAGE} from './sglang-metrics.js'

/**
 * SGLang: everything that is its own lives in this folder (docs/architecture.md, "Adding an engine"): discovery/
 * (`discover()`, scheduler titles, launch args, its PD timeouts and watchdog environment, the gateway's settings),
 * deployment/ (its HTTP and gateway clients, the watchdog contract's rules: the deployment layer asks them), its metric
 * names (sglang-metrics.ts) and when each is fresh (freshness.ts), its release texts and its pin states.
 */
export const sglangEngine: Engine = {
  name: 'sglang',
  processesOf: rows =>
    rows.filter(r => parseRankTitle(r.args) !== undefined || /(^|[\s/])sglang\.launch_server(\s|$)/.test(r.args)),
  metricsAreOurs: text => /^sglang:[a-z_]+/m.test(text),
  deadline: {
    kind: 'watchdog',
    summary:
      "prefill's watchdog contract (deployment file `watchdog:`): a request unread past its deadline is released",
  },
  metrics: {
    names: [RUNNING_REQS, QUEUE_REQS, TOKEN_USAGE],
    freshness: 'per scheduler step (engines/sglang/freshness.ts)',
  },
  // One line per cause its texts can name, in the words a report uses (CAUSE_NAMES).
  releaseCauses: [...new Set(SGLANG_RELEASE_TEXTS.flatMap(t => [t.cause, ...Object.values(t.byState ?? {})]))].map(
    cause => ({cause, text: CAUSE_NAMES[cause]}),
  ),
  releaseTexts: SGLANG_RELEASE_TEXTS,
  pinStates: SGLANG_PIN_STATES,
}
