import type {Engine, EngineName} from './engine.js'
import {sglangEngine} from './sglang/engine.js'
import {vllmEngine} from './vllm/engine.js'

export const ENGINES: Record<EngineName, Engine> = {sglang: sglangEngine, vllm: vllmEngine}

/** The engines whose processes a host's process list shows. */
export function enginesIn(rows: Parameters<Engine['processesOf']>[0]): EngineName[] {
  return Object.values(ENGINES)
    .filter(e => e.processesOf(rows).length > 0)
    .map(e => e.name)
}
