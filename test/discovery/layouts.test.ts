import {describe, expect, it} from 'vitest'

import {
  CONFIG_SCRIPT,
  parseConfigBlocks,
  rankName,
  routeKeyOf,
  serviceOwner,
} from '../../src/engines/sglang/discovery/discover.js'
import {gpuFromLayout, gpuIndexByPid, parseComputeApps, parseGpuList} from '../../src/discovery/gpus.js'
import {
  isServerLaunch,
  mergeLaunchArgs,
  parseConfigYaml,
  parseLaunchCommand,
} from '../../src/engines/sglang/discovery/launch-args.js'
import {parseDockerProxy, parsePs, parseSsListeners} from '../../src/discovery/proc.js'
import {parseRankTitle} from '../../src/engines/sglang/discovery/rank-title.js'

describe('scheduler titles by SGLang rule', () => {
  it('reads every segment in upstream order: DP, PP, ATTN_CP, MOE_DP, TP, EP', () => {
    expect(parseRankTitle('sglang::scheduler_DP1_PP0_ATTN_CP1_MOE_DP2_TP3_EP3')).toEqual({
      dpRank: 1,
      ppRank: 0,
      attnCpRank: 1,
      moeDpRank: 2,
      tpRank: 3,
      epRank: 3,
    })
    expect(parseRankTitle('sglang::scheduler_DP1_TP3_EP1')).toEqual({dpRank: 1, tpRank: 3, epRank: 1})
    expect(parseRankTitle('sglang::scheduler_MOE_DP1')).toEqual({tpRank: 0, moeDpRank: 1})
  })

  it('refuses what SGLang never writes: segments out of order, repeated, or glued to other text', () => {
    expect(parseRankTitle('sglang::scheduler_TP1_DP0')).toBeUndefined()
    expect(parseRankTitle('sglang::scheduler_TP1_TP2')).toBeUndefined()
    expect(parseRankTitle('sglang::scheduler_TPx')).toBeUndefined()
    expect(parseRankTitle('sglang::schedulers')).toBeUndefined()
    expect(parseRankTitle('python -m sglang.launch_server')).toBeUndefined()
  })

  it('names a rank as its title does', () => {
    expect(rankName({tpRank: 1, dpRank: 1, ppRank: 0})).toBe('DP1 PP0 TP1')
    expect(rankName({tpRank: 0})).toBe('TP0')
  })
})

describe('bootstrap route keys', () => {
  it('DP attention: dp group from the title, attention TP rank = TP rank mod tp/dp', () => {
    // tp 4, dp 2, DP attention: attn_tp_size 2; scheduler DP1_TP3 registers as dp 1, tp 1.
    expect(routeKeyOf({dpRank: 1, tpRank: 3}, 2)).toEqual({dp: 1, cp: 0, tp: 1, pp: 0})
  })
  it('PP: the title PP rank is the key, the TP rank as is', () => {
    expect(routeKeyOf({ppRank: 1, tpRank: 1}, 2)).toEqual({dp: 0, cp: 0, tp: 1, pp: 1})
  })
  it('plain DP: the system DP rank is the dp group', () => {
    expect(routeKeyOf({dpRank: 1, tpRank: 1}, 2)).toEqual({dp: 1, cp: 0, tp: 1, pp: 0})
  })
})

