/**
 * What the deployment file's shape cannot say about where services run: every host name a service gives must be one
 * of `hosts:`, every named host must run something, `host:` and `hosts:` exclude each other, and each instance has its
 * own URL (and each prefill its own bootstrap address). Pure: the schema (file-schema.ts) turns each finding into an
 * issue at its path, so it prints as one line like any other schema error.
 */

export type Role = 'prefill' | 'decode' | 'router'

/** One service as the file states it, wherever it sits (a single object or an element of a list). */
export interface ServiceEntry {
  role: Role
  /** Its path in the file: ['services', 'decode', 1] for a list element, ['services', 'decode'] for a single object. */
  path: (string | number)[]
  url: string
  host?: string
  nodes?: string[]
  bootstrapPort?: number
}

export interface PlacementInput {
  /** The file has a top-level `host:` (one host, every service on it). */
  hasHost: boolean
  /** The names of `hosts:`, when the file has it. */
  hostNames?: string[]
  /** Each role is a single object and there is no `hosts:`: the file as pdchaos has always read it. */
  legacy: boolean
  entries: ServiceEntry[]
}

export interface PlacementIssue {
  path: (string | number)[]
  message: string
}

/** A path as the schema's own errors print it: services.decode[1].host. */
export function pathText(path: (string | number)[]): string {
  return path.map((p, i) => (typeof p === 'number' ? `[${p}]` : i === 0 ? p : `.${p}`)).join('')
}

export function placementIssues(input: PlacementInput): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  const {hasHost, hostNames} = input
  if (hasHost && hostNames !== undefined) {
    // Which host would a service without host: run on? Neither reading is safe to guess, so neither is taken.
    issues.push({
      path: ['hosts'],
      message:
        'give host: (one host, every service on it) or hosts: (named hosts, each service naming its own), not both',
    })
    return issues
  }
  if (!hasHost && hostNames === undefined) {
    issues.push({
      path: ['host'],
      message:
        'required: host: (the one host every service runs on) or hosts: (named hosts, each service naming its own ' +
        'with host: NAME)',
    })
    return issues
  }
  if (hostNames === undefined) issues.push(...singleHostIssues(input.entries))
  else issues.push(...namedHostIssues(hostNames, input.entries))
  // A file as pdchaos has always read it keeps loading as it did (test fixtures point all three services at one
  // server).
  if (!input.legacy) issues.push(...duplicateUrls(input.entries), ...duplicateBootstrapAddresses(input.entries))
  return issues
}

/** With top-level host: there are no names to refer to: a service that names a host is a mistake, not a default. */
function singleHostIssues(entries: ServiceEntry[]): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  for (const e of entries) {
    if (e.host !== undefined) {
      issues.push({
        path: [...e.path, 'host'],
        message:
          `no host named ${JSON.stringify(e.host)}: this file has no hosts: map (with top-level host:, ` +
          `every service runs on that host; leave host: out)`,
      })
    }
    if (e.nodes !== undefined) {
      issues.push({
        path: [...e.path, 'nodes'],
        message:
          'a multi-node instance names its nodes from hosts:, and this file has top-level host: (one host) instead',
      })
    }
  }
  return issues
}

function namedHostIssues(hostNames: string[], entries: ServiceEntry[]): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  if (hostNames.length === 0) return [{path: ['hosts'], message: 'name at least one host'}]
  const known = new Set(hostNames)
  const knownText = `(known: ${hostNames.join(', ')})`
  const unknown = (name: string) => `no host named ${JSON.stringify(name)} in hosts ${knownText}`
  const used = new Set<string>()
  for (const e of entries) {
    if (e.host !== undefined && e.nodes !== undefined) {
      issues.push({
        path: e.path,
        message: 'give host: (a single-node instance) or nodes: (one host per --node-rank, rank 0 first), not both',
      })
      continue
    }
    if (e.host === undefined && e.nodes === undefined) {
      const how =
        e.role === 'router'
          ? 'name the host it runs on'
          : 'name the host it runs on (or nodes: for a multi-node instance)'
      issues.push({path: [...e.path, 'host'], message: `required with hosts: ${how} ${knownText}`})
      continue
    }
    if (e.host !== undefined) {
      used.add(e.host)
      if (!known.has(e.host)) issues.push({path: [...e.path, 'host'], message: unknown(e.host)})
    }
    for (const [rank, node] of (e.nodes ?? []).entries()) {
      used.add(node)
      if (!known.has(node)) issues.push({path: [...e.path, 'nodes', rank], message: unknown(node)})
      else if (e.nodes!.indexOf(node) < rank)
        issues.push({
          path: [...e.path, 'nodes', rank],
          message: `${node} is node rank ${e.nodes!.indexOf(node)} already: each node rank runs on a host of its own`,
        })
    }
  }
  // A named host no service runs on is most likely a typo elsewhere (decode put on gpu-a, meant for gpu-b).
  for (const name of hostNames) {
    if (!used.has(name))
      issues.push({
        path: ['hosts', name],
        message: "no service runs on this host: name it in a service's host: or nodes:, or remove it",
      })
  }
  return issues
}

/** The URL as a client reaches it: scheme, host and port (default ports dropped), path without its trailing slash. */
function urlKey(url: string): string {
  try {
    const u = new URL(url)
    return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, '')}`
  } catch {
    return url
  }
}

/**
 * An instance is known by its URL (to the gateway, in status, in a pin's pair): two services on one URL are one
 * service.
 */
function duplicateUrls(entries: ServiceEntry[]): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  const seen = new Map<string, ServiceEntry>()
  for (const e of entries) {
    const key = urlKey(e.url)
    const first = seen.get(key)
    if (first)
      issues.push({
        path: [...e.path, 'url'],
        message: `${e.url} is already ${pathText(first.path)}.url: each service has its own URL`,
      })
    else seen.set(key, e)
  }
  return issues
}

/** Decode finds a prefill's bootstrap server by the prefill URL's host and bootstrapPort (the gateway sends both). */
function duplicateBootstrapAddresses(entries: ServiceEntry[]): PlacementIssue[] {
  const issues: PlacementIssue[] = []
  const seen = new Map<string, ServiceEntry>()
  for (const e of entries) {
    if (e.role !== 'prefill' || e.bootstrapPort === undefined) continue
    let hostname: string
    try {
      hostname = new URL(e.url).hostname
    } catch {
      continue
    }
    const key = `${hostname}:${e.bootstrapPort}`
    const first = seen.get(key)
    if (first)
      issues.push({
        path: [...e.path, 'bootstrapPort'],
        message:
          `${key} is already the bootstrap address of ${pathText(first.path)}: decode tells prefill ` +
          `instances apart by URL host and bootstrap port`,
      })
    else seen.set(key, e)
  }
  return issues
}
