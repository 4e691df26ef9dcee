import {type ChildProcess, spawn} from 'node:child_process'
import {mkdtempSync, rmSync} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {ensureTool} from './tools.js'

/** Debian's prometheus-pushgateway on 127.0.0.1, a free port and a temp persistence file; stop() removes it all. */
export interface Gateway {
  url: string
  stop(): Promise<void>
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as {port: number}).port
      s.close(() => resolve(port))
    })
  })
}

export async function startPushgateway(): Promise<Gateway> {
  const bin = ensureTool('prometheus-pushgateway', 'prometheus-pushgateway')
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-push-'))
  let log = ''
  // A port picked free can be taken by a neighbour before the gateway binds it: retry with a new one.
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort()
    const url = `http://127.0.0.1:${port}`
    const child: ChildProcess = spawn(
      bin,
      [`--web.listen-address=127.0.0.1:${port}`, `--persistence.file=${join(dir, 'persist')}`],
      {stdio: ['ignore', 'pipe', 'pipe']},
    )
    child.stdout?.on('data', d => (log += d))
    child.stderr?.on('data', d => (log += d))
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline && child.exitCode === null) {
      try {
        if ((await fetch(`${url}/-/ready`, {signal: AbortSignal.timeout(2000)})).status === 200) {
          return {
            url,
            stop: async () => {
              if (child.exitCode === null && child.signalCode === null) {
                const exited = new Promise(r => child.once('exit', r))
                child.kill('SIGTERM')
                await Promise.race([exited, new Promise(r => setTimeout(r, 3000))])
                if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
              }
              rmSync(dir, {recursive: true, force: true})
            },
          }
        }
      } catch {
        /* not up yet */
      }
      await new Promise(r => setTimeout(r, 50))
    }
    child.kill('SIGKILL')
  }
  rmSync(dir, {recursive: true, force: true})
  throw new Error(`the Pushgateway did not become ready: ${log.slice(-500)}`)
}
