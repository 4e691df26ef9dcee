import {afterEach, describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import type {Host, RunOptions} from '../../src/hosts/host.js'
import {coRestart, type RestartOptions, roleTargets} from '../../src/restart/co-restart.js'
import {FakePd} from '../experiment/fake-deployment.js'

// A co-restart against a scripted deployment on loopback (prefill, decode and router answering at once): what a
// person reads of it (each step, each verdict, the progress lines, the pin watch's samples) for a restart that works,
// one whose command fails, and one over the nodes of a multi-node instance. Durations vary: numbers are masked.

/** A host that records what it is asked to run and answers the exit code `codeOf` gives each argv. */
function scriptedHost(codeOf: (argv: string[]) => number = () => 0): Host & {ran: string[][]} {
  const ran: string[][] = []
  return {
    ran,
    run: async (argv: string[], _opts: RunOptions) => {
      ran.push(argv)
      const code = codeOf(argv)
      return {code, stdout: '', stderr: code === 0 ? '' : 'no such unit', durationMs: 1}
    },
    upload: async () => undefined,
    startDetached: async () => ({pid: 1}),
    describe: () => 'scripted',
    close: async () => undefined,
  }
}

const masked = (s: string) => s.replace(/\d+(\.\d+)?/g, 'N')

let fake: FakePd | undefined
afterEach(async () => {
  await fake?.close()
  fake = undefined
})

async function deployment() {
  fake = await FakePd.start({evictAfterMs: null})
  const d = fake.deployment('/tmp/pdchaos-co-restart-unit', {deadlineSeconds: 2, pollSeconds: 1})
  return DeploymentSchema.parse({
    ...d,
    services: {
      prefill: {...d.services.prefill, restart: ['restart-prefill']},
      decode: {...d.services.decode, restart: ['restart-decode']},
      router: {...d.services.router, restart: ['restart-router']},
    },
  })
}

const OPTS: RestartOptions = {
  order: ['prefill', 'decode', 'router'],
  healthTimeoutS: 5,
  commandTimeoutS: 5,
  canaries: 2,
  watchS: 0.5,
  sampleS: 0.2,
  settleS: 0,
}

describe('co-restart, phase by phase', () => {
  it('restarts each service behind its gate, then canaries and a pin watch that see no pin', async () => {
    const d = await deployment()
    const host = scriptedHost()
    const lines: string[] = []
    const r = await coRestart(d, host, {...OPTS, onProgress: l => lines.push(l)})
    expect(host.ran).toEqual([['restart-prefill'], ['restart-decode'], ['restart-router']])
    expect(r.steps.map(s => [s.service, s.exitCode, s.healthyAfterMs !== null, s.lastHealth?.ok])).toEqual([
      ['prefill', 0, true, true],
      ['decode', 0, true, true],
      ['router', 0, true, true],
    ])
    expect(r.verdicts.map(v => [v.check, v.subject, v.verdict, masked(v.summary)])).toEqual([
      ['restart', 'prefill', 'pass', 'prefill healthy Ns after its restart command'],
      ['restart', 'decode', 'pass', 'decode healthy Ns after its restart command'],
      ['restart', 'router', 'pass', 'router healthy Ns after its restart command'],
      ['restart', 'canaries', 'pass', 'N of N canary requests succeeded end to end'],
      ['restart', 'pin watch', 'pass', 'N of N requests during the Ns watch succeeded; no pin'],
    ])
    expect(Object.keys(r.verdicts[0]!.evidence)).toEqual([
      'command',
      'exitCode',
      'commandMs',
      'healthyAfterMs',
      'gate',
      'lastHealth',
    ])
    expect(r.verdicts[4]!.summary).toBe(
      `${r.watch.requests.length} of ${r.watch.requests.length} requests during the 0.5s watch succeeded; no pin`,
    )
    expect(r.canaries.map(c => c.status)).toEqual([200, 200])
    expect(r.watch.requests.length).toBeGreaterThan(0)
    expect(r.watch.requests.every(w => w.status === 200)).toBe(true)
    expect(r.watch.samples.length).toBe(r.watch.requests.length)
    expect(masked(r.watch.samples[0]!.line)).toBe('t+Ns inflight=? bootstrap=N decode_running=N')
    expect(Object.keys(r.verdicts[4]!.evidence)).toEqual(['samples', 'requests', 'deadlineSeconds'])
    expect(lines.map(masked).slice(0, 8)).toEqual([
      'restarting prefill: restart-prefill',
      'prefill healthy after Ns',
      'restarting decode: restart-decode',
      'decode healthy after Ns',
      'restarting router: restart-router',
      'router healthy after Ns',
      'warm-up after the restart: ok after N request(s)',
      'watching for pins for Ns',
    ])
    const markers = r.observations.filter(o => o.kind === 'marker').map(o => (o as {name: string}).name)
    expect(markers).toEqual(['restart prefill', 'restart decode', 'restart router', 'warm-up'])
    expect(r.totalMs).toBeGreaterThanOrEqual(0)
  })

  it('a restart command that fails stops the restart there: its step and a failed verdict, nothing after', async () => {
    const d = await deployment()
    const host = scriptedHost(argv => (argv[0] === 'restart-decode' ? 3 : 0))
    const lines: string[] = []
    const r = await coRestart(d, host, {...OPTS, onProgress: l => lines.push(l)})
    expect(host.ran).toEqual([['restart-prefill'], ['restart-decode']])
    expect(r.steps.map(s => [s.service, s.exitCode, s.healthyAfterMs === null])).toEqual([
      ['prefill', 0, false],
      ['decode', 3, true],
    ])
    expect(r.verdicts.map(v => [v.subject, v.verdict])).toEqual([
      ['prefill', 'pass'],
      ['decode', 'fail'],
    ])
    expect(r.verdicts[1]!.summary).toBe(
      "decode's restart command exited 3: it was not restarted as the file says; later services were not restarted",
    )
    expect(Object.keys(r.verdicts[1]!.evidence)).toEqual(['command', 'exitCode', 'commandMs'])
    expect(lines).toContain('decode restart command exited 3: no such unit')
    expect(r.canaries).toEqual([])
    expect(r.watch).toEqual({samples: [], requests: []})
  })

  it('a multi-node instance runs its command on every node at once; one node failing fails the step', async () => {
    const d = await deployment()
    const a = scriptedHost()
    const b = scriptedHost(() => 1)
    const [prefill] = roleTargets(d, a, ['prefill'])
    const lines: string[] = []
    const r = await coRestart(d, a, {
      ...OPTS,
      targets: [
        {
          ...prefill!,
          name: 'prefill[0]',
          path: 'services.prefill[0]',
          nodes: [
            {name: 'node-a', host: a},
            {name: 'node-b', host: b},
          ],
        },
      ],
      onProgress: l => lines.push(l),
    })
    expect(lines[0]).toBe('restarting prefill[0] on its 2 nodes (node-a, node-b) at once: restart-prefill')
    expect(lines).toContain('prefill[0] (node rank 1 on node-b) restart command exited 1: no such unit')
    expect(r.steps).toHaveLength(1)
    expect(r.steps[0]).toMatchObject({
      service: 'prefill',
      instance: 'services.prefill[0]',
      exitCode: 1,
      nodes: [
        {host: 'node-a', exitCode: 0},
        {host: 'node-b', exitCode: 1},
      ],
      healthyAfterMs: null,
    })
    expect(r.verdicts.map(v => [v.subject, v.verdict, v.summary])).toEqual([
      [
        'prefill[0]',
        'fail',
        "prefill[0]'s restart command exited 1 (node-a: exit 0, node-b: exit 1): it was not restarted as the file " +
          'says; later services were not restarted',
      ],
    ])
  })

  it('gates only: stops after the health gates, with no warm-up, canaries or watch', async () => {
    const d = await deployment()
    const r = await coRestart(d, scriptedHost(), {...OPTS, order: ['decode'], gatesOnly: true})
    expect(r.verdicts.map(v => [v.subject, v.verdict])).toEqual([['decode', 'pass']])
    expect(r.observations.filter(o => o.kind === 'marker').map(o => (o as {name: string}).name)).toEqual([
      'restart decode',
    ])
  })
})
