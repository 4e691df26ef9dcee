import {chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {simDown} from '../../src/sim/lifecycle/down.js'
import {upOnFreePorts} from '../sim/lifecycle-helpers.js'
import {runCli} from './cli.js'

// A user without root cannot touch the host's packet filter. Against the twin (and only the twin) pdchaos then uses
// the twin's own failure points, and says so.
let dir: string

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-fp-'))
  chmodSync(dir, 0o755)
  // The drop's held load opens the gateway's breaker; it half-opens after 10 s here instead of 60 (still waited for).
  await upOnFreePorts({stateDir: dir, deadlineS: 1.5, pollS: 0.5, waitS: 60, router: {cbTimeoutDurationS: 10}})
  // The twin's deployment file keeps leases under host-state: the unprivileged user's own, private dir here (one
  // that others could write is refused: issue 12, S1).
  mkdirSync(join(dir, 'host-state'), {recursive: true, mode: 0o700})
  chownSync(join(dir, 'host-state'), 65_534, 65_534)
}, 120_000)

afterAll(async () => {
  if (dir) {
    await simDown(dir)
    rmSync(dir, {recursive: true, force: true})
  }
}, 60_000)

const asNobody = (args: string[]) => runCli(args, {env: {HOME: dir}, asUser: 65_534})

describe('without root, against the twin', () => {
  it('drop-dest-info falls back to the twin failure point, names it, and the verdicts hold', async () => {
    const r = await asNobody(['inject', 'drop-dest-info', '--sim', '--state-dir', dir, '--json', '--pins', '2'])
    const j = JSON.parse(r.stdout)
    expect(j.mechanism).toBe('twin-failpoint')
    expect(j.description).toMatch(/twin's own failure point/)
    expect(j.description).toMatch(/exists only on the twin/)
    expect(j.summary.failed, JSON.stringify(j.verdicts.filter((v: any) => v.verdict === 'fail'))).toBe(0)
    expect(r.code).toBe(0)
  }, 120_000)

  it('stall-kv on a prefill GPU through the failure point pins in Transferring and is evicted in its ' +
    'window', async () => {
    const r = await asNobody(['inject', 'stall-kv', '--gpu', '2', '--sim', '--state-dir', dir, '--json', '--pins', '2'])
    const j = JSON.parse(r.stdout)
    expect(j.mechanism).toBe('twin-failpoint')
    expect(j.pins.every((p: any) => p.verdict === 'pass')).toBe(true)
    expect(r.code).toBe(0)
  }, 120_000)
})
