/**
 * A rank's side of `changed` (protocol.ts ChangedMsg): a change between steps is told once, since the step it brings
 * polls every room; a change while a step is handled is in that step's answer; after the answer, the next change is
 * told again. So a rank sends at most one `changed` per step, however much moves.
 */
export class ChangeTeller {
  private inStep = false
  private told = false

  constructor(private readonly tell: () => void) {}

  /** Something the next poll may report differently has happened. */
  changed(): void {
    if (this.inStep || this.told) return
    this.told = true
    this.tell()
  }

  /** Handle one step (its ops, its poll and its answer) inside this. */
  step(handle: () => void): void {
    this.inStep = true
    try {
      handle()
    } finally {
      this.inStep = false
      this.told = false
    }
  }
}
