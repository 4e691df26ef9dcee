import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {runCli} from './cli.js'

/**
 * `pdchaos status -c` against the vLLM twin's deployment file (issue 31): read as a real host is (ps, /proc, HTTP),
 * every value with its source; other commands refuse the file with exit 2.
 */
const cli = (args: string[]) => runCli(args, {timeoutMs: 150_000})

describe('status of a vLLM deployment', {timeout: 180_000}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'vllm-status-'))
  const file = join(dir, 'pdchaos.yaml')
  let base = 0

  beforeAll(async () => {
    base = (await freeVllmPorts()).base
    const up = await cli([
      'sim',
      'up',
      '--engine',
      'vllm',
      '--state-dir',
      dir,
      '--base-port',
      String(base),
      '--side-channel-port',
      String(base + 7),
      '--kv-lease-duration',
      '12',
      '--abort-request-timeout',
      '90',
    ])
    expect(up.code, up.stderr).toBe(0)
  }, 120_000)
  afterAll(async () => {
    await cli(['sim', 'down', '--state-dir', dir])
    rmSync(dir, {recursive: true, force: true})
  }, 60_000)

  it('shows the engine, connector and lease with where each was read', async () => {
    const r = await cli(['status', '-c', file])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/^engine\s+vllm/)
    expect(r.stdout).toMatch(/kv_lease_duration\s+12 s\s+\(cmdline:/)
    expect(r.stdout).toMatch(/heartbeat interval\s+2 s\s+\(derived/)
    expect(r.stdout).toMatch(/heartbeat extension\s+8 s\s+\(derived/)
    expect(r.stdout).toMatch(/legacy abort timeout 90 s\s+\(env: VLLM_NIXL_ABORT_REQUEST_TIMEOUT/)
    expect(r.stdout).toMatch(/titles\s+VLLM::EngineCore/)
  })

  it('gives the same in --json', async () => {
    const r = await cli(['status', '-c', file, '--json'])
    expect(r.code, r.stderr).toBe(0)
    const j = JSON.parse(r.stdout)
    expect(j.engine).toBe('vllm')
    expect(j.router.health.ok).toBe(true)
    for (const s of j.servers) {
      expect(s.health.ok).toBe(true)
      expect(s.metrics.vllm).toBe(true)
      expect(s.lease.connector).toMatchObject({value: 'NixlConnector', source: 'cmdline'})
      expect(s.lease.leaseDurationS).toMatchObject({value: 12, source: 'cmdline'})
      expect(s.lease.legacyAbortTimeoutS).toMatchObject({value: 90, source: 'env'})
    }
  })

  it('says which server is unhealthy and exits 5 when decode stops answering', async () => {
    const j = JSON.parse((await cli(['status', '-c', file, '--json'])).stdout)
    const pid = j.servers[1].pid as number
    process.kill(pid, 'SIGSTOP')
    try {
      const r = await cli(['status', '-c', file, '--timeout', '2'])
      expect(r.code).toBe(5)
      expect(r.stdout).toMatch(/^decode\s+\S+\s+UNHEALTHY/m)
      expect(r.stdout).toMatch(/^prefill\s+\S+\s+healthy/m)
    } finally {
      process.kill(pid, 'SIGCONT')
    }
  })

  it('refuses a fault that has no vLLM experiment with exit 2, one line and the faults it has', async () => {
    // trip-breaker acts on SGLang's gateway breaker; vLLM's toy proxy has none, so no vLLM experiment maps it.
    const r = await cli(['inject', 'trip-breaker', '-c', file])
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(/"trip-breaker" is not built for vLLM deployments/)
    expect(r.stderr).toMatch(/Try this: use one of: .*drop-dest-info/)
    expect(r.stderr).not.toMatch(/\n\s+at /)
  })
})
