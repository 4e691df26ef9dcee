import {existsSync, readdirSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parse as parseYaml} from 'yaml'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {createTestHost, type TestHost} from './test-host.js'

describe('createTestHost with the twin started inside over SSH', () => {
  let host: TestHost

  beforeAll(async () => {
    host = await createTestHost({sshd: true, twin: {deadlineSeconds: 20, pollSeconds: 2}})
  }, 150_000)
  afterAll(async () => {
    await host?.destroy()
  })

  it('sim up ran inside the namespace: endpoints on its address, every twin process inside it', async () => {
    expect(host.twin).toBeDefined()
    for (const url of Object.values(host.twin!.endpoints)) expect(new URL(url).hostname).toBe(host.ssh.host)
    const inside = new Set(await host.netns.pids())
    const services = join(host.stateDir, 'services')
    const recorded: number[] = []
    for (const f of readdirSync(services).filter(n => n.endsWith('.json'))) {
      const s = JSON.parse(readFileSync(join(services, f), 'utf8')) as {pid: number; rankPids?: number[]}
      recorded.push(s.pid, ...(s.rankPids ?? []))
    }
    expect(recorded.length).toBeGreaterThanOrEqual(3)
    expect(recorded.filter(p => !inside.has(p))).toEqual([])
  })

  it('a request through the router reaches the twin from the root side', async () => {
    const res = await fetch(`${host.twin!.endpoints.router}/generate`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({text: 'hello from the root namespace', sampling_params: {max_new_tokens: 4}}),
      signal: AbortSignal.timeout(15_000),
    })
    expect(res.status).toBe(200)
    expect(typeof ((await res.json()) as {text?: unknown}).text).toBe('string')
  })

  it(
    "nvidia-smi resolves over SSH to the twin's stand-in and maps GPUs to rank pids inside the " + 'namespace',
    async () => {
      const r = await host.sshRun(['nvidia-smi', '--query-compute-apps=pid,gpu_uuid', '--format=csv,noheader'])
      expect(r.code).toBe(0)
      const pids = r.stdout
        .trim()
        .split('\n')
        .map(l => Number(l.split(',')[0]))
      expect(pids.length).toBe(8)
      const inside = new Set(await host.netns.pids())
      expect(pids.filter(p => !inside.has(p))).toEqual([])
    },
  )

  it("the deployment file is the twin's, reached over ssh", () => {
    const doc = DeploymentSchema.parse(parseYaml(readFileSync(host.deploymentFile, 'utf8')))
    expect(doc.host).toMatchObject({kind: 'ssh', hostname: host.ssh.host, port: 22, user: 'root'})
    expect(doc.services.router.url).toBe(host.twin!.endpoints.router.replace(/\/$/, ''))
    expect(doc.watchdog).toMatchObject({deadlineSeconds: 20, pollSeconds: 2})
  })

  it('destroy() stops the twin and leaves nothing behind', async () => {
    const inside = await host.netns.pids()
    await host.destroy()
    expect(existsSync(host.dir)).toBe(false)
    const until = Date.now() + 5000
    while (inside.some(p => existsSync(`/proc/${p}`)) && Date.now() < until) await new Promise(r => setTimeout(r, 50))
    expect(inside.filter(p => existsSync(`/proc/${p}`))).toEqual([])
  })
})
