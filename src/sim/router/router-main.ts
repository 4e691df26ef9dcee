/**
 * The router process: `node router-main.js --state-dir DIR` (title sgl-model-gateway). Reads DIR/sim.json,
 * serves the PD router on ports.router and its metrics on ports.routerMetrics, writes its service file
 * once listening, removes it on SIGTERM/SIGINT and exits 0.
 */
import {mkdirSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

import {type SimConfig, simPaths} from '../sim-config.js'
import {startRouter} from './router.js'

process.title = 'sgl-model-gateway'

function argValue(name: string): string | undefined {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const log = (line: string): void => {
  process.stdout.write(`${new Date().toISOString()}  INFO sgl_model_gateway: ${line}\n`)
}

const stateDir = argValue('--state-dir')
if (!stateDir) {
  process.stderr.write('usage: router-main --state-dir DIR\n')
  process.exit(2)
}
const paths = simPaths(stateDir)
const config = JSON.parse(readFileSync(paths.config, 'utf8')) as SimConfig
const url = (port: number): string => `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`
const r = config.router ?? {}

try {
  const router = await startRouter({
    host: config.host,
    port: config.ports.router,
    metricsPort: config.ports.routerMetrics,
    prefillUrl: url(config.ports.prefill),
    decodeUrl: url(config.ports.decode),
    bootstrapPort: config.ports.bootstrap,
    health: {
      intervalS: r.healthIntervalS,
      timeoutS: r.healthTimeoutS,
      failureThreshold: r.healthFailureThreshold,
      successThreshold: r.healthSuccessThreshold,
    },
    requestTimeoutS: r.requestTimeoutS,
    truthFile: paths.truth('router'),
    log,
  })
  const serviceFile = paths.service('router')
  mkdirSync(dirname(serviceFile), {recursive: true})
  const tmp = `${serviceFile}.${process.pid}.tmp`
  writeFileSync(tmp, JSON.stringify({role: 'router', pid: process.pid, startedAt: Date.now(), httpUrl: router.url, metricsUrl: router.metricsUrl}))
  renameSync(tmp, serviceFile)

  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) return
    stopping = true
    log(`received ${signal}, shutting down`)
    rmSync(serviceFile, {force: true})
    const hard = setTimeout(() => process.exit(0), 1500)
    hard.unref()
    void router.close().then(() => process.exit(0))
  }
  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))
} catch (error) {
  process.stderr.write(`${new Date().toISOString()} ERROR sgl_model_gateway: failed to start: ${(error as Error).message}\n`)
  process.exit(1)
}
