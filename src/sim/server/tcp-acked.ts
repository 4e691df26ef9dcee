import {readFileSync} from 'node:fs'
import {isIPv4} from 'node:net'
import type * as net from 'node:net'

/**
 * How much of what a TCP socket wrote has the peer's kernel acknowledged? `/proc/net/tcp[6]` lists each socket's
 * tx_queue, which for a connected socket is write_seq - snd_una: bytes handed to the kernel and not yet ACKed.
 * That is the twin's analogue of an RDMA WRITE completing: the remote side's transport (its kernel here, its NIC
 * there) has the bytes, whatever its process is doing. A write callback alone would not do: under a packet filter
 * that drops the connection, the kernel still accepts about 4 MB into the send buffer (measured, docs/twin.md).
 */

/** /proc/net/tcp's address form: the IPv4 address as one little-endian 32-bit word, the port as 4 hex digits. */
export function procTcpEndpoint(address: string, port: number): string | undefined {
  const p = port.toString(16).toUpperCase().padStart(4, '0')
  const v4 = address.startsWith('::ffff:') && isIPv4(address.slice(7)) ? address.slice(7) : address
  if (isIPv4(v4)) {
    const b = v4.split('.').map(Number)
    return `${[b[3], b[2], b[1], b[0]].map(x => x!.toString(16).toUpperCase().padStart(2, '0')).join('')}:${p}`
  }
  const words = expandIPv6(address)
  if (!words) return undefined
  // Four 32-bit words, each in host (little-endian) byte order.
  let out = ''
  for (let w = 0; w < 4; w++) {
    const hi = words[2 * w]!
    const lo = words[2 * w + 1]!
    const bytes = [hi >> 8, hi & 0xff, lo >> 8, lo & 0xff]
    out += bytes
      .reverse()
      .map(x => x.toString(16).toUpperCase().padStart(2, '0'))
      .join('')
  }
  return `${out}:${p}`
}

function expandIPv6(a: string): number[] | undefined {
  const [head, tail] = a.split('::') as [string, string | undefined]
  const parse = (s: string) => (s === '' ? [] : s.split(':').map(x => parseInt(x, 16)))
  const h = parse(head)
  const t = tail === undefined ? [] : parse(tail)
  const fill = 8 - h.length - t.length
  if (fill < 0 || (tail === undefined && fill !== 0)) return undefined
  const words = [...h, ...Array<number>(fill).fill(0), ...t]
  return words.every(w => Number.isInteger(w) && w >= 0 && w <= 0xffff) ? words : undefined
}

/** The tx_queue of one connected socket, or undefined when /proc does not list it (closed, or no procfs). */
export function txQueue(
  sock: Pick<net.Socket, 'localAddress' | 'localPort' | 'remoteAddress' | 'remotePort'>,
  tables: ProcTcpTables = new ProcTcpTables(),
): number | undefined {
  const {localAddress, localPort, remoteAddress, remotePort} = sock
  if (!localAddress || !localPort || !remoteAddress || !remotePort) return undefined
  const local = procTcpEndpoint(localAddress, localPort)
  const remote = procTcpEndpoint(remoteAddress, remotePort)
  if (!local || !remote) return undefined
  const text = tables.read(local.length > 13 ? '/proc/net/tcp6' : '/proc/net/tcp')
  if (text === undefined) return undefined
  const needle = ` ${local} ${remote} `
  const at = text.indexOf(needle)
  if (at < 0) return undefined
  // "sl: local remote st tx_queue:rx_queue ..."
  const rest = text
    .slice(at + needle.length, at + needle.length + 40)
    .trim()
    .split(/\s+/)
  const tx = rest[1]?.split(':')[0]
  return tx === undefined ? undefined : parseInt(tx, 16)
}

/**
 * /proc/net/tcp[6], each read at most once per instance: one check of several connections reads the table once. The
 * kernel writes the whole table on every read, and it grows with every socket of the namespace.
 */
export class ProcTcpTables {
  private readonly texts = new Map<string, string | undefined>()

  read(file: string): string | undefined {
    if (!this.texts.has(file)) {
      let text: string | undefined
      try {
        text = readFileSync(file, 'latin1')
      } catch {
        text = undefined
      }
      this.texts.set(file, text)
    }
    return this.texts.get(file)
  }
}
