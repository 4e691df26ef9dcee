import type http from 'node:http'
import type net from 'node:net'

/**
 * What the vLLM twin's processes share: vLLM's log line format, JSON over HTTP, and the side channel's framing
 * (newline-delimited JSON over TCP; upstream's is ZMQ ROUTER/REQ with msgpack, nixl/base_scheduler.py
 * `_nixl_handshake_listener`).
 */

const LEVELS = {DEBUG: 10, INFO: 20, WARNING: 30, ERROR: 40} as const

/**
 * vLLM's `(EngineCore_DP0 pid=N) WARNING 12-04 11:50:00 [file.py:L] message` (vllm/logger.py's format), written only
 * at or above this process's VLLM_LOGGING_LEVEL (vllm/envs.py: default "INFO", upper-cased; vllm/logger.py
 * DEFAULT_LOGGING_CONFIG sets the "vllm" handler and logger to it): DEBUG lines only when it says DEBUG.
 */
export function vlog(proc: string, level: 'INFO' | 'WARNING' | 'ERROR' | 'DEBUG', where: string, msg: string): void {
  const want = (process.env.VLLM_LOGGING_LEVEL ?? 'INFO').toUpperCase()
  if (LEVELS[level] < (LEVELS[want as keyof typeof LEVELS] ?? LEVELS.INFO)) return
  const d = new Date()
  const p = (n: number): string => String(n).padStart(2, '0')
  const ts = `${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`
  const line = `(${proc} pid=${process.pid}) ${level} ${ts} [${where}] ${msg}\n`
  if (level === 'INFO' || level === 'DEBUG') process.stdout.write(line)
  else process.stderr.write(line)
}

export function readBody(req: http.IncomingMessage, limit = 8 << 20): Promise<string> {
  return new Promise((resolve, reject) => {
    let size = 0
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => {
      size += c.length
      if (size > limit) req.destroy(new Error('body too large'))
      else chunks.push(c)
    })
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    req.on('error', reject)
  })
}

export function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  if (res.headersSent || res.destroyed) return
  const text = JSON.stringify(body)
  res.writeHead(status, {'content-type': 'application/json', 'content-length': Buffer.byteLength(text)})
  res.end(text)
}

/** vLLM's OpenAI error body. */
export const errorBody = (message: string, type: string, code: number) => ({error: {message, type, param: null, code}})

/** A newline-delimited JSON message stream over one TCP socket. */
export function onLines(sock: net.Socket, handle: (msg: Record<string, unknown>) => void): void {
  let buf = ''
  sock.setEncoding('utf8')
  sock.on('data', (chunk: string) => {
    buf += chunk
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const line = buf.slice(0, i)
      buf = buf.slice(i + 1)
      try {
        if (line) handle(JSON.parse(line) as Record<string, unknown>)
      } catch {}
    }
  })
}

export const writeLine = (sock: net.Socket, msg: unknown): boolean =>
  !sock.destroyed && sock.write(`${JSON.stringify(msg)}\n`)

/** Tokens of a prompt, roughly as a BPE tokenizer counts English: one per 4 characters, at least one. */
export const promptTokens = (prompt: unknown): number =>
  Math.max(1, Math.ceil((typeof prompt === 'string' ? prompt.length : JSON.stringify(prompt ?? '').length) / 4))

/** Prometheus text for one metric family. */
export function family(
  name: string,
  type: 'gauge' | 'counter',
  help: string,
  samples: Array<[Record<string, string>, number]>,
): string {
  const sample = type === 'counter' ? `${name}_total` : name
  const lines = [`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`]
  for (const [labels, v] of samples) {
    const l = Object.entries(labels)
      .map(([k, x]) => `${k}="${x}"`)
      .join(',')
    lines.push(`${sample}{${l}} ${v}`)
  }
  return `${lines.join('\n')}\n`
}
