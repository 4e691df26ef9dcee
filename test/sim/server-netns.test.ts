import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {createNetns, type Netns} from '../harness/netns.js'
import {launchPair, nextRoom, pdBody, post, waitFor, firstEvent, eventsOf, abortRid, internalState, type Pair} from './launch-pair.js'

/**
 * Faults made with iptables, as pdchaos makes them on a real host, inside a namespace the test owns
 * (10.231.N.2): the twin runs there, and only that namespace's rules are touched.
 */
const isRoot = process.getuid?.() === 0

describe.skipIf(!isRoot)('twin under iptables faults (network namespace)', () => {
  let ns: Netns
  let pair: Pair
  beforeAll(async () => {
    ns = await createNetns()
    try {
      pair = await launchPair({host: ns.address, wrap: [...ns.prefix], prefillTp: 2, decodeTp: 2, watchdog: {scope: 'off'}})
    } catch (err) {
      await ns.destroy()
      throw err
    }
  })
  afterAll(async () => {
    try { await pair?.stop() } finally { await ns?.destroy() }
  })

  const iptables = (op: '-A' | '-D', port: number) => ns.run(['iptables', op, 'INPUT', '-p', 'tcp', '--dport', String(port), '-j', 'DROP'])

  it('drop-dest-info: with the prefill rank_port dropped the request stays in Bootstrapping', async () => {
    const port = pair.service('prefill').rankPorts[0]!.zmqPort
    await iptables('-A', port)
    try {
      const body = pdBody(pair, 'ns-ddi-1', nextRoom())
      const p = post(pair.prefillUrl, body)
      const d = post(pair.decodeUrl, body)
      await waitFor('decode sent its destination info', () => firstEvent(pair, 'decode', 'ns-ddi-1', 'enter', 'transfer'))
      await new Promise((r) => setTimeout(r, 2000))
      const states = eventsOf(pair, 'prefill', 'ns-ddi-1').filter((e) => e.event === 'state').map((e) => e.state)
      expect(states).toEqual(['KVPoll.Bootstrapping'])
      expect((await internalState(pair.prefillUrl)).bootstrap).toBe(1)
      await abortRid(pair.prefillUrl, 'ns-ddi-1')
      await abortRid(pair.decodeUrl, 'ns-ddi-1')
      expect((await p).status).toBe(500)
      expect((await d).status).toBe(500)
    } finally {
      await iptables('-D', port)
    }
  })

  it('stall-kv: with one decode data port dropped the request stays in Transferring, decode stays healthy', async () => {
    const port = pair.service('decode').rankPorts[0]!.dataPort!
    await iptables('-A', port)
    try {
      const body = pdBody(pair, 'ns-stall-1', nextRoom())
      const p = post(pair.prefillUrl, body)
      const d = post(pair.decodeUrl, body)
      await waitFor('prefill Transferring', () => eventsOf(pair, 'prefill', 'ns-stall-1').find((e) => e.event === 'state' && e.state === 'KVPoll.Transferring'))
      await new Promise((r) => setTimeout(r, 2000))
      expect(firstEvent(pair, 'prefill', 'ns-stall-1', 'exit', 'inflight')).toBeUndefined()
      expect((await internalState(pair.prefillUrl)).inflight).toBe(1)
      expect((await fetch(`${pair.decodeUrl}/health`)).status).toBe(200)
      await abortRid(pair.prefillUrl, 'ns-stall-1')
      await abortRid(pair.decodeUrl, 'ns-stall-1')
      expect((await p).status).toBe(500)
      expect((await d).status).toBe(500)
    } finally {
      await iptables('-D', port)
    }
  })
})
