import {homedir} from 'node:os'
import {join} from 'node:path'

/**
 * The twin's default state dir: $PDCHAOS_SIM_DIR, else $XDG_STATE_HOME/pdchaos/sim, else ~/.local/state/pdchaos/sim.
 */
export function defaultSimDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.PDCHAOS_SIM_DIR) return env.PDCHAOS_SIM_DIR
  const base = env.XDG_STATE_HOME || join(homedir(), '.local', 'state')
  return join(base, 'pdchaos', 'sim')
}

/**
 * The deployment's stateDir on the host, as a path pdchaos may use: absolute, normalised (no . or .. segment, no
 * doubled or trailing slash), not / and without control characters. Undefined when it may; otherwise why not.
 * The host-side scripts then check who owns it and who can write it (faults/lease/host-safety.ts).
 */
export function stateDirProblem(dir: string): string | undefined {
  if (typeof dir !== 'string' || !dir.startsWith('/')) return 'is not an absolute path'
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(dir)) return 'contains a control character'
  if (dir === '/' || /^\/+$/.test(dir)) return 'is the root directory'
  if (dir.endsWith('/') || dir.includes('//')) return 'is not normalised (a doubled or trailing slash)'
  if (dir.split('/').some(seg => seg === '.' || seg === '..')) return 'has a . or .. segment'
  return undefined
}
