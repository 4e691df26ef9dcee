import {Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {DEFAULT_PROBE_TIMEOUT_MS} from '../deployment/clients.js'
import {ExitCode} from '../exit-codes.js'
import {discover, type StatusReport} from '../discovery/discover.js'
import {targetFlags} from '../cli/flags.js'
import {renderStatus} from '../report/status-text.js'
import {resolveTarget} from '../cli/target.js'

export default class Status extends BaseCommand<typeof Status> {
  static override summary = 'Discover the deployment: health, versions, ranks, ports, counters, watchdog settings, leases.'
  static override description = "Reads the services' HTTP APIs, the host's process table, /proc, nvidia-smi and the prefill bootstrap route. Changes nothing on the host. Exits 5 when a service is unhealthy."
  static override examples = ['<%= config.bin %> status --sim', '<%= config.bin %> status -c pdchaos.yaml --json']
  static override flags = {
    ...targetFlags,
    'accept-new-host-key': Flags.boolean({summary: 'Trust and record the host key of a host not yet in known_hosts.'}),
    timeout: Flags.integer({summary: 'Deadline of each probe, in seconds.', default: DEFAULT_PROBE_TIMEOUT_MS / 1000, min: 1, max: 120}),
  }

  async run(): Promise<StatusReport> {
    const target = await resolveTarget(this.flags, {onProgress: (l) => this.progress(l)})
    try {
      const report = await discover(target.deployment, target.host, {timeoutMs: this.flags.timeout * 1000})
      if (!this.jsonEnabled()) this.log(renderStatus(report))
      // The report is printed either way; an unhealthy service makes the exit code say so (5), for scripts.
      if (Object.values(report.services).some((s) => !s.health.ok)) process.exitCode = ExitCode.unreachable
      return report
    } finally {
      await target.host.close()
    }
  }
}
