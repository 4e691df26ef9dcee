import {createServer, type Server} from 'node:http'
import type {AddressInfo} from 'node:net'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {preflight} from '../../src/cli/preflight.js'
import {DeploymentSchema, type Deployment} from '../../src/deployment/config.js'
import {PdError} from '../../src/errors.js'
import {ExitCode} from '../../src/exit-codes.js'

/** Loopback services that answer /health, counting the probes each gets. */
let server: Server
let base = ''
const probes = new Map<string, number>()
beforeAll(async () => {
  server = createServer((req, res) => {
    probes.set(req.url ?? '', (probes.get(req.url ?? '') ?? 0) + 1)
    res.writeHead(200).end('ok')
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  await new Promise(resolve => server.close(resolve))
})

const view = (prefill: string, decode: string): Deployment =>
  DeploymentSchema.parse({
    host: {kind: 'local'},
    services: {
      prefill: {url: prefill, healthPath: '/p'},
      decode: {url: decode, healthPath: '/d'},
      router: {url: base, healthPath: '/r'},
    },
    watchdog: {deadlineSeconds: 2, pollSeconds: 0.5},
  })

describe('the preflight of a suite over several instance pairs', () => {
  it(
    "checks every pair's services, each URL once; a pair that is down is exit 5 naming the service by " + 'its URL',
    async () => {
      probes.clear()
      await preflight(view(base, base), [view(base, base)], 2000)
      // Every service shares one URL here: probed once, whatever the number of pairs.
      expect([...probes.values()].reduce((a, b) => a + b, 0)).toBe(1)

      // Port 1 on loopback refuses at once: the other pair's prefill is down.
      const error = await preflight(view(base, base), [view('http://127.0.0.1:1', base)], 2000).then(
        () => undefined,
        (e: unknown) => e,
      )
      expect(error).toBeInstanceOf(PdError)
      expect((error as PdError).exitCode).toBe(ExitCode.unreachable)
      expect((error as PdError).message).toMatch(/^prefill at http:\/\/127\.0\.0\.1:1\b/)
      // Without the other pairs, the run's own pair passes (as before scenarios could name pairs).
      await preflight(view(base, base), [], 2000)
    },
  )
})
