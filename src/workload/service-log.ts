import type {Deployment} from '../deployment/config.js'
import {oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import type {LogService, Observation} from '../model/timeline.js'

/**
 * The services' own logs, read on the host for one run's time range: what released each pin, in the server's words
 * (SGLang's `Prefill transfer failed for request rank=… req.rid='…'`, decode's `Decode transfer failed …`, the
 * watchdog's own line). Only lines naming a pin's rid leave the host, bounded in bytes and by a deadline. A file is
 * read from the byte offset it had when the run began (a rotated file, shorter than that, from its start); a journald
 * unit for [start, end]. A log that cannot be read is recorded as such: the checks then say so.
 */

type LogSource = NonNullable<Deployment['services']['prefill']['logs']>

/** Where a service's log stood when the run began. */
export interface LogMark {
  service: LogService
  /** Absent: the deployment file names no log for the service. */
  source?: LogSource
  /** Epoch ms when the mark was taken. */
  at: number
  /** A file's size then (bytes). */
  offset?: number
  /** Why the log cannot be read (no logs: entry, no such file, no permission). */
  error?: string
}

export interface LogReadOptions {
  timeoutMs: number
  /** Bytes kept per service at most (the lines that name a pin; SGLang's are a few hundred bytes each). */
  maxBytes?: number
  /** The deployment's watchdog.logPattern (named groups rid and held). */
  watchdogPattern?: string
  now?: () => number
}

const DEFAULT_MAX_BYTES = 256 * 1024

/** `{file: P}` → "file:P", `{journald: U}` → "journald:U": how evidence names a source. */
export function describeSource(source: LogSource): string {
  return 'file' in source ? `file:${source.file}` : `journald:${source.journald}`
}

// Constant scripts: every value reaches them as a positional parameter ($1 …), never as shell text.
const SIZE_SCRIPT = 'wc -c < "$1"'
const FILE_SCRIPT =
  'size=$(wc -c < "$1") || exit 3; off="$2"; if [ "$size" -lt "$off" ]; then echo "pdchaos: the log is shorter ' +
  'than when the run began (rotated or truncated): read from its start" >&2; off=0; fi; tail -c +"$((off + 1))" -- ' +
  '"$1" | grep -aF -e "$3" | head -c "$4"'
const JOURNAL_SCRIPT =
  'journalctl -u "$1" --since "@$2" --until "@$3" -o short-iso-precise --no-pager | grep -aF -e "$4" | head -c "$5"'

/** Note where prefill's and decode's logs stand now (a file's size), before anything is injected. */
/** The host a service's log is on: the one host, or each service's own (a deployment over several hosts). */
export type LogHost = Host | ((service: 'prefill' | 'decode') => Host)
const hostFor = (h: LogHost, service: 'prefill' | 'decode'): Host => (typeof h === 'function' ? h(service) : h)

export async function markLogs(
  hosts: LogHost,
  deployment: Deployment,
  o: {timeoutMs: number; now?: () => number},
): Promise<LogMark[]> {
  const now = o.now ?? Date.now
  return Promise.all(
    (['prefill', 'decode'] as const).map(async (service): Promise<LogMark> => {
      const source = deployment.services[service].logs
      const host = hostFor(hosts, service)
      const at = now()
      if (!source)
        return {
          service,
          at,
          error:
            `the deployment file names no logs: source for ${service} (services.${service}.logs: {file: PATH} ` +
            `or {journald: UNIT})`,
        }
      if ('journald' in source) return {service, source, at}
      try {
        const r = await host.run(['sh', '-c', SIZE_SCRIPT, 'sh', source.file], {
          timeoutMs: o.timeoutMs,
          sudo: deployment.sudo === 'passwordless',
        })
        const size = Number(r.stdout.trim())
        if (r.code !== 0 || !Number.isInteger(size))
          return {
            service,
            source,
            at,
            error: `cannot read ${source.file} on ${host.describe()}: ${oneLine(r.stderr) || `exit ${r.code}`}`,
          }
        return {service, source, at, offset: size}
      } catch (error) {
        return {service, source, at, error: `cannot read ${source.file} on ${host.describe()}: ${oneLine(error)}`}
      }
    }),
  )
}

/** Read what each marked log gained since its mark, keeping the lines that name one of the rids. */
export async function readLogs(
  hosts: LogHost,
  deployment: Deployment,
  marks: LogMark[],
  rids: string[],
  o: LogReadOptions,
): Promise<Observation[]> {
  const now = o.now ?? Date.now
  const max = o.maxBytes ?? DEFAULT_MAX_BYTES
  const out: Observation[] = []
  await Promise.all(
    marks.map(async m => {
      const source = m.source ? describeSource(m.source) : 'none'
      const host = hostFor(hosts, m.service)
      const read = (ok: boolean, lines: number, truncated: boolean, detail: string) =>
        out.push({kind: 'log-read', t: now(), service: m.service, source, ok, lines, truncated, detail})
      if (m.error || !m.source) return read(false, 0, false, m.error ?? 'no log source')
      if (rids.length === 0) return read(true, 0, false, 'no pin to look for')
      const patterns = rids.join('\n')
      const argv =
        'file' in m.source
          ? ['sh', '-c', FILE_SCRIPT, 'sh', m.source.file, String(m.offset ?? 0), patterns, String(max)]
          : [
              'sh',
              '-c',
              JOURNAL_SCRIPT,
              'sh',
              m.source.journald,
              String(Math.floor(m.at / 1000) - 1),
              String(Math.ceil(now() / 1000) + 1),
              patterns,
              String(max),
            ]
      let stdout: string
      let stderr: string
      try {
        const r = await host.run(argv, {timeoutMs: o.timeoutMs, sudo: deployment.sudo === 'passwordless'})
        if (r.code !== 0)
          return read(
            false,
            0,
            false,
            `reading ${source} on ${host.describe()} failed: ${oneLine(r.stderr) || `exit ${r.code}`}`,
          )
        ;({stdout, stderr} = r)
      } catch (error) {
        return read(false, 0, false, `reading ${source} on ${host.describe()} failed: ${oneLine(error)}`)
      }
      const truncated = Buffer.byteLength(stdout) >= max
      const lines = parseLogLines(stdout, rids, o.watchdogPattern, truncated)
      for (const l of lines) out.push({kind: 'log-line', t: now(), service: m.service, source, ...l})
      // journalctl without the right to read a unit's journal says so on stderr and prints nothing: not an empty log.
      const warn = oneLine(stderr).slice(0, 300)
      const denied = lines.length === 0 && /not seeing messages|permission|no journal files|failed to/i.test(warn)
      read(
        !denied,
        lines.length,
        truncated,
        `${lines.length} line(s) naming a pin ` +
          `from ${source}` +
          `${'file' in m.source ? ` after byte ${m.offset ?? 0}` : ` from ${new Date(m.at).toISOString()}`}` +
          `${truncated ? ` (cut at ${max} bytes)` : ''}${warn ? `; ${warn}` : ''}`,
      )
    }),
  )
  return out
}

/**
 * The lines (of what a read returned) that name one of the rids, each with the rid it names and, when the
 * deployment's watchdog pattern matches it, the watchdog's rid and held seconds. A last line cut by the byte bound is
 * dropped. Pure: tested on SGLang's and the twin's own lines.
 */
export function parseLogLines(
  text: string,
  rids: string[],
  watchdogPattern?: string,
  truncated = false,
): Array<{line: string; rid?: string; watchdog?: {rid: string; heldSeconds: number}}> {
  const pattern = watchdogPattern ? new RegExp(watchdogPattern) : undefined
  const raw = text.split('\n')
  if (truncated) raw.pop()
  const out: Array<{line: string; rid?: string; watchdog?: {rid: string; heldSeconds: number}}> = []
  for (const line of raw) {
    if (!line) continue
    const w = pattern?.exec(line)?.groups
    const held = w?.held === undefined ? Number.NaN : Number(w.held)
    const watchdog = w?.rid !== undefined && Number.isFinite(held) ? {rid: w.rid, heldSeconds: held} : undefined
    // The longest rid the line names: one rid may be another's prefix.
    const rid = rids.filter(r => line.includes(r)).sort((a, b) => b.length - a.length)[0]
    if (!rid && !watchdog) continue
    out.push({
      line: line.length > 2000 ? `${line.slice(0, 2000)}…` : line,
      ...(rid ? {rid} : {}),
      ...(watchdog ? {watchdog} : {}),
    })
  }
  return out
}
