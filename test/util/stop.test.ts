import {describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {expand, planBatches, planBatchesInTurns} from '../../src/suite/planner.js'
import {MAX_PLANNED_SCENARIOS, SuiteSchema} from '../../src/suite/suite-file.js'
import {withStopSignal} from '../../src/cli/stop-signal.js'
import {abortable, currentStop, stoppedError, throwIfStopped} from '../../src/util/stop.js'

describe("the run's stop (issue 28: every phase hears it)", () => {
  it('abortable: the work, or exit 3 naming the phase as soon as the signal aborts', async () => {
    const stop = new AbortController()
    const never = new Promise<number>(() => {})
    const waiting = abortable(never, stop.signal, 'discovery')
    setTimeout(() => stop.abort('interrupted (SIGINT)'), 10)
    const error = await waiting.catch((e: unknown) => e)
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(3)
    expect((error as PdError).message).toBe('interrupted (SIGINT) during discovery: stopped before changing anything')
    expect(await abortable(Promise.resolve(7), new AbortController().signal, 'x')).toBe(7)
  })

  it("a stop condition's reason (an Error) is the message, and throwIfStopped is silent until the stop", () => {
    const stop = new AbortController()
    expect(() => throwIfStopped(stop.signal, 'planning')).not.toThrow()
    stop.abort(new Error('router health failing for 31.0s'))
    expect(stoppedError(stop.signal, 'planning').message).toMatch(/^router health failing for 31\.0s during planning/)
    expect(() => throwIfStopped(stop.signal, 'planning')).toThrow(PdError)
  })

  it("planning in turns hears a stop between two scenarios and shows progress; the plan is planBatches'", async () => {
    const suite = SuiteSchema.parse({
      scenarios: Array.from({length: 400}, (_, i) => ({name: `s${i}`, fault: 'drop-dest-info', params: {rank: i % 4}})),
    })
    const scenarios = expand(suite.scenarios)
    const opts = {}
    const turns = await planBatchesInTurns(scenarios, opts, {})
    expect(turns.map(b => b.scenarios.map(s => s.name))).toEqual(
      planBatches(scenarios, {}).map(b => b.scenarios.map(s => s.name)),
    )
    const stop = new AbortController()
    stop.abort('interrupted (SIGINT)')
    await expect(planBatchesInTurns(scenarios, {}, {signal: stop.signal})).rejects.toThrow(
      /interrupted \(SIGINT\) during planning/,
    )
  })

  it(
    `a suite plans at most ${MAX_PLANNED_SCENARIOS} scenarios x repetitions, refused before any scenario is ` +
      `validated`,
    () => {
      const ok = SuiteSchema.safeParse({
        scenarios: Array.from({length: 10}, (_, i) => ({name: `s${i}`, fault: 'drop-dest-info', repetitions: 100})),
      })
      expect(ok.success).toBe(true)
      const over = SuiteSchema.safeParse({
        scenarios: [
          ...Array.from({length: 10}, (_, i) => ({name: `s${i}`, fault: 'drop-dest-info', repetitions: 100})),
          {name: 'x', fault: 'nope'},
        ],
      })
      expect(over.success).toBe(false)
      // Only the count is reported: the scenario with an unknown fault was never validated.
      expect(over.error!.issues).toHaveLength(1)
      expect(over.error!.issues[0]!.message).toMatch(/^1001 scenarios to plan/)
      expect(over.error!.issues[0]!.path).toEqual(['scenarios'])
    },
  )

  it('scenario names: a trailing space is refused; names alike but for runs of spaces are duplicates', () => {
    const trailing = SuiteSchema.safeParse({scenarios: [{name: 'one ', fault: 'drop-dest-info'}]})
    expect(trailing.error?.issues[0]?.message).toMatch(/must not end with a space/)
    const spaced = SuiteSchema.safeParse({
      scenarios: [
        {name: 'a b', fault: 'drop-dest-info'},
        {name: 'a  b', fault: 'drop-dest-info'},
      ],
    })
    expect(spaced.error?.issues[0]?.message).toBe('duplicate scenario name "a  b" (reads as "a b")')
  })

  it("the command's stop is currentStop() while it runs (readers handed no signal see it), and only then", async () => {
    expect(currentStop()).toBeUndefined()
    let seen: AbortSignal | undefined
    await withStopSignal(async ({signal, stop}) => {
      seen = currentStop()
      expect(seen).toBe(signal)
      stop('halted (halt file)')
    })
    expect(seen?.aborted).toBe(true)
    expect(seen?.reason).toBe('halted (halt file)')
    expect(currentStop(), 'restored when the command ends').toBeUndefined()
    await expect(
      withStopSignal(async () => {
        throw new Error('boom')
      }),
    ).rejects.toThrow('boom')
    expect(currentStop(), 'restored when the command throws').toBeUndefined()
  })
})
