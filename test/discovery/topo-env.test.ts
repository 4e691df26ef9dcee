import {spawnSync} from 'node:child_process'
import {describe, expect, it} from 'vitest'

import {
  ENVIRON_SCRIPT,
  parseEnvironBlocks,
  type StatusReport,
  twinRailsOf,
} from '../../src/engines/sglang/discovery/discover.js'
import {transportAcross} from '../../src/engines/sglang/discovery/discover-hosts.js'
import {nicsOfGpu, parseNvidiaTopo} from '../../src/discovery/topo.js'
import {
  healthCheckFromEnv,
  mooncakeTimeoutFromEnv,
  parseUcxTime,
  qpAckTimeout,
  rcLimitsFromEnv,
  rcTransportOf,
} from '../../src/engines/sglang/discovery/transport-env.js'
import {FEWER_NICS, railHost} from './topo-samples.js'

describe('nvidia-smi topo -m', () => {
  it(
    'parses the real layout (SGR-underlined header, tabs, CPU/NUMA columns, NIC rows, NIC Legend): a rail host ' +
      'maps GPU g to its PIX NIC',
    () => {
      const t = parseNvidiaTopo(railHost())
      expect(t.gpus).toEqual([0, 1, 2, 3, 4, 5, 6, 7])
      expect(t.nics.map(n => `${n.label}=${n.device}`)).toEqual([
        'NIC0=mlx5_0',
        'NIC1=mlx5_3',
        'NIC2=mlx5_4',
        'NIC3=mlx5_5',
        'NIC4=mlx5_6',
        'NIC5=mlx5_7',
        'NIC6=mlx5_8',
        'NIC7=mlx5_9',
      ])
      expect(t.gpuToNic['0']).toMatchObject({NIC0: 'PIX', NIC1: 'NODE', NIC4: 'SYS'})
      expect(Object.keys(t.gpuToNic['0']!)).toHaveLength(8)
      const g5 = nicsOfGpu(t, 5)
      expect(g5).toMatchObject({ok: true, level: 'PIX', nics: [{label: 'NIC5', device: 'mlx5_7'}], sharedWithGpus: []})
      if (g5.ok) expect(g5.evidence).toBe('nvidia-smi topo -m: GPU5 is PIX to NIC5 (mlx5_7)')
    },
  )

  it(
    'fewer NICs than GPUs: PXB when no NIC is PIX, naming the GPUs that share it; PHB/NODE/SYS only is no NIC of ' +
      'its own',
    () => {
      const t = parseNvidiaTopo(FEWER_NICS)
      expect(t.nics.map(n => n.device)).toEqual(['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_bond_0'])
      expect(nicsOfGpu(t, 2)).toMatchObject({
        ok: true,
        level: 'PXB',
        nics: [{label: 'NIC1', device: 'mlx5_1'}],
        sharedWithGpus: [3],
      })
      expect(nicsOfGpu(t, 5)).toMatchObject({ok: true, level: 'PXB', nics: [{label: 'NIC2'}], sharedWithGpus: [4]})
      const g7 = nicsOfGpu(t, 7)
      expect(g7.ok).toBe(false)
      expect(g7.evidence).toMatch(/no NIC is PIX or PXB to GPU7 \(NIC0 SYS, NIC1 SYS, NIC2 NODE, NIC3 PHB\)/)
      expect(nicsOfGpu(t, 9)).toMatchObject({ok: false, evidence: expect.stringContaining('no row for GPU 9')})
    },
  )

  it('a host without NICs, or output that is not a matrix, maps no GPU to a NIC (and says why)', () => {
    const noNic = parseNvidiaTopo(
      '\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-15\t0\nGPU1\tNV4\t X \t0-15\t0\n\nLegend:\n',
    )
    expect(noNic.gpus).toEqual([0, 1])
    expect(nicsOfGpu(noNic, 0)).toMatchObject({ok: false, evidence: expect.stringContaining('lists no NIC')})
    const none = parseNvidiaTopo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    expect(none.gpus).toEqual([])
    expect(nicsOfGpu(none, 0)).toMatchObject({
      ok: false,
      evidence: expect.stringContaining('printed no GPU/NIC matrix'),
    })
  })
})

