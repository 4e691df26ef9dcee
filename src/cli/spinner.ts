import type {Ora} from 'ora'

/**
 * A spinner only on a terminal that has a width: a pseudo-terminal of 0 columns (`script`, some CI runners' ptys) made
 * ora's line count infinite, and it spun a core clearing lines forever.
 */
export function spinnable(): boolean {
  return Boolean(process.stderr.isTTY) && (process.stderr.columns ?? 0) > 0
}

/**
 * ora, loaded only where a spinner can show: it and its dependencies are about 20 modules that a piped, scripted or
 * --json run (CI, a cron job, the tests) would load on every start for nothing.
 */
const ora = spinnable() ? (await import('ora')).default : undefined

/** A spinner on stderr, started; undefined where none can show. */
export function startSpinner(text: string): Ora | undefined {
  return ora?.({text, stream: process.stderr}).start()
}
