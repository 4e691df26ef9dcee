import type {Host} from '../hosts/host.js'

/**
 * What pdchaos itself left on the host: leases of injected faults and the run lock, under the deployment's state dir.
 */

export interface HostState {
  leases: Array<Record<string, unknown> & {file: string}>
  lock: (Record<string, unknown> & {file: string}) | null
}

// A constant script: the state dir arrives as $1, so nothing user-supplied is parsed by the shell. A symlink, or a
// file not owned by the user it runs as (or root), is never read: status must not print what another user pointed
// it at (issue 12, S1; recover names such files, faults/lease/host-safety.ts).
const LIST_SCRIPT =
  'for f in "$1"/leases/*.json "$1"/lock.json; do [ -f "$f" ] && [ ! -L "$f" ] || continue; ' +
  '[ -O "$f" ] || [ "$(ls -ldn -- "$f" | { read -r _ _ u _; echo "$u"; })" = 0 ] || continue; ' +
  'printf "%s\\n" "$f"; cat "$f"; printf "\\n\\036\\n"; done'

export async function listHostState(host: Host, stateDir: string, timeoutMs: number): Promise<HostState> {
  const res = await host.run(['sh', '-c', LIST_SCRIPT, 'sh', stateDir], {timeoutMs, sudo: true})
  if (res.code !== 0) throw new Error(`listing ${stateDir} failed: ${res.stderr.trim()}`)
  const state: HostState = {leases: [], lock: null}
  for (const chunk of res.stdout.split('\n\u001e\n')) {
    const nl = chunk.indexOf('\n')
    if (nl < 0) continue
    const file = chunk.slice(0, nl).trim()
    let body: Record<string, unknown>
    try {
      body = JSON.parse(chunk.slice(nl + 1)) as Record<string, unknown>
    } catch {
      body = {unreadable: true}
    }
    if (file.endsWith('/lock.json')) state.lock = {file, ...body}
    else state.leases.push({file, ...body})
  }
  return state
}
