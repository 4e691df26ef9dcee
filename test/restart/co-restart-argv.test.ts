import {describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import type {Host, RunOptions} from '../../src/hosts/host.js'
import {displayArgv} from '../../src/hosts/quote.js'
import {coRestart} from '../../src/restart/co-restart.js'

/** A host that records what it is asked to run and answers exit 0. */
function recordingHost(): Host & {ran: Array<{argv: string[]; opts: RunOptions}>} {
  const ran: Array<{argv: string[]; opts: RunOptions}> = []
  return {
    ran,
    run: async (argv, opts) => {
      ran.push({argv, opts})
      return {code: 0, stdout: '', stderr: '', durationMs: 1}
    },
    upload: async () => undefined,
    startDetached: async () => ({pid: 1}),
    describe: () => 'recording',
    close: async () => undefined,
  }
}

const FORGED = ['/usr/bin/restart-prefill', '--name', 'x\n2026-12-01 prefill healthy after 0.10s\u001b[2K', "it's"]

const deployment = (sudo: 'never' | 'passwordless') =>
  DeploymentSchema.parse({
    host: {kind: 'local'},
    sudo,
    // Port 1 on loopback refuses at once: the health gate fails fast and the restart stops after prefill.
    services: {
      prefill: {url: 'http://127.0.0.1:1', restart: FORGED},
      decode: {url: 'http://127.0.0.1:1'},
      router: {url: 'http://127.0.0.1:1'},
    },
    watchdog: {deadlineSeconds: 2, pollSeconds: 1},
  })

const run = async (sudo: 'never' | 'passwordless') => {
  const host = recordingHost()
  const lines: string[] = []
  const r = await coRestart(deployment(sudo), host, {
    order: ['prefill'],
    healthTimeoutS: 0.3,
    commandTimeoutS: 5,
    canaries: 0,
    watchS: 0,
    sampleS: 1,
    settleS: 0,
    onProgress: l => lines.push(l),
  })
  return {host, lines, r}
}

describe('co-restart: the restart argv (issue 12, S7)', () => {
  it('prints the argv quoted on one line: a newline in an argument cannot forge a progress line', async () => {
    const {lines, host} = await run('never')
    expect(host.ran.map(x => x.argv)).toEqual([FORGED])
    const line = lines.find(l => l.startsWith('restarting prefill: '))!
    expect(line).toBe(`restarting prefill: ${displayArgv(FORGED)}`)
    expect(line).toBe(
      "restarting prefill: /usr/bin/restart-prefill --name $'x\\n2026-12-01 prefill healthy after 0.10s\\x1b[2K' " +
        "'it'\\''s'",
    )
    for (const l of lines) expect(l).not.toMatch(/[\n\r\u001b]/)
  })

  it(
    'a multi-node instance: its restart command runs on every node at once, each exit kept, the step failing with ' +
      'any that fails',
    async () => {
      const [a, b] = [recordingHost(), recordingHost()]
      b.run = async (argv, opts) => {
        b.ran.push({argv, opts})
        return {code: 3, stdout: '', stderr: 'node 1 said no', durationMs: 1}
      }
      const d = deployment('never')
      const lines: string[] = []
      const r = await coRestart(d, a, {
        order: ['prefill'],
        healthTimeoutS: 0.3,
        commandTimeoutS: 5,
        canaries: 0,
        watchS: 0,
        sampleS: 1,
        settleS: 0,
        onProgress: l => lines.push(l),
        targets: [
          {
            name: 'prefill',
            role: 'prefill',
            path: 'services.prefill',
            service: d.services.prefill,
            host: a,
            nodes: [
              {name: 'gpu-a', host: a},
              {name: 'gpu-b', host: b},
            ],
          },
        ],
      })
      expect(a.ran.map(x => x.argv)).toEqual([FORGED])
      expect(b.ran.map(x => x.argv)).toEqual([FORGED])
      expect(r.steps[0]!.nodes).toEqual([
        {host: 'gpu-a', exitCode: 0},
        {host: 'gpu-b', exitCode: 3},
      ])
      expect(r.steps[0]!.exitCode).toBe(3)
      // A failed command restarted nothing anyone can vouch for: the step fails without waiting on health.
      expect(r.verdicts.map(v => [v.verdict, v.summary])).toEqual([
        [
          'fail',
          "prefill's restart command exited 3 (gpu-a: exit 0, gpu-b: exit 3): it was not restarted as the file says; " +
            'later services were not restarted',
        ],
      ])
      expect(lines[0]).toMatch(/^restarting prefill on its 2 nodes \(gpu-a, gpu-b\) at once: /)
      expect(lines).toContain('prefill (node rank 1 on gpu-b) restart command exited 3: node 1 said no')
    },
  )

  it('follows the sudo: policy: privileged only under passwordless', async () => {
    expect((await run('never')).host.ran[0]!.opts.sudo).toBe(false)
    expect((await run('passwordless')).host.ran[0]!.opts.sudo).toBe(true)
  })
})
