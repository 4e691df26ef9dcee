import {type ChildProcess, fork} from 'node:child_process'

/**
 * An engine-core or TP-worker process of the vLLM twin, with vLLM's process title (`setproctitle`:
 * "VLLM::EngineCore" under the API server, "VLLM::Worker_TP<k>" under the engine core, PRs #21445 and #22205; the
 * DP/PP/EP suffixes appear only when those sizes are above 1). The engine core answers each engine step once every
 * worker under it has (the executor's collective_rpc), so stopping any of them (SIGSTOP) wedges the engine as a
 * stopped GPU worker does. Each process exits with its parent.
 *   node worker-main.js --title VLLM::EngineCore [--workers N]
 */
function arg(name: string): string | undefined {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const title = arg('--title')
if (title) process.title = title
const n = Number(arg('--workers') ?? 0)

const workers: ChildProcess[] = Array.from({length: n}, (_, k) =>
  // The same module, the same node flags (tsx under tests), a worker's title.
  fork(process.argv[1]!, ['--title', `VLLM::Worker_TP${k}`], {stdio: 'inherit'}),
)
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
