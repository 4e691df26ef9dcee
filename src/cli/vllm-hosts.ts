import {existsSync} from 'node:fs'
import {resolve} from 'node:path'

import {readEngineField} from '../deployment/engine-field.js'
import {loadVllmDeployment, type VllmDeployment, vllmStateDir} from '../engines/vllm/deployment-file.js'
import {badInput} from '../errors.js'
import type {HaltHost} from '../halt/host-halt.js'
import {openHost} from '../hosts/open-host.js'
import {defaultSimDir} from '../state-dir.js'
import {abortable} from '../util/stop.js'
import {checkEngineFlags, type EngineTargetFlags, vllmSimDir} from './engine-target.js'
import {simStateDir} from './sim-flags.js'

/**
 * The vLLM deployment a command that never starts the twin acts on (`halt`, `resume`, `recover`: they are for outages,
 * and a twin that is not running has nothing to stop or revert), and its one host as the halt and the leases see it:
 * the file's `stateDir` (else /run/pdchaos, where the vLLM faults keep their leases), reached as every vLLM run
 * reaches it (engines/vllm/deployment-file.ts, hosts/open-host.ts). No service is probed.
 */

/**
 * The `engine: vllm` file of -c FILE, of --sim --engine vllm (the vLLM twin's state dir, running or not), or of --sim
 * on a state dir whose file is the vLLM twin's; undefined for an SGLang deployment (the command's own path).
 */
export async function vllmFileNoStart(f: EngineTargetFlags): Promise<string | undefined> {
  checkEngineFlags(f)
  if (!f.sim) {
    const file = resolve(f.config)
    return (await readEngineField(file)) === 'vllm' ? file : undefined
  }
  const dir = simStateDir(f['state-dir'] ?? (f.engine === 'vllm' ? vllmSimDir() : defaultSimDir()))
  const file = resolve(dir, 'pdchaos.yaml')
  if (!existsSync(file)) {
    if (f.engine !== 'vllm') return undefined
    throw badInput(
      `no vLLM twin's deployment file in ${dir}`,
      `start it with \`pdchaos sim up --engine vllm --state-dir ${dir}\`, or give the --state-dir it runs in`,
    )
  }
  const engine = await readEngineField(file)
  if (f.engine !== undefined && f.engine !== engine)
    throw badInput(
      `the twin in ${dir} is the ${engine === 'vllm' ? 'vLLM' : 'SGLang'} twin, not --engine ${f.engine}`,
      `drop --engine, or give the --state-dir of the ${f.engine === 'vllm' ? 'vLLM' : 'SGLang'} twin`,
    )
  return engine === 'vllm' ? file : undefined
}

export interface VllmHost extends HaltHost {
  deployment: VllmDeployment
  file: string
  close(): Promise<void>
}

/** The vLLM file read and its host opened (not yet connected: the first command connects). */
export async function openVllmHost(
  file: string,
  o: {acceptNewHostKey?: boolean; signal?: AbortSignal} = {},
): Promise<VllmHost> {
  const deployment = await loadVllmDeployment(file)
  const opening = openHost(deployment.host, {
    sudo: deployment.sudo,
    ...(o.acceptNewHostKey ? {acceptNewHostKey: true} : {}),
  })
  const host = o.signal ? await abortable(opening, o.signal, 'opening the host') : await opening
  return {
    name: 'host',
    host,
    stateDir: vllmStateDir(deployment),
    deployment,
    file,
    close: () => host.close().catch(() => {}),
  }
}
