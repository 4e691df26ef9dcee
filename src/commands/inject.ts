import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {assertMayDisturb} from '../deployment/protection.js'
import {ExitCode} from '../exit-codes.js'
import {runInject, type InjectResult} from '../experiment/inject.js'
import {FAULT_NAMES} from '../faults/registry.js'
import {targetFlags} from '../cli/flags.js'
import {renderInject} from '../report/inject-text.js'
import {injectJournal} from '../report/journal-fields.js'
import {writeJournal} from '../report/journal.js'
import {resolveTarget} from '../cli/target.js'

export default class Inject extends BaseCommand<typeof Inject> {
  static override summary = 'One experiment: inject a fault under a lease, drive pins, observe, revert, verify clean, judge the watchdog.'
  static override description = [
    'Faults: drop-dest-info (decode destination info never reaches prefill; pins sit in Bootstrapping),',
    'stall-kv --gpu N (one rank\'s KV transfer stalls; pins sit in Transferring),',
    'abort-mid-transfer (aborts fired inside the transfer window, N trials).',
    'Every fault is installed under a lease on the host that reverts it at its TTL even if pdchaos dies.',
    'Exit 0 all checks passed, 1 a check failed, 3 interrupted (reverted), 4 cleanup unverified.',
  ].join(' ')
  static override examples = [
    '<%= config.bin %> inject drop-dest-info --sim',
    '<%= config.bin %> inject stall-kv --gpu 2 -c pdchaos.yaml --journal run.json',
    '<%= config.bin %> inject stall-kv --gpu 5 --mechanism sigstop --side decode --dry-run',
    '<%= config.bin %> inject abort-mid-transfer --trials 20 --sim',
  ]
  static override args = {
    fault: Args.string({required: true, options: FAULT_NAMES, description: 'The fault to inject.'}),
  }
  static override flags = {
    ...targetFlags,
    pins: Flags.integer({summary: 'Pinned requests to create.', default: 3, min: 1, max: 10_000}),
    'pin-interval': Flags.integer({summary: 'Milliseconds between pin sends; spacing keeps each pin\'s queue entry close to its send time (0: all at once).', default: 20, min: 0, max: 10_000}),
    gpu: Flags.integer({summary: 'stall-kv: the GPU whose rank stalls; abort-mid-transfer: widen the window on this GPU\'s rank.', min: 0}),
    rank: Flags.integer({summary: 'drop-dest-info: only this prefill TP rank.', min: 0}),
    mechanism: Flags.option({options: ['auto', 'packet-filter', 'sigstop', 'twin-failpoint'] as const, summary: 'How the fault is made (auto follows the detected transport; twin-failpoint is the twin\'s own, for users without root).'})(),
    side: Flags.option({options: ['prefill', 'decode'] as const, summary: 'stall-kv with sigstop: stop the prefill rank or its decode peer.'})(),
    trials: Flags.integer({summary: 'abort-mid-transfer: number of trials.', min: 1, max: 200}),
    'widen-kbytes': Flags.integer({summary: 'abort-mid-transfer: widen the window by rate-limiting --gpu\'s KV connections to this many kB/s.', min: 1}),
    hold: Flags.boolean({summary: 'Inject, verify, and leave the fault in place until its lease expires (explore by hand).'}),
    'dry-run': Flags.boolean({summary: 'Show the plan and run only its read-only probes; change nothing.'}),
    ttl: Flags.integer({summary: 'Lease TTL in seconds (default: deadline + poll + hold + margin; at most 3600).', min: 1, max: 3600}),
    'prompt-tokens': Flags.integer({summary: 'Prompt length of every request, in tokens.', default: 128, min: 1, max: 131_072}),
    'load-interval': Flags.integer({summary: 'Milliseconds between steady-load requests (0: no load).', default: 500, min: 0}),
    canaries: Flags.integer({summary: 'Requests after the revert that must succeed.', default: 3, min: 1, max: 100}),
    journal: Flags.string({summary: 'Write the run journal (JSON) to this file.'}),
    'allow-production': Flags.boolean({summary: 'Allow injecting into a deployment labelled environment: production.'}),
    'accept-new-host-key': Flags.boolean({summary: 'Trust and record the host key of a host not yet in known_hosts.'}),
  }

  async run(): Promise<ReturnType<typeof injectJournal>> {
    const f = this.flags
    const target = await resolveTarget(f, {onProgress: (l) => this.progress(l)})
    try {
      assertMayDisturb(target.deployment, f['allow-production'], 'inject a fault into')
      const params: Record<string, unknown> = {}
      if (f.gpu !== undefined) params.gpu = f.gpu
      if (f.rank !== undefined) params.rank = f.rank
      if (f.mechanism !== undefined) params.mechanism = f.mechanism
      if (f.side !== undefined) params.side = f.side
      if (f.trials !== undefined) params.trials = f.trials
      if (f['widen-kbytes'] !== undefined) params.widenKBytesPerSecond = f['widen-kbytes']
      const run = () => runInject(target.deployment, target.host, {
        fault: this.args.fault, params, pins: f.pins, pinIntervalMs: f['pin-interval'], hold: f.hold, dryRun: f['dry-run'], ttlS: f.ttl,
        promptTokens: f['prompt-tokens'], loadIntervalMs: f['load-interval'], canaries: f.canaries, onProgress: (l) => this.progress(l),
      })
      let result: InjectResult
      if (f['dry-run']) {
        result = await run()
      } else {
        const w = target.deployment.watchdog
        // --hold leaves the fault in place: the lock stays too, and expires with the lease.
        const ttlMs = f.hold ? ((f.ttl ?? 60) + 5) * 1000 : ((w.deadlineSeconds + w.pollSeconds) * 3 + 300) * 1000
        const lock = await acquireHostLock(target.host, target.deployment.stateDir, {command: `inject ${this.args.fault}${f.hold ? ' --hold' : ''}`, ttlMs, untilExpiry: f.hold})
        try {
          result = await run()
        } finally {
          if (!f.hold) await lock.release().catch(() => {})
        }
      }
      const journal = injectJournal(target.deployment, result)
      if (f.journal) writeJournal(f.journal, {command: 'inject', ...journal, timeline: result.timeline})
      if (!this.jsonEnabled()) this.log(renderInject(result))
      if (result.summary.failed > 0) process.exitCode = ExitCode.checkFailed
      return journal
    } finally {
      await target.host.close()
    }
  }
}
