import {describe, expect, it} from 'vitest'

import {releasePath} from '../../src/checks/decode-release.js'
import {releaseCauseOf} from '../../src/checks/release-cause.js'
import {ENGINES} from '../../src/engines/registry.js'
import {SGLANG_RELEASE_TEXTS} from '../../src/engines/sglang/release-texts.js'

const sglang = ENGINES.sglang

describe("SGLang's folder holds its release texts and pin states, and the checks take them as data", () => {
  it('names the cause from the state SGLang writes after KVPoll, and only from a state it lists', () => {
    const t = (state: string) => `KVTransferError(bootstrap_room=7): Request 7 timed out after 3.0s in KVPoll.${state}`
    expect(releaseCauseOf(t('Bootstrapping')).cause).toBe('bootstrap-timeout')
    expect(releaseCauseOf(t('WaitingForInput')).cause).toBe('waiting-timeout')
    expect(releaseCauseOf(t('Transferring')).cause).toBe('timeout')
    // A state word that happens to be an object's own property name is not a listed state.
    expect(releaseCauseOf(t('constructor')).cause).toBe('timeout')
  })

  it("judges by the texts it is given: another engine's texts, or none", () => {
    const lost = 'Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998)'
    expect(releaseCauseOf(lost).cause).toBe('heartbeat')
    expect(releaseCauseOf(lost, [])).toEqual({cause: 'unknown', evidence: `"${lost}"`})
    expect(releaseCauseOf('Releasing expired KV blocks for req r1', [{cause: 'timeout', re: /expired KV/}]).cause).toBe(
      'timeout',
    )
    expect(releasePath(lost).path).toBe('heartbeat')
    expect(releasePath(lost, []).path).toBe('unknown')
  })

  it('the engine offers the same texts the checks use, each cause with its report words', () => {
    expect(sglang.releaseTexts).toBe(SGLANG_RELEASE_TEXTS)
    const causes = sglang.releaseCauses.map(c => c.cause)
    expect(causes).toEqual(expect.arrayContaining(['watchdog', 'bootstrap-timeout', 'waiting-timeout', 'heartbeat']))
    expect(new Set(causes).size).toBe(causes.length)
    for (const c of sglang.releaseCauses) expect(c.text.length).toBeGreaterThan(0)
    expect(sglang.pinStates?.map(s => s.name)).toEqual(['Bootstrapping', 'WaitingForInput', 'Transferring'])
    // vLLM names no SGLang state and has no SGLang text.
    expect(ENGINES.vllm.pinStates).toBeUndefined()
    expect(ENGINES.vllm.releaseTexts).toBeUndefined()
  })

  it('confirms SGLang from its scheduler titles and launch command, and its metrics from their prefix', () => {
    const rows = [
      {pid: 1, ppid: 0, args: 'python3 -m sglang.launch_server --model m --disaggregation-mode prefill'},
      {pid: 2, ppid: 1, args: 'sglang::scheduler_TP1'},
      {pid: 3, ppid: 1, args: 'sglang::detokenizer'},
      {pid: 4, ppid: 0, args: 'vim sglang_notes.txt'},
    ]
    expect(sglang.processesOf(rows).map(r => r.pid)).toEqual([1, 2])
    expect(sglang.metricsAreOurs('# HELP x\nsglang:num_running_reqs{tp_rank="0"} 0\n')).toBe(true)
    expect(sglang.metricsAreOurs('vllm:num_requests_running 0\n')).toBe(false)
  })
})
