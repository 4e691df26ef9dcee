/**
 * bootstrap_room is a random 63-bit integer: JSON.parse would round it to a double. These helpers keep it
 * exact: parse turns every `bootstrap_room` number (or array of numbers) into a decimal string before
 * parsing; stringify writes string/bigint rooms back as bare integers, as SGLang and its router expect.
 */

const ROOM_KEY = 'bootstrap_room'

/**
 * Parse a JSON body; every `bootstrap_room` value that is a number (or an array of numbers) becomes a decimal string.
 */
export function parseRoomJson(text: string): unknown {
  return JSON.parse(quoteRooms(text))
}

/** Serialize; `bootstrap_room` values given as decimal strings or bigints are written as bare JSON integers. */
export function stringifyRoomJson(value: unknown): string {
  const tag = `\u0000room${Math.random().toString(36).slice(2)}:`
  const text = JSON.stringify(value, function (this: unknown, key: string, v: unknown) {
    if (typeof v === 'bigint') return `${tag}${v.toString()}`
    if (key === ROOM_KEY) return markRoom(v, tag)
    return v
  })
  // The tag starts with a NUL, which JSON.stringify escapes in any user string, so only our markers match.
  return text.replace(new RegExp(`"${escapeRe(JSON.stringify(tag).slice(1, -1))}(-?\\d+)"`, 'g'), '$1')
}

/**
 * A room as its canonical decimal string, or undefined when absent/null; throws on anything that is not a 64-bit
 * integer.
 */
export function normalizeRoom(value: unknown): string | undefined {
  if (value === undefined || value === null) return undefined
  let big: bigint
  if (typeof value === 'bigint') big = value
  else if (typeof value === 'string' && /^-?\d+$/.test(value.trim())) big = BigInt(value.trim())
  else if (typeof value === 'number' && Number.isSafeInteger(value)) big = BigInt(value)
  else throw new TypeError(`bootstrap_room must be an integer, got ${JSON.stringify(String(value))}`)
  if (big < 0n || big > 0xffff_ffff_ffff_ffffn) throw new TypeError(`bootstrap_room out of range: ${big}`)
  return big.toString()
}

/** A random room as the router draws it: 64 random bits masked to i64::MAX. */
export function randomRoom(): string {
  const hi = BigInt(Math.floor(Math.random() * 0x1_0000_0000))
  const lo = BigInt(Math.floor(Math.random() * 0x1_0000_0000))
  return (((hi << 32n) | lo) & 0x7fff_ffff_ffff_ffffn).toString()
}

function markRoom(v: unknown, tag: string): unknown {
  const one = (x: unknown) =>
    (typeof x === 'string' && /^-?\d+$/.test(x)) || typeof x === 'bigint' ? `${tag}${String(x)}` : x
  return Array.isArray(v) ? v.map(one) : one(v)
}

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

/**
 * Scan JSON text token by token (strings are skipped whole), quoting the numbers that follow a "bootstrap_room" key.
 */
function quoteRooms(text: string): string {
  if (!text.includes(ROOM_KEY)) return text
  let out = ''
  let i = 0
  const n = text.length
  const skipWs = (j: number) => {
    while (j < n && (text[j] === ' ' || text[j] === '\t' || text[j] === '\n' || text[j] === '\r')) j++
    return j
  }
  const numberEnd = (j: number) => {
    while (j < n && /[-+0-9.eE]/.test(text[j]!)) j++
    return j
  }
  while (i < n) {
    const c = text[i]!
    if (c !== '"') {
      out += c
      i++
      continue
    }
    let j = i + 1
    while (j < n && text[j] !== '"') j += text[j] === '\\' ? 2 : 1
    const str = text.slice(i, j + 1)
    out += str
    i = j + 1
    if (str !== `"${ROOM_KEY}"`) continue
    let k = skipWs(i)
    if (text[k] !== ':') continue
    k = skipWs(k + 1)
    out += text.slice(i, k)
    i = k
    if (text[i] === '[') {
      out += '['
      i++
      while (i < n && text[i] !== ']') {
        const s = skipWs(i)
        out += text.slice(i, s)
        i = s
        if (/[-0-9]/.test(text[i] ?? '')) {
          const e = numberEnd(i)
          out += `"${text.slice(i, e)}"`
          i = e
        } else if (text[i] !== ']') {
          out += text[i]
          i++
        }
      }
    } else if (/[-0-9]/.test(text[i] ?? '')) {
      const e = numberEnd(i)
      out += `"${text.slice(i, e)}"`
      i = e
    }
  }
  return out
}
