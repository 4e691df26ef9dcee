import {describe, expect, it} from 'vitest'

import {fromSimError} from '../../src/cli/twin.js'
import type {PdError} from '../../src/errors.js'
import {twinDeployment} from '../../src/sim/lifecycle/deployment-file.js'
import {endpoints} from '../../src/sim/lifecycle/files.js'
import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {gatewayArgsFor} from '../../src/sim/router/gateway-args.js'
import {launchFlags, physicalGpu, serverLayout, titleOf} from '../../src/sim/server/layout.js'
import {nodeTpRanks} from '../../src/sim/sim-config.js'
import {healthUrl} from '../../src/sim/lifecycle/services.js'

/** `sim up --only …`: one node of a twin that spans nodes (docs/twin.md, "Nodes"). */
describe('a twin node (--only and the peers)', () => {
  const prefillNode = buildSimConfig({
    stateDir: '/tmp/n1',
    host: '10.0.0.2',
    only: ['prefill', 'router'],
    peers: {decode: '10.0.1.2'},
  })

  it('runs only its services, and reaches the others at their nodes, on the same ports', () => {
    expect(prefillNode.node).toEqual({services: ['prefill', 'router'], peers: {decode: ['10.0.1.2']}})
    expect(endpoints(prefillNode)).toMatchObject({
      prefill: 'http://10.0.0.2:30100',
      bootstrap: 'http://10.0.0.2:30500',
      decode: 'http://10.0.1.2:30200',
      router: 'http://10.0.0.2:30000',
    })
    // The router on this node sends decode's half to the decode node.
    expect(gatewayArgsFor(prefillNode)).toMatchObject({
      prefill: [{url: 'http://10.0.0.2:30100', bootstrapPort: 30500}],
      decode: ['http://10.0.1.2:30200'],
      host: '10.0.0.2',
    })
  })

  it(
    "on the router's node, --prefill-host names further prefill instances: the router gets one --prefill each, " +
      "this node's first",
    () => {
      const router = buildSimConfig({
        stateDir: '/tmp/n2',
        host: '10.0.0.2',
        only: ['prefill', 'router'],
        peers: {prefill: '10.0.2.2,10.0.3.2', decode: '10.0.1.2'},
      })
      expect(gatewayArgsFor(router).prefill.map(p => p.url)).toEqual([
        'http://10.0.0.2:30100',
        'http://10.0.2.2:30100',
        'http://10.0.3.2:30100',
      ])
      // A decode node names every prefill node; its own endpoints use the first.
      const decode = buildSimConfig({
        stateDir: '/tmp/n3',
        host: '10.0.1.2',
        only: ['decode'],
        peers: {prefill: '10.0.0.2,10.0.2.2', router: '10.0.0.2'},
      })
      expect(decode.node!.peers.prefill).toEqual(['10.0.0.2', '10.0.2.2'])
      expect(endpoints(decode).prefill).toBe('http://10.0.0.2:30100')
    },
  )

  it('its deployment file says how to restart and read only its own services', () => {
    const d = twinDeployment(prefillNode)
    expect(d.services.prefill.restart).toContain('prefill')
    expect(d.services.router.logs).toBeDefined()
    expect(d.services.decode).toEqual({url: 'http://10.0.1.2:30200', healthPath: '/health'})
  })

  it('a twin without --only runs everything here, as before', () => {
    const all = buildSimConfig({stateDir: '/tmp/n0', host: '10.0.0.2'})
    expect(all.node).toBeUndefined()
    expect(endpoints(all).decode).toBe('http://10.0.0.2:30200')
  })

  const refused = (o: Parameters<typeof buildSimConfig>[0]): string => {
    try {
      buildSimConfig(o)
    } catch (error) {
      const e = fromSimError(error) as PdError
      return `${e.exitCode}: ${e.message} | ${e.suggestion ?? ''}`
    }
    throw new Error('expected a refusal')
  }

  it(
    'bad node input is exit 2 naming the flag: a service not placed, a peer for its own service, no address, an ' +
      'unknown service, a peer without --only, rails',
    () => {
      expect(refused({stateDir: '/tmp/x', only: ['prefill', 'router']})).toMatch(
        /^2: this node runs prefill, router only: say where decode runs \| --decode-host ADDR/,
      )
      expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2'}})).toMatch(
        /^2: .*say where router runs/,
      )
      expect(
        refused({
          stateDir: '/tmp/x',
          only: ['decode'],
          peers: {decode: '10.0.0.2', prefill: '10.0.0.3', router: '10.0.0.3'},
        }),
      ).toMatch(/^2: --decode-host: decode runs on this node/)
      expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: 'node-a', router: '10.0.0.3'}})).toMatch(
        /^2: --prefill-host must be the IP address/,
      )
      expect(refused({stateDir: '/tmp/x', only: ['gpu']})).toMatch(/^2: --only "gpu" is not a service/)
      expect(refused({stateDir: '/tmp/x', peers: {decode: '10.0.0.3'}})).toMatch(
        /^2: --decode-host says where decode runs, but this twin runs every service/,
      )
      expect(
        refused({
          stateDir: '/tmp/x',
          only: ['router'],
          peers: {prefill: '10.0.0.3', decode: '10.0.0.4'},
          railNics: true,
        }),
      ).toMatch(
        /^2: --rail-nics: this node runs router only, which has no GPU and so no rail NIC \| pass --rail-nics on the prefill and decode nodes only/,
      )
      // Lists: every entry an address, none twice, none this node's; one router.
      expect(
        refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2,node-b', router: '10.0.0.2'}}),
      ).toMatch(/^2: --prefill-host must be the IP address .* got "node-b"/)
      expect(
        refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2,10.0.0.2', router: '10.0.0.2'}}),
      ).toMatch(/^2: --prefill-host lists an address twice/)
      expect(
        refused({
          stateDir: '/tmp/x',
          host: '10.0.0.2',
          only: ['prefill', 'router'],
          peers: {prefill: '10.0.0.2', decode: '10.0.1.2'},
        }),
      ).toMatch(/^2: --prefill-host 10\.0\.0\.2 is this node/)
      expect(
        refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2,10.0.0.3'}}),
      ).toMatch(/^2: --router-host names one node/)
    },
  )
})

