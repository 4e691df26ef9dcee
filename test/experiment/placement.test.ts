import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {PdError} from '../../src/errors.js'
import {hostForFault, onHost, Placement, withLeasesOn} from '../../src/experiment/placement.js'
import type {Host} from '../../src/hosts/host.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {withLeases} from '../../src/faults/lease/lease-guard.js'

const deployment = DeploymentSchema.parse({
  name: 'two',
  host: {kind: 'local'},
  stateDir: '/var/lib/pdchaos',
  services: {
    prefill: {url: 'http://a:30100', bootstrapPort: 30500},
    decode: {url: 'http://b:30200'},
    router: {url: 'http://a:30000'},
  },
  watchdog: {deadlineSeconds: 2, pollSeconds: 1},
})
const host = (name: string): Host => ({describe: () => name}) as unknown as Host
const two = Placement.across(deployment, [
  {name: 'node-a', roles: ['prefill', 'router'], host: host('a'), view: deployment},
  {name: 'node-b', roles: ['decode'], host: host('b'), view: deployment},
])
const ranks = [
  {service: 'prefill' as const, gpu: 0, host: 'node-a'},
  {service: 'prefill' as const, gpu: 1, host: 'node-a'},
  {service: 'decode' as const, gpu: 4, host: 'node-b'},
  {service: 'decode' as const, gpu: 1, host: 'node-b'},
]

describe('where a fault acts on a deployment over several hosts', () => {
  it(
    "each host keeps its leases and lock in its own directory under the deployment's state dir; one host keeps " +
      'the state dir itself',
    () => {
      expect(two.hosts.map(h => h.stateDir)).toEqual(['/var/lib/pdchaos/node-a', '/var/lib/pdchaos/node-b'])
      expect(Placement.single(deployment, host('a')).hosts.map(h => h.stateDir)).toEqual(['/var/lib/pdchaos'])
      expect(two.of('decode').name).toBe('node-b')
      expect(two.of('router').name).toBe('node-a')
    },
  )

  it(
    "the host of the rank on the named GPU; prefill's without one; a GPU index two hosts share is exit 2, never " +
      'guessed',
    () => {
      expect(hostForFault(two, {gpu: 4}, ranks).name).toBe('node-b')
      expect(hostForFault(two, {gpu: 0}, ranks).name).toBe('node-a')
      expect(hostForFault(two, {}, ranks).name).toBe('node-a')
      let e: unknown
      try {
        hostForFault(two, {gpu: 1}, ranks)
      } catch (error) {
        e = error
      }
      expect(e).toBeInstanceOf(PdError)
      expect((e as PdError).exitCode).toBe(2)
      expect((e as PdError).message).toBe(
        "GPU 1 holds a rank on each of node-a and node-b: which host's GPU is meant is ambiguous",
      )
    },
  )

  it(
    "--gpu-host names the GPU's host where the index is shared (a multi-node instance's nodes); drop-dest-info " +
      "--rank goes to its rank's host",
    () => {
      expect(hostForFault(two, {gpu: 1}, ranks, 'node-b').name).toBe('node-b')
      expect(hostForFault(two, {gpu: 1}, ranks, 'node-a').name).toBe('node-a')
      const refused = (f: () => unknown): PdError => {
        try {
          f()
        } catch (error) {
          return error as PdError
        }
        throw new Error('not refused')
      }
      const unknown = refused(() => hostForFault(two, {gpu: 1}, ranks, 'node-c'))
      expect(unknown.exitCode).toBe(2)
      expect(unknown.message).toBe('--gpu-host node-c: the run acts on the hosts node-a, node-b, not on node-c')
      expect(refused(() => hostForFault(two, {}, ranks, 'node-a')).message).toBe(
        '--gpu-host node-a names the host of --gpu, and this fault names no GPU',
      )
      expect(refused(() => hostForFault(two, {gpu: 1}, ranks)).suggestion).toMatch(/--gpu-host .*one of node-a, node-b/)
      // Prefill over two nodes: TP2 and TP3 on node-b.
      const split = [
        ...ranks.map((r, i) => ({...r, tpRank: i})),
        {service: 'prefill' as const, gpu: 0, tpRank: 3, host: 'node-b'},
      ]
      expect(hostForFault(two, {rank: 3}, split).name).toBe('node-b')
      expect(hostForFault(two, {rank: 0}, split).name).toBe('node-a')
      expect(hostForFault(two, {}, split).name).toBe('node-a')
    },
  )

  it('a fault plans from the ranks of the host it acts on only', () => {
    expect(onHost({ranks}, two.named('node-b'), two).ranks.map(r => r.gpu)).toEqual([4, 1])
    const one = Placement.single(deployment, host('a'))
    expect(onHost({ranks}, one.hosts[0]!, one).ranks).toHaveLength(4)
  })
})

describe('lease guards on several hosts', () => {
  it("after a signal the process ends once, when every host's guard is done, with the worst code", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pdchaos-guards-'))
    const local = new LocalHost('never')
    const hosts = Placement.across({...deployment, stateDir: dir}, [
      {name: 'node-a', roles: ['prefill', 'router'], host: local, view: deployment},
      {name: 'node-b', roles: ['decode'], host: local, view: deployment},
    ]).hosts
    const exits: number[] = []
    let signalled!: () => void
    const after = new Promise<void>(resolve => {
      signalled = resolve
    })
    try {
      await withLeasesOn(
        hosts,
        async guardOf => {
          // node-b's guard cannot revert its lease (the revert script fails), node-a has none: 3 and 4 make one exit,
          // 4.
          const b = guardOf('node-b')
          ;(b as unknown as {revertAll: () => Promise<unknown>}).revertAll = async () => ({
            results: [],
            failures: [{lease: {id: 'L', expiresAt: Date.now() + 60_000}, why: 'connection lost'}],
          })
          process.emit('SIGINT', 'SIGINT')
          await after
        },
        {
          say: () => {},
          exit: code => {
            exits.push(code)
            signalled()
          },
        },
      )
    } finally {
      rmSync(dir, {recursive: true, force: true})
    }
    expect(exits).toEqual([4])
  })
})

describe('a guard whose command stops on the first signal itself', () => {
  it('leaves the first signal to the command (no revert, no exit) and acts on a second', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pdchaos-guards-'))
    const exits: number[] = []
    const said: string[] = []
    let second!: () => void
    const ended = new Promise<void>(resolve => {
      second = resolve
    })
    try {
      await withLeases(
        new LocalHost('never'),
        dir,
        async () => {
          process.emit('SIGINT', 'SIGINT')
          await new Promise(r => setTimeout(r, 50))
          expect(exits).toEqual([])
          process.emit('SIGINT', 'SIGINT')
          await ended
        },
        {
          say: l => said.push(l),
          actOn: 'second',
          exit: code => {
            exits.push(code)
            second()
          },
        },
      )
    } finally {
      rmSync(dir, {recursive: true, force: true})
    }
    // Nothing armed: the second signal reverts nothing and ends the run as stopped.
    expect(exits).toEqual([3])
    expect(said.join('\n')).toMatch(/SIGINT: reverting 0 lease\(s\) before exit/)
  })
})
