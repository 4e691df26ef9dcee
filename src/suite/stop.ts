import {checkCollateral} from '../checks/collateral.js'
import type {Deployment} from '../deployment/config.js'
import {serviceClients} from '../deployment/clients.js'
import {oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {sleep} from '../util/time.js'
import {now, type Recorder} from '../workload/recorder.js'
import type {StopSpec} from './suite-file.js'

/**
 * The stop conditions, watched for the whole run: the router's /liveness failing for longer than X s, the steady
 * load outside the faults' reach losing more than Y %, a new `NVRM: Xid` line in the host's kernel log. The first
 * to fire aborts the run's signal with its reason; the run then reverts everything and exits 3 (never resumed).
 */

export const XID_LINE = /NVRM: Xid/

export interface StopWatch {
  signal: AbortSignal
  /** Stop now (SIGINT, or a caller's own reason). */
  stop(reason: string): void
  reason(): string | undefined
  /** The current batch's recorder, for the collateral condition. */
  setRecorder(rec: Recorder | undefined): void
  /**
   * A co-restart takes the router down on purpose (behind its own health gates): its health is not watched meanwhile.
   */
  setRestarting(on: boolean): void
  /** Conditions that could not be watched (e.g. the kernel log unreadable), said once each. */
  notes: string[]
  close(): Promise<void>
}

/** Xid lines in a kernel log text. */
export function xidLines(text: string): string[] {
  return text.split('\n').filter(l => XID_LINE.test(l))
}

async function readKernelLog(host: Host): Promise<{text?: string; why?: string}> {
  for (const argv of [['dmesg'], ['journalctl', '-k', '--no-pager', '-q', '-o', 'short-monotonic', '-n', '5000']]) {
    try {
      const r = await host.run(argv, {timeoutMs: 5000, sudo: true})
      if (r.code === 0) return {text: r.stdout}
    } catch {}
  }
  return {why: 'neither `dmesg` nor `journalctl -k` could be read on the host'}
}

/**
 * `hosts`: every host of the deployment, each named (an Xid on any GPU host stops the run: on a deployment over several
 * hosts the GPUs are on several kernels); a name is shown only when there are several.
 */
export async function startStopWatch(
  deployment: Deployment,
  hosts: Array<{name: string; host: Host}>,
  spec: StopSpec,
  opts: {say: (l: string) => void; intervalMs?: number},
): Promise<StopWatch> {
  const controller = new AbortController()
  let why: string | undefined
  const notes: string[] = []
  let rec: Recorder | undefined
  let restarting = false
  const stop = (reason: string) => {
    if (why !== undefined) return
    why = reason
    opts.say(`STOP: ${reason}`)
    controller.abort(new Error(reason))
  }
  const {router} = serviceClients(deployment, {timeoutMs: 1000})
  // Each host's Xid lines before the run; a host whose kernel log cannot be read is not watched (and noted).
  const baselineXid = new Map<string, Set<string>>()
  const named = (name: string): string => (hosts.length > 1 ? ` on ${name}` : '')
  if (spec.kernelXid) {
    await Promise.all(
      hosts.map(async ({name, host}) => {
        const k = await readKernelLog(host)
        if (k.text === undefined) notes.push(`the kernel-log Xid condition is not watched${named(name)}: ${k.why}`)
        else baselineXid.set(name, new Set(xidLines(k.text)))
      }),
    )
  }
  const intervalMs = opts.intervalMs ?? 500
  let failingSince: number | undefined
  let lastXidRead = now()
  let closed = false
  const closing = new AbortController()
  const loop = (async () => {
    // Bounded: at most one day of checks; the run ends long before.
    for (let i = 0; !closed && i < 86_400_000 / intervalMs; i++) {
      try {
        if (restarting) failingSince = undefined
        else if (spec.routerUnhealthySeconds !== undefined) {
          const h = await router.liveness().catch((error: unknown) => ({ok: false, error: oneLine(error)}))
          if (h.ok) failingSince = undefined
          else {
            failingSince ??= now()
            if (now() - failingSince > spec.routerUnhealthySeconds * 1000) {
              stop(
                `router health failing for ${((now() - failingSince) / 1000).toFixed(1)}s ` +
                  `(limit ${spec.routerUnhealthySeconds}s): ${(h as {error?: string}).error ?? 'not ok'}`,
              )
            }
          }
        }
        if (spec.collateralLossPercent !== undefined && rec && rec.observations.length > 0) {
          const v = checkCollateral({
            contract: deployment.watchdog,
            calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0},
            observations: rec.sorted(),
          })
          const e = v.evidence as {judged: number; lost: unknown[]}
          const pct = e.judged > 0 ? (100 * e.lost.length) / e.judged : 0
          if (e.lost.length > 0 && pct > spec.collateralLossPercent)
            stop(`collateral loss ${pct.toFixed(1)}% above ${spec.collateralLossPercent}%: ${v.summary}`)
        }
        if (baselineXid.size > 0 && now() - lastXidRead >= 2000) {
          lastXidRead = now()
          await Promise.all(
            hosts
              .filter(h => baselineXid.has(h.name))
              .map(async ({name, host}) => {
                const k = await readKernelLog(host)
                const fresh = k.text === undefined ? [] : xidLines(k.text).filter(l => !baselineXid.get(name)!.has(l))
                if (fresh.length > 0)
                  stop(`new Xid line in the host's kernel log${named(name)}: ${fresh[0]!.trim().slice(0, 200)}`)
              }),
          )
        }
      } catch (error) {
        notes.push(`stop-condition check failed once: ${oneLine(error)}`)
      }
      // A sleep that close() cuts short, so closing never waits out an interval.
      await sleep(intervalMs, closing.signal)
    }
  })()
  return {
    signal: controller.signal,
    stop,
    reason: () => why,
    notes,
    setRecorder: r => {
      rec = r
    },
    setRestarting: on => {
      restarting = on
    },
    close: async () => {
      closed = true
      closing.abort()
      await loop
    },
  }
}
