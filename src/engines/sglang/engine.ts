import {parseRankTitle} from '../../discovery/proc.js'
import type {Engine} from '../engine.js'

/**
 * SGLang, thin: what discovery/ and deployment/ hold today (scheduler titles in discovery/proc.ts, the watchdog
 * contract in deployment/watchdog-rules.ts and discovery/watchdog-env.ts). A later pass may move those files here.
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
    names: ['sglang:num_running_reqs', 'sglang:num_queue_reqs', 'sglang:token_usage'],
    freshness: 'per scheduler step (deployment/freshness.ts)',
  },
  releaseCauses: [],
}
