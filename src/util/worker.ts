import {Worker} from 'node:worker_threads'

import {ownWorkerModule} from './lazy-require.js'
import {stoppedError} from './stop.js'

/**
 * One message to one of pdchaos's worker modules and its one answer, for synchronous work too long to run on the main
 * thread (parsing a large file): the main thread stays free, so a stop (SIGINT, SIGTERM) or the deadline ends the
 * work at once, terminating the worker. The worker is gone when this settles, however it settles.
 */
export async function inWorker<T>(
  module: string,
  message: unknown,
  o: {
    /** The run's stop: aborting it terminates the worker and rejects with stoppedError(signal, phase). */
    signal?: AbortSignal
    phase: string
    deadlineMs: number
    /** The error past the deadline. */
    late: () => Error
    /** The worker's heap; past it the worker dies with ERR_WORKER_OUT_OF_MEMORY. */
    maxHeapMb?: number
  },
): Promise<T> {
  if (o.signal?.aborted) throw stoppedError(o.signal, o.phase)
  const where = ownWorkerModule(module)
  const options = {resourceLimits: {maxOldGenerationSizeMb: o.maxHeapMb ?? 1024}, stdout: true, stderr: true}
  const worker = where.viaTsx
    ? new Worker(
        `import(${JSON.stringify(where.viaTsx)}).then(m => { m.register(); return import(${JSON.stringify(where.url)}` +
          `) })`,
        {...options, eval: true},
      )
    : new Worker(new URL(where.url), options)
  return new Promise<T>((resolve, reject) => {
    let settled = false
    const settle = (then: () => void): void => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      o.signal?.removeEventListener('abort', onAbort)
      void worker.terminate()
      then()
    }
    const onAbort = (): void => settle(() => reject(stoppedError(o.signal!, o.phase)))
    const timer = setTimeout(() => settle(() => reject(o.late())), o.deadlineMs)
    worker.once('message', (answer: T) => settle(() => resolve(answer)))
    worker.once('error', error => settle(() => reject(error)))
    worker.once('exit', code => settle(() => reject(new Error(`the worker exited (${code}) before it answered`))))
    o.signal?.addEventListener('abort', onAbort, {once: true})
    worker.postMessage(message)
  })
}
