import {Flags} from '@oclif/core'

import {type VllmUpResult, vllmUp} from '../sim/vllm/up.js'
import {VLLM_BUG_NAMES, VLLM_LOG_LEVELS, VLLM_NOTIF_PATHS} from '../sim/vllm/config.js'
import {seconds, simStateDir} from './sim-flags.js'
import {fromSimError} from './twin.js'

/**
 * `pdchaos sim up --engine vllm`: the flags of the vLLM twin (src/sim/vllm/) and the call, kept out of the SGLang
 * twin's command so that command needs only a spread of these flags and one dispatch line.
 */
export const vllmUpFlags = {
  engine: Flags.option({
    options: ['sglang', 'vllm'] as const,
    summary: 'Which engine the twin models: SGLang (router, prefill, decode) or vLLM (toy proxy, P and D, NIXL).',
    default: 'sglang',
  })(),
  'kv-lease-duration': Flags.string({
    summary: "vLLM: kv_connector_extra_config.kv_lease_duration in seconds (vLLM's default 30).",
  }),
  'abort-request-timeout': Flags.string({
    summary: 'vLLM: VLLM_NIXL_ABORT_REQUEST_TIMEOUT in seconds, used with --vllm-bug no-lease (default 480).',
  }),
  'vllm-version': Flags.string({summary: 'vLLM: the version the twin states.'}),
  'vllm-release-date': Flags.string({
    summary: 'vLLM: its release date (YYYY-MM-DD); before 2025-09-29 the legacy abort timeout defaults to 120 s.',
  }),
  'vllm-bug': Flags.string({
    summary: `vLLM: switch on a defect (${VLLM_BUG_NAMES.join(', ')}); repeatable.`,
    options: [...VLLM_BUG_NAMES],
    multiple: true,
  }),
  'side-channel-port': Flags.integer({
    summary: "vLLM: prefill's VLLM_NIXL_SIDE_CHANNEL_PORT (decode's is one more); default 5600.",
  }),
  'vllm-tp': Flags.integer({summary: 'vLLM: TP size of each server (VLLM::Worker_TP<k> processes above 1).'}),
  'xfer-stall-timeout': Flags.string({
    summary: "vLLM: NIXL's opt-in READ stall timeout in seconds (nixl PR #2047); 0, the default, is off.",
  }),
  'vllm-step-ms': Flags.integer({summary: "vLLM: the engine's step period in ms while it has work (default 20)."}),
  'vllm-notif-path': Flags.string({
    summary:
      "vLLM: where D's heartbeats and read notifications travel: side (the side channel, the default) or data " +
      "(each rank's data connection, as NIXL notifications ride the READ's transport).",
    options: [...VLLM_NOTIF_PATHS],
  }),
  'vllm-log-level': Flags.string({
    summary: 'vLLM: VLLM_LOGGING_LEVEL of P and D (default DEBUG: P logs its lease renewals; INFO: it does not).',
    options: [...VLLM_LOG_LEVELS],
  }),
}

interface Flagged {
  'state-dir': string
  host: string
  'base-port': number
  wait: string
  'kv-lease-duration'?: string
  'abort-request-timeout'?: string
  'vllm-version'?: string
  'vllm-release-date'?: string
  'vllm-bug'?: string[]
  'side-channel-port'?: number
  'vllm-tp'?: number
  'xfer-stall-timeout'?: string
  'vllm-step-ms'?: number
  'vllm-notif-path'?: string
  'vllm-log-level'?: string
}

export async function vllmSimUp(f: Flagged, log: (line: string) => void): Promise<Omit<VllmUpResult, 'config'>> {
  let result: VllmUpResult
  try {
    result = await vllmUp({
      stateDir: simStateDir(f['state-dir']),
      host: f.host,
      basePort: f['base-port'],
      ...(f['side-channel-port'] === undefined ? {} : {sideChannelPort: f['side-channel-port']}),
      leaseDurationS: seconds('--kv-lease-duration', f['kv-lease-duration']),
      abortRequestTimeoutS: seconds('--abort-request-timeout', f['abort-request-timeout']),
      version: f['vllm-version'],
      releaseDate: f['vllm-release-date'],
      bugs: f['vllm-bug'] ?? [],
      tp: f['vllm-tp'],
      xferStallTimeoutS: seconds('--xfer-stall-timeout', f['xfer-stall-timeout']),
      stepMs: f['vllm-step-ms'],
      ...(f['vllm-notif-path'] === undefined ? {} : {notifPath: f['vllm-notif-path']}),
      ...(f['vllm-log-level'] === undefined ? {} : {logLevel: f['vllm-log-level']}),
      waitS: seconds('--wait', f.wait),
    })
  } catch (error) {
    throw fromSimError(error)
  }
  const {config: c, ...out} = result
  const lease =
    c.lease.mode === 'lease'
      ? `lease ${c.lease.durationS}s (heartbeat every ${c.lease.intervalS}s, +${c.lease.extensionS}s)`
      : `legacy VLLM_NIXL_ABORT_REQUEST_TIMEOUT ${c.lease.abortTimeoutS}s`
  log(
    `vLLM twin healthy in ${(out.healthyMs / 1000).toFixed(1)} s (vLLM ${c.version}, NixlConnector kv_both, TP ` +
      `${c.tp}, ${lease}${c.bugs.length ? `, bugs: ${c.bugs.join(', ')}` : ''})`,
  )
  for (const [name, url] of Object.entries(out.endpoints))
    log(`  ${(name === 'router' ? 'proxy' : name).padEnd(15)} ${url}`)
  log(`  side channel    ${c.host}:${c.sideChannel.prefill} (prefill), ${c.host}:${c.sideChannel.decode} (decode)`)
  log(`  deployment file ${out.deploymentFile}`)
  log(`Stop it with: pdchaos sim down --state-dir ${out.stateDir}`)
  return out
}
