import {describe, expect, it} from 'vitest'

import {parseReleaseLine, parseReleaseLog, VLLM_LOG_RESOLUTION_MS} from '../../../src/engines/vllm/log-lines.js'
import {logLevelFromEnv} from '../../../src/engines/vllm/renewal-log.js'

// A UTC host: the log's local time is UTC.
const clock = {nearMs: Date.UTC(2026, 11, 4, 12, 0, 0), utcOffsetMin: 0}

describe('vLLM release log lines', () => {
  it("reads the lease reaper's line as upstream prints it (base_worker.py _reap_expired_send_leases)", () => {
    const line =
      '(EngineCore_DP0 pid=4242) WARNING 12-04 11:50:07 [base_worker.py:3005] Releasing expired KV blocks for ' +
      'request cmpl-abc-0 which were retrieved by 0 remote worker(s) before lease expired.'
    expect(parseReleaseLine(line, clock)).toEqual({
      t: Date.UTC(2026, 11, 4, 11, 50, 7),
      resolutionMs: VLLM_LOG_RESOLUTION_MS,
      requestId: 'cmpl-abc-0',
      cause: 'lease-expired',
      retrievedBy: 0,
      line,
    })
  })

  it("reads the legacy timeout's line, quoted from a vLLM issue (nixl_connector.py get_finished)", () => {
    const line =
      '(EngineCore_DP0 pid=3747544) WARNING 09-24 16:35:21 [nixl_connector.py:1048] Releasing expired KV blocks ' +
      'for request cmpl-3da205a6-1c3c-41b5-aeaa-b8421e81fd5c-0 which were retrieved by 0 decode worker(s) within ' +
      '120 seconds.'
    const o = parseReleaseLine(line, {nearMs: Date.UTC(2025, 8, 25), utcOffsetMin: 0})
    expect(o?.cause).toBe('legacy-timeout')
    expect(o?.requestId).toBe('cmpl-3da205a6-1c3c-41b5-aeaa-b8421e81fd5c-0')
    expect(o?.t).toBe(Date.UTC(2025, 8, 24, 16, 35, 21))
  })

  it("reads the twin's lines (its vlog format) and the unrecognized-notification warning", () => {
    const text = [
      '(EngineCore_DP0 pid=77) DEBUG 12-04 11:50:01 [pull_scheduler.py:256] NIXLConnector request_finished(cmpl-x-0) ' +
        'waiting for 6 seconds before releasing blocks',
      '(EngineCore_DP0 pid=77) WARNING 12-04 11:50:07 [nixl/base_worker.py:_reap_expired_send_leases] Releasing ' +
        'expired KV blocks for request cmpl-x-0 which were retrieved by 0 remote worker(s) before lease expired.',
      '(EngineCore_DP0 pid=77) WARNING 12-04 11:50:09 [nixl/base_worker.py:_get_new_notifs] Potentially invalid KV ' +
        'blocks for unrecognized request cmpl-x-0 were retrieved by a remote worker. This may happen when ...',
      'garbage line',
    ].join('\n')
    expect(parseReleaseLog(text, clock).map(o => [o.requestId, o.cause])).toEqual([
      ['cmpl-x-0', 'lease-expired'],
      ['cmpl-x-0', 'unrecognized-notification'],
    ])
  })

  it('places a month-day in the year nearest the reference (a log read across New Year)', () => {
    const line =
      'WARNING 12-31 23:59:59 [w.py:1] Releasing expired KV blocks for request r which were retrieved by 1 remote ' +
      'worker(s) before lease expired.'
    expect(parseReleaseLine(line, {nearMs: Date.UTC(2027, 0, 1, 0, 0, 5), utcOffsetMin: 0})?.t).toBe(
      Date.UTC(2026, 11, 31, 23, 59, 59),
    )
  })

  it("applies the host's UTC offset (the log is local time, without a zone)", () => {
    const line =
      'WARNING 12-04 13:50:07 [w.py:1] Releasing expired KV blocks for request r which were retrieved by 1 remote ' +
      'worker(s) before lease expired.'
    expect(parseReleaseLine(line, {...clock, utcOffsetMin: 120})?.t).toBe(Date.UTC(2026, 11, 4, 11, 50, 7))
  })

  it("reads upstream's ERROR for a notification P no longer tracks (worker _get_new_notifs)", () => {
    const line =
      '(EngineCore_DP0 pid=9) ERROR 12-04 11:50:09 [pull_worker.py:312] Potentially invalid KV blocks for ' +
      'unrecognized request cmpl-y-0 were retrieved by a decode worker. They may have expired.'
    expect(parseReleaseLine(line, clock)).toMatchObject({requestId: 'cmpl-y-0', cause: 'unrecognized-notification'})
  })

  it('names no release for other lines', () => {
    expect(parseReleaseLine('INFO 12-04 11:50:07 [api_server.py:1] Started server process', clock)).toBeUndefined()
  })
})

describe('vLLM log line variants', () => {
  const msg =
    'Releasing expired KV blocks for request r which were retrieved by 1 remote worker(s) before lease expired.'
  it('reads the older format without brackets (`file.py:L]`) and a VLLM_LOGGING_PREFIX', () => {
    expect(parseReleaseLine(`WARNING 12-04 11:50:07 base_worker.py:3005] ${msg}`, clock)?.requestId).toBe('r')
    expect(parseReleaseLine(`[node-3] WARNING 12-04 11:50:07 [base_worker.py:3005] ${msg}`, clock)?.requestId).toBe('r')
  })

  it('strips ANSI colours and takes milliseconds where a fork prints them', () => {
    const o = parseReleaseLine(`\x1b[33mWARNING\x1b[0m 12-04 11:50:07.250 \x1b[2m[w.py:1]\x1b[0m ${msg}`, clock)
    expect(o?.t).toBe(Date.UTC(2026, 11, 4, 11, 50, 7, 250))
    expect(o?.resolutionMs).toBe(1)
  })
})

describe("P's log level from its environment (vllm/envs.py VLLM_LOGGING_LEVEL, default INFO)", () => {
  it('DEBUG only when VLLM_LOGGING_LEVEL says so and vLLM configures its own logging', () => {
    const src = "P's environment"
    expect(logLevelFromEnv({VLLM_LOGGING_LEVEL: 'debug'}, src)).toEqual({
      debug: true,
      evidence: "P's environment: VLLM_LOGGING_LEVEL=DEBUG",
    })
    expect(logLevelFromEnv({}, src)).toEqual({debug: false, evidence: "P's environment: unset: vLLM's default INFO"})
    expect(logLevelFromEnv({VLLM_LOGGING_LEVEL: 'DEBUG', VLLM_CONFIGURE_LOGGING: '0'}, src).debug).toBe(false)
    expect(logLevelFromEnv({VLLM_LOGGING_LEVEL: 'DEBUG', VLLM_LOGGING_CONFIG_PATH: '/etc/l.json'}, src).debug).toBe(
      false,
    )
    expect(logLevelFromEnv(undefined, src).evidence).toMatch(/not readable/)
  })
})
