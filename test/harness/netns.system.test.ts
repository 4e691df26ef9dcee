import {type ChildProcess, execFileSync} from 'node:child_process'
import {existsSync} from 'node:fs'
import {createServer, connect, type Server} from 'node:net'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createNetns, type Netns, NETNS_MARKER_DIR, runCommand} from './netns.js'

const node = process.execPath

/** A TCP server that answers "pong <tag>" to whatever connects; prints its port once listening. */
const serverScript = (host: string, port: number, tag: string): string =>
  `const s=require('net').createServer(c=>c.end('pong ${tag}\\n'));s.listen(${port},'${host}',()=>console.log(s.address().port))`

/** Start the server inside the namespace and resolve with its port. */
function startInside(ns: Netns, host: string, port: number, tag: string): Promise<{child: ChildProcess; port: number}> {
  const child = ns.exec([node, '-e', serverScript(host, port, tag)], {stdio: ['ignore', 'pipe', 'pipe']})
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server inside did not start within 10 s')), 10_000)
    child.stdout!.once('data', (d: Buffer) => {
      clearTimeout(timer)
      resolve({child, port: Number(d.toString().trim())})
    })
    child.once('exit', code => {
      clearTimeout(timer)
      reject(new Error(`server inside exited ${code}`))
    })
  })
}

/** Connect from the root namespace and read what the server says; rejects with the socket error code. */
function fetchTcp(host: string, port: number, timeoutMs = 3000): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = connect({host, port})
    let data = ''
    sock.setTimeout(timeoutMs, () => {
      sock.destroy()
      reject(Object.assign(new Error('timeout'), {code: 'ETIMEDOUT'}))
    })
    sock.on('data', d => (data += d.toString()))
    sock.on('end', () => resolve(data.trim()))
    sock.on('error', reject)
  })
}

