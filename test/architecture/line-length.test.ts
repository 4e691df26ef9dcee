import {describe, expect, it} from 'vitest'

// @ts-expect-error: a plain .mjs script with no type declarations; anyone can run it with `npm run lint`.
import {longLines, problems} from '../../scripts/check-line-length.mjs'

describe('no source line runs over 120 characters', () => {
  it('every line in src/ is at most 120 characters', () => {
    expect(problems()).toEqual([])
  })

  it('names the 1-based line and its length, counting a line of exactly the limit as fine', () => {
    const text = ['a'.repeat(120), 'b'.repeat(121), '', `${'c'.repeat(121)}\r`].join('\n')
    expect(longLines(text, 120)).toEqual([
      {line: 2, length: 121},
      {line: 4, length: 121},
    ])
  })
})
