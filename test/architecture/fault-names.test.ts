import {readdirSync, readFileSync} from 'node:fs'
import {join} from 'node:path'

import {describe, expect, it} from 'vitest'

import {OBSERVERS} from '../../src/experiment/observers.js'
import {FAULT_NAMES, getFault} from '../../src/faults/registry.js'

const filesUnder = (dir: string): string[] =>
  readdirSync(dir, {withFileTypes: true}).flatMap(d =>
    d.isDirectory() ? filesUnder(join(dir, d.name)) : d.name.endsWith('.ts') ? [join(dir, d.name)] : [],
  )

describe('a fault is its file and one registry line', () => {
  it('no file in src/suite or src/experiment names a fault (comments included)', () => {
    const named = ['src/suite', 'src/experiment'].flatMap(filesUnder).flatMap(file => {
      const text = readFileSync(file, 'utf8')
      return FAULT_NAMES.filter(name => text.includes(name)).map(name => `${file}: ${name}`)
    })
    expect(named).toEqual([])
  })

  it("every fault's observe has its observation kind in experiment/observers.ts", () => {
    for (const name of FAULT_NAMES) expect(OBSERVERS[getFault(name).observe], name).toBeDefined()
  })
})
