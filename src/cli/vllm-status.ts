import {listHostState} from '../discovery/host-state.js'
import {loadVllmDeployment, vllmStateDir} from '../engines/vllm/deployment-file.js'
import {oneLine} from '../errors.js'
import {readHalt} from '../halt/host-halt.js'
import {discoverVllm, type VllmStatusReport} from '../engines/vllm/discover.js'
import {renderVllmStatus} from '../engines/vllm/status-text.js'
import {ExitCode} from '../exit-codes.js'
import {openHost} from '../hosts/open-host.js'
import {redactDeep} from '../util/redact.js'

/** `pdchaos status -c FILE` for an `engine: vllm` file: read the hosts once, print or return the report. */
export async function vllmStatus(
  file: string,
  opts: {timeoutS?: number; json: boolean; log: (text: string) => void; warn?: (line: string) => void},
): Promise<VllmStatusReport> {
  const d = await loadVllmDeployment(file)
  const host = await openHost(d.host, {sudo: d.sudo})
  try {
    const timeoutMs = (opts.timeoutS ?? d.probeTimeoutSeconds ?? 5) * 1000
    // Beside the discovery, what pdchaos holds in the stateDir (leases, lock) and the halt, as SGLang's status reads
    // them; a host that cannot say is a warning line, not a failed status.
    const stateDir = vllmStateDir(d)
    const [found, hostState, halt] = await Promise.all([
      discoverVllm(d, host, {timeoutMs}),
      listHostState(host, stateDir, timeoutMs).catch((error: unknown) => {
        opts.warn?.(`pdchaos state on ${host.describe()}: ${oneLine(error)}`)
        return undefined
      }),
      readHalt({name: 'host', host, stateDir}, {timeoutMs}).catch(() => undefined),
    ])
    const report = redactDeep({...found, ...(hostState ? {hostState} : {}), ...(halt ? {halt} : {})})
    if (!opts.json) opts.log(renderVllmStatus(report))
    if (!report.router.health.ok || report.servers.some(s => !s.health.ok)) process.exitCode = ExitCode.unreachable
    return report
  } finally {
    await host.close()
  }
}
