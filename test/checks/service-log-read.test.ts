import {appendFileSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {markLogs, readLogs} from '../../src/workload/service-log.js'

/** The runner's log step on this machine's files (LocalHost runs the same argv an SSH host would). */
const dir = mkdtempSync(join(tmpdir(), 'pdchaos-service-log-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

const PATTERN = String.raw`watchdog evicted request rid='(?<rid>[^']+)'.* held=(?<held>[0-9.]+)s`
const deployment = (prefill: object | undefined, decode: object | undefined) =>
  DeploymentSchema.parse({
    host: {kind: 'local'},
    services: {
      prefill: {url: 'http://127.0.0.1:1', ...(prefill ? {logs: prefill} : {})},
      decode: {url: 'http://127.0.0.1:2', ...(decode ? {logs: decode} : {})},
      router: {url: 'http://127.0.0.1:3'},
    },
    watchdog: {deadlineSeconds: 2, pollSeconds: 0.5, logPattern: PATTERN},
  })

describe("reading the services' logs for a run", () => {
  const host = new LocalHost('never')

  it("reads only what was written after the mark, only lines naming a pin, with the watchdog's held time", async () => {
    const prefill = join(dir, 'prefill.log')
    writeFileSync(prefill, "[old] Disaggregation watchdog evicted request rid='pin-a' held=9.000s\n")
    const d = deployment({file: prefill}, undefined)
    const marks = await markLogs(host, d, {timeoutMs: 5000})
    appendFileSync(
      prefill,
      [
        '[TP0] Prefill batch. #new-seq: 2',
        "[TP0] Disaggregation watchdog evicted request rid='pin-a' bootstrap_room=1 queue=inflight " +
          'state=KVPoll.Transferring held=2.104s (deadline 2s, scope all)',
        "[TP0] Prefill transfer failed for request rank=0 req.rid='pin-b' req.bootstrap_room=2 with exception " +
          'KVTransferError(bootstrap_room=2): Request 2 was aborted by decode.',
        "[TP0] Prefill transfer failed for request rank=0 req.rid='someone-else' req.bootstrap_room=3",
        '',
      ].join('\n'),
    )
    const out = await readLogs(host, d, marks, ['pin-a', 'pin-b'], {timeoutMs: 5000, watchdogPattern: PATTERN})
    const lines = out.filter(o => o.kind === 'log-line')
    expect(lines.map(l => l.kind === 'log-line' && l.rid)).toEqual(['pin-a', 'pin-b'])
    expect(lines[0]).toMatchObject({
      service: 'prefill',
      source: `file:${prefill}`,
      watchdog: {rid: 'pin-a', heldSeconds: 2.104},
    })
    expect(out.find(o => o.kind === 'log-read' && o.service === 'prefill')).toMatchObject({
      ok: true,
      lines: 2,
      truncated: false,
    })
    // No logs: entry for decode: said, not guessed around.
    expect(out.find(o => o.kind === 'log-read' && o.service === 'decode')).toMatchObject({
      ok: false,
      detail: expect.stringMatching(/names no logs: source for decode/),
    })
  })

  it('a log rotated since the mark is read from its start; a log that vanished is reported unreadable', async () => {
    const decode = join(dir, 'decode.log')
    const gone = join(dir, 'gone.log')
    writeFileSync(decode, 'x'.repeat(500) + '\n')
    writeFileSync(gone, 'before\n')
    const d = deployment({file: gone}, {file: decode})
    const marks = await markLogs(host, d, {timeoutMs: 5000})
    writeFileSync(
      decode,
      "Decode transfer failed for request rank=0 decode_req.req.rid='pin-c' decode_req.req.bootstrap_room=4 with " +
        'exception KVTransferError(bootstrap_room=4): Request 4 timed out after 2.0s in KVPoll.WaitingForInput\n',
    )
    rmSync(gone)
    const out = await readLogs(host, d, marks, ['pin-c'], {timeoutMs: 5000})
    expect(out.find(o => o.kind === 'log-line')).toMatchObject({service: 'decode', rid: 'pin-c'})
    expect(out.find(o => o.kind === 'log-read' && o.service === 'decode')).toMatchObject({
      ok: true,
      detail: expect.stringMatching(/rotated or truncated/),
    })
    expect(out.find(o => o.kind === 'log-read' && o.service === 'prefill')).toMatchObject({
      ok: false,
      detail: expect.stringMatching(/reading file:.*gone\.log on local failed/),
    })
  })

  it('keeps at most maxBytes per service and says it cut', async () => {
    const big = join(dir, 'big.log')
    writeFileSync(big, '')
    const d = deployment({file: big}, undefined)
    const marks = await markLogs(host, d, {timeoutMs: 5000})
    appendFileSync(big, Array.from({length: 200}, (_, i) => `line ${i} req.rid='pin-d'\n`).join(''))
    const out = await readLogs(host, d, marks, ['pin-d'], {timeoutMs: 5000, maxBytes: 1000})
    const read = out.find(o => o.kind === 'log-read' && o.service === 'prefill')
    expect(read).toMatchObject({ok: true, truncated: true, detail: expect.stringMatching(/cut at 1000 bytes/)})
    expect(out.filter(o => o.kind === 'log-line').length).toBeLessThan(60)
  })
})
