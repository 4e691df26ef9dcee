import {mkdtempSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {describe, expect, it} from 'vitest'

import {runBatch} from '../../src/experiment/batch.js'
import {createLease, listLeases, revertLease} from '../../src/faults/lease/lease.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {FakePd, ScriptedHost, SeededSession} from './fake-deployment.js'

/** Edges of the runner found by its unit tests: a slow inject, stops while pins go out and during the revert, and
 * the last record of a lease listing. */

const root = mkdtempSync(join(tmpdir(), 'pdchaos-edges-'))
const W = {deadlineSeconds: 0.6, pollSeconds: 0.4}
const base = {
  mode: 'run' as const,
  promptTokens: 16,
  loadIntervalMs: 0,
  canaries: 1,
  pinPacing: {burst: 1, gapMs: 10},
  paramsSource: 'flags' as const,
  planErrors: 'throw' as const,
  say: () => {},
}
const dd = (pins = 1) => ({name: 'dd', fault: 'drop-dest-info', params: {mechanism: 'twin-failpoint'}, pins})

async function setup(d: string) {
  const fake = await FakePd.start({evictAfterMs: 630})
  const host = new ScriptedHost()
  return {fake, host, session: new SeededSession(fake.deployment(join(root, d), W), host, fake.discovery())}
}

describe.concurrent('runner edges', () => {
  it('a lease listing keeps its last record readable', async () => {
    const h = new LocalHost()
    const dir = join(root, 'l')
    const l = await createLease(h, dir, {fault: 'drop-dest-info', ttlMs: 30_000, revert: [['true']], command: 't'})
    await revertLease(h, dir, l.id)
    expect((await listLeases(h, dir)).done).toMatchObject([{id: l.id, revertedBy: 'pdchaos', exitStatus: 0}])
  }, 30_000)

  it('a slow inject command: the fault window opens when the command starts, so load caught meanwhile is not ' +
    'collateral', async () => {
    const {fake, host, session} = await setup('w')
    const run = host.run.bind(host)
    host.run = async (a, o) => {
      const r = await run(a, o)
      if (a[0] === 'node' && a[4]?.includes('"enabled":true')) await new Promise(x => setTimeout(x, 1500))
      return r
    }
    try {
      const {
        scenarios: [s],
      } = await runBatch(session, [dd()], {...base, loadIntervalMs: 100})
      expect(s!.verdicts.filter(v => v.verdict === 'fail').map(v => v.summary)).toEqual([])
    } finally {
      await fake.close()
    }
  }, 30_000)

  it('a stop while pins are being sent stops the sending', async () => {
    const {fake, session} = await setup('p')
    const stop = new AbortController()
    const t = setInterval(() => {
      if (fake.heldRids.length) {
        stop.abort()
        clearInterval(t)
      }
    }, 5)
    try {
      const {
        scenarios: [s],
      } = await runBatch(session, [dd(20)], {...base, pinPacing: {burst: 1, gapMs: 50}, signal: stop.signal})
      expect(s!.timeline!.observations.filter(o => o.kind === 'request-sent' && o.role === 'pin').length).toBeLessThan(
        5,
      )
      expect(s!.error).toMatch(/stopped before its window closed/)
    } finally {
      clearInterval(t)
      await fake.close()
    }
  }, 30_000)

  it('a stop during the revert is "stopped", not a failed recovery', async () => {
    const {fake, host, session} = await setup('r')
    const stop = new AbortController()
    host.script = a => {
      if (a[0] === 'sh' && a[4] === 'revert') stop.abort()
      return undefined
    }
    try {
      const {
        scenarios: [s],
      } = await runBatch(session, [dd()], {...base, signal: stop.signal})
      expect({error: s!.error, failed: s!.verdicts.filter(v => v.verdict === 'fail').map(v => v.summary)}).toEqual({
        error: expect.stringMatching(/stopped/),
        failed: [],
      })
    } finally {
      await fake.close()
    }
  }, 30_000)
})
