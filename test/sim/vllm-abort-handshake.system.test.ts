import {mkdtempSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {describe, expect, it} from 'vitest'

import {runCli, truth} from '../e2e/cli.js'
import {freeVllmPorts} from './lifecycle-helpers.js'

/**
 * The vLLM twin's D on a client abort while it still waits on the NIXL handshake with P. In vLLM the request already
 * holds its blocks in WAITING_FOR_REMOTE_KVS (`update_state_after_alloc` cleared `do_remote_prefill`; the handshake
 * runs in the worker), so `request_finished` sends P nothing and the READ still starts once the handshake completes,
 * its notification freeing P. The request leaves D's waiting gauge at once (scheduler.py `finish_requests`).
 */

type Ev = {t: number; rid: string; event: string; detail?: Record<string, unknown>}

async function until<T>(what: string, f: () => T | undefined | Promise<T | undefined>, ms: number): Promise<T> {
  const end = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v !== undefined) return v
    if (Date.now() > end) throw new Error(`timed out: ${what}`)
    await new Promise(r => setTimeout(r, 20))
  }
}

const waiting = async (url: string): Promise<number> => {
  const text = await (await fetch(`${url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('vllm:num_requests_waiting{'))
  return Number(line?.split(' ').pop())
}

describe('the vLLM twin: a client abort during the handshake', () => {
  it('sends P nothing at the abort, drops the request from the gauge, and P frees on the READ that follows', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-abort-hs-'))
    const {base, side} = await freeVllmPorts()
    const up = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
    up.push('--side-channel-port', String(side), '--kv-lease-duration', '30')
    let pid: number | undefined
    try {
      expect((await runCli(up, {timeoutMs: 60_000})).code).toBe(0)
      const [p, d] = [`http://127.0.0.1:${base + 100}`, `http://127.0.0.1:${base + 200}`]
      const ktp = {do_remote_decode: true, do_remote_prefill: false}
      const body = (extra: object) => JSON.stringify({model: 'm', prompt: 'x '.repeat(40), max_tokens: 1, ...extra})
      const headers = {'content-type': 'application/json', 'x-request-id': 'hs'}
      const grant = (await (
        await fetch(`${p}/v1/completions`, {method: 'POST', headers, body: body({kv_transfer_params: ktp})})
      ).json()) as {kv_transfer_params: object}
      pid = (JSON.parse(readFileSync(join(dir, 'services', 'prefill.json'), 'utf8')) as {pid: number}).pid
      process.kill(pid, 'SIGSTOP') // P answers no handshake: D waits on it
      const client = new AbortController()
      const answer = fetch(`${d}/v1/completions`, {
        method: 'POST',
        headers,
        body: body({kv_transfer_params: grant.kv_transfer_params}),
        signal: client.signal,
      }).catch(() => 'aborted')
      const ev = (role: 'prefill' | 'decode', e: string) =>
        (truth(dir, role) as Ev[]).find(x => x.rid === 'cmpl-hs-0' && x.event === e)
      await until('D received it', () => ev('decode', 'received'), 10_000)
      await until("D's waiting gauge at 1", async () => ((await waiting(d)) === 1 ? true : undefined), 10_000)
      client.abort()
      expect(await answer).toBe('aborted')
      const aborted = await until('D aborts', () => ev('decode', 'aborted'), 5000)
      expect(aborted.detail).toMatchObject({during: 'waiting', handshake: true})
      await until("D's waiting gauge back at 0", async () => ((await waiting(d)) === 0 ? true : undefined), 5000)
      expect(ev('decode', 'notified')).toBeUndefined()
      process.kill(pid, 'SIGCONT')
      pid = undefined
      const freed = await until('P frees', () => ev('prefill', 'freed'), 10_000)
      expect(freed.detail?.cause).toBe('read-notified')
      expect(ev('decode', 'read-start')!.t).toBeGreaterThan(aborted.t)
      expect(ev('decode', 'notified')!.detail?.why).toBe('read')
    } finally {
      if (pid !== undefined) process.kill(pid, 'SIGCONT')
      await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 30_000}).catch(() => undefined)
    }
  }, 90_000)
})
