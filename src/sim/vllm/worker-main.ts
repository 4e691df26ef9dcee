import {type ChildProcess, fork} from 'node:child_process'
import net from 'node:net'

/**
 * An engine-core or TP-worker process of the vLLM twin, with vLLM's process title (`setproctitle`:
 * "VLLM::EngineCore" under the API server, "VLLM::Worker_TP<k>" under the engine core, PRs #21445 and #22205; the
 * DP/PP/EP suffixes appear only when those sizes are above 1). The engine core answers each engine step once every
 * worker under it has (the executor's collective_rpc), so stopping any of them (SIGSTOP) wedges the engine as a
 * stopped GPU worker does. Each process exits with its parent.
 *
 * Each TP rank owns its NIXL data listener (real NIXL: one agent, one UCX listener per worker): `VLLM::Worker_TP<k>`
 * listens on rank k's port, or the engine core at TP 1 (the worker runs in it), so `ss -tlnp` names the rank's pid.
 * Each connection is relayed, after a `RANK k` line, to the API server's local (abstract unix) socket, which serves
 * the READ from the request's state: the bytes pass through the rank's process, so a stopped worker stalls its
 * share as a stopped NIXL agent does.
 *   node worker-main.js --title VLLM::EngineCore [--workers N] --data-host H --data-ports P0,P1,… --data-relay NAME
 *   node worker-main.js --title VLLM::Worker_TP<k> --rank k --data-host H --data-ports Pk --data-relay NAME
 */
function arg(name: string): string | undefined {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const title = arg('--title')
if (title) process.title = title
const n = Number(arg('--workers') ?? 0)
const dataHost = arg('--data-host') ?? '127.0.0.1'
const ports = (arg('--data-ports') ?? '0').split(',').map(Number)
const relay = arg('--data-relay') ?? ''

const workers: ChildProcess[] = Array.from({length: n}, (_, k) =>
  // The same module, the same node flags (tsx under tests), a worker's title and its rank's data port.
  fork(
    process.argv[1]!,
    [
      ...['--title', `VLLM::Worker_TP${k}`, '--rank', String(k), '--data-host', dataHost],
      ...['--data-ports', String(ports[k] ?? 0), '--data-relay', relay],
    ],
    {stdio: 'inherit'},
  ),
)
// The rank's data listener, here when this process is the rank (a worker, or the engine core at TP 1).
if (n === 0) {
  const rank = Number(arg('--rank') ?? 0)
  const server = net.createServer(sock => {
    const up = net.connect({path: `\0${relay}`})
    up.write(`RANK ${rank}\n`)
    sock.pipe(up)
    up.pipe(sock)
    sock.on('error', () => up.destroy())
    up.on('error', () => sock.destroy())
    sock.on('close', () => up.destroy())
    up.on('close', () => sock.end())
  })
  server.on('error', e => {
    process.stderr.write(`NIXL data listener of rank ${rank} failed: ${e.message}\n`)
    process.exit(1)
  })
  server.listen(ports[0] ?? 0, dataHost, () =>
    process.send?.({t: 'data-port', rank, port: (server.address() as net.AddressInfo).port}),
  )
}
// A worker that dies takes the engine down (vLLM's MultiprocExecutor monitors its workers and shuts down).
for (const [k, w] of workers.entries())
  w.on('exit', (code, signal) => {
    process.stderr.write(`Worker proc VllmWorker-${k} died unexpectedly (${signal ?? code}), shutting down executor.\n`)
    process.exit(1)
  })
// The API server lists the processes of its engine (status, discovery tests).
process.send?.({t: 'pids', pids: workers.map(w => w.pid)})
const pending = new Map<number, number>()
for (const w of workers)
  w.on('message', (m: {t?: string; seq?: number}) => {
    // A rank's data port goes up to the API server (its side channel states the ports).
    if (m?.t === 'data-port') return void process.send?.(m)
    if (m?.t !== 'stepped' || m.seq === undefined) return
    const left = (pending.get(m.seq) ?? 1) - 1
    if (left > 0) pending.set(m.seq, left)
    else {
      pending.delete(m.seq)
      process.send?.({t: 'stepped', seq: m.seq})
    }
  })

process.on('message', (m: {t?: string; seq?: number}) => {
  if (m?.t !== 'step' || m.seq === undefined) return
  if (workers.length === 0) return void process.send?.({t: 'stepped', seq: m.seq})
  pending.set(m.seq, workers.length)
  for (const w of workers) w.send(m, () => undefined)
})
process.on('disconnect', () => {
  for (const w of workers) w.kill('SIGTERM')
  process.exit(0)
})
process.on('SIGTERM', () => {
  for (const w of workers) w.kill('SIGTERM')
  process.exit(0)
})
