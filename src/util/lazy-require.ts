import {createRequire} from 'node:module'

/**
 * A dependency loaded on first use, not at start-up: every pdchaos command pays for what it imports before it parses
 * its flags, and most runs never open an SSH connection or push metrics (a CLI spawn that dies on bad input took
 * 1.1 CPU-s, a third of it ssh2, execa and prom-client). CommonJS packages only: an ES module must be imported
 * lazily with import(), since require() of one fails under tsx (bin/dev.js) when a dependency exports only for import.
 */
export function lazyRequire<T>(id: string): () => T {
  let loaded: T | undefined
  return () => {
    loaded ??= createRequire(import.meta.url)(id) as T
    return loaded
  }
}
