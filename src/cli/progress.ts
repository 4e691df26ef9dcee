import type {Ora} from 'ora'

import {spinnable, startSpinner} from './spinner.js'

/**
 * Progress on stderr (stdout belongs to results): on a TTY a spinner with the phase, a countdown to its deadline
 * and the last line said; otherwise plain lines; nothing under --json.
 */
export class Progress {
  private readonly spin?: Ora
  private readonly ticker?: NodeJS.Timeout
  private phase = 'starting'
  private deadlineAt?: number
  private last = ''

  constructor(private readonly opts: {json: boolean}) {
    if (spinnable() && !opts.json) this.spin = startSpinner(this.phase)
    if (this.spin) this.ticker = setInterval(() => this.paint(), 200)
  }

  /** A progress line: the spinner's tail on a TTY, a line of its own otherwise. */
  readonly say = (line: string): void => {
    if (this.spin) {
      this.last = line
      this.paint()
    } else if (!this.opts.json) process.stderr.write(line + '\n')
  }

  /** The phase, and when it ends (for the countdown). */
  readonly setPhase = (phase: string, deadlineAt?: number): void => {
    this.phase = phase
    this.deadlineAt = deadlineAt
    this.paint()
  }

  /** Lines that must stand on their own even on a TTY (the batch plan, printed before any injection). */
  readonly print = (lines: string[]): void => {
    this.spin?.clear()
    if (!this.opts.json) for (const l of lines) process.stderr.write(l + '\n')
  }

  stop(): void {
    if (this.ticker) clearInterval(this.ticker)
    this.spin?.stop()
  }

  private paint(): void {
    if (!this.spin) return
    const left =
      this.deadlineAt === undefined ? '' : ` (${Math.max(0, (this.deadlineAt - Date.now()) / 1000).toFixed(1)}s left)`
    this.spin.text = `${this.phase}${left}${this.last ? ` — ${this.last}` : ''}`
  }
}
