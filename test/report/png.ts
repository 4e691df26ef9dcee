import {inflateSync} from 'node:zlib'

/** A minimal PNG decoder for screenshots (8-bit RGB/RGBA, not interlaced): enough to count colours in a test. */
export interface Image {
  width: number
  height: number
  /** RGB triples, row-major. */
  rgb: Uint8Array
}

export function decodePng(buf: Buffer): Image {
  if (buf.subarray(0, 8).toString('hex') !== '89504e470d0a1a0a') throw new Error('not a PNG')
  let off = 8
  let width = 0
  let height = 0
  let colorType = -1
  const idat: Buffer[] = []
  while (off < buf.length) {
    const len = buf.readUInt32BE(off)
    const type = buf.subarray(off + 4, off + 8).toString('latin1')
    const data = buf.subarray(off + 8, off + 8 + len)
    if (type === 'IHDR') {
      width = data.readUInt32BE(0)
      height = data.readUInt32BE(4)
      const depth = data[8]
      colorType = data[9]
      if (depth !== 8 || (colorType !== 2 && colorType !== 6) || data[12] !== 0)
        throw new Error(`unsupported PNG: depth ${depth}, colour type ${colorType}, interlace ${data[12]}`)
    } else if (type === 'IDAT') {
      idat.push(data)
    } else if (type === 'IEND') {
      break
    }
    off += 12 + len
  }
  const bpp = colorType === 6 ? 4 : 3
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * bpp
  const out = new Uint8Array(width * height * bpp)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const row = y * stride
    for (let i = 0; i < stride; i++) {
      const a = i >= bpp ? out[row + i - bpp] : 0
      const b = y > 0 ? out[row - stride + i] : 0
      const c = i >= bpp && y > 0 ? out[row - stride + i - bpp] : 0
      let v: number
      switch (filter) {
        case 0:
          v = line[i]
          break
        case 1:
          v = line[i] + a
          break
        case 2:
          v = line[i] + b
          break
        case 3:
          v = line[i] + ((a + b) >> 1)
          break
        case 4: {
          const p = a + b - c
          const pa = Math.abs(p - a)
          const pb = Math.abs(p - b)
          const pc = Math.abs(p - c)
          v = line[i] + (pa <= pb && pa <= pc ? a : pb <= pc ? b : c)
          break
        }
        default:
          throw new Error(`bad PNG filter ${filter} on row ${y}`)
      }
      out[row + i] = v & 0xff
    }
  }
  if (bpp === 3) return {width, height, rgb: out}
  const rgb = new Uint8Array(width * height * 3)
  for (let p = 0; p < width * height; p++) {
    rgb[p * 3] = out[p * 4]
    rgb[p * 3 + 1] = out[p * 4 + 1]
    rgb[p * 3 + 2] = out[p * 4 + 2]
  }
  return {width, height, rgb}
}

export function distinctColours(img: Image): number {
  const seen = new Set<number>()
  for (let p = 0; p < img.rgb.length; p += 3) seen.add((img.rgb[p] << 16) | (img.rgb[p + 1] << 8) | img.rgb[p + 2])
  return seen.size
}

/** Pixels close to a colour (each channel within tol). */
export function pixelsNear(img: Image, [r, g, b]: [number, number, number], tol = 24): number {
  let n = 0
  for (let p = 0; p < img.rgb.length; p += 3) {
    if (Math.abs(img.rgb[p] - r) <= tol && Math.abs(img.rgb[p + 1] - g) <= tol && Math.abs(img.rgb[p + 2] - b) <= tol)
      n++
  }
  return n
}

/** Share of pixels that are not (near) white. */
export function inkShare(img: Image): number {
  let n = 0
  for (let p = 0; p < img.rgb.length; p += 3) if (img.rgb[p] < 235 || img.rgb[p + 1] < 235 || img.rgb[p + 2] < 235) n++
  return n / (img.width * img.height)
}
