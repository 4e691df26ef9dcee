import type {Observation} from '../model/timeline.js'

/** Epoch ms with sub-ms precision, monotonic within the process: every observation shares this clock. */
export const now = (): number => performance.timeOrigin + performance.now()

/** Collects observations in the order they happened; the effectful side's only way to speak to the checks. */
export class Recorder {
  readonly observations: Observation[] = []

  add<O extends Observation>(o: O): O {
    this.observations.push(o)
    return o
  }

  marker(name: string, detail?: string): void {
    this.add({kind: 'marker', t: now(), name, detail})
  }

  sorted(): Observation[] {
    return [...this.observations].sort((a, b) => a.t - b.t)
  }
}
