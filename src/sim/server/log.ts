/**
 * SGLang-like log lines: `[2026-07-20 12:00:00 TP0] message` (scheduler) or `[2026-07-20 12:00:00] message`.
 * Warnings and errors go to stderr, the rest to stdout; the launcher redirects both into the role's log file.
 */
function stamp(d = new Date()): string {
  const p = (n: number) => String(n).padStart(2, '0')
  return (
    `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:` +
    `${p(d.getSeconds())}`
  )
}

export interface Logger {
  info(msg: string): void
  warn(msg: string): void
  error(msg: string): void
}

export function makeLogger(prefix = ''): Logger {
  const line = (msg: string) => `[${stamp()}${prefix ? ' ' + prefix : ''}] ${msg}\n`
  return {
    info: msg => {
      process.stdout.write(line(msg))
    },
    warn: msg => {
      process.stderr.write(line(msg))
    },
    error: msg => {
      process.stderr.write(line(msg))
    },
  }
}
