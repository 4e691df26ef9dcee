import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import type {Deployment} from './config.js'

/**
 * True when any spelling of the environment label says production: keys and values are compared trimmed and
 * case-insensitively, so `Environment: production` or `environment: " Production "` count too.
 */
export function isProduction(labels: Record<string, string>): boolean {
  return Object.entries(labels).some(([k, v]) => k.trim().toLowerCase() === 'environment' && typeof v === 'string' && v.trim().toLowerCase() === 'production')
}

/** Commands that inject or restart refuse a deployment labelled environment: production unless told otherwise. */
export function assertMayDisturb(deployment: Deployment, allowProduction: boolean, action: string): void {
  if (isProduction(deployment.labels) && !allowProduction) {
    throw new PdError(`refusing to ${action} deployment ${deployment.name}: it is labelled environment: production`, {
      exit: ExitCode.badInput, code: 'E_PRODUCTION',
      suggestion: 'pass --allow-production if you really mean to disturb production',
    })
  }
}
