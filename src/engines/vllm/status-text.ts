import type {Sourced} from '../engine.js'
import {haltLine} from '../../model/halt.js'
import type {VllmStatusReport} from './discover.js'

/** `pdchaos status` of a vLLM deployment, as text: each value with where it was read. */

const src = (s: Sourced<number | string> | {value: string; detail: string}, unit = ''): string =>
  'source' in s ? `${s.value}${unit}  (${s.source}: ${s.detail})` : `${s.value}${unit}  (${s.detail})`

export function renderVllmStatus(r: VllmStatusReport): string {
  const out = [`engine      vllm  (host ${r.host})`]
  for (const s of r.servers) {
    out.push('', `${s.role.padEnd(11)} ${s.url}  ${s.health.ok ? 'healthy' : 'UNHEALTHY'}  (${s.health.detail})`)
    out.push(`  pid         ${s.pid ?? 'not found'}`)
    out.push(`  titles      ${s.titles.length === 0 ? 'none' : s.titles.join(', ')}`)
    out.push(`  metrics     ${s.metrics.vllm ? 'vllm:* names' : 'no vllm:* names'}  (${s.metrics.detail})`)
    out.push(`  version     ${src(s.version)}`)
    const l = s.lease
    if (l) {
      out.push(`  connector   ${l.connector ? src(l.connector) : 'unknown  (no kv_connector in --kv-transfer-config)'}`)
      out.push(`  lease mode  ${l.mode}`)
      out.push(`  kv_lease_duration    ${src(l.leaseDurationS, ' s')}`)
      out.push(`  heartbeat interval   ${src(l.heartbeatIntervalS, ' s')}`)
      out.push(`  heartbeat extension  ${src(l.extensionS, ' s')}`)
      out.push(`  legacy abort timeout ${src(l.legacyAbortTimeoutS, ' s')}`)
      out.push(`  release window       ${l.window}`)
    }
    for (const p of s.problems) out.push(`  ! ${p}`)
  }
  out.push(
    '',
    `router      ${r.router.url}  ${r.router.health.ok ? 'healthy' : 'UNHEALTHY'}  (${r.router.health.detail})`,
  )
  return [...out, ...pdchaosLines(r)].join('\n')
}

/** What pdchaos holds on the host, as SGLang's status shows it: leases, the run lock, and the halt, loud. */
function pdchaosLines(r: VllmStatusReport): string[] {
  const out: string[] = []
  if (r.hostState) {
    const {leases, lock} = r.hostState
    const named = leases.map(l => `${String(l.id ?? l.file)} (${String(l.fault ?? '?')})`)
    out.push(
      '',
      `leases      ${named.length === 0 ? 'none' : named.join(', ')}`,
      `lock        ${lock ? `held by ${String(lock.owner)} for ${String(lock.command)}` : 'free'}`,
    )
  }
  if (r.halt)
    out.push('', `HALTED      ${haltLine(r.halt)}`, '            no chaos run acts on it until `pdchaos resume`')
  return out
}
