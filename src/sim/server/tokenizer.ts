import {sleep} from './clock.js'
import {drawLag, type Lag} from './lag.js'

/**
 * `sim up --tokenize-ms N[:J]` (docs/twin.md, "Lags"): SGLang's TokenizerManager tokenizes a request before it sends
 * it to the scheduler and only then knows its rid (managers/tokenizer_manager.py: `_send_one_request` sets
 * `rid_to_state[rid]`), and `abort_request` returns at once for a rid not in `rid_to_state`. With one tokenizer
 * (`--tokenizer-worker-num 1`) requests are tokenized one at a time, so a burst waits in line: the k-th of a burst is
 * known k × N ms after it arrived. The twin draws N per request (not SGLang's timing, its shape).
 */
export class TokenizerQueue {
  private tail: Promise<void> = Promise.resolve()
  private readonly pending = new Set<string>()

  constructor(private readonly lag: Lag | undefined) {}

  /** Resolves once the request is tokenized (its turn in line, then its own N ms); at once without the option. */
  async tokenize(rid: string): Promise<void> {
    const lag = this.lag
    if (!lag) return
    this.pending.add(rid)
    const turn = this.tail.then(() => sleep(drawLag(lag)))
    this.tail = turn
    await turn
    this.pending.delete(rid)
  }

  /** Arrived but not yet tokenized: an abort of it is dropped, as for any rid the TokenizerManager does not know. */
  unknown(rid: string): boolean {
    return this.pending.has(rid)
  }
}
