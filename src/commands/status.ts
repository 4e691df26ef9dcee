import {Flags} from '@oclif/core'

import {TargetCommand} from '../cli/target-command.js'
import {withHaltOf} from '../cli/halt-hook.js'
import {DEFAULT_PROBE_TIMEOUT_MS} from '../engines/sglang/deployment/clients.js'
import {ExitCode} from '../exit-codes.js'
import {discover, type StatusReport} from '../engines/sglang/discovery/discover.js'
import {type DeploymentReport, discoverAcrossHosts} from '../engines/sglang/discovery/discover-hosts.js'
import {hostView, instancesOn} from '../deployment/single-host.js'
import {renderStatus} from '../report/status-text.js'
import {vllmStatus} from '../cli/vllm-status.js'
import {engineFlags, vllmTarget} from '../cli/engine-target.js'
import {redactDeep} from '../util/redact.js'

export default class Status extends TargetCommand<typeof Status> {
  static override summary =
    'Discover the deployment: health, versions, ranks, ports, counters, watchdog settings, leases.'
  static override description =
    "Reads the services' HTTP APIs, the host's process table, /proc, nvidia-smi and the prefill bootstrap route. " +
    'Changes nothing on the host. Exits 5 when a service is unhealthy.'
  static override examples = ['<%= config.bin %> status --sim', '<%= config.bin %> status -c pdchaos.yaml --json']
  static override flags = {
    ...TargetCommand.targetFlags,
    ...engineFlags,
    timeout: Flags.integer({
      summary:
        `Deadline of each probe, in seconds (default: the deployment file's probeTimeoutSeconds, ` +
        `else ${DEFAULT_PROBE_TIMEOUT_MS / 1000}).`,
      min: 1,
      max: 120,
    }),
  }

  async run(): Promise<StatusReport | DeploymentReport | Awaited<ReturnType<typeof vllmStatus>>> {
    // engine: vllm (issue 31), or --sim --engine vllm (its twin's file): read by engines/vllm, not SGLang's discovery.
    const vllm = await vllmTarget(this.flags, {say: l => this.progress(l)})
    if (vllm)
      return vllmStatus(vllm.file, {
        timeoutS: this.flags.timeout,
        json: this.jsonEnabled(),
        log: t => this.log(t),
        warn: l => this.progress(l),
      })
    // The service URLs are shown as the deployment file gives them, minus any password (issue 12, S4).
    const report = redactDeep(
      await this.withTarget(
        {},
        withHaltOf(t => {
          const timeoutMs =
            (this.flags.timeout ?? t.deployment.probeTimeoutSeconds ?? DEFAULT_PROBE_TIMEOUT_MS / 1000) * 1000
          // Over several hosts: each host read for the services it runs.
          if (t.across)
            return discoverAcrossHosts(
              t.across.map(a => ({...a, view: hostView(t.model, a.name), instances: instancesOn(t.model, a.name)})),
              {timeoutMs},
            )
          return discover(t.deployment, t.host, {timeoutMs})
        }),
      ),
    )
    if (!this.jsonEnabled()) this.log(renderStatus(report))
    // The report is printed either way; an unhealthy service makes the exit code say so (5), for scripts.
    const every = [...Object.values(report.services), ...((report as DeploymentReport).instances ?? [])]
    if (every.some(s => !s.health.ok)) process.exitCode = ExitCode.unreachable
    return report
  }
}
