import http from 'node:http'

/**
 * One HTTP request over node:http, given up when the socket is idle for timeoutMs (the answers are a few hundred
 * bytes: idle is the whole wait). The twin's ranks use this rather than fetch: fetch loads undici and its WebAssembly
 * parser on first use, which cost each prefill rank about 0.3 CPU-s to start (0.61-0.66 against 0.29 now).
 */
export function httpCall(
  url: string,
  o: {method?: string; body?: string; timeoutMs: number},
): Promise<{status: number; text: string}> {
  return new Promise((resolve, reject) => {
    const headers =
      o.body === undefined ? {} : {'content-type': 'application/json', 'content-length': Buffer.byteLength(o.body)}
    const req = http.request(url, {method: o.method ?? 'GET', headers, timeout: o.timeoutMs}, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => {
        text += d
      })
      res.on('end', () => resolve({status: res.statusCode ?? 0, text}))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url} within ${o.timeoutMs} ms`)))
    req.on('error', reject)
    req.end(o.body)
  })
}

export const isOk = (status: number): boolean => status >= 200 && status < 300
