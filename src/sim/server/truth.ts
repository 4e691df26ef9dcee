import {closeSync, mkdirSync, openSync, writeSync} from 'node:fs'
import {dirname} from 'node:path'
import {nowMs} from './clock.js'

/** One ground-truth event: what happened to a request, exactly when (epoch ms, fractional). */
export interface TruthEvent {
  t: number
  role: string
  rid: string
  room: string | null
  event: string
  queue?: string
  state?: string
  detail?: Record<string, unknown> | string
}

/** Appends JSON lines synchronously, so a reader never misses an event that already happened. */
export class TruthLog {
  private fd: number | undefined

  constructor(
    file: string,
    private readonly role: string,
  ) {
    mkdirSync(dirname(file), {recursive: true})
    this.fd = openSync(file, 'a')
  }

  record(
    rid: string,
    room: string | null,
    event: string,
    extra: Omit<Partial<TruthEvent>, 't' | 'role' | 'rid' | 'room' | 'event'> = {},
  ): number {
    const t = nowMs()
    if (this.fd !== undefined)
      writeSync(this.fd, JSON.stringify({t, role: this.role, rid, room, event, ...extra}) + '\n')
    return t
  }

  close(): void {
    if (this.fd !== undefined) closeSync(this.fd)
    this.fd = undefined
  }
}
