import {writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {stringify} from 'yaml'

import {type Deployment, DeploymentSchema, type DeploymentInput} from '../../deployment/config.js'
import {type SimConfig, simPaths} from '../sim-config.js'
import {endpoints} from './files.js'
import type {Service} from './lock.js'

/**
 * The CLI entry an operator's restart command runs: bin/run.js when pdchaos runs compiled, bin/dev.js
 * when it runs from its TypeScript sources (no dist/ to run then).
 */
export function cliEntry(moduleUrl: string = import.meta.url): string {
  const fromSource = moduleUrl.endsWith('.ts')
  return fileURLToPath(new URL(`../../../bin/${fromSource ? 'dev.js' : 'run.js'}`, moduleUrl))
}

export function restartArgv(stateDir: string, service: Service): string[] {
  return [process.execPath, cliEntry(), 'sim', 'restart', service, '--state-dir', stateDir]
}

/** The deployment file for a twin, validated by the same schema pdchaos reads deployments with. */
export function twinDeployment(config: SimConfig): Deployment {
  const e = endpoints(config)
  const p = simPaths(config.stateDir)
  const input: DeploymentInput = {
    version: 1,
    name: 'pdchaos-twin',
    labels: {environment: 'twin'},
    host: {kind: 'local'},
    stateDir: join(config.stateDir, 'host-state'),
    services: {
      prefill: {url: e.prefill, healthPath: '/health', bootstrapPort: config.ports.bootstrap, restart: restartArgv(config.stateDir, 'prefill'), logs: {file: p.log('prefill')}},
      decode: {url: e.decode, healthPath: '/health', restart: restartArgv(config.stateDir, 'decode'), logs: {file: p.log('decode')}},
      router: {url: e.router, healthPath: '/health', readinessPath: '/readiness', metricsUrl: e.routerMetrics, restart: restartArgv(config.stateDir, 'router'), logs: {file: p.log('router')}},
    },
    backend: config.backend,
    // A real host has nvidia-smi on its PATH; the twin's stand-in lives in its state dir.
    tools: {nvidiaSmi: join(p.bin, 'nvidia-smi')},
    watchdog: {scope: config.watchdog.scope, deadlineSeconds: config.watchdog.deadlineS, pollSeconds: config.watchdog.pollS},
    sglangVersion: config.version,
  }
  return DeploymentSchema.parse(input)
}

export function writeDeploymentFile(config: SimConfig): string {
  const file = simPaths(config.stateDir).deploymentFile
  const header = `# Written by \`pdchaos sim up\` for the twin in ${config.stateDir}. Rewritten on every up.\n`
  writeFileSync(file, header + stringify(twinDeployment(config)))
  return file
}
