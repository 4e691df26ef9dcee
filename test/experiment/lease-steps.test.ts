import {describe, expect, it} from 'vitest'

import {revertAndVerify} from '../../src/experiment/lease-steps.js'
import type {FaultPlan} from '../../src/faults/fault.js'
import type {LeaseGuard} from '../../src/faults/lease/lease-guard.js'
import {buildFilter} from '../../src/faults/mechanisms/packet-filter.js'
import {buildTwinFailpoint} from '../../src/faults/mechanisms/twin-failpoint.js'
import type {Host, RunResult} from '../../src/hosts/host.js'
import type {LeaseRecord} from '../../src/model/run.js'
import {Recorder} from '../../src/workload/recorder.js'

/**
 * The revert step reads the fault's rules once more before taking them out: a packet filter's match count reaches
 * the timeline as a number (filter-matched), which the abort check needs to show the widening held a transfer.
 */

const ok = (stdout: string): RunResult => ({code: 0, stdout, stderr: '', durationMs: 1})

/** nft's JSON listing of lease t1's table, each rule's counter at `packets`; after the revert, no table at all. */
function nftHost(packets: number): Host {
  const reverted = false
  const table = 'pdchaos_t1'
  const listing = JSON.stringify({
    nftables: [
      {table: {family: 'inet', name: table}},
      {chain: {family: 'inet', table, name: 'input', hook: 'input'}},
      {chain: {family: 'inet', table, name: 'output', hook: 'output'}},
      ...['input', 'output'].map(chain => ({
        rule: {
          family: 'inet',
          table,
          chain,
          comment: 'to-8998',
          expr: [{counter: {packets, bytes: 60 * packets}}, {drop: null}],
        },
      })),
    ],
  })
  return {
    async run(argv) {
      if (argv.join(' ') === `nft -j list table inet ${table}`) return ok(listing)
      if (argv.join(' ') === 'nft -j list tables')
        return ok(JSON.stringify({nftables: reverted ? [] : [{table: {family: 'inet', name: table}}]}))
      throw new Error(`unexpected command ${argv.join(' ')}`)
    },
    upload: async () => {},
    startDetached: async () => ({pid: 0}),
    describe: () => 'scripted',
    close: async () => {},
  } satisfies Host
}

function guardOn(host: Host): LeaseGuard {
  // The two members revertAndVerify uses: the host its probes run on, and the revert of the lease.
  return {host, revert: async () => ({status: 'reverted', exitCode: 0, byWhom: 'pdchaos'})} as unknown as LeaseGuard
}

function planOf(m: {
  verifyInjected: FaultPlan['verifyInjected'][number]
  verifyClean: FaultPlan['verifyClean'][number]
}): FaultPlan {
  return {
    fault: 'abort-mid-transfer',
    mechanism: 'abort-requests',
    leaseId: 't1',
    targets: [],
    inject: [],
    revert: [],
    sudo: true,
    verifyInjected: [m.verifyInjected],
    verifyClean: [m.verifyClean],
    readOnlyProbes: [],
    description: 'test',
  }
}

const lease = (): LeaseRecord => ({
  id: 't1',
  fault: 'abort-mid-transfer',
  mechanism: 'abort-requests',
  injectedAt: 1,
  revertedAt: null,
  verifiedInjected: true,
  verifiedClean: false,
  expiresAt: 0,
  evidence: {injected: [], clean: []},
})

describe('revertAndVerify', () => {
  it("records the packet filter's match count, summed over its rules, before the revert", async () => {
    const rec = new Recorder()
    const record = lease()
    await revertAndVerify(
      guardOn(nftHost(156)),
      planOf(buildFilter({tool: 'nft', leaseId: 't1', matches: [{kind: 'to', port: 8998}]})),
      rec,
      record,
      1000,
      () => {},
    )
    const matched = rec.observations.filter(o => o.kind === 'filter-matched')
    expect(matched).toMatchObject([
      {leaseId: 't1', packets: 312, evidence: expect.stringContaining('312 packet(s) matched so far')},
    ])
    // Read before the revert: the revert's own observation comes after it.
    const reverted = rec.observations.find(o => o.kind === 'fault-reverted')!
    expect(matched[0]!.t).toBeLessThanOrEqual(reverted.t)
    expect(record.evidence.injected).toEqual([expect.stringMatching(/^at revert: .*312 packet\(s\) matched so far$/)])
  })

  it('a filter that matched nothing says 0, not nothing', async () => {
    const rec = new Recorder()
    await revertAndVerify(
      guardOn(nftHost(0)),
      planOf(buildFilter({tool: 'nft', leaseId: 't1', matches: [{kind: 'to', port: 8998}]})),
      rec,
      lease(),
      1000,
      () => {},
    )
    expect(rec.observations.filter(o => o.kind === 'filter-matched')).toMatchObject([{packets: 0}])
  })

  it("a mechanism without a counter (the twin's failure point) records no count", async () => {
    const rec = new Recorder()
    const host: Host = {...nftHost(0), run: async () => ok(JSON.stringify({failpoints: {'stall-kv': [0]}}))}
    const record = lease()
    await revertAndVerify(
      guardOn(host),
      planOf(buildTwinFailpoint('http://127.0.0.1:1/_pdchaos/twin/failpoint', 'stall-kv', [0])),
      rec,
      record,
      1000,
      () => {},
    )
    // It was read before the revert like any fault, and carries no count.
    expect(record.evidence.injected).toEqual(['at revert: twin failpoint stall-kv: on for TP0'])
    expect(rec.observations.filter(o => o.kind === 'filter-matched')).toEqual([])
  })
})
