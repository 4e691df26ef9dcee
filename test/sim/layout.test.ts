import {describe, expect, it} from 'vitest'

import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {
  coordsOf,
  launchYaml,
  physicalGpu,
  rankCount,
  registrationKey,
  titleOf,
  type ServerLayout,
} from '../../src/sim/server/layout.js'

const plain: ServerLayout = {tp: 2, dp: 1, pp: 1, dpAttention: false, ep: 1, baseGpuId: 0}
const titles = (l: ServerLayout) => Array.from({length: rankCount(l)}, (_, k) => titleOf(l, k))

describe('the twin layouts', () => {
  it('titles its schedulers by SGLang rule', () => {
    expect(titles(plain)).toEqual(['sglang::scheduler_TP0', 'sglang::scheduler_TP1'])
    expect(titles({...plain, tp: 1})).toEqual(['sglang::scheduler'])
    expect(titles({...plain, tp: 4, dp: 2, dpAttention: true})).toEqual([
      'sglang::scheduler_DP0_TP0',
      'sglang::scheduler_DP0_TP1',
      'sglang::scheduler_DP1_TP2',
      'sglang::scheduler_DP1_TP3',
    ])
    expect(titles({...plain, tp: 1, dp: 2, pp: 2})).toEqual([
      'sglang::scheduler_DP0_PP0',
      'sglang::scheduler_DP0_PP1',
      'sglang::scheduler_DP1_PP0',
      'sglang::scheduler_DP1_PP1',
    ])
    expect(titles({...plain, ep: 2})).toEqual(['sglang::scheduler_TP0_EP0', 'sglang::scheduler_TP1_EP1'])
  })

  it(
    'registers each prefill rank under upstream key: DP attention by attention DP rank, plain DP by system ' +
      'DP rank',
    () => {
      const dpa = {...plain, tp: 4, dp: 2, dpAttention: true}
      expect(registrationKey(dpa, 3)).toMatchObject({
        attn_tp_size: 2,
        attn_tp_rank: 1,
        attn_dp_rank: 1,
        system_dp_size: 1,
        pp_rank: 0,
      })
      const dp = {...plain, dp: 2, pp: 2}
      expect(coordsOf(dp, 6)).toMatchObject({dp: 1, pp: 1, tp: 0})
      expect(registrationKey(dp, 6)).toMatchObject({
        attn_tp_size: 2,
        attn_tp_rank: 0,
        system_dp_size: 2,
        system_dp_rank: 1,
        pp_rank: 1,
      })
    },
  )

  it('places each rank on base GPU + rank, through CUDA_VISIBLE_DEVICES', () => {
    expect(physicalGpu({...plain, baseGpuId: 3}, 1)).toBe(4)
    expect(physicalGpu({...plain, baseGpuId: 1, cudaVisibleDevices: [7, 6, 5, 4]}, 1)).toBe(5)
  })

  it('writes the launch flags as SGLang YAML config', () => {
    expect(
      launchYaml([
        ['tp-size', '2'],
        ['enable-dp-attention', true],
        ['host', '::1'],
      ]),
    ).toBe('tp-size: 2\nenable-dp-attention: true\nhost: ::1\n')
  })

  it('refuses layouts SGLang or the host could not run, naming the flag', () => {
    const cfg = (o: Record<string, unknown>) => () =>
      buildSimConfig({stateDir: '/tmp/x', gpus: 8, prefillTp: 2, decodeTp: 2, ...o})
    expect(cfg({prefillLayout: {dp: 3, dpAttention: true}})).toThrow(/--prefill-dp-attention needs --prefill-dp/)
    expect(cfg({decodeLayout: {ep: 3}})).toThrow(/--decode-ep 3 must divide/)
    expect(cfg({prefillLayout: {dp: 5}})).toThrow(/prefill needs GPUs 0..9 .* --gpus is 8/)
    expect(cfg({prefillLayout: {dp: 4}})).toThrow(/decode needs GPUs 8..9/)
    expect(cfg({decodeLayout: {baseGpuId: 1}})).toThrow(
      /GPU 1 would hold both prefill scheduler 1 and decode scheduler 0/,
    )
    expect(cfg({prefillLayout: {cudaVisibleDevices: '1,1'}})).toThrow(/distinct GPU indices/)
    expect(cfg({prefillLayout: {pp: 2}, railNics: true})).toThrow(/--rail-nics cannot be combined/)
    // A layout counts its schedulers: plain DP 2 × TP 2 is four processes, DP attention keeps two.
    expect(
      buildSimConfig({stateDir: '/tmp/x', gpus: 8, prefillTp: 2, decodeTp: 2, prefillLayout: {dp: 2}}).prefillTp,
    ).toBe(4)
    expect(
      buildSimConfig({
        stateDir: '/tmp/x',
        gpus: 8,
        prefillTp: 2,
        decodeTp: 2,
        prefillLayout: {dp: 2, dpAttention: true},
      }).prefillTp,
    ).toBe(2)
  })
})
