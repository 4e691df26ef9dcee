import {mkdtempSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterEach, describe, expect, it, vi} from 'vitest'

import {ChangeTeller} from '../../src/sim/server/change-teller.js'
import {DecodeRank} from '../../src/sim/server/decode-rank.js'
import {PrefillRank} from '../../src/sim/server/prefill-rank.js'
import type {RankGroup} from '../../src/sim/server/rank-group.js'
import {SchedulerCore} from '../../src/sim/server/scheduler-core.js'
import {readEnvSettings} from '../../src/sim/server/settings.js'
import type {SimConfig} from '../../src/sim/sim-config.js'

/**
 * The twin's loop backs off while nothing moves; a rank's change between steps must still bring the next iteration
 * at once, as SGLang's spinning loop would see it (docs/twin.md, scheduler loop).
 */

const cfg = {
  model: 'm',
  bugs: [],
  host: '127.0.0.1',
  prefillTp: 1,
  decodeTp: 1,
  timing: {kvBytesPerToken: 1},
} as unknown as SimConfig
const quiet = {info: () => {}, warn: () => {}, error: () => {}}

describe('a rank tells a change between steps once (ChangeTeller)', () => {
  it('one `changed` for any number of changes until the next step; none for changes inside a step', () => {
    let told = 0
    const t = new ChangeTeller(() => told++)
    t.changed()
    t.changed()
    expect(told).toBe(1)
    t.step(() => t.changed())
    expect(told).toBe(1)
    t.changed()
    expect(told).toBe(2)
  })

  it('a step that throws still lets the next change be told', () => {
    let told = 0
    const t = new ChangeTeller(() => told++)
    expect(() =>
      t.step(() => {
        throw new Error('bad op')
      }),
    ).toThrow('bad op')
    t.changed()
    expect(told).toBe(1)
  })
})

describe('the ranks call onChange when what they would poll changes', () => {
  it('prefill: a status change does, a repeated one does not', () => {
    const rank = new PrefillRank(cfg, readEnvSettings({}), 0, quiet)
    let n = 0
    rank.onChange = () => n++
    rank.apply({op: 'create', room: '7', rid: 'r'})
    rank.apply({op: 'create', room: '7', rid: 'r'})
    expect(n).toBe(1)
    rank.apply({op: 'abort', room: '7'})
    expect(n).toBe(2)
    rank.close()
  })

  it('decode: a transfer notification does (poll drains it later)', () => {
    const rank = new DecodeRank(cfg, readEnvSettings({}), 0, quiet)
    let n = 0
    rank.onChange = () => n++
    rank.notify('7', 0)
    expect(n).toBe(1)
  })
})

/** A scheduler whose steps the test ends, with ranks that only carry `onChanged`. */
class Stepped extends SchedulerCore {
  steps = 0
  private finish: (() => void) | undefined
  busy = true
  constructor(ranks: Pick<RankGroup, 'onChanged'>) {
    super('prefill', cfg, readEnvSettings({}), ranks as RankGroup, quiet, mkdtempSync(join(tmpdir(), 'pdchaos-wake-')))
  }

  step(): Promise<void> {
    this.steps++
    return new Promise(resolve => {
      this.finish = resolve
    })
  }

  end(): void {
    this.finish?.()
  }
  add(): void {}
  abort(): number {
    return 0
  }
  queued(): never[] {
    return []
  }
  isBusy(): boolean {
    return this.busy
  }
  queueSizes(): Record<string, number> {
    return {}
  }
}

describe('the scheduler loop wakes on a rank change', () => {
  afterEach(() => {
    vi.useRealTimers()
  })
  const turn = () => new Promise<void>(resolve => setImmediate(resolve))

  it('a change during an iteration skips the back-off; without one, the loop waits for its timer', async () => {
    vi.useFakeTimers({toFake: ['setTimeout', 'clearTimeout']})
    const ranks = {onChanged: () => {}}
    const s = new Stepped(ranks)
    void s.run()
    await turn()
    expect(s.steps).toBe(1)

    // A rank answered, then its room changed while the iteration was still running.
    ranks.onChanged()
    s.end()
    await turn()
    await turn()
    expect(s.steps).toBe(2)

    // Nothing changed: the loop is in its back-off, a timer only the clock can end.
    s.end()
    for (let i = 0; i < 5; i++) await turn()
    expect(s.steps).toBe(2)
    // A change while it waits wakes it at once.
    ranks.onChanged()
    for (let i = 0; i < 3; i++) await turn()
    expect(s.steps).toBe(3)

    s.stopped = true
    s.end()
    await turn()
    s.truth.close()
  })
})