describe('a rank GPU', () => {
  const gpus = parseGpuList('0, GPU-aaa, H100\n1, GPU-bbb, H100\n5, GPU-fff, H100\n')

  it('is the context using the most memory, not the first nvidia-smi lists', () => {
    // nvidia-smi lists by GPU: the stray 500 MiB context on GPU 0 comes first.
    const apps = parseComputeApps('700, GPU-aaa, 500\n701, GPU-aaa, 500\n700, GPU-fff, 72000\n701, GPU-bbb, 72000\n')
    const m = gpuIndexByPid(apps, gpus)
    expect(m.get(700)).toEqual({index: 5, usedMiB: 72_000, contexts: 2})
    expect(m.get(701)).toEqual({index: 1, usedMiB: 72_000, contexts: 2})
  })

  it('is left unknown when several contexts carry no memory figure', () => {
    expect(gpuIndexByPid(parseComputeApps('700, GPU-aaa, [N/A]\n700, GPU-fff, [N/A]\n'), gpus).has(700)).toBe(false)
    expect(gpuIndexByPid(parseComputeApps('700, GPU-fff, [N/A]\n'), gpus).get(700)?.index).toBe(5)
  })

  const layout = {tpSize: 2, dpSize: 1, ppSize: 1, enableDpAttention: false, baseGpuId: 0, gpuIdStep: 1}
  it('follows base GPU id and rank, then CUDA_VISIBLE_DEVICES', () => {
    expect(gpuFromLayout({...layout, baseGpuId: 2}, {tpRank: 1}, gpus)).toEqual({index: 3, local: 3})
    expect(gpuFromLayout({...layout, baseGpuId: 1, cudaVisibleDevices: '6,7,4,5'}, {tpRank: 1}, gpus)).toEqual({
      index: 4,
      local: 2,
    })
    expect(gpuFromLayout({...layout, cudaVisibleDevices: 'GPU-fff,GPU-bbb'}, {tpRank: 0}, gpus)).toEqual({
      index: 5,
      local: 0,
    })
    // A list too short for the rank, or naming a device this host does not list: unknown, never a guess.
    expect(gpuFromLayout({...layout, baseGpuId: 1, cudaVisibleDevices: '6,7'}, {tpRank: 1}, gpus)).toBeUndefined()
    expect(gpuFromLayout({...layout, cudaVisibleDevices: 'GPU-zzz'}, {tpRank: 0}, gpus)).toBeUndefined()
  })

  it('places plain DP groups one whole TP×PP group apart, DP attention and PP as upstream', () => {
    expect(gpuFromLayout({...layout, dpSize: 2}, {dpRank: 1, tpRank: 1}, gpus)?.index).toBe(3)
    expect(
      gpuFromLayout({...layout, tpSize: 4, dpSize: 2, enableDpAttention: true}, {dpRank: 1, tpRank: 3}, gpus)?.index,
    ).toBe(3)
    expect(gpuFromLayout({...layout, ppSize: 2, baseGpuId: 4}, {ppRank: 1, tpRank: 0}, gpus)?.index).toBe(6)
    expect(gpuFromLayout({...layout, gpuIdStep: 2}, {tpRank: 1}, gpus)?.index).toBe(2)
  })

  it(
    'over --nnodes each node numbers its own GPUs from --base-gpu-id; the title keeps the global TP rank ' +
      '(engine.py)',
    () => {
      // TP 16 over 2 nodes: TP8..TP15 on node rank 1 run on its GPUs 0..7.
      expect(gpuFromLayout({...layout, tpSize: 16, nnodes: 2}, {tpRank: 8}, gpus)?.index).toBe(0)
      expect(gpuFromLayout({...layout, tpSize: 16, nnodes: 2}, {tpRank: 13}, gpus)?.index).toBe(5)
      expect(gpuFromLayout({...layout, tpSize: 16, nnodes: 2, baseGpuId: 2}, {tpRank: 9}, gpus)?.index).toBe(3)
      // PP 2 over 2 nodes: each node one PP stage of the whole TP group.
      expect(gpuFromLayout({...layout, tpSize: 4, ppSize: 2, nnodes: 2}, {ppRank: 1, tpRank: 3}, gpus)?.index).toBe(3)
      // One node: as before.
      expect(gpuFromLayout({...layout, tpSize: 8, nnodes: 1}, {tpRank: 5}, gpus)?.index).toBe(5)
    },
  )
})

