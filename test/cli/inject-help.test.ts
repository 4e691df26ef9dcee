import {describe, expect, it} from 'vitest'

import Inject from '../../src/commands/inject.js'
import {FAULT_NAMES, getFault} from '../../src/faults/registry.js'

describe('inject --help', () => {
  it('names every registered fault with its summary, so a new fault is never missing from the help', () => {
    const text = Inject.description ?? ''
    for (const name of FAULT_NAMES) expect(text).toContain(`${name} (${getFault(name).summary})`)
  })
})
