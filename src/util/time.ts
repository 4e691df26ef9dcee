/**
 * The CLI's one sleep and one deadline helper. Waits never outlive their purpose: a timer left pending keeps the
 * process alive after its work is done, so every timer and listener here is cleared when the wait ends, however it
 * ends.
 * (The twin, src/sim, keeps its own: it imports nothing from outside src/sim.)
 */

/**
 * Resolve after ms; never rejects. With a signal, resolve at once when it is or becomes aborted, so an interrupt
 * never waits out a sleep. The caller checks signal.aborted afterwards if it must tell the two apart.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>(resolve => {
    if (signal?.aborted) return resolve()
    const onAbort = (): void => {
      clearTimeout(timer)
      resolve()
    }
    const timer = setTimeout(
      () => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      },
      Math.max(0, ms),
    )
    signal?.addEventListener('abort', onAbort, {once: true})
  })
}

/**
 * Resolve once clock() reads at least `at` (or at once on an aborted signal). Node's timers can fire a millisecond or
 * more early against a sub-ms clock (the delay is truncated and counted from the event loop's cached time), so the
 * rest is slept again: a planned moment is never met early.
 */
export async function sleepUntil(at: number, clock: () => number, signal?: AbortSignal): Promise<void> {
  for (let left = at - clock(); left > 0 && !signal?.aborted; left = at - clock()) await sleep(Math.ceil(left), signal)
}

/**
 * p, or undefined once ms have passed (or at once when the signal is or becomes aborted); the timer and the listener
 * are cleared either way, so a wait that p ended early leaves nothing that keeps the process alive. p itself is not
 * cancelled.
 */
export async function within<T>(p: Promise<T>, ms: number, signal?: AbortSignal): Promise<T | undefined> {
  let cancel = (): void => {}
  try {
    return await Promise.race([
      p,
      new Promise<undefined>(resolve => {
        if (signal?.aborted) return resolve(undefined)
        const onAbort = (): void => resolve(undefined)
        const timer = setTimeout(() => resolve(undefined), Math.max(0, ms))
        signal?.addEventListener('abort', onAbort, {once: true})
        cancel = () => {
          clearTimeout(timer)
          signal?.removeEventListener('abort', onAbort)
        }
      }),
    ])
  } finally {
    cancel()
  }
}
