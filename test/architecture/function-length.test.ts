import {describe, expect, it} from 'vitest'

// @ts-expect-error: a plain .mjs script with no type declarations; anyone can run it with `npm run lint`.
import {functionsOf, problems} from '../../scripts/check-function-length.mjs'

describe('no function runs over a screen', () => {
  it('every function in src/ fits in 80 lines, or is listed (not grown) in scripts/long-functions.txt', () => {
    expect(problems()).toEqual([])
  })

  it('measures a function from its first line to its last, nested functions included', () => {
    const fns = functionsOf(new URL('../../scripts/check-layers.mjs', import.meta.url).pathname) as Array<{
      name: string
      lines: number
    }>
    const circles = fns.find(f => f.name === 'circles')!
    const visit = fns.find(f => f.name === 'visit')!
    expect(circles.lines).toBeGreaterThan(visit.lines)
  })
})
