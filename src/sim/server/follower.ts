import {mkdirSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import type {Server} from 'node:http'

import {distEndpoint, simPaths, type Role, type SimConfig} from '../sim-config.js'
import {connectWithRetry, JsonLines, type FollowerMsg, type LeaderMsg} from './dist-link.js'
import {createDummyHealthServer} from './dummy-health.js'
import type {Logger} from './log.js'
import {RankGroup} from './rank-group.js'
import {nowMs} from './clock.js'

/**
 * A node of rank >= 1 of one instance (`--nnodes N --node-rank K`, K >= 1): SGLang runs only this node's schedulers
 * there, no tokenizer and no HTTP API, then a stand-in health endpoint (engine.py `_launch_subprocesses`). The twin's
 * server process joins node 0 at the dist-init-addr first (SGLang's schedulers rendezvous before they register), starts
 * its ranks, and from then on relays: node 0's steps to its ranks, each rank's answer back as it comes. It ends (exit
 * 1,
 * with a log line saying why) when its link to node 0 or one of its ranks is gone, as the NCCL group would end it.
 */
export async function runFollower(
  cfg: SimConfig,
  role: Role,
  stateDir: string,
  log: Logger,
  readyMs: number,
): Promise<void> {
  const d = cfg.dist!
  const f: Follower = {
    cfg,
    role,
    d,
    log,
    paths: simPaths(stateDir),
    startedAt: nowMs(),
    ranks: new RankGroup(cfg, role, stateDir, log),
    link: undefined,
    health: undefined,
    exiting: false,
  }
  process.on('SIGTERM', () => {
    void shutdown(f, 0, 'SIGTERM')
  })
  process.on('SIGINT', () => {
    void shutdown(f, 0, 'SIGINT')
  })

  try {
    const deadline = Date.now() + readyMs
    log.info(
      `server_args=ServerArgs(model_path='${cfg.model}', host='${cfg.host}', port=${cfg.ports[role]}, ` +
        `tp_size=${f.ranks.size}, nnodes=${d.nnodes}, node_rank=${d.nodeRank}, dist_init_addr='${d.distInitAddr}', ` +
        `disaggregation_mode='${role}')`,
    )
    log.info(
      `Node rank ${d.nodeRank}: joining node rank 0 at ${d.distInitAddr} ` +
        `(TP${f.ranks.tpRanks[0]}..TP${f.ranks.tpRanks.at(-1)} on this node)`,
    )
    const l = await joinLeader(f, deadline)
    relay(f, l)
    await f.ranks.start(Math.max(1, deadline - Date.now()))
    for (const r of f.ranks.readies) l.send(r)
    await startHealth(f)
    writeService(f)
    log.info(
      `Node rank ${d.nodeRank} ready: TP${f.ranks.tpRanks[0]}..TP${f.ranks.tpRanks.at(-1)} joined node rank 0 ` +
        `(${Math.round(nowMs() - f.startedAt)} ms)`,
    )
  } catch (err) {
    log.error(
      `Failed to start ${role} server (node rank ${d.nodeRank}): ${err instanceof Error ? err.message : String(err)}`,
    )
    await shutdown(f, 1, 'startup failed')
  }
}

/** A follower node's state, passed to each of its phases. */
interface Follower {
  cfg: SimConfig
  role: Role
  d: NonNullable<SimConfig['dist']>
  log: Logger
  paths: ReturnType<typeof simPaths>
  startedAt: number
  ranks: RankGroup
  link: JsonLines<LeaderMsg, FollowerMsg> | undefined
  health: Server | undefined
  exiting: boolean
}

async function shutdown(f: Follower, code: number, why: string): Promise<never> {
  if (!f.exiting) {
    f.exiting = true
    setTimeout(() => process.exit(code), 1800).unref()
    f.log.info(`Shutting down ${f.role} server (node rank ${f.d.nodeRank}): ${why}`)
    rmSync(f.paths.service(f.role), {force: true})
    f.health?.closeAllConnections()
    f.health?.close()
    if (f.link) {
      f.link.onClose = () => undefined
      f.link.close('shutting down')
    }
    await f.ranks.stop().catch(() => undefined)
    rmSync(f.paths.service(f.role), {force: true})
  }
  process.exit(code)
}

/** Joins node rank 0 at the dist-init-addr: hello, then its welcome (or refusal) before the deadline. */
async function joinLeader(f: Follower, deadline: number): Promise<JsonLines<LeaderMsg, FollowerMsg>> {
  const {d, cfg} = f
  const {host, port} = distEndpoint(d)
  const l = new JsonLines<LeaderMsg, FollowerMsg>(await connectWithRetry(host, port, cfg.host, deadline))
  f.link = l
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`node rank 0 at ${d.distInitAddr} did not admit this node in time`)),
      Math.max(0, deadline - Date.now()),
    )
    l.onMessage = m => {
      clearTimeout(timer)
      if (m.t === 'welcome') resolve()
      else reject(new Error(`node rank 0 refused this node: ${m.t === 'reject' ? m.message : m.t}`))
    }
    l.onClose = why => {
      clearTimeout(timer)
      reject(new Error(`node rank 0 closed the link: ${why}`))
    }
    l.send({t: 'hello', role: f.role, nnodes: d.nnodes, nodeRank: d.nodeRank, tpRanks: f.ranks.tpRanks})
  })
  return l
}

/** From here on this node only relays; losing node 0 ends it, as a broken NCCL group ends SGLang's schedulers. */
function relay(f: Follower, l: JsonLines<LeaderMsg, FollowerMsg>): void {
  const {ranks, log} = f
  l.onMessage = m => {
    if (m.t === 'step') ranks.sendStep(m)
  }
  l.onClose = why => {
    log.error(`Lost the link to node rank 0 at ${f.d.distInitAddr}: ${why}`)
    void shutdown(f, 1, 'lost the link to node rank 0')
  }
  ranks.relay = (tpRank, m) => l.send({...m, tpRank})
  ranks.onUnexpectedExit = (k, code, signal) => {
    log.error(`Scheduler TP${k} (rank process) died unexpectedly: exit code ${code}, signal ${signal}`)
    l.send({t: 'fatal', tpRank: k, message: `exit code ${code}, signal ${signal}`})
    void shutdown(f, 1, `rank TP${k} died`)
  }
}

/** SGLang's stand-in health endpoint on the server's port. */
async function startHealth(f: Follower): Promise<void> {
  const {cfg, role} = f
  f.health = createDummyHealthServer()
  const h = f.health
  await new Promise<void>((resolve, reject) => {
    h.once('error', reject)
    h.listen(cfg.ports[role], cfg.host, () => {
      h.off('error', reject)
      resolve()
    })
  })
  f.log.info(`Dummy health check server started at ${cfg.host}:${cfg.ports[role]}`)
}

/** The node's service file, written atomically once it serves. */
function writeService(f: Follower): void {
  const {cfg, role, d, paths, ranks} = f
  mkdirSync(paths.services, {recursive: true})
  const service = {
    role,
    pid: process.pid,
    startedAt: Math.round(f.startedAt),
    httpUrl: `http://${cfg.host}:${cfg.ports[role]}`,
    nnodes: d.nnodes,
    nodeRank: d.nodeRank,
    distInitAddr: d.distInitAddr,
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
