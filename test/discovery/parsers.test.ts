import {describe, expect, it} from 'vitest'

import {gpuIndexByPid, parseComputeApps, parseGpuList} from '../../src/discovery/gpus.js'
import {parseEnviron, parseProcStat, parsePs, parseSsListeners} from '../../src/discovery/proc.js'
import {parseRankTitle} from '../../src/engines/sglang/discovery/rank-title.js'
import {
  timeoutsFromEnv,
  timeoutsFromServices,
  watchdogFromEnv,
  watchdogWarnings,
} from '../../src/engines/sglang/discovery/watchdog-env.js'

describe('process parsers', () => {
  it('reads SGLang rank titles, including the DP and PP variants, and ignores other processes', () => {
    expect(parseRankTitle('sglang::scheduler_TP3')).toEqual({tpRank: 3})
    expect(parseRankTitle('sglang::scheduler_DP1_TP2')).toEqual({tpRank: 2, dpRank: 1})
    expect(parseRankTitle('sglang::scheduler_DP0_PP1_TP7')).toEqual({tpRank: 7, dpRank: 0, ppRank: 1})
    // TP 1: no TP segment at all, as upstream titles it.
    expect(parseRankTitle('sglang::scheduler')).toEqual({tpRank: 0})
    expect(parseRankTitle('sglang::scheduler_PP1')).toEqual({tpRank: 0, ppRank: 1})
    expect(parseRankTitle('sglang::detokenizer')).toBeUndefined()
    expect(parseRankTitle('python -m sglang.launch_server --tp 4')).toBeUndefined()
  })

  it('parses ps rows with arguments that contain spaces', () => {
    const rows = parsePs(
      '  101     1 Ssl  python -m sglang.launch_server --disaggregation-mode prefill\n  102   101 Sl   ' +
        'sglang::scheduler_TP0\n',
    )
    expect(rows).toEqual([
      {pid: 101, ppid: 1, stat: 'Ssl', args: 'python -m sglang.launch_server --disaggregation-mode prefill'},
      {pid: 102, ppid: 101, stat: 'Sl', args: 'sglang::scheduler_TP0'},
    ])
  })

  it('takes the start time from field 22 even when the comm holds spaces and parentheses', () => {
    const fields = ['T', '101', ...Array.from({length: 17}, (_, i) => String(i)), '987654', '0']
    const s = parseProcStat(`102 (sglang::sch (x) y) ${fields.join(' ')}`)
    expect(s).toEqual({pid: 102, state: 'T', ppid: 101, startTicks: 987_654})
  })

  it('splits environ on NUL and keeps = inside values', () => {
    expect(parseEnviron('A=1\0B=x=y\0\0EMPTY=\0')).toEqual({A: '1', B: 'x=y', EMPTY: ''})
  })

  it('maps listening ports to pids from ss -ltnp, IPv4 and IPv6', () => {
    const text = [
      'LISTEN 0 511 10.231.4.2:30100 0.0.0.0:* users:(("node",pid=4242,fd=21))',
      'LISTEN 0 128 [::1]:8998 [::]:* users:(("python3",pid=77,fd=3),("python3",pid=77,fd=4))',
      'LISTEN 0 128 127.0.0.1:9 0.0.0.0:*',
    ].join('\n')
    expect(parseSsListeners(text)).toEqual([
      {address: '10.231.4.2', port: 30_100, pids: [4242]},
      {address: '::1', port: 8998, pids: [77]},
      {address: '127.0.0.1', port: 9, pids: []},
    ])
  })
})

describe('nvidia-smi parsers', () => {
  it('joins compute apps to GPU indices by uuid, with or without a header', () => {
    const gpus = parseGpuList(
      'index, uuid, name\n0, GPU-aaa, NVIDIA H100 80GB HBM3\n1, GPU-bbb, NVIDIA H100 80GB HBM3\n',
    )
    expect(gpus).toEqual([
      {index: 0, uuid: 'GPU-aaa', name: 'NVIDIA H100 80GB HBM3'},
      {index: 1, uuid: 'GPU-bbb', name: 'NVIDIA H100 80GB HBM3'},
    ])
    const apps = parseComputeApps('pid, gpu_uuid\n500, GPU-bbb\n501, GPU-aaa\n')
    expect(gpuIndexByPid(apps, gpus)).toEqual(
      new Map([
        [500, {index: 1, contexts: 1}],
        [501, {index: 0, contexts: 1}],
      ]),
    )
  })
})

describe('watchdog settings from the environment', () => {
  const contract = {scope: 'all' as const, deadlineSeconds: 30, pollSeconds: 1}

  it('agrees silently when environment and file match', () => {
    const env = {
      SGLANG_DISAGGREGATION_WATCHDOG_SCOPE: 'all',
      SGLANG_DISAGGREGATION_WATCHDOG_TIMEOUT: '30',
      SGLANG_DISAGGREGATION_WATCHDOG_POLL_INTERVAL: '1',
      SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '3600',
      SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '3600',
    }
    expect(watchdogWarnings(watchdogFromEnv(env), contract, timeoutsFromEnv(env), 'prefill')).toEqual([])
  })

  it('names each disagreement, and a deadline SGLang timeouts would pre-empt', () => {
    const env = {
      SGLANG_DISAGGREGATION_WATCHDOG_SCOPE: 'inflight',
      SGLANG_DISAGGREGATION_WATCHDOG_TIMEOUT: '45',
      SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '20',
    }
    const w = watchdogWarnings(watchdogFromEnv(env), contract, timeoutsFromEnv(env), 'prefill')
    expect(w.join('\n')).toMatch(/scope is inflight .* says all/)
    expect(w.join('\n')).toMatch(/deadline is 45s .* says 30s/)
    expect(w.join('\n')).toMatch(
      /deadline \+ poll 31s is not below SGLang's own timeouts \(decode's SGLANG_DISAGGREGATION_WAITING_TIMEOUT 20s\)/,
    )
  })

  it(
    'reads each timeout from the service that owns it: bootstrap from prefill, waiting and heartbeat from ' + 'decode',
    () => {
      const prefill = {SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '900', SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '5'}
      const decode = {
        SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '1.75',
        SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: '2',
        SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '7',
      }
      const t = timeoutsFromServices({prefill, decode})
      expect(t).toMatchObject({
        bootstrapTimeout: 900,
        waitingTimeout: 1.75,
        heartbeatInterval: 2,
        heartbeatMaxFailure: 2,
      })
      expect(t.sources).toEqual({
        bootstrapTimeout: "prefill's environment (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
        waitingTimeout: "decode's environment (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)",
        heartbeatInterval: "decode's environment (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL)",
        heartbeatMaxFailure: "SGLang's default (unset in decode's environment)",
      })
      expect(timeoutsFromServices({prefill}).sources.waitingTimeout).toBe(
        "SGLang's default (decode's environment not read)",
      )
      expect(
        watchdogWarnings({}, {scope: 'all', deadlineSeconds: 1.5, pollSeconds: 0.5}, t, 'prefill').join('\n'),
      ).toMatch(/decode's SGLANG_DISAGGREGATION_WAITING_TIMEOUT 1\.75s/)
    },
  )

  it('falls back to SGLang defaults for unset timeouts', () => {
    expect(timeoutsFromEnv({})).toEqual({
      bootstrapTimeout: 300,
      waitingTimeout: 300,
      heartbeatInterval: 5,
      heartbeatMaxFailure: 2,
    })
  })
})
