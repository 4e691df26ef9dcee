import net from 'node:net'

import {badInput} from './sim-error.js'
import {portHolder} from './procs.js'

/** Try to bind host:port and release it: undefined when free, else the errno code. */
export function probeBind(host: string, port: number): Promise<string | undefined> {
  return new Promise(resolve => {
    const s = net.createServer()
    s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'EBIND'))
    s.listen({host, port, exclusive: true}, () => s.close(() => resolve(undefined)))
  })
}

/** Every port must be bindable on host; the first that is not gives bad input naming the port and its holder. */
export async function assertPortsFree(host: string, ports: Record<string, number>, suggestion: string): Promise<void> {
  for (const [name, port] of Object.entries(ports)) {
    const code = await probeBind(host, port)
    if (code === undefined) continue
    if (code === 'EADDRINUSE') {
      const who = portHolder(port)
      throw badInput(`port ${port} (${name}) on ${host} is already in use${who ? ` by ${who}` : ''}`, suggestion)
    }
    if (code === 'EADDRNOTAVAIL')
      throw badInput(
        `cannot bind ${host}: the address is not on this host`,
        'pass --host 127.0.0.1 or an address of this host',
      )
    if (code === 'EACCES')
      throw badInput(`no permission to bind port ${port} (${name}) on ${host}`, 'pass --base-port 30000 or higher')
    throw badInput(`cannot bind port ${port} (${name}) on ${host}: ${code}`, suggestion)
  }
}

/** A free TCP port on host picked by the kernel (tests, benchmark). */
export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, host, () => {
      const port = (s.address() as net.AddressInfo).port
      s.close(() => resolve(port))
    })
  })
}