describe('launch arguments', () => {
  it('reads a multi-node launch: --nnodes, --node-rank and --dist-init-addr', () => {
    expect(
      parseLaunchCommand(
        'python3 -m sglang.launch_server --disaggregation-mode prefill --tp-size 16 --nnodes 2 --node-rank 1 ' +
          '--dist-init-addr 10.0.0.1:5000 --port 30000',
      ),
    ).toEqual({
      mode: 'prefill',
      tpSize: 16,
      nnodes: 2,
      nodeRank: 1,
      distInitAddr: '10.0.0.1:5000',
      port: 30_000,
    })
  })

  it('reads the command line, aliases included', () => {
    expect(
      parseLaunchCommand(
        'python3 -m sglang.launch_server --disaggregation-mode decode --tp 2 --dp-size=2 --enable-dp-attention ' +
          '--base-gpu-id 4 --port 30200 --host 10.0.0.1',
      ),
    ).toEqual({
      mode: 'decode',
      tpSize: 2,
      dpSize: 2,
      enableDpAttention: true,
      baseGpuId: 4,
      port: 30_200,
      host: '10.0.0.1',
    })
    expect(isServerLaunch('python -m sglang.launch_server --config /etc/sglang/prefill.yaml')).toBe(true)
    expect(isServerLaunch('python -m sglang.launch_server --model x')).toBe(false)
  })

  it('reads SGLang YAML config keys as flags, and lets the command line win', () => {
    const file = parseConfigYaml(
      'disaggregation-mode: prefill\ntp-size: 2\nport: 30100\nbase_gpu_id: 2\nenable-dp-attention: ' +
        'false\nmodel-path: m\n',
    )
    expect(file).toEqual({mode: 'prefill', tpSize: 2, port: 30_100, baseGpuId: 2, enableDpAttention: false})
    const cli = parseLaunchCommand('python -m sglang.launch_server --config p.yaml --port 31000')
    expect(mergeLaunchArgs(file, cli)).toMatchObject({
      mode: 'prefill',
      tpSize: 2,
      port: 31_000,
      baseGpuId: 2,
      configFile: 'p.yaml',
    })
    expect(() => parseConfigYaml('- a\n- b\n')).toThrow(/mapping/)
  })

  it('splits the config-file read into one block per pid, with the reason a file could not be read', () => {
    expect(CONFIG_SCRIPT).toContain('/proc/$p/cwd/')
    const m = parseConfigBlocks('\u001E101\ntp-size: 2\n\u001E102\n\u001Fcannot read /x.yaml\n')
    expect(m.get(101)).toEqual({text: 'tp-size: 2\n'})
    expect(m.get(102)).toEqual({error: 'cannot read /x.yaml'})
  })
})

describe('docker-proxy', () => {
  const rows = parsePs(
    [
      '  900     1 Sl   /usr/bin/docker-proxy -proto tcp -host-ip 0.0.0.0 -host-port 30100 -container-ip ' +
        '172.17.0.2 -container-port 30000',
      ' 1000     1 Ssl  python3 -m sglang.launch_server --disaggregation-mode prefill --port 30000',
    ].join('\n'),
  )
  const byPid = new Map(rows.map(r => [r.pid, r]))

  it('parses its published and container ports', () => {
    expect(parseDockerProxy(rows[0]!.args)).toEqual({
      hostPort: 30_100,
      containerIp: '172.17.0.2',
      containerPort: 30_000,
    })
    expect(parseDockerProxy(rows[1]!.args)).toBeUndefined()
  })

  it('is never taken as the server: the owner is whoever listens on the container port', () => {
    const ss = parseSsListeners(
      [
        'LISTEN 0 4096 0.0.0.0:30100 0.0.0.0:* users:(("docker-proxy",pid=900,fd=4))',
        'LISTEN 0 2048 172.17.0.2:30000 0.0.0.0:* users:(("python3",pid=1000,fd=9))',
      ].join('\n'),
    )
    expect(serviceOwner(30_100, ss, byPid)).toEqual({pid: 1000, proxy: {pid: 900, containerPort: 30_000}})
  })

  it(
    'without the container port in view (or without ss pids), names the proxy and its container port but no ' +
      'server',
    () => {
      const ss = parseSsListeners('LISTEN 0 4096 0.0.0.0:30100 0.0.0.0:* users:(("docker-proxy",pid=900,fd=4))')
      expect(serviceOwner(30_100, ss, byPid)).toEqual({proxy: {pid: 900, containerPort: 30_000}})
      expect(serviceOwner(30_100, parseSsListeners('LISTEN 0 4096 0.0.0.0:30100 0.0.0.0:*'), byPid)).toEqual({
        proxy: {pid: 900, containerPort: 30_000},
      })
    },
  )
})
