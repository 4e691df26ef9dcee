import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import type {Deployment} from './config.js'

/** Commands that inject or restart refuse a deployment labelled environment: production unless told otherwise. */
export function assertMayDisturb(deployment: Deployment, allowProduction: boolean, action: string): void {
  const env = deployment.labels.environment
  if (env && env.toLowerCase() === 'production' && !allowProduction) {
    throw new PdError(`refusing to ${action} deployment ${deployment.name}: it is labelled environment: production`, {
      exit: ExitCode.badInput, code: 'E_PRODUCTION',
      suggestion: 'pass --allow-production if you really mean to disturb production',
    })
  }
}
