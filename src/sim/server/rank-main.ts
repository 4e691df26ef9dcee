import {mkdirSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {argValue} from './args.js'
import {simPaths, type SimConfig} from '../sim-config.js'
import {readEnvSettings} from './settings.js'
import {makeLogger} from './log.js'
import {bindPull} from './zmq-link.js'
import {PrefillRank, type RdmaPoster} from './prefill-rank.js'
import {DecodeRank} from './decode-rank.js'
import type {FromRank, ToRank, PrefillOp, DecodeOp, RankOp, StepMsg} from './protocol.js'
import {physicalGpu, serverLayout, titleOf} from './layout.js'
import {KVPoll} from './kvpoll.js'
import {ChangeTeller} from './change-teller.js'

/**
 * One scheduler process (`sglang::scheduler_TP<k>`, or its DP/PP/EP title), child of a server process over IPC. It
 * holds the KV
 * sender/receiver state of its rank and answers one `step` per scheduler iteration. It exits as soon as
 * its parent's IPC channel goes away, so it is never orphaned.
 */
const role = argValue(process.argv, 'role')
const tpRank = Number(argValue(process.argv, 'tp-rank'))
const stateDir = argValue(process.argv, 'state-dir')
if ((role !== 'prefill' && role !== 'decode') || !Number.isInteger(tpRank) || !stateDir || !process.send) {
  process.stderr.write('usage: rank-main --role prefill|decode --tp-rank K --state-dir DIR (with an IPC channel)\n')
  process.exit(2)
}
const cfg = JSON.parse(readFileSync(simPaths(stateDir).config, 'utf8')) as SimConfig
const layout = serverLayout(cfg, role)
// SGLang's title rule: a TP-1 scheduler is plain sglang::scheduler, DP/PP/EP segments as the layout has them.
process.title = titleOf(layout, tpRank)
const env = readEnvSettings()
const log = makeLogger(`TP${tpRank}`)
const gpu = physicalGpu(layout, tpRank)
const gpuFile = simPaths(stateDir).gpu(gpu)
// A stray context on the first visible GPU, as a library touching cuda:0 before set_device leaves one.
const strayGpu = cfg.gpuView?.strayContext ? (layout.cudaVisibleDevices?.[0] ?? 0) : undefined
const send = (m: FromRank) => {
  try {
    process.send!(m)
  } catch {
    /* parent gone */
  }
}
const teller = new ChangeTeller(() => send({t: 'changed'}))
const changed = (): void => teller.changed()
/** One step: its ops, then the poll of its rooms, answered (the all-reduce's part on this rank). */
function step(
  m: StepMsg,
  apply: (op: RankOp) => void,
  poll: (room: string) => number,
  why: (room: string) => string | undefined,
): void {
  teller.step(() => {
    for (const op of m.ops) apply(op)
    const states = m.rooms.map(poll)
    send({t: 'polled', seq: m.seq, states, reasons: reasonsOf(m.rooms, states, why)})
  })
}
/** [index, why] of the polled rooms this rank reports Failed and knows why. */
function reasonsOf(
  rooms: string[],
  states: number[],
  why: (room: string) => string | undefined,
): Array<[number, string]> | undefined {
  const out: Array<[number, string]> = []
  states.forEach((s, i) => {
    if (s !== KVPoll.Failed) return
    const text = why(rooms[i]!)
    if (text !== undefined) out.push([i, text])
  })
  return out.length > 0 ? out : undefined
}

let closing = false
let closeRank: () => void = () => undefined
function shutdown(code: number): never {
  if (!closing) {
    closing = true
    try {
      closeRank()
    } catch {
      /* best effort */
    }
    rmSync(gpuFile, {force: true})
  }
  process.exit(code)
}
process.on('disconnect', () => shutdown(0))
process.on('SIGTERM', () => shutdown(0))
process.on('SIGINT', () => shutdown(0))

try {
  mkdirSync(simPaths(stateDir).gpus, {recursive: true})
  const tmp = `${gpuFile}.${process.pid}.tmp`
  writeFileSync(
    tmp,
    JSON.stringify({
      pid: process.pid,
      role,
      tpRank,
      startedAt: Date.now(),
      ...(strayGpu !== undefined && strayGpu !== gpu ? {strayGpu} : {}),
    }),
  )
  renameSync(tmp, gpuFile)

  const {sock: pull, port: zmqPort} = await bindPull(cfg.host)
  if (role === 'prefill') {
    // With rail NICs, this rank's RDMA WRITEs go to its GPU's NIC in the server process; completions come back.
    let wrSeq = 0
    const wrs = new Map<number, {resolve: () => void; reject: (e: Error) => void}>()
    const rdma: RdmaPoster | undefined = cfg.rails
      ? w =>
          new Promise<void>((resolve, reject) => {
            const wrId = ++wrSeq
            wrs.set(wrId, {resolve, reject})
            send({t: 'rdma_write', wrId, dest: w.dest, room: w.room, bytes: w.bytes, notify: w.notify})
          })
      : undefined
    const rank = new PrefillRank(cfg, env, tpRank, log, rdma)
    rank.onChange = changed
    closeRank = () => {
      rank.close()
      pull.close()
    }
    void rank.receive(pull)
    process.on('message', (m: ToRank) => {
      if (m.t === 'rdma_cqe') {
        const wr = wrs.get(m.wrId)
        wrs.delete(m.wrId)
        if (m.error === undefined) wr?.resolve()
        else wr?.reject(new Error(m.error))
        return
      }
      if (m.t !== 'step') return
      step(
        m,
        op => rank.apply(op as PrefillOp),
        r => rank.poll(r),
        r => rank.reason(r),
      )
    })
    await rank.register(zmqPort)
    log.info(`Prefill rank registered to bootstrap server: rank_port=${zmqPort}`)
    send({t: 'ready', tpRank, pid: process.pid, zmqPort})
  } else {
    const rank = new DecodeRank(cfg, env, tpRank, log)
    rank.onChange = changed
    rank.zmqPort = zmqPort
    const dataPort = await rank.listen()
    closeRank = () => {
      rank.close()
      pull.close()
    }
    // Decode's PULL socket receives nothing under NIXL; drain it anyway.
    void (async () => {
      for await (const _ of pull) {
        /* drain */
      }
    })().catch(() => undefined)
    process.on('message', (m: ToRank) => {
      if (m.t === 'rdma_notif') {
        rank.notify(m.room, m.prefillRank)
        return
      }
      if (m.t !== 'step') return
      step(
        m,
        op => rank.apply(op as DecodeOp),
        r => rank.poll(r),
        r => rank.reason(r),
      )
    })
    send({t: 'ready', tpRank, pid: process.pid, zmqPort, dataPort})
  }
} catch (err) {
  log.error(`TP${tpRank} failed to start: ${String(err)}`)
  send({t: 'fatal', tpRank, message: String(err)})
  shutdown(1)
}
