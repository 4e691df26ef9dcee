/**
 * The twin's stand-in for RDMA WRITEs on the TCP data path: framed chunks on one persistent TCP connection per
 * prefill->decode rank pair. Header (20 bytes, big-endian): type u8 | room u64 | prefill rank u16 | chunk u32 |
 * isLast u8 | length u32, then `length` payload bytes. Types: KV chunk, AUX (after the last KV chunk; its arrival is
 * decode's notification). The WRITE is one-sided: prefill completes it when the peer's transport has the bytes. What
 * flows back is only a receipt (8 bytes, big-endian: the bytes of the connection the peer's process has read so far),
 * a cheap proof of that; without one (a stopped peer, a dead path) prefill asks its kernel (tcp-acked.ts).
 */
export const FrameType = {kv: 1, aux: 2} as const
export const HEADER_BYTES = 20
export const CHUNK_BYTES = 256 * 1024
export const AUX_BYTES = 64

/** Shared zero payload: the bytes' content never matters, only that they have to cross the wire. */
const ZERO = Buffer.alloc(CHUNK_BYTES)

export interface FrameHeader {
  type: number
  room: bigint
  prefillRank: number
  chunk: number
  isLast: boolean
  length: number
}

export function header(h: FrameHeader): Buffer {
  const b = Buffer.allocUnsafe(HEADER_BYTES)
  b.writeUInt8(h.type, 0)
  b.writeBigUInt64BE(h.room, 1)
  b.writeUInt16BE(h.prefillRank, 9)
  b.writeUInt32BE(h.chunk, 11)
  b.writeUInt8(h.isLast ? 1 : 0, 15)
  b.writeUInt32BE(h.length, 16)
  return b
}

export const payload = (length: number): Buffer => ZERO.subarray(0, length)

/** Splits the KV bytes of one request into chunk frames, followed by the AUX frame. */
export function* kvFrames(room: bigint, prefillRank: number, bytes: number): Generator<Buffer> {
  const chunks = Math.max(1, Math.ceil(bytes / CHUNK_BYTES))
  for (let c = 0; c < chunks; c++) {
    const len = Math.min(CHUNK_BYTES, bytes - c * CHUNK_BYTES)
    const size = Math.max(0, len)
    yield header({type: FrameType.kv, room, prefillRank, chunk: c, isLast: c === chunks - 1, length: size})
    if (size > 0) yield payload(size)
  }
  yield header({type: FrameType.aux, room, prefillRank, chunk: 0, isLast: true, length: AUX_BYTES})
  yield payload(AUX_BYTES)
}

/**
 * Incremental reader: calls onFrame once a frame's payload has fully arrived (payload bytes are skipped, not copied).
 */
export class FrameReader {
  private head: Buffer = Buffer.alloc(0)
  private current: FrameHeader | undefined
  private remaining = 0

  constructor(private readonly onFrame: (h: FrameHeader) => void) {}

  push(data: Buffer): void {
    let off = 0
    while (off < data.length) {
      if (this.current) {
        const take = Math.min(this.remaining, data.length - off)
        this.remaining -= take
        off += take
        if (this.remaining === 0) this.finish()
        continue
      }
      const need = HEADER_BYTES - this.head.length
      const take = Math.min(need, data.length - off)
      this.head =
        this.head.length === 0 && take === HEADER_BYTES
          ? data.subarray(off, off + take)
          : Buffer.concat([this.head, data.subarray(off, off + take)])
      off += take
      if (this.head.length < HEADER_BYTES) continue
      const b = this.head
      this.current = {
        type: b.readUInt8(0),
        room: b.readBigUInt64BE(1),
        prefillRank: b.readUInt16BE(9),
        chunk: b.readUInt32BE(11),
        isLast: b.readUInt8(15) === 1,
        length: b.readUInt32BE(16),
      }
      this.head = Buffer.alloc(0)
      this.remaining = this.current.length
      if (this.remaining === 0) this.finish()
    }
  }

  private finish(): void {
    const h = this.current!
    this.current = undefined
    this.onFrame(h)
  }
}

export const RECEIPT_BYTES = 8

/** Decode's receipt: how many bytes of this connection its process has read. */
export function receipt(total: number): Buffer {
  const b = Buffer.allocUnsafe(RECEIPT_BYTES)
  b.writeBigUInt64BE(BigInt(total), 0)
  return b
}

/** Prefill's side: the latest receipt of a connection, from a stream of 8-byte records in any slicing. */
export class ReceiptReader {
  private partial: Buffer = Buffer.alloc(0)
  latest = 0

  push(data: Buffer): void {
    const b = this.partial.length === 0 ? data : Buffer.concat([this.partial, data])
    const whole = b.length - (b.length % RECEIPT_BYTES)
    if (whole > 0) this.latest = Math.max(this.latest, Number(b.readBigUInt64BE(whole - RECEIPT_BYTES)))
    this.partial = Buffer.from(b.subarray(whole))
  }
}
