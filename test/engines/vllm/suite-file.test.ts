import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {loadVllmSuite} from '../../../src/engines/vllm/experiments/suite-file.js'

/** A vLLM suite file: its scenarios as the runner's entries, or exit 2 naming the scenario and what is wrong. */

const dir = mkdtempSync(join(tmpdir(), 'vllm-suite-file-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

let n = 0
function fileWith(text: string): string {
  const f = join(dir, `s${n++}.yaml`)
  writeFileSync(f, text)
  return f
}

describe('a vLLM suite file', () => {
  it('gives the runner its scenarios in order, with the options inject would take, the co-restart by default', async () => {
    const s = await loadVllmSuite(
      fileWith(
        'engine: vllm\nname: nightly-vllm\nscenarios:\n  - {fault: drop-dest-info, pins: 3}\n  - {fault: drop-dest-info}\n',
      ),
    )
    expect(s).toEqual({
      name: 'nightly-vllm',
      entries: [
        {fault: 'drop-dest-info', options: {requests: 3}},
        {fault: 'drop-dest-info', options: {}},
      ],
      coRestart: true,
    })
    const noRestart = await loadVllmSuite(
      fileWith('engine: vllm\nname: x\nscenarios: [{fault: drop-dest-info}]\ncoRestart: false\n'),
    )
    expect(noRestart.coRestart).toBe(false)
  })

  it('refuses a fault not built for vLLM, an option its experiment does not take, and an SGLang suite file', async () => {
    const bad = async (text: string) =>
      loadVllmSuite(fileWith(text)).then(
        () => undefined,
        (e: Error) => e,
      )
    const unknown = await bad('engine: vllm\nname: x\nscenarios: [{fault: trip-breaker}]\n')
    expect(unknown?.message).toMatch(/scenarios\[0\] fault trip-breaker is not built for vLLM deployments/)
    const option = await bad('engine: vllm\nname: x\nscenarios: [{fault: drop-dest-info, gpu: 1}]\n')
    expect(option?.message).toMatch(/scenarios\[0\] \(drop-dest-info\) takes no gpu/)
    const sglang = await bad('name: x\nscenarios: [{fault: drop-dest-info}]\n')
    expect(sglang?.message).toMatch(/is an SGLang suite file \(it has no engine: vllm\)/)
    for (const e of [unknown, option, sglang]) expect((e as {exitCode?: number}).exitCode).toBe(2)
  })
})
