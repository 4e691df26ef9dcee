import {afterEach, describe, expect, it} from 'vitest'

import {Progress} from '../../src/cli/progress.js'
import {spinnable} from '../../src/cli/spinner.js'

/** A spinner only where it can be drawn: a terminal with a width. */
describe('spinners', () => {
  const saved = {isTTY: process.stderr.isTTY, columns: process.stderr.columns}
  const as = (isTTY: boolean, columns: number | undefined): void => {
    Object.defineProperty(process.stderr, 'isTTY', {value: isTTY, configurable: true, writable: true})
    Object.defineProperty(process.stderr, 'columns', {value: columns, configurable: true, writable: true})
  }
  afterEach(() => as(Boolean(saved.isTTY), saved.columns))

  it(
    'spin on a terminal with a width, not on a pipe, and not on a pseudo-terminal of 0 columns (ora looped ' +
      'forever there)',
    () => {
      as(true, 120)
      expect(spinnable()).toBe(true)
      as(false, undefined)
      expect(spinnable()).toBe(false)
      as(true, 0)
      expect(spinnable()).toBe(false)
    },
  )

  it('progress on a 0-column terminal is plain lines, and stop() returns', () => {
    as(true, 0)
    const lines: string[] = []
    const write = process.stderr.write
    process.stderr.write = ((s: string) => {
      lines.push(s)
      return true
    }) as typeof process.stderr.write
    try {
      const p = new Progress({json: false})
      p.say('a line')
      p.stop()
    } finally {
      process.stderr.write = write
    }
    expect(lines).toEqual(['a line\n'])
  })
})
