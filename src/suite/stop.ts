import {checkCollateral} from '../checks/collateral.js'
import type {Deployment} from '../deployment/config.js'
import {serviceClients} from '../engines/sglang/deployment/clients.js'
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

/** What the watch loop keeps between checks. */
interface WatchState {
  deployment: Deployment
  hosts: Array<{name: string; host: Host}>
  spec: StopSpec
  router: ReturnType<typeof serviceClients>['router']
  stop: (reason: string) => void
  notes: string[]
  rec?: Recorder
  restarting: boolean
  failingSince?: number
  lastXidRead: number
  /** Each host's Xid lines before the run; a host whose kernel log cannot be read is not watched (and noted). */
  baselineXid: Map<string, Set<string>>
}

const namedIn = (st: WatchState, name: string): string => (st.hosts.length > 1 ? ` on ${name}` : '')

async function readXidBaseline(st: WatchState): Promise<void> {
  await Promise.all(
    st.hosts.map(async ({name, host}) => {
      const k = await readKernelLog(host)
      if (k.text === undefined)
        st.notes.push(`the kernel-log Xid condition is not watched${namedIn(st, name)}: ${k.why}`)
      else st.baselineXid.set(name, new Set(xidLines(k.text)))
    }),
  )
}

async function checkRouterHealth(st: WatchState): Promise<void> {
  const limit = st.spec.routerUnhealthySeconds
  if (st.restarting) st.failingSince = undefined
  else if (limit !== undefined) {
    const h = await st.router.liveness().catch((error: unknown) => ({ok: false, error: oneLine(error)}))
    if (h.ok) st.failingSince = undefined
    else {
      st.failingSince ??= now()
      if (now() - st.failingSince > limit * 1000) {
        st.stop(
          `router health failing for ${((now() - st.failingSince) / 1000).toFixed(1)}s ` +
            `(limit ${limit}s): ${(h as {error?: string}).error ?? 'not ok'}`,
        )
      }
    }
  }
}

function checkCollateralLoss(st: WatchState): void {
  const limit = st.spec.collateralLossPercent
  if (limit === undefined || !st.rec || st.rec.observations.length === 0) return
  const v = checkCollateral({
    contract: st.deployment.watchdog,
    calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0},
    observations: st.rec.sorted(),
  })
  const e = v.evidence as {judged: number; lost: unknown[]}
  const pct = e.judged > 0 ? (100 * e.lost.length) / e.judged : 0
  if (e.lost.length > 0 && pct > limit) st.stop(`collateral loss ${pct.toFixed(1)}% above ${limit}%: ${v.summary}`)
}

async function checkNewXid(st: WatchState): Promise<void> {
  if (st.baselineXid.size === 0 || now() - st.lastXidRead < 2000) return
  st.lastXidRead = now()
  await Promise.all(
    st.hosts
      .filter(h => st.baselineXid.has(h.name))
      .map(async ({name, host}) => {
        const k = await readKernelLog(host)
        const fresh = k.text === undefined ? [] : xidLines(k.text).filter(l => !st.baselineXid.get(name)!.has(l))
        if (fresh.length > 0)
          st.stop(`new Xid line in the host's kernel log${namedIn(st, name)}: ${fresh[0]!.trim().slice(0, 200)}`)
      }),
  )
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
  const stop = (reason: string) => {
    if (why !== undefined) return
    why = reason
    opts.say(`STOP: ${reason}`)
    controller.abort(new Error(reason))
  }
  const st: WatchState = {
    deployment,
    hosts,
    spec,
    router: serviceClients(deployment, {timeoutMs: 1000}).router,
    stop,
    notes: [],
    restarting: false,
    lastXidRead: now(),
    baselineXid: new Map(),
  }
  if (spec.kernelXid) await readXidBaseline(st)
  st.lastXidRead = now()
  const intervalMs = opts.intervalMs ?? 500
  let closed = false
  const closing = new AbortController()
  const loop = (async () => {
    // Bounded: at most one day of checks; the run ends long before.
    for (let i = 0; !closed && i < 86_400_000 / intervalMs; i++) {
      try {
        await checkRouterHealth(st)
        checkCollateralLoss(st)
        await checkNewXid(st)
      } catch (error) {
        st.notes.push(`stop-condition check failed once: ${oneLine(error)}`)
      }
      // A sleep that close() cuts short, so closing never waits out an interval.
      await sleep(intervalMs, closing.signal)
    }
  })()
  return {
    signal: controller.signal,
    stop,
    reason: () => why,
    notes: st.notes,
    setRecorder: r => {
      st.rec = r
    },
    setRestarting: on => {
      st.restarting = on
    },
    close: async () => {
      closed = true
      closing.abort()
      await loop
    },
  }
}
