import {loadVllmDeployment} from '../engines/vllm/deployment-file.js'
import {discoverVllm, type VllmStatusReport} from '../engines/vllm/discover.js'
import {renderVllmStatus} from '../engines/vllm/status-text.js'
import {ExitCode} from '../exit-codes.js'
import {openHost} from '../hosts/open-host.js'
import {redactDeep} from '../util/redact.js'

/** `pdchaos status -c FILE` for an `engine: vllm` file: read the hosts once, print or return the report. */
export async function vllmStatus(
  file: string,
  opts: {timeoutS?: number; json: boolean; log: (text: string) => void},
): Promise<VllmStatusReport> {
  const d = await loadVllmDeployment(file)
  const host = await openHost(d.host, {sudo: d.sudo})
  try {
    const timeoutMs = (opts.timeoutS ?? d.probeTimeoutSeconds ?? 5) * 1000
    const report = redactDeep(await discoverVllm(d, host, {timeoutMs}))
    if (!opts.json) opts.log(renderVllmStatus(report))
    if (!report.router.health.ok || report.servers.some(s => !s.health.ok)) process.exitCode = ExitCode.unreachable
    return report
  } finally {
    await host.close()
  }
}
