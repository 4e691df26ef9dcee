import {describe, expect, it} from 'vitest'

// @ts-expect-error: a plain .mjs script with no type declarations; anyone can run it with `npm run check:layers`.
import {circles, layerOf, violations} from '../../scripts/check-layers.mjs'

describe('data flows one way', () => {
  it('no import in src/ runs back up command → plan → effects → timeline → checks → reports', () => {
    expect(violations()).toEqual([])
  })

  it('has no import circle, type-only imports included', () => {
    expect(circles()).toEqual([])
  })

  it('knows every folder, and keeps the twin a world of its own', () => {
    expect(layerOf('model/run.ts')).toBeLessThan(layerOf('report/html.ts'))
    expect(layerOf('checks/eviction.ts')).toBeLessThan(layerOf('faults/stall-kv.ts'))
    expect(layerOf('experiment/batch.ts')).toBeLessThan(layerOf('commands/inject.ts'))
    expect(layerOf('sim/server/http-api.ts')).toBe('sim')
  })

  it("places an engine's faults and experiments at their own layers inside its one folder", () => {
    expect(layerOf('engines/vllm/lease-contract.ts')).toBe(layerOf('discovery/proc.ts'))
    expect(layerOf('engines/vllm/faults/drop-dest-info.ts')).toBe(layerOf('faults/stall-kv.ts'))
    expect(layerOf('engines/vllm/experiments/registry.ts')).toBe(layerOf('experiment/batch.ts'))
    // Its service clients and file rules sit at the deployment layer, which the deployment loader may ask.
    expect(layerOf('engines/sglang/deployment/sglang-client.ts')).toBe(layerOf('deployment/config.ts'))
    expect(layerOf('engines/sglang/discovery/discover.ts')).toBe(layerOf('engines/engine.ts'))
    // A file named like a subfolder at the engine's top stays at the engines layer.
    expect(layerOf('engines/vllm/faults.ts')).toBe(layerOf('engines/engine.ts'))
  })
})
