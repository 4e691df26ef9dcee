import {describe, expect, it} from 'vitest'

import {fromSimError} from '../../src/cli/twin.js'
import type {PdError} from '../../src/errors.js'
import {twinDeployment} from '../../src/sim/lifecycle/deployment-file.js'
import {endpoints} from '../../src/sim/lifecycle/files.js'
import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {gatewayArgsFor} from '../../src/sim/router/gateway-args.js'

/** `sim up --only …`: one node of a twin that spans nodes (docs/twin.md, "Nodes"). */
describe('a twin node (--only and the peers)', () => {
  const prefillNode = buildSimConfig({stateDir: '/tmp/n1', host: '10.0.0.2', only: ['prefill', 'router'], peers: {decode: '10.0.1.2'}})

  it('runs only its services, and reaches the others at their nodes, on the same ports', () => {
    expect(prefillNode.node).toEqual({services: ['prefill', 'router'], peers: {decode: ['10.0.1.2']}})
    expect(endpoints(prefillNode)).toMatchObject({
      prefill: 'http://10.0.0.2:30100', bootstrap: 'http://10.0.0.2:30500', decode: 'http://10.0.1.2:30200', router: 'http://10.0.0.2:30000',
    })
    // The router on this node sends decode's half to the decode node.
    expect(gatewayArgsFor(prefillNode)).toMatchObject({prefill: [{url: 'http://10.0.0.2:30100', bootstrapPort: 30500}], decode: ['http://10.0.1.2:30200'], host: '10.0.0.2'})
  })

  it('on the router\'s node, --prefill-host names further prefill instances: the router gets one --prefill each, this node\'s first', () => {
    const router = buildSimConfig({stateDir: '/tmp/n2', host: '10.0.0.2', only: ['prefill', 'router'], peers: {prefill: '10.0.2.2,10.0.3.2', decode: '10.0.1.2'}})
    expect(gatewayArgsFor(router).prefill.map((p) => p.url)).toEqual(['http://10.0.0.2:30100', 'http://10.0.2.2:30100', 'http://10.0.3.2:30100'])
    // A decode node names every prefill node; its own endpoints use the first.
    const decode = buildSimConfig({stateDir: '/tmp/n3', host: '10.0.1.2', only: ['decode'], peers: {prefill: '10.0.0.2,10.0.2.2', router: '10.0.0.2'}})
    expect(decode.node!.peers.prefill).toEqual(['10.0.0.2', '10.0.2.2'])
    expect(endpoints(decode).prefill).toBe('http://10.0.0.2:30100')
  })

  it("its deployment file says how to restart and read only its own services", () => {
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

  it('bad node input is exit 2 naming the flag: a service not placed, a peer for its own service, no address, an unknown service, a peer without --only, rails', () => {
    expect(refused({stateDir: '/tmp/x', only: ['prefill', 'router']})).toMatch(/^2: this node runs prefill, router only: say where decode runs \| --decode-host ADDR/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2'}})).toMatch(/^2: .*say where router runs/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {decode: '10.0.0.2', prefill: '10.0.0.3', router: '10.0.0.3'}})).toMatch(/^2: --decode-host: decode runs on this node/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: 'node-a', router: '10.0.0.3'}})).toMatch(/^2: --prefill-host must be the IP address/)
    expect(refused({stateDir: '/tmp/x', only: ['gpu']})).toMatch(/^2: --only "gpu" is not a service/)
    expect(refused({stateDir: '/tmp/x', peers: {decode: '10.0.0.3'}})).toMatch(/^2: --decode-host says where decode runs, but this twin runs every service/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.3', router: '10.0.0.3'}, railNics: true})).toMatch(/^2: --rail-nics cannot be combined with --only/)
    // Lists: every entry an address, none twice, none this node's; one router.
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2,node-b', router: '10.0.0.2'}})).toMatch(/^2: --prefill-host must be the IP address .* got "node-b"/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2,10.0.0.2', router: '10.0.0.2'}})).toMatch(/^2: --prefill-host lists an address twice/)
    expect(refused({stateDir: '/tmp/x', host: '10.0.0.2', only: ['prefill', 'router'], peers: {prefill: '10.0.0.2', decode: '10.0.1.2'}})).toMatch(/^2: --prefill-host 10\.0\.0\.2 is this node/)
    expect(refused({stateDir: '/tmp/x', only: ['decode'], peers: {prefill: '10.0.0.2', router: '10.0.0.2,10.0.0.3'}})).toMatch(/^2: --router-host names one node/)
  })
})
