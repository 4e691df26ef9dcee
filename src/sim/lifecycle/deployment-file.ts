import {writeFileSync} from 'node:fs'
import {join} from 'node:path'

import {stringify} from 'yaml'

import {type Backend, type SimConfig, servicesHere, simPaths, type WatchdogScope} from '../sim-config.js'
import {packageRootOf} from '../entry.js'
import {endpoints} from './files.js'
import type {Service} from './lock.js'
import {assertOwnDeploymentFile} from './state-marker.js'

/**
 * The CLI entry an operator's restart command runs: bin/run.js when pdchaos runs compiled, bin/dev.js
 * when it runs from its TypeScript sources (no dist/ to run then).
 */
export function cliEntry(moduleUrl: string = import.meta.url): string {
  const fromSource = moduleUrl.endsWith('.ts')
  return join(packageRootOf(moduleUrl), 'bin', fromSource ? 'dev.js' : 'run.js')
}

export function restartArgv(stateDir: string, service: Service): string[] {
  return [process.execPath, cliEntry(), 'sim', 'restart', service, '--state-dir', stateDir]
}

/**
 * Matches the twin watchdog's line for one eviction (server/prefill-scheduler.ts, the line docs/twin.md recommends a
 * watchdog log): its rid and the seconds it held the request, by its own clock.
 */
export const WATCHDOG_LOG_PATTERN =
  String.raw`Disaggregation watchdog evicted request rid='(?<rid>[^']+)'.*` + String.raw` held=(?<held>[0-9.]+)s`

interface TwinService {
  url: string
  healthPath: string
  /** Absent for a service another node of the twin runs (its own node's file has them). */
  restart?: string[]
  logs?: {file: string}
}

/**
 * The deployment file the twin writes for pdchaos (pdchaos.yaml in its state dir): a local host, the services'
 * URLs, restart commands and logs, and the watchdog contract. Every field is filled in and the keys are in the
 * order pdchaos's deployment file lists them, so the file reads like one written by hand.
 */
export interface TwinDeployment {
  version: 1
  name: string
  labels: Record<string, string>
  host: {kind: 'local'}
  sudo: 'never'
  stateDir: string
  services: {
    prefill: TwinService & {bootstrapPort: number}
    decode: TwinService
    router: TwinService & {readinessPath: string; metricsUrl: string}
  }
  backend: Backend
  tools: {nvidiaSmi: string}
  watchdog: {scope: WatchdogScope; deadlineSeconds: number; pollSeconds: number; logPattern: string}
  sglangVersion: string
}

/** The deployment file for a twin. */
export function twinDeployment(config: SimConfig): TwinDeployment {
  const e = endpoints(config)
  const p = simPaths(config.stateDir)
  // A service of this node: how to restart it and where it logs (a service on another node: its URL only).
  const own = (service: Service): {restart?: string[]; logs?: {file: string}} =>
    servicesHere(config).includes(service)
      ? {restart: restartArgv(config.stateDir, service), logs: {file: p.log(service)}}
      : {}
  return {
    version: 1,
    name: 'pdchaos-twin',
    labels: {environment: 'twin'},
    host: {kind: 'local'},
    sudo: 'never',
    stateDir: join(config.stateDir, 'host-state'),
    services: {
      prefill: {url: e.prefill, healthPath: '/health', ...own('prefill'), bootstrapPort: config.ports.bootstrap},
      decode: {url: e.decode, healthPath: '/health', ...own('decode')},
      router: {
        url: e.router,
        healthPath: '/health',
        ...own('router'),
        readinessPath: '/readiness',
        metricsUrl: e.routerMetrics,
      },
    },
    backend: config.backend,
    // A real host has nvidia-smi on its PATH; the twin's stand-in lives in its state dir.
    tools: {nvidiaSmi: join(p.bin, 'nvidia-smi')},
    watchdog: {
      scope: config.watchdog.scope,
      deadlineSeconds: config.watchdog.deadlineS,
      pollSeconds: config.watchdog.pollS,
      logPattern: WATCHDOG_LOG_PATTERN,
    },
    sglangVersion: config.version,
  }
}

/**
 * Writes DIR/pdchaos.yaml; a refusal is a rejected promise. yaml is imported statically: every command that reaches
 * here has already loaded it to read deployment files, and the CLI's bundle shares one copy of it.
 */
export async function writeDeploymentFile(config: SimConfig): Promise<string> {
  const file = simPaths(config.stateDir).deploymentFile
  assertOwnDeploymentFile(file) // never over a deployment file pdchaos did not write (issue 12, S2)
  const header = `# Written by \`pdchaos sim up\` for the twin in ${config.stateDir}. Rewritten on every up.\n`
  writeFileSync(file, header + stringify(twinDeployment(config)))
  return file
}
