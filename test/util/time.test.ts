import {getEventListeners} from 'node:events'
import {describe, expect, it} from 'vitest'

import {sleep, sleepUntil, within} from '../../src/util/time.js'

describe('sleep', () => {
  it('waits the time it is given (a negative time is none)', async () => {
    const started = performance.now()
    await sleep(50)
    expect(performance.now() - started).toBeGreaterThanOrEqual(45)
    const again = performance.now()
    await sleep(-10)
    expect(performance.now() - again).toBeLessThan(40)
  })

  it('ends at once when its signal is aborted, or already was, and leaves no listener behind', async () => {
    const controller = new AbortController()
    const started = performance.now()
    const slept = sleep(10_000, controller.signal)
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1)
    setTimeout(() => controller.abort(), 20)
    await slept
    expect(performance.now() - started).toBeLessThan(2000)
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0)

    const quick = performance.now()
    await sleep(10_000, controller.signal)
    expect(performance.now() - quick).toBeLessThan(100)

    // A sleep that runs its course unhooks itself: a long-lived signal does not collect listeners.
    const live = new AbortController()
    for (let i = 0; i < 20; i++) await sleep(1, live.signal)
    expect(getEventListeners(live.signal, 'abort')).toHaveLength(0)
  })
})

describe('within', () => {
  it('gives the value when it comes in time, undefined when it does not', async () => {
    expect(await within(Promise.resolve(7), 1000)).toBe(7)
    const never = new Promise<number>(() => {})
    const started = performance.now()
    expect(await within(never, 30)).toBeUndefined()
    expect(performance.now() - started).toBeLessThan(2000)
  })

  it('passes a rejection through', async () => {
    await expect(within(Promise.reject(new Error('boom')), 1000)).rejects.toThrow('boom')
  })

  it('leaves no timer and no listener behind when the value comes first: a finished run exits at once', async () => {
    const timers = (): number => process.getActiveResourcesInfo().filter(r => r === 'Timeout').length
    const before = timers()
    const controller = new AbortController()
    expect(await within(Promise.resolve('done'), 60_000, controller.signal)).toBe('done')
    expect(timers()).toBe(before)
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0)
  })

  it('ends at once, undefined, when its signal is aborted, or already was', async () => {
    const controller = new AbortController()
    const never = new Promise<number>(() => {})
    const started = performance.now()
    const waited = within(never, 60_000, controller.signal)
    setTimeout(() => controller.abort(), 20)
    expect(await waited).toBeUndefined()
    expect(performance.now() - started).toBeLessThan(2000)
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0)
    const quick = performance.now()
    expect(await within(never, 60_000, controller.signal)).toBeUndefined()
    expect(performance.now() - quick).toBeLessThan(100)
  })
})

describe('sleepUntil', () => {
  it('never returns before its clock reads the moment: a timer that fired early is slept again', async () => {
    // A clock that reads 8 after the first sleep of 10, as when a timer fires early against a sub-ms clock.
    const reads = [0, 8, 10]
    let calls = 0
    const clock = () => reads[Math.min(calls++, reads.length - 1)]!
    await sleepUntil(10, clock)
    expect(calls).toBe(3)
  })

  it('a moment already past, or an aborted signal, returns at once', async () => {
    const started = performance.now()
    await sleepUntil(5, () => 6)
    const controller = new AbortController()
    controller.abort()
    await sleepUntil(10_000, () => 0, controller.signal)
    expect(performance.now() - started).toBeLessThan(500)
  })
})
