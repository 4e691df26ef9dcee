/** Waits that never outlive their purpose: a timer left pending keeps the process alive after its work is done. */

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)))

/** p, or undefined once ms have passed; the timer is cleared either way. */
export async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let cancel = (): void => {}
  try {
    return await Promise.race([p, new Promise<undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), Math.max(0, ms))
      cancel = () => clearTimeout(timer)
    })])
  } finally {
    cancel()
  }
}
