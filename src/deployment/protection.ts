import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import type {Deployment} from './config.js'

/**
 * A label as a person reads it: Unicode NFKC (full-width letters become ASCII), invisible format characters removed
 * (zero-width space, joiners, the BOM, soft hyphen, bidi marks), case folded, trimmed. The guard compares labels this
 * way so that nothing a reader would take for "production" gets past it.
 */
export function normalizeLabel(text: string): string {
  return text
    .normalize('NFKC')
    .replace(/[\p{Cf}\u180E\u115F\u1160\u3164\uFFA0]/gu, '')
    .toLowerCase()
    .trim()
}

/**
 * True when any spelling of the environment label says production: keys and values are compared normalized
 * (normalizeLabel), so `Environment: production`, `environment: " Production "`, a zero-width space after it or
 * full-width letters count too.
 */
export function isProduction(labels: Record<string, string>): boolean {
  return Object.entries(labels).some(
    ([k, v]) => normalizeLabel(k) === 'environment' && typeof v === 'string' && normalizeLabel(v) === 'production',
  )
}

/** Commands that inject or restart refuse a deployment labelled environment: production unless told otherwise. */
export function assertMayDisturb(deployment: Deployment, allowProduction: boolean, action: string): void {
  if (isProduction(deployment.labels) && !allowProduction) {
    throw new PdError(`refusing to ${action} deployment ${deployment.name}: it is labelled environment: production`, {
      exit: ExitCode.badInput,
      code: 'E_PRODUCTION',
      suggestion: 'pass --allow-production if you really mean to disturb production',
    })
  }
}
