import {mkdirSync, writeFileSync} from 'node:fs'
import http from 'node:http'
import {dirname} from 'node:path'

import {unavailable} from './sim-error.js'
import {entryArgv, packageRootOf, simModule} from '../entry.js'
import {gatewayArgsFor, gatewayArgv} from '../router/gateway-args.js'
import {isFollower, type Role, SIM_ENV, type SimConfig, simPaths} from '../sim-config.js'
import {launchArgv, launchFlags, launchYaml} from '../server/layout.js'
import {endpoints, causeFromLog, readServiceFile, type ServiceFile, urlOf} from './files.js'
import type {Service} from './lock.js'
import {isSameProcess, type ProcRef, spawnDetached} from './procs.js'

// By the package root, not a relative URL: this module may run from a chunk of the CLI's bundle (dist/chunks/).
const serverModule = simModule(import.meta.url, 'server/server-main')
// The services (and the rank processes they spawn with a bare `--import tsx`) run from the package root,
// where node resolves pdchaos's own dependencies.
const packageRoot = packageRootOf(import.meta.url)
const routerModule = simModule(import.meta.url, 'router/router-main')

/** The environment of every twin service: PATH led by DIR/bin (the nvidia-smi stand-in) and SGLang's variables. */
export function serviceEnv(config: SimConfig, base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const bin = simPaths(config.stateDir).bin
  return {
    ...base,
    PATH: base.PATH ? `${bin}:${base.PATH}` : bin,
    [SIM_ENV.bootstrapTimeout]: String(config.timeouts.bootstrapS),
    [SIM_ENV.waitingTimeout]: String(config.timeouts.waitingS),
    [SIM_ENV.heartbeatInterval]: String(config.timeouts.heartbeatIntervalS),
    [SIM_ENV.heartbeatMaxFailure]: String(config.timeouts.heartbeatMaxFailure),
    [SIM_ENV.watchdogScope]: config.watchdog.scope,
    [SIM_ENV.watchdogTimeout]: String(config.watchdog.deadlineS),
    [SIM_ENV.watchdogPollInterval]: String(config.watchdog.pollS),
    [SIM_ENV.backend]: config.backend,
    ...kvPathEnv(config),
  }
}

/**
 * The KV path as a real host states it. TCP (the default): UCX's transport list, or Mooncake's TCP switch. Rail NICs:
 * UCX may use RC (UCX_TLS=rc), with the RC timeout and retry count `sim up` was given, as UCX reads them
 * (UCX_RC_TIMEOUT, UCX_RC_RETRY_COUNT; UCX's defaults 1.0s and 7 when absent): /proc/<pid>/environ shows them.
 */
function kvPathEnv(config: SimConfig): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = config.rails
    ? config.backend === 'nixl'
      ? {UCX_TLS: 'rc'}
      : {}
    : config.backend === 'nixl'
      ? {UCX_TLS: 'tcp'}
      : {MC_FORCE_TCP: '1'}
  if (config.ucx?.rcTimeout !== undefined) env.UCX_RC_TIMEOUT = config.ucx.rcTimeout
  if (config.ucx?.rcRetryCount !== undefined) env.UCX_RC_RETRY_COUNT = String(config.ucx.rcRetryCount)
  return env
}

export function serviceArgv(config: SimConfig, service: Service): {command: string; args: string[]} {
  const argv =
    service === 'router'
      ? // The gateway's launch flags after the twin's own, in sgl-model-gateway's names: what `ps` shows, what it runs
        // with.
        entryArgv(routerModule, '--state-dir', config.stateDir, ...gatewayArgv(gatewayArgsFor(config)))
      : // The SGLang launch flags after the twin's own: what an operator (and discovery, without root) reads in `ps`.
        // With --server-config-file they are in DIR/config/<role>.yaml and the command line names the file.
        entryArgv(
          serverModule,
          '--role',
          service,
          '--state-dir',
          config.stateDir,
          ...(config.serverConfigFile
            ? ['--config', simPaths(config.stateDir).serverConfig(service)]
            : launchArgv(launchFlags(config, service))),
        )
  // Absolute, so the service does not depend on its cwd to find tsx.
  const i = argv.args.indexOf('--import')
  if (i >= 0 && argv.args[i + 1] === 'tsx') argv.args[i + 1] = import.meta.resolve('tsx')
  return argv
}

