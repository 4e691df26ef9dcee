import {mkdtemp, rm, writeFile} from 'node:fs/promises'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {readEngineField} from '../../src/deployment/engine-field.js'
import {loadDeployment} from '../../src/deployment/load.js'
import {loadVllmDeployment} from '../../src/engines/vllm/deployment-file.js'
import {PdError} from '../../src/errors.js'
import {ExitCode} from '../../src/exit-codes.js'
import {GOOD} from '../deployment/fixtures.js'

const VLLM = `engine: vllm
host: {kind: local}
services:
  prefill: {url: 'http://127.0.0.1:8100', sideChannelPort: 5600}
  decode: {url: 'http://127.0.0.1:8200', sideChannelPort: 5601}
  router: {url: 'http://127.0.0.1:8000', healthPath: /healthcheck, kind: toy-proxy}
vllm: {version: 0.22.0, kvTransferConfig: {kv_connector: NixlConnector}}
`

describe('engine: in the deployment file', () => {
  let dir: string
  const write = async (name: string, text: string) => {
    await writeFile(join(dir, name), text)
    return join(dir, name)
  }
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'pdchaos-engine-'))
  })
  afterAll(async () => {
    await rm(dir, {recursive: true, force: true})
  })

  it('defaults to sglang, and an explicit engine: sglang file loads as before', async () => {
    expect(await readEngineField(await write('a.yaml', GOOD))).toBe('sglang')
    const f = await write('b.yaml', `engine: sglang\n${GOOD}`)
    expect(await readEngineField(f)).toBe('sglang')
    await expect(loadDeployment(f)).resolves.toBeDefined()
  })

  it('refuses a vLLM file in the SGLang loader with exit 2 and one line, and reads it with the vLLM schema', async () => {
    const f = await write('v.yaml', VLLM)
    expect(await readEngineField(f)).toBe('vllm')
    const error = await loadDeployment(f).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(ExitCode.badInput)
    expect((error as PdError).message).toBe(
      `${f} is a vLLM deployment (engine: vllm), and this reads SGLang deployments only`,
    )
    const d = await loadVllmDeployment(f)
    expect(d.services.prefill.healthPath).toBe('/health')
    expect(d.services.router.kind).toBe('toy-proxy')
  })

  it('names an unknown engine', async () => {
    const f = await write('x.yaml', `engine: trtllm\n${GOOD}`)
    const error = await readEngineField(f).catch((e: unknown) => e)
    expect((error as PdError).message).toMatch(/engine/)
  })
})
