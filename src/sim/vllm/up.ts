import {mkdirSync, rmSync, writeFileSync} from 'node:fs'
import http from 'node:http'
import {join} from 'node:path'
import {performance} from 'node:perf_hooks'

import {stringify} from 'yaml'

import {entryArgv, packageRootOf, simModule} from '../entry.js'
import {restartArgv} from '../lifecycle/deployment-file.js'
import {readJson, urlOf, writeJsonAtomic} from '../lifecycle/files.js'
import {acquireLock, downHint, type LockFile, removeLock, type Service, writeLock} from '../lifecycle/lock.js'
import {assertPortsFree} from '../lifecycle/ports.js'
import {isSameProcess, type ProcRef, spawnDetached, stopGroup} from '../lifecycle/procs.js'
import {SimError, unavailable} from '../lifecycle/sim-error.js'
import {assertOwnDeploymentFile, claimStateDir} from '../lifecycle/state-marker.js'
import {simPaths} from '../sim-config.js'
import {
  buildVllmConfig,
  dataPorts,
  kvTransferConfig,
  serveArgv,
  serverEnv,
  VLLM_DEFAULTS,
  type VllmTwinConfig,
  type VllmUpOptions,
  vllmPaths,
} from './config.js'

export interface VllmUpResult {
  stateDir: string
  deploymentFile: string
  endpoints: {router: string; prefill: string; decode: string}
  pids: Partial<Record<Service, number>>
  healthyMs: number
  config: VllmTwinConfig
}

const packageRoot = packageRootOf(import.meta.url)

export const vllmEndpoints = (c: VllmTwinConfig) => ({
  router: urlOf(c.host, c.ports.proxy),
  prefill: urlOf(c.host, c.ports.prefill),
  decode: urlOf(c.host, c.ports.decode),
})

/** The argv of a service: the twin's own flags, then the command line a real host would show. */
export function vllmServiceArgv(c: VllmTwinConfig, s: Service): {command: string; args: string[]} {
  const argv =
    s === 'router'
      ? entryArgv(simModule(import.meta.url, 'vllm/proxy-main'), '--state-dir', c.stateDir, ...proxyFlags(c))
      : entryArgv(
          simModule(import.meta.url, 'vllm/engine-main'),
          '--state-dir',
          c.stateDir,
          '--role',
          s,
          ...serveArgv(c, s),
        )
  const i = argv.args.indexOf('--import')
  if (i >= 0 && argv.args[i + 1] === 'tsx') argv.args[i + 1] = import.meta.resolve('tsx')
  return argv
}

const proxyFlags = (c: VllmTwinConfig): string[] => [
  '--host',
  c.host,
  '--port',
  String(c.ports.proxy),
  '--prefiller-hosts',
  c.host,
  '--prefiller-ports',
  String(c.ports.prefill),
  '--decoder-hosts',
  c.host,
  '--decoder-ports',
  String(c.ports.decode),
]

function get(url: string, timeoutMs: number): Promise<number> {
  return new Promise(resolve => {
    const req = http.get(url, {timeout: timeoutMs, agent: false}, res => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
    })
    req.on('timeout', () => req.destroy())
    req.on('error', () => resolve(0))
  })
}

export const vllmHealthUrl = (c: VllmTwinConfig, s: Service): string =>
  s === 'router' ? `${vllmEndpoints(c).router}/healthcheck` : `${vllmEndpoints(c)[s]}/health`

export async function waitVllmHealthy(c: VllmTwinConfig, s: Service, ref: ProcRef, deadline: number): Promise<void> {
  for (;;) {
    if (!isSameProcess(ref)) throw unavailable(`${s} exited while starting`, `read ${vllmPaths(c.stateDir).log(s)}`)
    const file = readJson<{pid: number}>(vllmPaths(c.stateDir).service(s))
    if (file?.pid === ref.pid && (await get(vllmHealthUrl(c, s), 1000)) === 200) return
    if (Date.now() >= deadline)
      throw unavailable(
        `${s} did not become healthy in time`,
        `read ${vllmPaths(c.stateDir).log(s)}, or pass a longer --wait`,
      )
    await new Promise(r => setTimeout(r, 50))
  }
}

/** Start one service detached (its own process group), logging to DIR/logs/<service>.log. */
export function startVllmService(c: VllmTwinConfig, s: Service): ProcRef {
  const {command, args} = vllmServiceArgv(c, s)
  const env = {...process.env, ...(s === 'router' ? {} : serverEnv(c, s))}
  return spawnDetached(command, args, {env, logFile: vllmPaths(c.stateDir).log(s), cwd: packageRoot})
}

