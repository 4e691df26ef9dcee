import {mkdirSync, renameSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

/** The run journal: one JSON document, written atomically so a reader never sees half of it. */
export function writeJournal(file: string, body: Record<string, unknown>): void {
  mkdirSync(dirname(file), {recursive: true})
  const tmp = `${file}.tmp-${process.pid}`
  writeFileSync(tmp, JSON.stringify({pdchaos: 1, writtenAt: new Date().toISOString(), ...body}, null, 2) + '\n')
  renameSync(tmp, file)
}
