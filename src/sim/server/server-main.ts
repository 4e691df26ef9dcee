import {mkdirSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import type {Server} from 'node:http'
import {argValue} from './args.js'
import {isFollower, simPaths, type Role, type SimConfig} from '../sim-config.js'
import {runFollower} from './follower.js'
import {readEnvSettings} from './settings.js'
import {makeLogger} from './log.js'
import {BootstrapServer} from './bootstrap-server.js'
import {RankGroup} from './rank-group.js'
import {PrefillScheduler} from './prefill-scheduler.js'
import {DecodeScheduler} from './decode-scheduler.js'
import {Heartbeat} from './heartbeat.js'
import {createHttpApi} from './http-api.js'
import type {SchedulerCore} from './scheduler-core.js'
import {nowMs} from './clock.js'
import {launchArgv, launchFlags} from './layout.js'
import {startDockerProxy} from './docker-proxy.js'

/**
 * One SGLang server of the twin: `server-main --role prefill|decode --state-dir DIR`. HTTP API, the
 * scheduler loop, the TP rank processes and (prefill) the bootstrap server, all as SGLang lays them out.
 */
const RANKS_READY_MS = 30_000

const roleArg = argValue(process.argv, 'role') as Role | undefined
const stateDirArg = argValue(process.argv, 'state-dir')
if ((roleArg !== 'prefill' && roleArg !== 'decode') || !stateDirArg) {
  process.stderr.write('usage: server-main --role prefill|decode --state-dir DIR\n')
  process.exit(2)
}
// Narrowed once here, so that the functions below see them as set.
const role: Role = roleArg
const stateDir: string = stateDirArg
const paths = simPaths(stateDir)
const cfg = JSON.parse(readFileSync(paths.config, 'utf8')) as SimConfig
// SGLang's launch flags stay visible in `ps`, as a real server's command line is: discovery without root reads them.
// With --server-config-file the flags are in the YAML and the command line names only the file, as such launches do.
process.title =
  `sglang::${role}_server ` +
  `${cfg.serverConfigFile ? `--config ${paths.serverConfig(role)}` : launchArgv(launchFlags(cfg, role)).join(' ')}`
/** Behind docker-proxy the server listens on its container port; the proxy owns the service port. */
const ownPort = cfg.dockerProxy ? cfg.dockerProxy[role] : cfg.ports[role]
const env = readEnvSettings()
const log = makeLogger()
/** Scheduler-side lines carry SGLang's `TP0` prefix (the scheduler of attn-TP rank 0 logs them). */
const schedLog = makeLogger('TP0')
const startedAt = nowMs()

let sched: SchedulerCore | undefined
let http: Server | undefined
let bootstrap: BootstrapServer | undefined
let heartbeat: Heartbeat | undefined
const ranks = new RankGroup(cfg, role, stateDir, log)
let exiting = false
let stopProxy: () => void = () => undefined

async function shutdown(code: number, why: string): Promise<never> {
  if (!exiting) {
    exiting = true
    const hard = setTimeout(() => process.exit(code), 1800)
    hard.unref()
    log.info(`Shutting down ${role} server: ${why}`)
    rmSync(paths.service(role!), {force: true})
    heartbeat?.close()
    sched?.close()
    http?.closeAllConnections()
    http?.close()
    bootstrap?.close()
    stopProxy()
    await ranks.stop().catch(() => undefined)
    rmSync(paths.service(role!), {force: true})
  }
  process.exit(code)
}

function listen(server: Server, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, cfg.host, () => {
      server.off('error', reject)
      resolve()
    })
  })
}

/** SGLang's first lines: its server args and, on prefill, the watchdog's settings. */
function logServerArgs(): void {
  log.info(
    `server_args=ServerArgs(model_path='${cfg.model}', host='${cfg.host}', port=${cfg.ports[role]}, ` +
      `tp_size=${role === 'prefill' ? cfg.prefillTp : cfg.decodeTp}, ${
        cfg.dist
          ? `nnodes=${cfg.dist.nnodes}, ` +
            `node_rank=${cfg.dist.nodeRank}, dist_init_addr='${cfg.dist.distInitAddr}', `
          : ''
      }disaggregation_mode='${role}', disaggregation_transfer_backend='${env.backend}', ` +
      `disaggregation_bootstrap_port=${cfg.ports.bootstrap})`,
  )
  if (role === 'prefill')
    log.info(
      `Disaggregation watchdog: scope=${env.watchdog.scope} timeout=${env.watchdog.deadlineS}s ` +
        `poll_interval=${env.watchdog.pollS}s`,
    )
}

