import {describe, expect, it} from 'vitest'

import {refuseVllmOnlyFault, vllmFaultOptions} from '../../src/cli/vllm-fault-options.js'

describe("inject's flags for a vLLM experiment", () => {
  it('maps what the experiment takes', () => {
    expect(vllmFaultOptions({pins: 3, side: 'decode', gpu: '1'}, 'wedge-rank', true)).toEqual({
      requests: 3,
      side: 'decode',
      gpu: 1,
    })
    expect(vllmFaultOptions({pins: 3}, 'drop-dest-info', false)).toEqual({})
  })

  it('refuses a flag the experiment does not take, naming what it takes', () => {
    expect(() => vllmFaultOptions({gpu: '1'}, 'drop-dest-info', false)).toThrow(/drop-dest-info on vLLM takes no --gpu/)
    // --ttl is not a fault flag: refused where the experiment installs nothing and so holds no lease.
    expect(() => vllmFaultOptions({ttl: 60}, 'drop-dest-info', false)).toThrow(/takes no --ttl/)
    expect(vllmFaultOptions({ttl: 60}, 'abort-mid-transfer', false)).toEqual({ttlS: 60})
  })

  it('refuses a vLLM-only fault for an SGLang target', () => {
    expect(() => refuseVllmOnlyFault('kill-decode', ['drop-dest-info'])).toThrow(/kill-decode is a vLLM fault/)
    expect(() => refuseVllmOnlyFault('drop-dest-info', ['drop-dest-info'])).not.toThrow()
  })
})
