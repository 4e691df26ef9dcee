import {mkdirSync, readFileSync, renameSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

import {badInput} from './sim-error.js'
import {type SimConfig, serviceHost, simPaths} from '../sim-config.js'
import type {Service} from './lock.js'

/** What a service writes into DIR/services/<service>.json once it serves (T1's contract for prefill/decode). */
export interface ServiceFile {
  role: Service
  pid: number
  startedAt: number
  httpUrl: string
  bootstrapUrl?: string
  metricsUrl?: string
  rankPids?: number[]
  rankPorts?: Array<{tpRank: number; zmqPort: number; dataPort?: number}>
}

export function writeJsonAtomic(file: string, value: unknown): void {
  mkdirSync(dirname(file), {recursive: true})
  const tmp = `${file}.${process.pid}.tmp`
  writeFileSync(tmp, JSON.stringify(value, null, 2) + '\n')
  renameSync(tmp, file)
}

export function readJson<T>(file: string): T | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T
  } catch {
    return undefined
  }
}

export function readServiceFile(stateDir: string, service: Service): ServiceFile | undefined {
  return readJson<ServiceFile>(simPaths(stateDir).service(service))
}

/** The twin's sim.json, or bad input when the state dir holds no twin. */
export function readSimConfig(stateDir: string): SimConfig {
  const config = readJson<SimConfig>(simPaths(stateDir).config)
  if (!config)
    throw badInput(`no twin in state dir ${stateDir} (no sim.json)`, `pdchaos sim up --state-dir ${stateDir}`)
  return config
}

export const urlOf = (host: string, port: number): string => `http://${host.includes(':') ? `[${host}]` : host}:${port}`

/** Every service's URL: on a node of a multi-node twin, the others' at their node's address. */
export function endpoints(config: SimConfig) {
  const at = (service: Service, p: number) => urlOf(serviceHost(config, service), p)
  return {
    router: at('router', config.ports.router),
    prefill: at('prefill', config.ports.prefill),
    decode: at('decode', config.ports.decode),
    bootstrap: at('prefill', config.ports.bootstrap),
    routerMetrics: at('router', config.ports.routerMetrics) + '/metrics',
  }
}

/** The last non-empty lines of a log (the tail only, so a big log is cheap). */
export function logTail(file: string, lines = 5): string[] {
  try {
    const text = readFileSync(file, 'utf8')
    return text
      .slice(-8192)
      .split('\n')
      .map(l => l.trim())
      .filter(Boolean)
      .slice(-lines)
  } catch {
    return []
  }
}

/** The line of a log tail that best explains a failure. */
export function causeFromLog(file: string): string | undefined {
  const tail = logTail(file, 40).filter(l => !l.startsWith('at ') && !/^Node\.js v\d/.test(l))
  const bad = [...tail].reverse().find(l => /error|exception|fail|refused|EADDR|cannot|unable|traceback/i.test(l))
  const line = bad ?? tail.at(-1)
  return line && line.length > 300 ? line.slice(0, 297) + '...' : line
}