/** The deployment file (pdchaos.yaml) of a vLLM twin: `engine: vllm`, the services, and the lease as launched. */
export function vllmDeployment(c: VllmTwinConfig): Record<string, unknown> {
  const e = vllmEndpoints(c)
  const p = vllmPaths(c.stateDir)
  const svc = (s: Service, healthPath: string) => ({
    url: e[s],
    healthPath,
    restart: restartArgv(c.stateDir, s),
    logs: {file: p.log(s)},
  })
  return {
    version: 1,
    name: 'pdchaos-twin-vllm',
    engine: 'vllm',
    labels: {environment: 'twin'},
    host: {kind: 'local'},
    sudo: 'never',
    stateDir: join(c.stateDir, 'host-state'),
    services: {
      prefill: {...svc('prefill', '/health'), sideChannelPort: c.sideChannel.prefill},
      decode: {...svc('decode', '/health'), sideChannelPort: c.sideChannel.decode},
      router: {...svc('router', '/healthcheck'), kind: 'toy-proxy'},
    },
    backend: 'nixl',
    vllm: {
      version: c.version,
      kvTransferConfig: JSON.parse(kvTransferConfig(c)) as unknown,
      lease:
        c.lease.mode === 'lease'
          ? {mode: 'lease', durationSeconds: c.lease.durationS, extensionSeconds: c.lease.extensionS}
          : {mode: 'legacy', abortRequestTimeoutSeconds: c.lease.abortTimeoutS},
    },
  }
}

/**
 * `sim up --engine vllm`: a prefill and a decode vLLM server (kv_both, NixlConnector) and the toy proxy, detached,
 * healthy, with a deployment file. The lock, state-dir guard and process groups are the SGLang twin's, so
 * `sim down` stops this twin as it stops that one.
 */
export async function vllmUp(options: VllmUpOptions): Promise<VllmUpResult> {
  const t0 = performance.now()
  const c = buildVllmConfig(options)
  const sp = simPaths(c.stateDir)
  claimStateDir(c.stateDir)
  assertOwnDeploymentFile(sp.deploymentFile)
  const lock: LockFile = acquireLock(c.stateDir)
  const started: Array<[Service, ProcRef]> = []
  try {
    await assertPortsFree(
      c.host,
      {
        proxy: c.ports.proxy,
        prefill: c.ports.prefill,
        decode: c.ports.decode,
        'prefill side channel': c.sideChannel.prefill,
        'decode side channel': c.sideChannel.decode,
        ...Object.fromEntries(dataPorts(c, 'prefill').map((p, k) => [`prefill NIXL data (rank ${k})`, p])),
      },
      `pass another --base-port (now ${c.ports.proxy}) or --side-channel-port, or stop what holds the port`,
    )
    for (const d of [sp.services, sp.truthDir, sp.logs]) rmSync(d, {recursive: true, force: true})
    for (const d of [sp.services, sp.truthDir, sp.logs]) mkdirSync(d, {recursive: true})
    rmSync(sp.config, {force: true}) // an SGLang twin's sim.json: this dir now holds a vLLM twin
    writeJsonAtomic(vllmPaths(c.stateDir).config, c)
    const deadline = Date.now() + (options.waitS ?? VLLM_DEFAULTS.waitS) * 1000
    const refs: Partial<Record<Service, ProcRef>> = {}
    for (const s of ['prefill', 'decode', 'router'] as const) {
      const ref = startVllmService(c, s)
      started.push([s, ref])
      refs[s] = ref
      lock.services[s] = ref
      writeLock(c.stateDir, lock)
    }
    for (const s of ['prefill', 'decode', 'router'] as const) await waitVllmHealthy(c, s, refs[s]!, deadline)
    const header = `# Written by \`pdchaos sim up\` for the twin in ${c.stateDir}. Rewritten on every up.\n`
    writeFileSync(sp.deploymentFile, header + stringify(vllmDeployment(c)))
    lock.owner = {pid: 0, start: ''}
    writeLock(c.stateDir, lock)
    const pids = Object.fromEntries(started.map(([s, r]) => [s, r.pid]))
    return {
      stateDir: c.stateDir,
      deploymentFile: sp.deploymentFile,
      endpoints: vllmEndpoints(c),
      pids,
      healthyMs: Math.round(performance.now() - t0),
      config: c,
    }
  } catch (error) {
    await Promise.all(started.map(([, ref]) => stopGroup(ref, 3000, 2000)))
    removeLock(c.stateDir)
    if (error instanceof SimError) throw error
    throw unavailable(`sim up failed: ${(error as Error).message}`, downHint(c.stateDir), error)
  }
}
