import {describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {discover} from '../../src/engines/sglang/discovery/discover.js'
import {PdError} from '../../src/errors.js'
import {ExitCode} from '../../src/exit-codes.js'
import {answered, answeringHost} from '../hosts/answering-host.js'

/** A host that answers `true` but whose process table read times out, as a slow SSH host does. */
const slowHost = answeringHost('slow-host', (argv, opts) => {
  if (argv[0] === 'ps')
    throw new PdError(`\`ps\` timed out after ${opts.timeoutMs} ms on slow-host`, {
      exit: ExitCode.unreachable,
      code: 'E_TIMEOUT',
    })
  return answered()
})

describe('discovery over a slow host (issue 12)', () => {
  it(
    'a process table that does not answer in time is exit 5 naming the host, not "no prefill rank ' + 'processes"',
    async () => {
      // Port 1 on loopback: nothing listens, every service probe is refused at once.
      const deployment = DeploymentSchema.parse({
        host: {kind: 'local'},
        stateDir: '/tmp/pdchaos-discover-timeout',
        services: {
          prefill: {url: 'http://127.0.0.1:1'},
          decode: {url: 'http://127.0.0.1:1'},
          router: {url: 'http://127.0.0.1:1'},
        },
        watchdog: {deadlineSeconds: 2, pollSeconds: 0.5},
      })
      const error = await discover(deployment, slowHost, {timeoutMs: 500}).then(
        () => undefined,
        (e: unknown) => e,
      )
      expect(error).toBeInstanceOf(PdError)
      expect((error as PdError).exitCode).toBe(ExitCode.unreachable)
      expect((error as PdError).message).toMatch(
        /^discovery: the process table on slow-host did not answer: `ps` timed out after 500 ms/,
      )
    },
  )
})
