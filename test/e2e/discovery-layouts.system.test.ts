import {mkdtempSync, readdirSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {runCli} from './cli.js'

// Discovery on the layouts real hosts have (issue 11, item 6): for each, `pdchaos status` must find every scheduler
// with its own GPU and (prefill) its own ZMQ port. What is right comes from the twin's ground truth: the GPU files
// its ranks hold and the rank ports its servers report, never from discovery's own rules.

interface Twin {
  dir: string
  up: Record<string, unknown>
}

interface Rank {
  service: 'prefill' | 'decode'
  title: string
  pid: number
  tpRank: number
  dpRank?: number
  ppRank?: number
  epRank?: number
  gpu?: number
  gpuSource?: string
  zmqPort?: number
  routeKey?: {dp: number; cp: number; tp: number; pp: number}
}

interface Status {
  ranks: Rank[]
  services: Record<
    'prefill' | 'decode',
    {
      pid?: number
      launch?: {pid: number; source: string; args: Record<string, unknown>}
      dockerProxy?: {pid: number; containerPort?: number}
    }
  >
  warnings: string[]
}

/** Twins still up: each describe stops its own (one twin at a time: CPU is scarce), this catches the rest. */
const twins = new Set<Twin>()

/** `sim up` on a free base port (retried when a port is taken), the twin's layout given as flags. */
async function up(flags: string[]): Promise<Twin> {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-layout-'))
  for (let attempt = 0; ; attempt++) {
    const basePort = 20_000 + Math.floor(Math.random() * 400) * 100
    const r = await runCli(
      ['sim', 'up', '--state-dir', dir, '--base-port', String(basePort), '--wait', '60', '--json', ...flags],
      {timeoutMs: 90_000},
    )
    if (r.code === 0) {
      const twin = {dir, up: JSON.parse(r.stdout) as Record<string, unknown>}
      twins.add(twin)
      return twin
    }
    if (attempt < 5 && /already in use/.test(r.stderr + r.stdout)) continue
    rmSync(dir, {recursive: true, force: true})
    throw new Error(`sim up ${flags.join(' ')} failed (exit ${r.code}): ${r.stderr || r.stdout}`)
  }
}

async function down(twin: Twin | undefined): Promise<void> {
  if (!twin) return
  twins.delete(twin)
  await runCli(['sim', 'down', '--state-dir', twin.dir, '--json'], {timeoutMs: 30_000}).catch(() => undefined)
  rmSync(twin.dir, {recursive: true, force: true})
}

afterAll(async () => {
  for (const t of [...twins]) await down(t)
}, 60_000)

async function status(twin: Twin): Promise<Status> {
  const r = await runCli(['status', '--sim', '--state-dir', twin.dir, '--json'], {timeoutMs: 60_000})
  expect(r.code, r.stderr).toBe(0)
  return JSON.parse(r.stdout) as Status
}

/** The twin's truth: pid → GPU (the GPU file each rank holds), pid → ZMQ port (the servers' own rank ports). */
function truth(twin: Twin): {
  gpuOf: Map<number, number>
  zmqOf: Map<number, number>
  serverPid: Record<'prefill' | 'decode', number>
} {
  const gpuOf = new Map<number, number>()
  for (const f of readdirSync(join(twin.dir, 'gpus')).filter(x => /^\d+\.json$/.test(x))) {
    const held = JSON.parse(readFileSync(join(twin.dir, 'gpus', f), 'utf8')) as {pid: number}
    gpuOf.set(held.pid, Number(f.split('.')[0]))
  }
  const zmqOf = new Map<number, number>()
  const serverPid = {prefill: 0, decode: 0}
  for (const role of ['prefill', 'decode'] as const) {
    const s = JSON.parse(readFileSync(join(twin.dir, 'services', `${role}.json`), 'utf8')) as {
      pid: number
      rankPids: number[]
      rankPorts: Array<{zmqPort: number}>
    }
    serverPid[role] = s.pid
    s.rankPids.forEach((pid, k) => {
      zmqOf.set(pid, s.rankPorts[k]!.zmqPort)
    })
  }
  return {gpuOf, zmqOf, serverPid}
}

/** Every scheduler found, each with the GPU it holds and (prefill) the ZMQ port it bound; prints what differs. */
function expectEveryRank(twin: Twin, s: Status, counts: {prefill: number; decode: number}): void {
  const t = truth(twin)
  const seen = s.ranks.map(r => ({
    service: r.service,
    title: r.title,
    pid: r.pid,
    gpu: r.gpu,
    zmqPort: r.service === 'prefill' ? r.zmqPort : undefined,
  }))
  const want = s.ranks.map(r => ({
    service: r.service,
    title: r.title,
    pid: r.pid,
    gpu: t.gpuOf.get(r.pid),
    zmqPort: r.service === 'prefill' ? t.zmqOf.get(r.pid) : undefined,
  }))
  expect(seen, `warnings: ${s.warnings.join(' | ')}`).toEqual(want)
  expect(s.ranks.filter(r => r.service === 'prefill').length).toBe(counts.prefill)
  expect(s.ranks.filter(r => r.service === 'decode').length).toBe(counts.decode)
  // Every scheduler the twin runs is among them, and no two ranks share a GPU.
  expect(new Set(s.ranks.map(r => r.pid))).toEqual(new Set(t.zmqOf.keys()))
  expect(new Set(s.ranks.map(r => r.gpu)).size).toBe(s.ranks.length)
}

const titles = (s: Status, service: 'prefill' | 'decode') =>
  s.ranks
    .filter(r => r.service === service)
    .map(r => r.title)
    .sort()

describe('DP attention on prefill, EP on decode, a stray CUDA context per scheduler', () => {
  let twin: Twin
  let s: Status
  beforeAll(async () => {
    twin = await up([
      '--gpus',
      '4',
      '--prefill-tp',
      '2',
      '--prefill-dp',
      '2',
      '--prefill-dp-attention',
      '--decode-tp',
      '2',
      '--decode-ep',
      '2',
      '--stray-cuda-context',
    ])
    s = await status(twin)
  }, 120_000)
  afterAll(() => down(twin), 60_000)

  it('titles the schedulers by SGLang rule and finds them all', () => {
    expect(titles(s, 'prefill')).toEqual(['sglang::scheduler_DP0_TP0', 'sglang::scheduler_DP1_TP1'])
    expect(titles(s, 'decode')).toEqual(['sglang::scheduler_TP0_EP0', 'sglang::scheduler_TP1_EP1'])
    expect(s.warnings.filter(w => /scheduler processes|GPU/.test(w))).toEqual([])
  })

  it('reads each prefill rank ZMQ port under its DP-attention route key (attention TP size 1)', () => {
    const keys = Object.fromEntries(s.ranks.filter(r => r.service === 'prefill').map(r => [r.title, r.routeKey]))
    expect(keys).toEqual({
      'sglang::scheduler_DP0_TP0': {dp: 0, cp: 0, tp: 0, pp: 0},
      'sglang::scheduler_DP1_TP1': {dp: 1, cp: 0, tp: 0, pp: 0},
    })
    expectEveryRank(twin, s, {prefill: 2, decode: 2})
  })

  it('takes the context using the most memory, not the stray one nvidia-smi lists first on GPU 0', () => {
    const decode1 = s.ranks.find(r => r.title === 'sglang::scheduler_TP1_EP1')!
    expect(decode1.gpu).toBe(3)
    expect(decode1.gpuSource).toMatch(/most memory \(72000 MiB\), of 2/)
  })
})

describe('PP and plain DP on prefill (TP 1: no TP segment), TP 1 on decode', () => {
  let twin: Twin
  let s: Status
  beforeAll(async () => {
    twin = await up(['--gpus', '6', '--prefill-tp', '1', '--prefill-pp', '2', '--prefill-dp', '2', '--decode-tp', '1'])
    s = await status(twin)
  }, 120_000)
  afterAll(() => down(twin), 60_000)

  it('titles and finds every scheduler, the TP-1 ones without a TP segment', () => {
    expect(titles(s, 'prefill')).toEqual([
      'sglang::scheduler_DP0_PP0',
      'sglang::scheduler_DP0_PP1',
      'sglang::scheduler_DP1_PP0',
      'sglang::scheduler_DP1_PP1',
    ])
    expect(titles(s, 'decode')).toEqual(['sglang::scheduler'])
    expect(s.warnings.filter(w => /scheduler processes/.test(w))).toEqual([])
  })

  it('reads each prefill rank ZMQ port under its (dp, pp) route key, and places each GPU', () => {
    for (const r of s.ranks.filter(x => x.service === 'prefill'))
      expect(r.routeKey).toEqual({dp: r.dpRank, cp: 0, tp: 0, pp: r.ppRank})
    expectEveryRank(twin, s, {prefill: 4, decode: 1})
  })
})

describe('nvidia-smi lists no processes (a container): GPUs from CUDA_VISIBLE_DEVICES, base GPU id and rank', () => {
  let twin: Twin
  let s: Status
  beforeAll(async () => {
    twin = await up([
      '--gpus',
      '8',
      '--hide-gpu-processes',
      '--prefill-tp',
      '2',
      '--prefill-base-gpu-id',
      '1',
      '--prefill-cuda-visible-devices',
      '7,6,5,4',
      '--decode-tp',
      '1',
      '--decode-base-gpu-id',
      '1',
      '--decode-cuda-visible-devices',
      '1,0',
    ])
    s = await status(twin)
  }, 120_000)
  afterAll(() => down(twin), 60_000)

  it('finds every rank on the GPU it holds', () => {
    expectEveryRank(twin, s, {prefill: 2, decode: 1})
    expect(s.ranks.map(r => r.gpu)).toEqual([6, 5, 0])
    for (const r of s.ranks) expect(r.gpuSource).toMatch(/base-gpu-id 1 .* of CUDA_VISIBLE_DEVICES=/)
  })
})

describe('servers behind docker-proxy', () => {
  let twin: Twin
  let s: Status
  beforeAll(async () => {
    twin = await up(['--gpus', '2', '--prefill-tp', '1', '--decode-tp', '1', '--docker-proxy'])
    s = await status(twin)
  }, 120_000)
  afterAll(() => down(twin), 60_000)

  it('takes the server, not docker-proxy, as the process behind each port, and finds its ranks', () => {
    const t = truth(twin)
    for (const role of ['prefill', 'decode'] as const) {
      expect(s.services[role].pid).toBe(t.serverPid[role])
      expect(s.services[role].dockerProxy?.pid).not.toBe(t.serverPid[role])
      expect(s.services[role].dockerProxy?.containerPort).toBe(s.services[role].launch?.args.port)
    }
    expectEveryRank(twin, s, {prefill: 1, decode: 1})
  })
})

describe('servers launched with --config FILE', () => {
  let twin: Twin
  let s: Status
  beforeAll(async () => {
    twin = await up([
      '--gpus',
      '4',
      '--prefill-tp',
      '2',
      '--decode-tp',
      '1',
      '--decode-base-gpu-id',
      '3',
      '--server-config-file',
      '--hide-gpu-processes',
    ])
    s = await status(twin)
  }, 120_000)
  afterAll(() => down(twin), 60_000)

  it('reads the launch arguments from the YAML file the command line names', () => {
    const p = s.services.prefill.launch!
    const d = s.services.decode.launch!
    expect(p.source).toContain(join(twin.dir, 'config', 'prefill.yaml'))
    expect(p.args).toMatchObject({
      mode: 'prefill',
      tpSize: 2,
      baseGpuId: 0,
      port: Number(new URL(String((twin.up.endpoints as Record<string, string>).prefill)).port),
    })
    expect(d.args).toMatchObject({mode: 'decode', tpSize: 1, baseGpuId: 3})
  })

  it('finds every rank on its GPU from those arguments', () => {
    expectEveryRank(twin, s, {prefill: 2, decode: 1})
    expect(s.ranks.map(r => r.gpu)).toEqual([0, 1, 3])
  })
})
