import {existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, type Stats, statSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'

import {simPaths} from '../sim-config.js'
import {badInput} from './sim-error.js'

/**
 * Whose directory is this (issue 12, S2)? `sim up` deletes logs/, services/, gpus/ and truth/ and rewrites
 * pdchaos.yaml in its state dir, and `sim down` signals the processes its lock names: both only in a dir pdchaos
 * made for a twin, shown by a marker file `up` writes first. A non-empty dir without it (a project, a home dir) is
 * refused; a deployment file pdchaos did not write is never overwritten; a lock anyone else could have written is
 * never acted on.
 */

export const MARKER = '.pdchaos-twin'
/** The first line of every deployment file the twin writes (deployment-file.ts). */
export const DEPLOYMENT_HEADER = '# Written by `pdchaos sim up`'

const markerOf = (stateDir: string): string => join(stateDir, MARKER)

/** A twin state dir from before the marker: its sim.json was written by `sim up` for this very dir. */
function legacyTwinDir(stateDir: string): boolean {
  try {
    const config = JSON.parse(readFileSync(simPaths(stateDir).config, 'utf8')) as {stateDir?: unknown}
    return config.stateDir === stateDir
  } catch {
    return false
  }
}

/** pdchaos made this dir for a twin (its marker, or a sim.json of its own from before the marker). */
export function isTwinStateDir(stateDir: string): boolean {
  return existsSync(markerOf(stateDir)) || legacyTwinDir(stateDir)
}

/**
 * For `sim up`: create the state dir (0700) with its marker, or accept one that is empty or already a twin's.
 * Anything else is bad input, before a single file in it is touched.
 */
export function claimStateDir(stateDir: string): void {
  if (!existsSync(stateDir)) mkdirSync(stateDir, {recursive: true, mode: 0o700})
  let entries: string[]
  try {
    if (!statSync(stateDir).isDirectory()) throw new Error('not a directory')
    entries = readdirSync(stateDir)
  } catch (error) {
    throw badInput(
      `cannot use --state-dir ${stateDir}: ${(error as Error).message}`,
      'give a new or empty directory for the twin',
    )
  }
  if (entries.length > 0 && !isTwinStateDir(stateDir)) {
    throw badInput(
      `--state-dir ${stateDir} is not empty and is not a twin state dir made by pdchaos (no ${MARKER}): refusing ` +
        `to delete its logs, services, gpus and truth or to overwrite its pdchaos.yaml`,
      'give a new or empty directory (or leave --state-dir out for the default)',
    )
  }
  if (!existsSync(markerOf(stateDir))) {
    writeFileSync(
      markerOf(stateDir),
      'pdchaos twin state dir: made by `pdchaos sim up`, which may delete and rewrite what is in it\n',
      {mode: 0o600},
    )
  }
}

/** Bad input when `file` exists and is not a deployment file the twin wrote. */
export function assertOwnDeploymentFile(file: string): void {
  let head: string
  try {
    head = readFileSync(file, 'utf8').slice(0, DEPLOYMENT_HEADER.length)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return
    throw badInput(`cannot read ${file}: ${(error as Error).message}`, 'give a new or empty --state-dir')
  }
  if (head !== DEPLOYMENT_HEADER) {
    throw badInput(
      `refusing to overwrite ${file}: pdchaos did not write it (it does not begin with "${DEPLOYMENT_HEADER}")`,
      'move that file away, or give the twin a new or empty --state-dir',
    )
  }
}

/**
 * Why a file in the state dir cannot be trusted to name processes to signal, or undefined when it can: a symlink,
 * or owned by another user than this one (or root), or writable by group or others. Checked for the dir too.
 */
export function untrustedBecause(path: string): string | undefined {
  let st: Stats
  try {
    st = lstatSync(path)
  } catch {
    return undefined
  }
  const me = process.geteuid?.() ?? 0
  if (st.isSymbolicLink()) return `${path} is a symbolic link`
  if (st.uid !== me && st.uid !== 0) return `${path} is owned by uid ${st.uid}, not by uid ${me} or root`
  if ((st.mode & 0o022) !== 0)
    return `${path} can be written by group or others (mode ${(st.mode & 0o777).toString(8)})`
  return undefined
}
