import type {ChildProcess} from 'node:child_process'

/**
 * The engine core's busy loop (vllm/v1/engine/core.py `EngineCoreProc.run_busy_loop`): while there is work, one
 * step after another; idle, it waits for input. A step is done only when every worker answered it (the executor's
 * collective_rpc), so a stopped worker (SIGSTOP) wedges the loop: no heartbeats go out, no lease is reaped.
 * The twin's loop also keeps stepping while P holds leased blocks, so that its reaper runs
 * (upstream: the KV connector keeps the engine stepping while sends are pending; unconfirmed in detail).
 */
export class EngineLoop {
  private wakeUp: (() => void) | undefined
  private seq = 0
  private readonly waiting = new Map<number, {left: Set<ChildProcess>; done: () => void}>()
  stopped = false

  constructor(
    private readonly step: () => Promise<boolean>,
    private readonly stepMs: number,
    private readonly workers: ChildProcess[],
  ) {
    for (const w of workers)
      w.on('message', (m: {t?: string; seq?: number}) => {
        if (m?.t !== 'stepped' || m.seq === undefined) return
        const entry = this.waiting.get(m.seq)
        if (!entry) return
        entry.left.delete(w)
        if (entry.left.size === 0) {
          this.waiting.delete(m.seq)
          entry.done()
        }
      })
  }

  wake(): void {
    this.wakeUp?.()
  }

  private collective(): Promise<void> {
    if (this.workers.length === 0) return Promise.resolve()
    const seq = ++this.seq
    return new Promise(resolve => {
      this.waiting.set(seq, {left: new Set(this.workers), done: resolve})
      for (const w of this.workers) w.send({t: 'step', seq}, () => undefined)
    })
  }

  async run(): Promise<void> {
    while (!this.stopped) {
      await this.collective()
      const pending = await this.step()
      await new Promise<void>(resolve => {
        const timer = setTimeout(resolve, pending ? this.stepMs : 500)
        this.wakeUp = () => {
          clearTimeout(timer)
          resolve()
        }
        // A pending engine steps at its own pace; only an idle one is woken early.
        if (pending) this.wakeUp = undefined
      })
      this.wakeUp = undefined
    }
  }
}