const linkExists = (link: string): boolean => {
  try {
    execFileSync('ip', ['link', 'show', link], {stdio: 'ignore'})
    return true
  } catch {
    return false
  }
}
const netnsList = (): string => execFileSync('ip', ['netns', 'list'], {encoding: 'utf8'})
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe('createNetns', () => {
  let ns: Netns
  const extra: Netns[] = []

  beforeAll(async () => {
    ns = await createNetns()
  })
  afterAll(async () => {
    await ns?.destroy()
    for (const n of extra) await n.destroy()
  })

  it('creates a pdc-* namespace with a veth pair and the 10.231.N.x addresses', async () => {
    expect(ns.name).toMatch(/^pdc-[0-9a-f]{8}$/)
    expect(ns.address).toBe(`10.231.${ns.index}.2`)
    expect(ns.hostAddress).toBe(`10.231.${ns.index}.1`)
    expect(netnsList()).toContain(ns.name)
    expect(linkExists(ns.hostLink)).toBe(true)
    const inside = await ns.run(['ip', '-o', '-4', 'addr', 'show'])
    expect(inside.stdout).toContain(`${ns.address}/24`)
    expect(inside.stdout).toMatch(/\blo\b.*127\.0\.0\.1/)
    expect(existsSync(join(NETNS_MARKER_DIR, `${ns.name}.json`))).toBe(true)
  })

  it('two namespaces get different N, names and links', async () => {
    const other = await createNetns()
    extra.push(other)
    expect(other.name).not.toBe(ns.name)
    expect(other.index).not.toBe(ns.index)
  })

  it('a server inside is reachable from the root side on the namespace address', async () => {
    const {child, port} = await startInside(ns, ns.address, 0, 'inside')
    try {
      expect(await fetchTcp(ns.address, port)).toBe('pong inside')
    } finally {
      child.kill('SIGKILL')
    }
  })

  it("is isolated: the root namespace's 127.0.0.1 is not the namespace's", async () => {
    // A root-side server on loopback: the namespace cannot reach it on its own 127.0.0.1.
    const server: Server = createServer(c => c.end('pong root\n'))
    await new Promise<void>(r => server.listen(0, '127.0.0.1', r))
    const rootPort = (server.address() as {port: number}).port
    try {
      const probe = `require('net').connect(${rootPort},'127.0.0.1').on('connect',()=>{console.log('connected');process.exit(0)}).on('error',e=>{console.log(e.code);process.exit(0)})`
      const inside = await ns.run([node, '-e', probe])
      expect(inside.stdout.trim()).toBe('ECONNREFUSED')
      expect(await fetchTcp('127.0.0.1', rootPort)).toBe('pong root')
      // And the root side reaches the namespace only through its address, not loopback.
      const {child, port} = await startInside(ns, '127.0.0.1', 0, 'loop')
      try {
        const inLoop = await ns.run([
          node,
          '-e',
          `require('net').connect(${port},'127.0.0.1').on('data',d=>{process.stdout.write(d);process.exit(0)})`,
        ])
        expect(inLoop.stdout.trim()).toBe('pong loop')
        await expect(fetchTcp(ns.address, port)).rejects.toMatchObject({code: 'ECONNREFUSED'})
      } finally {
        child.kill('SIGKILL')
      }
    } finally {
      server.close()
    }
  })

  it("iptables rules inside do not touch the root namespace's rules", async () => {
    const rootBefore = (await runCommand(['iptables-save'])).stdout.replace(/^#.*$/gm, '')
    const {child, port} = await startInside(ns, ns.address, 0, 'fw')
    try {
      expect(await fetchTcp(ns.address, port)).toBe('pong fw')
      await ns.run([
        'iptables',
        '-A',
        'INPUT',
        '-p',
        'tcp',
        '--dport',
        String(port),
        '-j',
        'REJECT',
        '--reject-with',
        'tcp-reset',
      ])
      const inside = await ns.run(['iptables', '-S', 'INPUT'])
      expect(inside.stdout).toContain(`--dport ${port}`)
      await expect(fetchTcp(ns.address, port)).rejects.toMatchObject({code: 'ECONNREFUSED'})
      const rootAfter = (await runCommand(['iptables-save'])).stdout.replace(/^#.*$/gm, '')
      expect(rootAfter).toBe(rootBefore)
      expect(rootAfter).not.toContain(`--dport ${port}`)
      await ns.run([
        'iptables',
        '-D',
        'INPUT',
        '-p',
        'tcp',
        '--dport',
        String(port),
        '-j',
        'REJECT',
        '--reject-with',
        'tcp-reset',
      ])
      expect(await fetchTcp(ns.address, port)).toBe('pong fw')
    } finally {
      child.kill('SIGKILL')
    }
  })

  it('run() rejects on a non-zero exit and on its deadline, and returns the code with reject: false', async () => {
    await expect(ns.run(['sh', '-c', 'echo nope >&2; exit 3'])).rejects.toThrow(/exit 3: nope/)
    expect((await ns.run(['sh', '-c', 'exit 4'], {reject: false})).code).toBe(4)
    const started = Date.now()
    await expect(ns.run(['sleep', '30'], {timeoutMs: 300})).rejects.toThrow(/timed out/)
    expect(Date.now() - started).toBeLessThan(5000)
  })

  it(
    'destroy() removes namespace, link, marker and every process inside, even a running one; twice ' + 'is fine',
    async () => {
      const victim = await createNetns()
      const sleeper = victim.exec(['sleep', '1000'], {stdio: 'ignore'})
      const {child: server} = await startInside(victim, victim.address, 0, 'victim')
      // A grandchild detached from our child tree: only the namespace sweep can find it.
      await victim.run(['sh', '-c', 'setsid sleep 1000 >/dev/null 2>&1 < /dev/null &'])
      const inside = await victim.pids()
      expect(inside.length).toBeGreaterThanOrEqual(3)
      await victim.destroy()
      await victim.destroy()
      expect(netnsList()).not.toContain(victim.name)
      expect(linkExists(victim.hostLink)).toBe(false)
      expect(existsSync(join(NETNS_MARKER_DIR, `${victim.name}.json`))).toBe(false)
      // Reaped asynchronously: give the kernel a moment, bounded.
      const deadline = Date.now() + 5000
      while (inside.some(alive) && Date.now() < deadline) await new Promise(r => setTimeout(r, 50))
      expect(inside.filter(alive)).toEqual([])
      expect(sleeper.killed || sleeper.exitCode !== null || sleeper.signalCode !== null).toBe(true)
      expect(server.pid).toBeDefined()
    },
  )

  it('a process that exits (or gets SIGTERM) with namespaces still alive removes them', async () => {
    for (const how of ['exit', 'SIGTERM'] as const) {
      const script = [
        `import {createNetns} from ${JSON.stringify(new URL('./netns.ts', import.meta.url).pathname)}`,
        `const ns = await createNetns()`,
        `ns.exec(['sleep', '1000'], {stdio: 'ignore', detached: true}).unref()`,
        `console.log(ns.name + ' ' + ns.hostLink)`,
        how === 'exit' ? `process.exit(0)` : `setInterval(() => {}, 1000)`,
      ].join('\n')
      const child = (await import('node:child_process')).spawn(
        node,
        ['--import', 'tsx', '--input-type=module', '-e', script],
        {stdio: ['ignore', 'pipe', 'pipe']},
      )
      const line = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('child did not report within 15 s')), 15_000)
        child.stdout!.once('data', (d: Buffer) => {
          clearTimeout(timer)
          resolve(d.toString().trim())
        })
      })
      const [name, hostLink] = line.split(' ') as [string, string]
      expect(netnsList()).toContain(name)
      if (how === 'SIGTERM') child.kill('SIGTERM')
      await new Promise(r => (child.exitCode !== null || child.signalCode !== null ? r(null) : child.once('exit', r)))
      expect(netnsList()).not.toContain(name)
      expect(linkExists(hostLink)).toBe(false)
    }
  })
})
