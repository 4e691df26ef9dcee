import type {Judgement, MechanismPlan} from '../fault.js'

/**
 * The twin's own failure points (POST /_pdchaos/twin/failpoint on its prefill server), for users who cannot change
 * the host's packet filter. Used only when discovery finds the target is the twin (its server_info says so), and
 * the plan says so. The commands run ON the host like every other mechanism: `node -e` with a constant script and
 * the URL and body as arguments, so the lease's reverter can take the fault out by itself.
 */

export type TwinFailpointName = 'drop-dest-info' | 'stall-kv' | 'refuse-generate'

// argv[1] URL, argv[2] optional JSON body (POST when given). Prints the answer; exit 1 unless 2xx.
const SCRIPT = [
  'const [url, body] = process.argv.slice(1);',
  "fetch(url, {method: body ? 'POST' : 'GET', headers: {'content-type': 'application/json'}, body: body || " +
    'undefined, signal: AbortSignal.timeout(5000)})',
  '.then(async (r) => { process.stdout.write(await r.text()); process.exitCode = r.ok ? 0 : 1 })',
  '.catch((e) => { process.stderr.write(String(e)); process.exitCode = 1 })',
].join(' ')

export const twinFailpointArgv = (url: string, body?: unknown): string[] => [
  'node',
  '-e',
  SCRIPT,
  url,
  ...(body === undefined ? [] : [JSON.stringify(body)]),
]

export type TwinFailpointPlan = MechanismPlan

function judge(name: TwinFailpointName, tpRanks: number[], wantOn: boolean) {
  return (stdout: string, code: number | null): Judgement => {
    let on: number[] = []
    try {
      on = (JSON.parse(stdout) as {failpoints?: Record<string, number[]>}).failpoints?.[name] ?? []
    } catch {
      return {
        ok: false,
        evidence:
          `the twin's failpoint endpoint ` +
          `answered ${code === 0 ? 'no JSON' : `exit ${code}`}: ${stdout.slice(0, 120)}`,
      }
    }
    const ok = tpRanks.every(k => on.includes(k) === wantOn)
    return {ok, evidence: `twin failpoint ${name}: on for TP${on.length ? on.join(',') : ' none'}`}
  }
}

export function buildTwinFailpoint(url: string, name: TwinFailpointName, tpRanks: number[]): TwinFailpointPlan {
  return {
    inject: [twinFailpointArgv(url, {name, enabled: true, tpRanks})],
    // Idempotent: switching a failure point off twice is harmless.
    revert: [twinFailpointArgv(url, {name, enabled: false, tpRanks})],
    verifyInjected: {
      name: `twin failpoint ${name} on`,
      argv: twinFailpointArgv(url),
      sudo: false,
      judge: judge(name, tpRanks, true),
    },
    verifyClean: {
      name: `twin failpoint ${name} off`,
      argv: twinFailpointArgv(url),
      sudo: false,
      judge: judge(name, tpRanks, false),
    },
    readOnlyProbes: [twinFailpointArgv(url)],
    summary: `the twin's own failure point ${name} on prefill TP${tpRanks.join(',')} (${url})`,
  }
}
