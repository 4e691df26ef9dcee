import {badInput} from '../errors.js'
import type {SudoPolicy} from './host-spec.js'

/**
 * The one way pdchaos acts on a machine: the GPU host over SSH, or this machine. Faults, discovery and
 * restarts talk to a Host and never know which kind it is, so code proven on the twin runs unchanged
 * against a real SGLang host.
 */

export type {SudoPolicy} from './host-spec.js'

export interface RunOptions {
  /**
   * Deadline for the whole command; on expiry the command (its process group) is killed and run() rejects with exit 5.
   */
  timeoutMs: number
  /** Run privileged: `sudo -n --` when the policy is passwordless and the login user is not root. */
  sudo?: boolean
  stdin?: string | Buffer
  /** Extra environment for the command (passed through `env`, so it needs no sshd AcceptEnv). */
  env?: Record<string, string>
  /** The run's stop (SIGINT): the command's process group is killed at once and run() rejects with exit 3. */
  signal?: AbortSignal
}

export interface RunResult {
  /** Exit status; null when the command died of a signal. A non-zero code is a result, not an error. */
  code: number | null
  signal?: string
  stdout: string
  stderr: string
  durationMs: number
}

export interface UploadOptions {
  sudo?: boolean
  timeoutMs?: number
}

export interface DetachedOptions {
  /** Where stdout and stderr go (appended); /dev/null when absent. */
  logFile?: string
  sudo?: boolean
  env?: Record<string, string>
  timeoutMs?: number
}

export interface Host {
  run(argv: string[], opts: RunOptions): Promise<RunResult>
  /** Write a file atomically (temp file + rename); mode defaults to 0644. */
  upload(path: string, content: string | Buffer, mode?: number, opts?: UploadOptions): Promise<void>
  /** Start a process in its own session (setsid + nohup) that outlives this connection; returns its pid. */
  startDetached(argv: string[], opts?: DetachedOptions): Promise<{pid: number}>
  /** "ssh root@10.231.0.2:22" or "local": for messages and evidence. */
  describe(): string
  close(): Promise<void>
}

/** The argv prefix that makes a command privileged under the deployment's sudo policy. */
export function sudoPrefix(requested: boolean | undefined, policy: SudoPolicy, isRoot: boolean): string[] {
  if (!requested || isRoot || policy !== 'passwordless') return []
  return ['sudo', '-n', '--']
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

/** `env -- K=V ...` in front of argv, so variables reach the command whatever sshd or sudo allow. */
export function envPrefix(env: Record<string, string> | undefined): string[] {
  if (!env) return []
  const pairs = Object.entries(env)
  if (pairs.length === 0) return []
  for (const [k] of pairs) {
    if (!ENV_NAME.test(k))
      throw badInput(
        `invalid environment variable name ${JSON.stringify(k)}`,
        'use letters, digits and _ (not starting with a digit)',
      )
  }
  return ['env', '--', ...pairs.map(([k, v]) => `${k}=${v}`)]
}

/** The full argv a host runs for run(): privilege, then environment, then the command itself. */
export function buildArgv(
  argv: string[],
  opts: {sudo?: boolean; env?: Record<string, string>},
  policy: SudoPolicy,
  isRoot: boolean,
): string[] {
  if (argv.length === 0) throw badInput('an empty command cannot be run', 'give at least the program name')
  return [...sudoPrefix(opts.sudo, policy, isRoot), ...envPrefix(opts.env), ...argv]
}

/** The timeout deadline must be a positive finite number: every wait has one. */
export function checkTimeout(timeoutMs: number): void {
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0)
    throw badInput(`invalid command timeout ${timeoutMs} ms`, 'give a positive timeoutMs')
}

/** Octal mode for chmod, validated. */
export function modeString(mode: number): string {
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777)
    throw badInput(`invalid file mode ${mode}`, 'give a mode between 0 and 0o7777, e.g. 0o644')
  return mode.toString(8).padStart(4, '0')
}

/**
 * Shell scripts the hosts run through `sh -c SCRIPT sh ARGS...`: the script is a constant and every user
 * value arrives as a positional parameter, so nothing user-supplied is ever parsed by the shell.
 */
export const UPLOAD_SCRIPT =
  'umask 077; t="$1.pdchaos-tmp.$$"; cat > "$t" && chmod "$2" "$t" && mv -f "$t" "$1" || { rm -f "$t"; exit 1; }'
export const DETACH_SCRIPT = 'log="$1"; shift; setsid nohup "$@" >>"$log" 2>&1 </dev/null & echo $!'