/** One service's environment: decode's own waiting timeout (`--decode-waiting-timeout`) overrides the shared one. */
export function serviceEnvFor(
  config: SimConfig,
  service: Service,
  base: NodeJS.ProcessEnv = process.env,
): NodeJS.ProcessEnv {
  const env = serviceEnv(config, base)
  if (service === 'decode' && config.timeouts.decodeWaitingS !== undefined)
    env[SIM_ENV.waitingTimeout] = String(config.timeouts.decodeWaitingS)
  return env
}

export function startService(config: SimConfig, service: Service): ProcRef {
  const {command, args} = serviceArgv(config, service)
  if (config.serverConfigFile && service !== 'router') writeServerConfig(config, service)
  // A server's CUDA_VISIBLE_DEVICES (layout flags): its schedulers inherit it, as SGLang's do.
  const cvd = service === 'router' ? undefined : config.layout?.[service]?.cudaVisibleDevices
  const env = {...serviceEnvFor(config, service), ...(cvd ? {CUDA_VISIBLE_DEVICES: cvd.join(',')} : {})}
  return spawnDetached(command, args, {env, logFile: simPaths(config.stateDir).log(service), cwd: packageRoot})
}

/** SGLang's YAML config file for a server launched with `--config FILE`: the launch flags as `key: value`. */
export function writeServerConfig(config: SimConfig, role: Role): string {
  const file = simPaths(config.stateDir).serverConfig(role)
  mkdirSync(dirname(file), {recursive: true})
  writeFileSync(file, launchYaml(launchFlags(config, role)))
  return file
}

function get(url: string, timeoutMs: number): Promise<number> {
  return new Promise(resolve => {
    const req = http.get(url, {timeout: timeoutMs, agent: false}, res => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
      res.on('error', () => resolve(0))
    })
    req.on('timeout', () => req.destroy())
    req.on('error', () => resolve(0))
  })
}

/** The URL whose 200 means the service is healthy: /health for the servers, /readiness for the router. */
export function healthUrl(config: SimConfig, service: Service): string {
  // A follower node serves only the stand-in /health, on its own address (its endpoints name node 0's API).
  if (isFollower(config, service)) return `${urlOf(config.host, config.ports[service as Role])}/health`
  const e = endpoints(config)
  return service === 'router' ? `${e.router}/readiness` : `${e[service]}/health`
}

export async function probeHealth(config: SimConfig, service: Service, timeoutMs = 1000): Promise<number> {
  return get(healthUrl(config, service), timeoutMs)
}

const sleep = (ms: number): Promise<void> => new Promise(r => setTimeout(r, ms))

/**
 * Wait until a service we started serves: its own service file names its pid and its health URL answers 200.
 * Fails (exit 5) when the process exits or the deadline passes, with the cause from its log.
 */
export async function waitHealthy(
  config: SimConfig,
  service: Service,
  ref: ProcRef,
  deadline: number,
): Promise<ServiceFile> {
  const log = simPaths(config.stateDir).log(service)
  let lastStatus = 0
  for (;;) {
    if (!isSameProcess(ref)) {
      const cause = causeFromLog(log)
      throw unavailable(`${service} exited while starting${cause ? `: ${cause}` : ''}`, `read ${log}`)
    }
    const file = readServiceFile(config.stateDir, service)
    if (file?.pid === ref.pid) {
      lastStatus = await probeHealth(config, service, 1000)
      if (lastStatus === 200) return file
    }
    if (Date.now() >= deadline) {
      const cause = causeFromLog(log)
      const state =
        file?.pid === ref.pid
          ? `${healthUrl(config, service)} answered ${lastStatus || 'nothing'}`
          : 'it never reported ready'
      throw unavailable(
        `${service} did not become healthy in time (${state})${cause ? `; last log line: ${cause}` : ''}`,
        `read ${log}, or pass a longer --wait`,
      )
    }
    await sleep(50)
  }
}
