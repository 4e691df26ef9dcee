import {hostname, userInfo} from 'node:os'
import {resolve} from 'node:path'

import {oneLine, PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import type {HaltHost} from '../halt/host-halt.js'
import {loadFleet} from '../suite/fleet-file.js'
import type {EngineTargetFlags} from './engine-target.js'
import {closeTarget, everyHostOf, resolveTarget, type TargetFlags} from './target.js'
import {openVllmHost, vllmFileNoStart} from './vllm-hosts.js'

/**
 * `pdchaos halt` and `pdchaos resume` act on every host of a deployment (the same target as every command: -c FILE,
 * --sim) or of every deployment of a fleet file (--fleet), never starting the twin and never probing a service (an
 * outage is when they are needed). A deployment that cannot be reached does not stop the others: each is reported,
 * and the command exits 5 when any failed. An `engine: vllm` file (or --sim --engine vllm) is acted on in its one
 * host's stateDir (cli/vllm-hosts.ts), the same file and checks as SGLang's: its runs poll the same halt file.
 */

export interface DeploymentOutcome<T> {
  deployment: string
  file: string
  hosts?: Array<{name: string; host: string; result: T}>
  error?: string
}

/** user@machine: who halts or resumes. */
export function whoAmI(): string {
  let user: string
  try {
    user = userInfo().username
  } catch {
    // A uid without a passwd entry (a container): named by its uid.
    user = process.env.USER ?? `uid${process.getuid?.() ?? '?'}`
  }
  return `${user}@${hostname()}`
}

export async function onEveryDeployment<T>(
  flags: TargetFlags & Pick<EngineTargetFlags, 'engine'> & {fleet?: string},
  act: (h: HaltHost) => Promise<T>,
  say: (line: string) => void,
): Promise<Array<DeploymentOutcome<T>>> {
  const targets: Array<TargetFlags & Pick<EngineTargetFlags, 'engine'> & {label?: string}> =
    flags.fleet === undefined
      ? [flags]
      : (await loadFleet(resolve(flags.fleet))).entries.map(e => ({
          config: e.deploymentFile,
          sim: false,
          label: e.name,
          ...(flags['accept-new-host-key'] ? {'accept-new-host-key': true} : {}),
        }))
  const outcomes: Array<DeploymentOutcome<T>> = []
  for (const f of targets) {
    try {
      const vllm = await vllmFileNoStart(f)
      if (vllm) {
        outcomes.push(await onVllm(vllm, f, act))
        continue
      }
      const t = await resolveTarget(f, {startTwin: false, command: 'halt'})
      try {
        const hosts = everyHostOf(t).hosts
        const results = await Promise.all(hosts.map(h => act(h)))
        outcomes.push({
          deployment: f.label ?? t.deployment.name,
          file: t.file,
          hosts: hosts.map((h, i) => ({name: h.name, host: h.host.describe(), result: results[i]!})),
        })
      } finally {
        await closeTarget(t)
      }
    } catch (error) {
      // One fleet member unreachable: the others are still acted on.
      if (targets.length === 1) throw error
      say(`${f.label ?? f.config}: ${oneLine(error)}`)
      outcomes.push({deployment: f.label ?? f.config, file: resolve(f.config), error: oneLine(error)})
    }
  }
  return outcomes
}

/** A vLLM deployment: its one host, in the file's stateDir. */
async function onVllm<T>(
  file: string,
  f: TargetFlags & {label?: string},
  act: (h: HaltHost) => Promise<T>,
): Promise<DeploymentOutcome<T>> {
  const h = await openVllmHost(file, f['accept-new-host-key'] ? {acceptNewHostKey: true} : {})
  try {
    const result = await act(h)
    return {
      deployment: f.label ?? h.deployment.name ?? 'vllm',
      file,
      hosts: [{name: h.name, host: h.host.describe(), result}],
    }
  } finally {
    await h.close()
  }
}

/** Exit 5 after reporting, when a fleet member could not be reached. */
export function failedDeployments(outcomes: Array<DeploymentOutcome<unknown>>, what: string): PdError | undefined {
  const failed = outcomes.filter(o => o.error !== undefined)
  if (failed.length === 0) return undefined
  return new PdError(`could not ${what} ${failed.map(o => `${o.deployment} (${o.error})`).join('; ')}`, {
    exit: ExitCode.unreachable,
    suggestion: `run the command again for those once they can be reached`,
  })
}
