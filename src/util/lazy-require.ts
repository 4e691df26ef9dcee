import {createRequire} from 'node:module'

/**
 * A dependency loaded on first use, not at start-up: every pdchaos command pays for what it imports before it parses
 * its flags, and most runs never open an SSH connection, push metrics or draw a spinner (a CLI spawn that dies on bad
 * input took 0.9 CPU-s, a quarter of it ssh2, execa, ora and prom-client). Node >= 20.19 (package.json engines)
 * requires ES modules too.
 */
export function lazyRequire<T>(id: string): () => T {
  let loaded: T | undefined
  return () => {
    loaded ??= createRequire(import.meta.url)(id) as T
    return loaded
  }
}
