/**
 * The router process: `node router-main.js --state-dir DIR [sgl-model-gateway launch flags]`. Its title is the
 * gateway's command line (`sgl-model-gateway --pd-disaggregation --prefill URL PORT --decode URL … --retry-max-retries
 * N
 * … --cb-failure-threshold N …`, see gateway-args.ts), and it configures itself from those flags; a flag that is not
 * given falls back to DIR/sim.json and upstream's defaults. Serves the PD router and its metrics, writes its service
 * file once listening, removes it on SIGTERM/SIGINT and exits 0.
 */
import {mkdirSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

import {type SimConfig, simPaths} from '../sim-config.js'
import {gatewayArgsFor, gatewayArgv, parseGatewayArgv} from './gateway-args.js'
import {startRouter} from './router.js'

const log = (line: string): void => {
  process.stdout.write(`${new Date().toISOString()}  INFO sgl_model_gateway: ${line}\n`)
}
const fail = (message: string, code: number): never => {
  process.stderr.write(`${new Date().toISOString()} ERROR sgl_model_gateway: ${message}\n`)
  process.exit(code)
}

const argv = process.argv.slice(2)
const at = argv.indexOf('--state-dir')
const stateDir = at >= 0 ? argv[at + 1] : undefined
if (!stateDir) {
  process.stderr.write('usage: router-main --state-dir DIR [sgl-model-gateway flags]\n')
  process.exit(2)
}
const paths = simPaths(stateDir)
const config = JSON.parse(readFileSync(paths.config, 'utf8')) as SimConfig
let args = gatewayArgsFor(config)
try {
  args = parseGatewayArgv([...argv.slice(0, at), ...argv.slice(at + 2)], args)
} catch (error) {
  fail(`bad launch flag: ${(error as Error).message}`, 2)
}
// What `ps` shows: the gateway's own command line (the title overwrites argv, so it is never longer than the launch).
process.title = ['sgl-model-gateway', ...gatewayArgv(args)].join(' ')

try {
  const router = await startRouter({
    host: args.host,
    port: args.port,
    metricsPort: args.prometheusPort,
    prefill: args.prefill,
    decode: args.decode,
    policy: {prefill: args.prefillPolicy ?? args.policy, decode: args.decodePolicy ?? args.policy},
    health: args.health,
    requestTimeoutS: args.requestTimeoutS,
    retry: args.retry,
    circuitBreaker: args.circuitBreaker,
    truthFile: paths.truth('router'),
    halfDispatch: config.bugs.includes('half-dispatch'),
    log,
  })
  const serviceFile = paths.service('router')
  mkdirSync(dirname(serviceFile), {recursive: true})
  const tmp = `${serviceFile}.${process.pid}.tmp`
  writeFileSync(
    tmp,
    JSON.stringify({
      role: 'router',
      pid: process.pid,
      startedAt: Date.now(),
      httpUrl: router.url,
      metricsUrl: router.metricsUrl,
    }),
  )
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
  fail(`failed to start: ${(error as Error).message}`, 1)
}