/** The role's scheduler loop (decode's with its heartbeat), run until it completes a first iteration. */
async function startScheduler(): Promise<void> {
  if (role === 'prefill') {
    const p = new PrefillScheduler(role, cfg, env, ranks, schedLog, stateDir)
    p.init()
    sched = p
  } else {
    const d = new DecodeScheduler(role, cfg, env, ranks, schedLog, stateDir)
    // `sim up --heartbeat off` (not SGLang): no liveness check at all. `stale-peer`: no instance-id check either.
    if (cfg.heartbeat !== 'off')
      heartbeat = new Heartbeat(
        d,
        env,
        schedLog,
        !cfg.bugs.includes('stale-prefill-ports') && !cfg.bugs.includes('stale-peer'),
      )
    sched = d
  }
  const s = sched
  s.run().catch((err: unknown) => {
    log.error(`Scheduler loop failed: ${String(err)}`)
    void shutdown(1, 'scheduler loop failed')
  })
  if (!(await s.waitIteration(RANKS_READY_MS))) throw new Error('scheduler loop did not complete an iteration')
}

/** The server's service file, written atomically once it serves. */
function writeService(): void {
  mkdirSync(paths.services, {recursive: true})
  const service = {
    role,
    pid: process.pid,
    startedAt: Math.round(startedAt),
    httpUrl: `http://${cfg.host}:${cfg.ports[role]}`,
    ...(role === 'prefill' ? {bootstrapUrl: `http://${cfg.host}:${cfg.ports.bootstrap}`} : {}),
    ...(cfg.dist ? {nnodes: cfg.dist.nnodes, nodeRank: 0, distInitAddr: cfg.dist.distInitAddr} : {}),
    rankPids: ranks.pids,
    rankPorts: ranks.readies.map(r => ({
      tpRank: r.tpRank,
      zmqPort: r.zmqPort,
      ...(r.dataPort ? {dataPort: r.dataPort} : {}),
    })),
  }
  const tmp = `${paths.service(role)}.${process.pid}.tmp`
  writeFileSync(tmp, JSON.stringify(service, null, 2))
  renameSync(tmp, paths.service(role))
}

/** Node rank 0 (or a one-node instance): the API, the scheduler loop and, on prefill, the bootstrap server. */
async function runServer(): Promise<void> {
  process.on('SIGTERM', () => {
    void shutdown(0, 'SIGTERM')
  })
  process.on('SIGINT', () => {
    void shutdown(0, 'SIGINT')
  })
  try {
    logServerArgs()
    http = createHttpApi({
      cfg,
      env,
      role,
      startedAt,
      sched: () => (sched?.running ? sched : undefined),
      onNewAddr: a => heartbeat?.watch(a),
    })
    await listen(http, ownPort)
    if (cfg.dockerProxy) stopProxy = await startDockerProxy(cfg.host, cfg.ports[role], ownPort, RANKS_READY_MS)
    if (role === 'prefill') {
      bootstrap = new BootstrapServer(cfg, log)
      await bootstrap.listen()
    }
    ranks.onUnexpectedExit = (k, code, signal) => {
      log.error(`Scheduler TP${k} (rank process) died unexpectedly: exit code ${code}, signal ${signal}`)
      void shutdown(1, `rank TP${k} died`)
    }
    // Another node's rank or link gone: the collective group is broken, as a NCCL/gloo failure would end SGLang.
    ranks.onRemoteLost = why => {
      log.error(`Distributed group broken: ${why}`)
      void shutdown(1, 'a node of the instance was lost')
    }
    await ranks.start(RANKS_READY_MS)
    await startScheduler()
    writeService()
    log.info(`The server is fired up and ready to roll! (${role}, ${Math.round(nowMs() - startedAt)} ms)`)
  } catch (err) {
    log.error(`Failed to start ${role} server: ${err instanceof Error ? err.message : String(err)}`)
    await shutdown(1, 'startup failed')
  }
}

// A node of rank >= 1 runs only its ranks and a stand-in health endpoint (follower.ts).
if (isFollower(cfg, role)) await runFollower(cfg, role, stateDir, log, RANKS_READY_MS)
else await runServer()
