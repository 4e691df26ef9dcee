import {describe, expect, it} from 'vitest'

import type {YamlParsed} from '../../src/deployment/yaml-parse.js'
import {PdError} from '../../src/errors.js'
import {inWorker} from '../../src/util/worker.js'

/** util/worker.ts: one answer from a worker module, or the deadline's error, or the stop's (exit 3). */
describe('inWorker', () => {
  it("answers with the module's result; past the deadline it rejects with `late` and the worker is gone", async () => {
    const ok = await inWorker<YamlParsed>(
      'deployment/yaml-worker',
      {text: 'a: [1, 2]\n', file: 'f.yaml'},
      {phase: 'reading f.yaml', deadlineMs: 60_000, late: () => new Error('late')},
    )
    expect(ok).toEqual({ok: true, data: {a: [1, 2]}})
    const hostile = 'a:\n' + '\t- ]\n'.repeat(50_000)
    const error = await inWorker<YamlParsed>(
      'deployment/yaml-worker',
      {text: hostile, file: 'h.yaml'},
      {phase: 'reading h.yaml', deadlineMs: 100, late: () => new Error('took too long')},
    ).catch((e: unknown) => e)
    expect((error as Error).message).toBe('took too long')
  }, 30_000)

  it('a stop already given: exit 3 at once, no worker started', async () => {
    const stop = new AbortController()
    stop.abort('interrupted (SIGINT)')
    const error = await inWorker(
      'deployment/yaml-worker',
      {text: 'a: 1', file: 'f.yaml'},
      {signal: stop.signal, phase: 'reading f.yaml', deadlineMs: 60_000, late: () => new Error('late')},
    ).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(3)
    expect((error as PdError).message).toBe(
      'interrupted (SIGINT) during reading f.yaml: stopped before changing anything',
    )
  })
})