describe('UCX RC limits from a rank environment', () => {
  it('reads UCX times as ucs_config_sscanf_time does (number, then m, s, ms, us or ns; none is seconds)', () => {
    expect(parseUcxTime('1.0s')).toBe(1)
    expect(parseUcxTime('500ms')).toBe(0.5)
    expect(parseUcxTime('2m')).toBe(120)
    expect(parseUcxTime('250us')).toBeCloseTo(0.00025)
    expect(parseUcxTime('3')).toBe(3)
    expect(parseUcxTime('1 s')).toBeUndefined()
    expect(parseUcxTime('1h')).toBeUndefined()
    expect(parseUcxTime('fast')).toBeUndefined()
  })

  it('rounds the QP ACK timeout to 4.096 µs × 2^n, n from 1; 2^32 and beyond is no timeout at all', () => {
    expect(qpAckTimeout(1)).toEqual({exponent: 18, seconds: 4.096e-6 * 2 ** 18})
    expect(qpAckTimeout(1).seconds).toBeCloseTo(1.0737, 3)
    expect(qpAckTimeout(1e-9).exponent).toBe(1)
    expect(qpAckTimeout(1e6)).toEqual({exponent: 0, seconds: Number.POSITIVE_INFINITY})
  })

  it('defaults (1 s, 7 retries): a stalled QP fails after about 8.6 s', () => {
    const rc = rcLimitsFromEnv({})
    expect(rc).toMatchObject({
      transport: 'rc_mlx5',
      timeout: {text: '1.0s', from: 'default', seconds: 1},
      retryCount: {value: 7, from: 'default'},
      warnings: [],
    })
    expect(rc.giveUpSeconds[0]).toBeCloseTo(7.516, 2)
    expect(rc.giveUpSeconds[1]).toBeCloseTo(8.59, 2)
    expect(rc.settings).toEqual([
      'UCX_RC_MLX5_TIMEOUT',
      'UCX_RC_TIMEOUT',
      'UCX_RC_MLX5_RETRY_COUNT',
      'UCX_RC_RETRY_COUNT',
    ])
  })

  it(
    'the transport prefix overrides the shared RC_ one; UCX_TLS picks the verbs flavour; retries are capped at 7; ' +
      'a bad value is named',
    () => {
      expect(rcLimitsFromEnv({UCX_RC_TIMEOUT: '2s', UCX_RC_MLX5_TIMEOUT: '30s'}).timeout).toEqual({
        text: '30s',
        from: 'UCX_RC_MLX5_TIMEOUT',
        seconds: 30,
      })
      expect(rcLimitsFromEnv({UCX_RC_TIMEOUT: '2s', UCX_RC_VERBS_TIMEOUT: '30s'}).timeout.from).toBe('UCX_RC_TIMEOUT')
      expect(rcTransportOf({UCX_TLS: 'rc_v,sm,self'})).toBe('rc_verbs')
      expect(rcTransportOf({UCX_TLS: 'rc,sm'})).toBe('rc_mlx5')
      expect(rcTransportOf({UCX_TLS: '^tcp'})).toBe('rc_mlx5')
      const verbs = rcLimitsFromEnv({UCX_TLS: 'rc_verbs', UCX_RC_VERBS_RETRY_COUNT: '3', UCX_RC_RETRY_COUNT: '5'})
      expect(verbs).toMatchObject({transport: 'rc_verbs', retryCount: {value: 3, from: 'UCX_RC_VERBS_RETRY_COUNT'}})
      expect(rcLimitsFromEnv({UCX_RC_RETRY_COUNT: '12'})).toMatchObject({
        retryCount: {value: 7},
        warnings: [expect.stringContaining('at most 7')],
      })
      expect(rcLimitsFromEnv({UCX_RC_TIMEOUT: 'soon'})).toMatchObject({
        timeout: {from: 'default', seconds: 1},
        warnings: [expect.stringContaining('UCX_RC_TIMEOUT=soon is not a UCX time')],
      })
    },
  )

  it("Mooncake's MC_TRANSFER_TIMEOUT, and SGLang's health-check settings", () => {
    expect(mooncakeTimeoutFromEnv({})).toEqual({seconds: 30, from: 'default'})
    expect(mooncakeTimeoutFromEnv({MC_TRANSFER_TIMEOUT: '120'})).toEqual({seconds: 120, from: 'MC_TRANSFER_TIMEOUT'})
    expect(healthCheckFromEnv(undefined)).toMatchObject({timeoutSeconds: 20, generates: true})
    expect(healthCheckFromEnv({SGLANG_HEALTH_CHECK_TIMEOUT: '5'})).toEqual({
      timeoutSeconds: 5,
      source: 'SGLANG_HEALTH_CHECK_TIMEOUT=5',
      generates: true,
    })
    expect(healthCheckFromEnv({SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION: 'false'}).generates).toBe(false)
  })
})

