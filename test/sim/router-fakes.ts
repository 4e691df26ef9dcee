import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {type RouterOptions, type RunningRouter, startRouter} from '../../src/sim/router/router.js'

/** Plain HTTP workers that record what they receive, for the router's unit tests (no twin processes). */

export type Behaviour = (body: string, req: http.IncomingMessage, res: http.ServerResponse) => void

export interface FakeWorker {
  url: string
  bodies: string[]
  closedEarly: number
  behaviour: Behaviour
  healthStatus: number
  server: http.Server
}

export async function fakeWorker(behaviour: Behaviour): Promise<FakeWorker> {
  const w = {bodies: [] as string[], closedEarly: 0, behaviour, healthStatus: 200} as FakeWorker
  w.server = http.createServer((req, res) => {
    if (req.url === '/health' || req.url === '/health_generate') {
      res.writeHead(w.healthStatus).end('OK')
      return
    }
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      w.bodies.push(body)
      res.on('close', () => {
        if (!res.writableFinished) w.closedEarly++
      })
      w.behaviour(body, req, res)
    })
  })
  await new Promise<void>(r => w.server.listen(0, '127.0.0.1', r))
  w.url = `http://127.0.0.1:${(w.server.address() as AddressInfo).port}`
  return w
}

export function closeWorker(w: FakeWorker | undefined): void {
  w?.server.closeAllConnections()
  w?.server.close()
}

export const roomOf = (body: string): string => /"bootstrap_room":(\d+)/.exec(body)![1]
export const ridOf = (body: string): unknown => (JSON.parse(body) as {rid?: unknown}).rid

export const json = (res: http.ServerResponse, status: number, obj: unknown, delayMs = 0): void => {
  setTimeout(() => {
    if (!res.destroyed) res.writeHead(status, {'content-type': 'application/json'}).end(JSON.stringify(obj))
  }, delayMs)
}

export const ok =
  (delayMs = 0): Behaviour =>
  (_b, _q, res) =>
    json(res, 200, {text: ' hello', meta_info: {finish_reason: {type: 'length'}}}, delayMs)
/** SGLang's error shape for a failed PD request (HTTP 500). */
export const fails =
  (status = 500, delayMs = 0): Behaviour =>
  (_b, _q, res) =>
    json(res, status, {error: {message: 'Prefill transfer failed', code: status}}, delayMs)

export async function post(
  url: string,
  body: unknown,
  timeoutMs = 10_000,
): Promise<{status: number; text: string; ms: number}> {
  const t0 = Date.now()
  const r = await fetch(url + '/generate', {
    method: 'POST',
    body: JSON.stringify(body),
    headers: {'content-type': 'application/json'},
    signal: AbortSignal.timeout(timeoutMs),
  })
  return {status: r.status, text: await r.text(), ms: Date.now() - t0}
}

export const sleep = (ms: number): Promise<void> => new Promise(r => setTimeout(r, ms))

export async function until(cond: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const end = Date.now() + timeoutMs
  while (!(await cond())) {
    if (Date.now() > end) throw new Error('condition not met in time')
    await sleep(20)
  }
}

export interface RouterRig {
  prefill: FakeWorker
  decode: FakeWorker
  router: RunningRouter
  dir: string
  truth(): Array<Record<string, unknown>>
  metrics(): Promise<string>
  close(): Promise<void>
}

/** A router (health probes every 100 ms) in front of two fake workers, ready before it returns. */
export async function routerRig(
  extra: Partial<RouterOptions> = {},
  prefillBehaviour: Behaviour = ok(),
  decodeBehaviour: Behaviour = ok(),
): Promise<RouterRig> {
  const dir = mkdtempSync(join(tmpdir(), 'pdc-router-'))
  const prefill = await fakeWorker(prefillBehaviour)
  const decode = await fakeWorker(decodeBehaviour)
  const truthFile = join(dir, 'truth', 'router.jsonl')
  const router = await startRouter({
    host: '127.0.0.1',
    port: 0,
    metricsPort: 0,
    prefill: [{url: prefill.url, bootstrapPort: 8998}],
    decode: [decode.url],
    health: {intervalS: 0.1, timeoutS: 0.5},
    truthFile,
    ...extra,
  })
  await until(() => router.ready())
  return {
    prefill,
    decode,
    router,
    dir,
    truth: () => {
      try {
        return readFileSync(truthFile, 'utf8')
          .trim()
          .split('\n')
          .filter(Boolean)
          .map(l => JSON.parse(l) as Record<string, unknown>)
      } catch {
        return []
      }
    },
    metrics: () => fetch(router.metricsUrl).then(r => r.text()),
    async close() {
      await router.close()
      closeWorker(prefill)
      closeWorker(decode)
      rmSync(dir, {recursive: true, force: true})
    },
  }
}

/** The value of one series in a Prometheus text page (0 when absent). */
export function sample(page: string, name: string, labels: Record<string, string> = {}): number {
  const want = Object.keys(labels)
    .sort()
    .map(k => `${k}="${labels[k]}"`)
    .join(',')
  for (const line of page.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (m && m[1] === name && (m[2] ?? '') === want) return Number(m[3])
  }
  return 0
}
