import {performance} from 'node:perf_hooks'

/** Epoch milliseconds with sub-ms precision (ground truth and latency measurements). */
export const nowMs = (): number => performance.timeOrigin + performance.now()

export const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))