describe("rank environments and the twin's rails", () => {
  it('keeps only UCX_, MC_, NIXL_ and SGLANG_ variables, per pid, from one script run', () => {
    const out =
      '\u001E101\nUCX_TLS=rc,cuda_copy\nSGLANG_HEALTH_CHECK_TIMEOUT=5\nPATH=/bin\n\u001E102\n\u001Ebad\nX=1\n\u001E103\n\u001Funreadable\n'
    const m = parseEnvironBlocks(out)
    // 103's environment could not be read: unknown, not empty (an empty one means every variable unset).
    expect([...m.keys()]).toEqual([101, 102])
    expect(m.get(101)).toEqual({UCX_TLS: 'rc,cuda_copy', SGLANG_HEALTH_CHECK_TIMEOUT: '5'})
    expect(m.get(102)).toEqual({})
  })

  it('the script reads a real /proc/<pid>/environ (this process), keeping = inside values', () => {
    const r = spawnSync('sh', ['-c', ENVIRON_SCRIPT, 'sh', String(process.pid)], {encoding: 'utf8'})
    expect(r.status).toBe(0)
    const env = parseEnvironBlocks(r.stdout).get(process.pid)!
    for (const [k, v] of Object.entries(process.env))
      if (/^(UCX_|MC_|NIXL_|SGLANG_)/.test(k) && !v!.includes('\n')) expect(env[k]).toBe(v)
    for (const k of Object.keys(env)) expect(k).toMatch(/^(UCX_|MC_|NIXL_|SGLANG_)/)
  })

  it("reads the twin's rails from server_info, dropping malformed entries", () => {
    expect(
      twinRailsOf([
        {gpu: 0, interface: 'rail0', address: '198.18.0.1', udp_port: 4791},
        {gpu: 1, interface: 'bad name; rm'},
        {interface: 'rail2'},
        'x',
      ]),
    ).toEqual([{gpu: 0, interface: 'rail0', address: '198.18.0.1', udpPort: 4791}])
    expect(twinRailsOf(undefined)).toEqual([])
  })

  it(
    "across hosts, the rails are prefill's and decode's: a twin split over nodes states each node's own in its " +
      "server's server_info",
    () => {
      const rail = (gpu: number) => ({gpu, interface: `rail${gpu}`, address: `198.18.${gpu}.1`, udpPort: 4791})
      const report = (prefill: number[], decode: number[]) =>
        ({
          transport: {
            backend: 'nixl',
            source: 'prefill server_info',
            dataPath: 'rdma-roce-rails',
            ...(prefill.length ? {rails: prefill.map(rail)} : {}),
          },
          services: {decode: {...(decode.length ? {twinRails: decode.map(rail)} : {})}},
        }) as unknown as StatusReport
      // The prefill node's report carries prefill's rails; the decode node's, decode's (each read from its
      // server_info).
      const split = transportAcross(report([0, 1, 2, 3], []), report([0, 1, 2, 3], [4, 5, 6, 7]))
      expect(split.rails!.map(r => r.interface)).toEqual([
        'rail0',
        'rail1',
        'rail2',
        'rail3',
        'rail4',
        'rail5',
        'rail6',
        'rail7',
      ])
      expect(split).toMatchObject({backend: 'nixl', dataPath: 'rdma-roce-rails'})
      // A twin on one node states every rail on both servers: nothing doubles. No rails: the transport as prefill
      // states
      // it.
      expect(transportAcross(report([0, 1, 2, 3], []), report([0, 1, 2, 3], [0, 1, 2, 3])).rails).toHaveLength(4)
      expect(transportAcross(report([], []), report([], [])).rails).toBeUndefined()
    },
  )
})
