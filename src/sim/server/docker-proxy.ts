import {spawn} from 'node:child_process'
import {entryArgv, sibling} from '../entry.js'

/**
 * Start docker-proxy (docker-proxy-main) in front of this server: host port → container port. Resolves once it
 * listens, with a function that stops it; it also exits on its own when this process goes away (IPC).
 */
export async function startDockerProxy(
  host: string,
  hostPort: number,
  containerPort: number,
  deadlineMs: number,
): Promise<() => void> {
  const {command, args} = entryArgv(
    sibling(import.meta.url, 'docker-proxy-main'),
    '-proto',
    'tcp',
    '-host-ip',
    host,
    '-host-port',
    String(hostPort),
    '-container-ip',
    host,
    '-container-port',
    String(containerPort),
  )
  const i = args.indexOf('--import')
  if (i >= 0 && args[i + 1] === 'tsx') args[i + 1] = import.meta.resolve('tsx')
  const child = spawn(command, args, {stdio: ['ignore', 'inherit', 'inherit', 'ipc'], env: process.env})
  let timer: NodeJS.Timeout | undefined
  try {
    await new Promise<void>((resolve, reject) => {
      timer = setTimeout(
        () => reject(new Error(`docker-proxy not listening on ${host}:${hostPort} within ${deadlineMs} ms`)),
        deadlineMs,
      )
      child.on('message', (m: {t?: string; message?: string}) =>
        m.t === 'ready' ? resolve() : reject(new Error(`docker-proxy: ${m.message}`)),
      )
      child.once('exit', code => reject(new Error(`docker-proxy exited (code ${code})`)))
    })
  } catch (error) {
    child.kill('SIGKILL')
    throw error
  } finally {
    clearTimeout(timer)
  }
  return () => {
    try {
      child.disconnect()
    } catch {
      /* gone */
    }
    child.kill('SIGTERM')
  }
}
