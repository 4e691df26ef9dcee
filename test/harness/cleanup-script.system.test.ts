import {type ChildProcess, execFileSync, spawn} from 'node:child_process'
import {existsSync, mkdirSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {afterAll, describe, expect, it} from 'vitest'

import {NETNS_MARKER_DIR, runCommand} from './netns.js'
import {createTestHost, type TestHost} from './test-host.js'

const script = fileURLToPath(new URL('../../scripts/cleanup-test-hosts.sh', import.meta.url))
const netnsList = (): string => execFileSync('ip', ['netns', 'list'], {encoding: 'utf8'})
const linkExists = (link: string): boolean => {
  try {
    execFileSync('ip', ['link', 'show', link], {stdio: 'ignore'})
    return true
  } catch {
    return false
  }
}
const alive = (pid: number): boolean => existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(readStatus(pid))
const readStatus = (pid: number): string => {
  try {
    return execFileSync('cat', [`/proc/${pid}/status`], {encoding: 'utf8'})
  } catch {
    return ''
  }
}

async function waitDead(pids: number[], ms = 5000): Promise<number[]> {
  const until = Date.now() + ms
  while (pids.some(alive) && Date.now() < until) await new Promise(r => setTimeout(r, 50))
  return pids.filter(alive)
}

describe('scripts/cleanup-test-hosts.sh', () => {
  const hosts: TestHost[] = []
  const children: ChildProcess[] = []
  afterAll(async () => {
    for (const c of children) c.kill('SIGKILL')
    for (const h of hosts) await h.destroy()
  })

  it(
    'removes a forgotten test host (namespace, processes inside, sshd, twin-like processes, temp dir) and ' +
      'nothing else',
    async () => {
      const doomed = await createTestHost({sshd: true})
      const bystander = await createTestHost({sshd: true})
      hosts.push(doomed, bystander)

      // Root-side leftovers a crashed twin would leave: a process with the twin's bin/ on PATH, one naming the
      // state dir on its command line, and a service file listing a node process.
      const twinBin = join(doomed.stateDir, 'bin')
      mkdirSync(join(doomed.stateDir, 'services'), {recursive: true})
      const byEnv = spawn('sleep', ['1000'], {
        stdio: 'ignore',
        env: {...process.env, PATH: `${twinBin}:${process.env.PATH}`},
      })
      const byArg = spawn(process.execPath, ['-e', 'setInterval(()=>{},1000)', doomed.stateDir], {stdio: 'ignore'})
      const byFile = spawn(process.execPath, ['-e', 'setInterval(()=>{},1000)'], {stdio: 'ignore'})
      writeFileSync(
        join(doomed.stateDir, 'services', 'prefill.json'),
        JSON.stringify({role: 'prefill', pid: byFile.pid, rankPids: []}),
      )
      // Must survive: an unrelated process, and the same kinds of leftovers of the other host.
      const unrelated = spawn('sleep', ['1000'], {stdio: 'ignore'})
      const otherTwin = spawn('sleep', ['1000'], {
        stdio: 'ignore',
        env: {...process.env, PATH: `${join(bystander.stateDir, 'bin')}:${process.env.PATH}`},
      })
      children.push(byEnv, byArg, byFile, unrelated, otherTwin)
      const inside = await doomed.netns.pids()
      expect(inside.length).toBeGreaterThan(0) // sshd at least
      const session = doomed.sshRun(['sleep', '1000'], {timeoutMs: 30_000})
      await new Promise(r => setTimeout(r, 300))

      const dry = await runCommand(['bash', script, '--only', doomed.token, '--dry-run'])
      expect(dry.stdout).toMatch(/would remove [1-9]\d* item/)
      expect(netnsList()).toContain(doomed.netns.name)

      const started = Date.now()
      await runCommand(['bash', script, '--only', doomed.token], {timeoutMs: 30_000})
      const tookMs = Date.now() - started
      expect((await session).code).not.toBe(0)

      expect(netnsList()).not.toContain(doomed.netns.name)
      expect(linkExists(doomed.netns.hostLink)).toBe(false)
      expect(existsSync(join(NETNS_MARKER_DIR, `${doomed.netns.name}.json`))).toBe(false)
      expect(existsSync(doomed.dir)).toBe(false)
      expect(await waitDead([...inside, byEnv.pid!, byArg.pid!, byFile.pid!])).toEqual([])

      expect(alive(unrelated.pid!)).toBe(true)
      expect(alive(otherTwin.pid!)).toBe(true)
      expect(netnsList()).toContain(bystander.netns.name)
      expect(existsSync(bystander.dir)).toBe(true)
      expect((await bystander.sshRun(['true'])).code).toBe(0)
      expect(tookMs).toBeLessThan(15_000)

      // Idempotent: a second run finds nothing and succeeds; destroy() after the script is harmless.
      const again = await runCommand(['bash', script, '--only', doomed.token, '--dry-run'])
      expect(again.stdout).toContain('would remove 0 item')
      await doomed.destroy()
    },
  )

  it('rejects a malformed --only and unknown arguments with exit 2, touching nothing', async () => {
    expect((await runCommand(['bash', script, '--only', '../x'], {reject: false})).code).toBe(2)
    expect((await runCommand(['bash', script, '--bogus'], {reject: false})).code).toBe(2)
  })
})
