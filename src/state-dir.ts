import {homedir} from 'node:os'
import {join} from 'node:path'

/** The twin's default state dir: $PDCHAOS_SIM_DIR, else $XDG_STATE_HOME/pdchaos/sim, else ~/.local/state/pdchaos/sim. */
export function defaultSimDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.PDCHAOS_SIM_DIR) return env.PDCHAOS_SIM_DIR
  const base = env.XDG_STATE_HOME || join(homedir(), '.local', 'state')
  return join(base, 'pdchaos', 'sim')
}
