import {randomBytes} from 'node:crypto'

const I64_MAX = (1n << 63n) - 1n

/** A bootstrap room as sgl-model-gateway makes it: a random u64 masked to i64::MAX (63 bits, never negative). */
export function randomRoom(): bigint {
  return randomBytes(8).readBigUInt64BE() & I64_MAX
}
