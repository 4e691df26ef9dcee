import {createServer} from 'node:net'
import {readdirSync, readFileSync} from 'node:fs'

import type {SimUpOptions} from '../../src/sim/lifecycle/options.js'
import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {simUp, type SimUpResult} from '../../src/sim/lifecycle/up.js'

/** Pids of every process whose argv mentions the state dir (servers, ranks, router): the test's safety net. */
export function pidsMentioning(stateDir: string): number[] {
  const out: number[] = []
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue
    try {
      if (readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').includes(stateDir)) out.push(Number(d))
    } catch {}
  }
  return out
}

/** SIGKILL whatever is left of a twin (after a failed test); returns the pids it found. */
export function sweep(stateDir: string): number[] {
  const pids = pidsMentioning(stateDir)
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {}
  }
  return pids
}

/** The ports a twin takes from its base port: router, prefill, decode, bootstrap, router metrics. */
const PORT_OFFSETS = [0, 100, 200, 500, 900]

/**
 * A random high base port whose five ports are free right now (for a twin started as its own process, which cannot be
 * retried on a conflict): the README's twin, left running by `suite --sim`, holds 30000-30900 for the whole run.
 */
export async function freeBasePort(offsets: readonly number[] = PORT_OFFSETS, step = 100): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20_000 + Math.floor((Math.random() * 40_000) / step) * step
    if ((await Promise.all(offsets.map(o => bindable(base + o)))).every(Boolean)) return base
  }
  throw new Error(`no base port with ${offsets.length} free ports in 50 tries`)
}

/**
 * The vLLM twin's ports from its base (src/sim/vllm: proxy, P, D, P's and D's data paths) and the side channels it is
 * given at base + 7 (P) and base + 8 (D): a base whose seven are free right now.
 */
export async function freeVllmPorts(): Promise<{base: number; side: number}> {
  const base = await freeBasePort([0, 100, 200, 300, 301, 7, 8], 10)
  return {base, side: base + 7}
}

function bindable(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const s = createServer()
    s.once('error', () => resolve(false))
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
  })
}

/** simUp on a random high base port, retrying when another test holds one of the ports. */
export async function upOnFreePorts(options: Omit<SimUpOptions, 'basePort'>): Promise<SimUpResult> {
  for (let attempt = 0; ; attempt++) {
    const basePort = 20_000 + Math.floor(Math.random() * 400) * 100
    try {
      return await simUp({...options, basePort})
    } catch (error) {
      if (attempt < 5 && error instanceof SimError && /already in use/.test(error.message)) continue
      throw error
    }
  }
}

export async function post(url: string, body: unknown, timeoutMs = 15_000): Promise<{status: number; text: string}> {
  const r = await fetch(url + '/generate', {
    method: 'POST',
    body: JSON.stringify(body),
    headers: {'content-type': 'application/json'},
    signal: AbortSignal.timeout(timeoutMs),
  })
  return {status: r.status, text: await r.text()}
}

export const readLines = (file: string): Array<Record<string, unknown>> => {
  try {
    return readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .filter(Boolean)
      .map(l => JSON.parse(l) as Record<string, unknown>)
  } catch {
    return []
  }
}

export const sleep = (ms: number): Promise<void> => new Promise(r => setTimeout(r, ms))
