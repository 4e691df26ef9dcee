import {mkdirSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {argValue} from './args.js'
import {simPaths, type SimConfig} from '../sim-config.js'
import {readEnvSettings} from './settings.js'
import {makeLogger} from './log.js'
import {bindPull} from './zmq-link.js'
import {PrefillRank} from './prefill-rank.js'
import {DecodeRank} from './decode-rank.js'
import {gpuIndex, type FromRank, type ToRank, type PrefillOp, type DecodeOp} from './protocol.js'

/**
 * One TP rank process (`sglang::scheduler_TP<k>`), child of a server process over IPC. It holds the KV
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
process.title = `sglang::scheduler_TP${tpRank}`

const cfg = JSON.parse(readFileSync(simPaths(stateDir).config, 'utf8')) as SimConfig
const env = readEnvSettings()
const log = makeLogger(`TP${tpRank}`)
const gpuFile = simPaths(stateDir).gpu(gpuIndex(role, tpRank, cfg.prefillTp))
const send = (m: FromRank) => { try { process.send!(m) } catch { /* parent gone */ } }

let closing = false
let closeRank: () => void = () => undefined
function shutdown(code: number): never {
  if (!closing) {
    closing = true
    try { closeRank() } catch { /* best effort */ }
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
  writeFileSync(tmp, JSON.stringify({pid: process.pid, role, tpRank, startedAt: Date.now()}))
  renameSync(tmp, gpuFile)

  const {sock: pull, port: zmqPort} = await bindPull(cfg.host)
  if (role === 'prefill') {
    const rank = new PrefillRank(cfg, env, tpRank, log)
    closeRank = () => { rank.close(); pull.close() }
    void rank.receive(pull)
    process.on('message', (m: ToRank) => {
      for (const op of m.ops) rank.apply(op as PrefillOp)
      send({t: 'polled', seq: m.seq, states: m.rooms.map((r) => rank.poll(r))})
    })
    await rank.register(zmqPort)
    log.info(`Prefill rank registered to bootstrap server: rank_port=${zmqPort}`)
    send({t: 'ready', tpRank, pid: process.pid, zmqPort})
  } else {
    const rank = new DecodeRank(cfg, env, tpRank, log)
    rank.zmqPort = zmqPort
    const dataPort = await rank.listen()
    closeRank = () => { rank.close(); pull.close() }
    // Decode's PULL socket receives nothing under NIXL; drain it anyway.
    void (async () => { for await (const _ of pull) { /* drain */ } })().catch(() => undefined)
    process.on('message', (m: ToRank) => {
      for (const op of m.ops) rank.apply(op as DecodeOp)
      send({t: 'polled', seq: m.seq, states: m.rooms.map((r) => rank.poll(r))})
    })
    send({t: 'ready', tpRank, pid: process.pid, zmqPort, dataPort})
  }
} catch (err) {
  log.error(`TP${tpRank} failed to start: ${String(err)}`)
  send({t: 'fatal', tpRank, message: String(err)})
  shutdown(1)
}
