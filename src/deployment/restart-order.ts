import {type PlacementIssue, pathText, type Role, type ServiceEntry} from './placement-checks.js'

/**
 * The co-restart's order as the deployment file may state it (`restartOrder:`): each service named once, as messages
 * name it (prefill[1], decode, router), the router last. SGLang starts prefill and decode in either order and the
 * gateway last, once every worker is healthy (it waits for healthy workers at start); a file with several instances
 * says which goes first (a canary instance, a node whose drain is slow). Pure: the schema (file-schema.ts) turns each
 * finding into an issue at its path, the model (model.ts) holds the order as paths.
 */

/** A reference to services: a role (every instance of it, in the file's order) or one instance, role[i]. */
const RESTART_REF = /^(prefill|decode|router)(?:\[(\d{1,4})\])?$/

/** The entries a reference names, or why it names none. */
function resolveRef(ref: string, entries: ServiceEntry[]): ServiceEntry[] | string {
  const m = RESTART_REF.exec(ref)
  if (!m)
    return (
      `${JSON.stringify(ref)} is not a service: name one as prefill, decode or router, or one instance as ` +
      `prefill[1]`
    )
  const role = m[1] as Role
  const ofRole = entries.filter(e => e.role === role)
  if (m[2] === undefined) return ofRole
  const i = Number(m[2])
  if (i < ofRole.length) return [ofRole[i]!]
  const known = ofRole.map((_, k) => `${role}[${k}]`).join(', ')
  return `no ${role}[${i}]: the file has ${ofRole.length} ${role} instance${ofRole.length === 1 ? '' : 's'} (${known})`
}

/** What is wrong with the stated order (empty: nothing). */
export function restartOrderIssues(order: string[], entries: ServiceEntry[]): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  const namedAt = new Map<ServiceEntry, number>()
  for (const [k, ref] of order.entries()) {
    const named = resolveRef(ref, entries)
    if (typeof named === 'string') {
      issues.push({path: ['restartOrder', k], message: named})
      continue
    }
    for (const e of named) {
      const first = namedAt.get(e)
      if (first === undefined) namedAt.set(e, k)
      else
        issues.push({
          path: ['restartOrder', k],
          message: `${pathText(e.path)} is already named at restartOrder[${first}]: each service restarts once`,
        })
    }
  }
  if (issues.length > 0) return issues
  const missing = entries.filter(e => !namedAt.has(e)).map(e => pathText(e.path))
  if (missing.length > 0)
    issues.push({
      path: ['restartOrder'],
      message: `leaves out ${missing.join(', ')}: a co-restart restarts every service, so name each once`,
    })
  const routerAt = [...namedAt.entries()].find(([e]) => e.role === 'router')?.[1]
  if (routerAt !== undefined && routerAt !== order.length - 1) {
    issues.push({
      path: ['restartOrder', routerAt],
      message:
        'the router restarts last, once every prefill and decode instance is healthy (the gateway waits for ' +
        'healthy workers): move it to the end',
    })
  }
  return issues
}

/**
 * The order as service paths (services.prefill[1]), every service once: the stated order (already checked), or by
 * default the file's own: the prefill instances, then the decode instances, then the router.
 */
export function restartOrderPaths(order: string[] | undefined, entries: ServiceEntry[]): string[] {
  if (order === undefined) return entries.map(e => pathText(e.path))
  return order.flatMap(ref => {
    const named = resolveRef(ref, entries)
    return typeof named === 'string' ? [] : named.map(e => pathText(e.path))
  })
}
