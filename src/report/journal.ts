import {checkJournal, issuesLine} from './journal-schema.js'
import {writeOutputFile} from '../util/safe-file.js'

/**
 * The run journal: one JSON document, written atomically so a reader never sees half of it, and never over a node
 * that is not a regular file (util/safe-file.ts). A run's or a failure's journal is checked against the schema
 * `pdchaos report` reads it with first: a journal that could not be read back is not written.
 */
export function writeJournal(file: string, body: Record<string, unknown>): void {
  const text = JSON.stringify({pdchaos: 1, writtenAt: new Date().toISOString(), ...body}, null, 2) + '\n'
  if ('scenarios' in body || 'error' in body) {
    const checked = checkJournal(JSON.parse(text))
    if (!checked.ok) throw new Error(`the journal does not match its schema: ${issuesLine(checked.issues)}`)
  }
  writeOutputFile(file, text)
}