/**
 * `sim up --only … --rail-nics`: each node makes the rails of its own GPUs, numbered as on one host (docs/twin.md,
 * "Rail NICs").
 */
describe('rail NICs on a twin node', () => {
  const rails = (o: Partial<Parameters<typeof buildSimConfig>[0]>) =>
    buildSimConfig({stateDir: '/tmp/r', railNics: true, ...o}).rails!.nics.map(
      n => `${n.gpu}:${n.name}=${n.addr}/${n.mac}`,
    )

  it(
    "a prefill node has the rails of prefill's GPUs, a decode node those of decode's, after prefill's: addresses " +
      'and MACs unique across the nodes',
    () => {
      const prefill = rails({host: '10.0.0.2', only: ['prefill', 'router'], peers: {decode: '10.0.1.2'}})
      const decode = rails({host: '10.0.1.2', only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2'}})
      expect(prefill).toEqual([0, 1, 2, 3].map(g => `${g}:rail${g}=198.18.${g}.1/02:00:c6:12:0${g}:01`))
      expect(decode).toEqual([4, 5, 6, 7].map(g => `${g}:rail${g}=198.18.${g}.1/02:00:c6:12:0${g}:01`))
      // TP sizes move the split as they move the ranks' GPUs; a node with both workers has both sets.
      expect(
        rails({gpus: 4, prefillTp: 1, decodeTp: 2, only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2'}}),
      ).toEqual(['1:rail1=198.18.1.1/02:00:c6:12:01:01', '2:rail2=198.18.2.1/02:00:c6:12:02:01'])
      expect(
        rails({gpus: 4, prefillTp: 1, decodeTp: 1, only: ['prefill', 'decode'], peers: {router: '10.0.0.3'}}).map(
          r => r.split(':')[0],
        ),
      ).toEqual(['0', '1'])
    },
  )

  it(
    'the table, rule and switch names stay those of one host; a twin without --only still has a rail per GPU of ' +
      'the host',
    () => {
      const c = buildSimConfig({
        stateDir: '/tmp/r',
        railNics: true,
        only: ['decode'],
        peers: {prefill: '10.0.0.2', router: '10.0.0.2'},
      })
      expect(c.rails).toMatchObject({bridge: 'railsw', tableBase: 479100, rulePrefBase: 50, localRulePref: 100})
      expect(buildSimConfig({stateDir: '/tmp/r', railNics: true}).rails!.nics).toHaveLength(8)
      expect(
        buildSimConfig({stateDir: '/tmp/r', only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2'}}).rails,
      ).toBeUndefined()
    },
  )
})

/** `sim up --only prefill --nnodes N --node-rank K --dist-init-addr A:P`: one instance over several nodes. */
describe('one instance over several nodes (--nnodes, --node-rank, --dist-init-addr)', () => {
  const peers = {decode: '10.0.1.2', router: '10.0.1.2'}
  const node0 = buildSimConfig({
    stateDir: '/tmp/d0',
    host: '10.0.0.2',
    only: ['prefill'],
    peers,
    prefillTp: 8,
    nnodes: 2,
    nodeRank: 0,
    distInitAddr: '10.0.0.2:5000',
  })
  const node1 = buildSimConfig({
    stateDir: '/tmp/d1',
    host: '10.0.0.3',
    only: ['prefill'],
    peers,
    prefillTp: 8,
    nnodes: 2,
    nodeRank: 1,
    distInitAddr: '10.0.0.2:5000',
  })

  it(
    'splits the total TP evenly: node K runs TP ranks [4K, 4K+4) on its GPUs 0..3, titled by their ' + 'global rank',
    () => {
      expect(node0.dist).toEqual({role: 'prefill', nnodes: 2, nodeRank: 0, distInitAddr: '10.0.0.2:5000'})
      expect(node0.prefillTp).toBe(8)
      expect(nodeTpRanks(node0, 'prefill')).toEqual([0, 1, 2, 3])
      expect(nodeTpRanks(node1, 'prefill')).toEqual([4, 5, 6, 7])
      const l = serverLayout(node1, 'prefill')
      expect([4, 5, 6, 7].map(k => physicalGpu(l, k))).toEqual([0, 1, 2, 3])
      expect(titleOf(l, 5)).toBe('sglang::scheduler_TP5')
      // Decode (not spread over nodes here) keeps its one-node placement.
      expect(nodeTpRanks(node1, 'decode')).toEqual([0, 1, 2, 3])
    },
  )

  it(
    "puts SGLang's multi-node flags on each node's command line, and reaches the API at node 0 from a " + 'follower',
    () => {
      expect(launchFlags(node1, 'prefill')).toEqual(
        expect.arrayContaining([
          ['tp-size', '8'],
          ['dist-init-addr', '10.0.0.2:5000'],
          ['nnodes', '2'],
          ['node-rank', '1'],
        ]),
      )
      expect(launchFlags(node1, 'decode').some(([k]) => k === 'nnodes')).toBe(false)
      expect(endpoints(node1)).toMatchObject({prefill: 'http://10.0.0.2:30100', bootstrap: 'http://10.0.0.2:30500'})
      expect(healthUrl(node1, 'prefill')).toBe('http://10.0.0.3:30100/health')
      const d = twinDeployment(node1)
      expect(d.services.prefill).toMatchObject({url: 'http://10.0.0.2:30100', bootstrapPort: 30500})
      expect(d.services.prefill.restart).toContain('prefill')
      expect(endpoints(node0).prefill).toBe('http://10.0.0.2:30100')
    },
  )

  it("decode spans nodes the same way; the GPU check counts this node's share only", () => {
    const dec = buildSimConfig({
      stateDir: '/tmp/d2',
      host: '10.0.1.3',
      gpus: 8,
      only: ['decode'],
      peers: {prefill: '10.0.0.2', router: '10.0.0.2'},
      decodeTp: 16,
      nnodes: 2,
      nodeRank: 1,
      distInitAddr: '10.0.1.2:5000',
    })
    expect(nodeTpRanks(dec, 'decode')).toEqual([8, 9, 10, 11, 12, 13, 14, 15])
    expect(physicalGpu(serverLayout(dec, 'decode'), 15)).toBe(7)
  })

  const refused = (o: Parameters<typeof buildSimConfig>[0]): string => {
    try {
      buildSimConfig(o)
    } catch (error) {
      const e = fromSimError(error) as PdError
      return `${e.exitCode}: ${e.message}`
    }
    throw new Error('expected a refusal')
  }
  const base = {
    stateDir: '/tmp/x',
    host: '10.0.0.3',
    only: ['prefill'],
    peers,
    nnodes: 2,
    nodeRank: 1,
    distInitAddr: '10.0.0.2:5000',
  }

  it(
    'refuses, exit 2 in one line: TP not divisible, --only not exactly prefill or decode, rank out of range, no ' +
      'dist-init-addr, rails',
    () => {
      expect(refused({...base, prefillTp: 3})).toMatch(
        /^2: --prefill-tp 3 is the instance's total TP and must split evenly over --nnodes 2$/,
      )
      expect(refused({...base, only: ['prefill', 'router'], peers: {decode: '10.0.1.2'}})).toMatch(
        /^2: --nnodes 2 spans one server over nodes: --only must name exactly one of prefill, decode \(got --only prefill,router\)/,
      )
      expect(refused({...base, only: ['router'], peers: {prefill: '10.0.0.2', decode: '10.0.1.2'}})).toMatch(
        /^2: --nnodes 2 spans one server/,
      )
      expect(refused({stateDir: '/tmp/x', nnodes: 2, distInitAddr: '127.0.0.1:5000'})).toMatch(
        /^2: .*--only must name exactly one of prefill, decode \(got no --only\)/,
      )
      expect(refused({...base, nodeRank: 2})).toMatch(
        /^2: --node-rank must be an integer from 0 to 1 \(--nnodes 2\), got 2/,
      )
      expect(refused({...base, nodeRank: -1})).toMatch(/^2: --node-rank must be/)
      expect(refused({...base, distInitAddr: undefined})).toMatch(/^2: --nnodes 2 needs --dist-init-addr HOST:PORT/)
      expect(refused({...base, distInitAddr: 'node0:5000'})).toMatch(/^2: --dist-init-addr must be IP:PORT/)
      expect(refused({...base, distInitAddr: '10.0.0.2'})).toMatch(/^2: --dist-init-addr must be IP:PORT/)
      expect(refused({...base, nodeRank: 0})).toMatch(
        /^2: --dist-init-addr 10\.0\.0\.2:5000 must be this node's own address on node rank 0/,
      )
      expect(refused({...base, distInitAddr: '10.0.0.3:5000'})).toMatch(
        /^2: --dist-init-addr 10\.0\.0\.3:5000 is this node's own address/,
      )
      expect(refused({...base, nnodes: 1, distInitAddr: undefined, nodeRank: 1})).toMatch(
        /^2: --node-rank 1 is out of range for --nnodes 1/,
      )
      expect(refused({...base, nnodes: 1, nodeRank: 0})).toMatch(
        /^2: --dist-init-addr joins the nodes of one instance, but --nnodes is 1/,
      )
      expect(refused({...base, nnodes: 0})).toMatch(/^2: --nnodes must be an integer from 1 to 64/)
      expect(refused({...base, railNics: true})).toMatch(/^2: --rail-nics cannot be combined with --nnodes above 1 yet/)
      expect(
        refused({...base, only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2'}, railNics: true}),
      ).toMatch(/^2: --rail-nics cannot be combined with --nnodes above 1 yet/)
      expect(refused({...base, prefillLayout: {dp: 2}})).toMatch(
        /^2: --nnodes cannot be combined with the layout flags/,
      )
      expect(refused({...base, dockerProxy: true})).toMatch(/^2: --nnodes cannot be combined with --docker-proxy/)
      for (const o of [
        {...base, prefillTp: 3},
        {...base, nodeRank: 5},
        {...base, distInitAddr: undefined},
      ])
        expect(refused(o).split('\n')).toHaveLength(1)
    },
  )
})
