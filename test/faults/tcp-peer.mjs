// Test peer for packet-filter mechanism tests (plain node, no deps).
//   server PORT        echo server; prints "listening <port>"
//   pinger HOST PORT one connection; sends "ping N" every 50 ms; prints "connected <localPort>" then "pong N" per echo
import net from 'node:net'

const [mode, a, b] = process.argv.slice(2)
const out = line => process.stdout.write(line + '\n')
if (mode === 'server') {
  const srv = net.createServer(s => {
    s.on('data', d => s.write(d))
    s.on('error', () => {})
  })
  srv.listen(Number(a), '0.0.0.0', () => out(`listening ${srv.address().port}`))
} else if (mode === 'pinger') {
  const s = net.createConnection({host: a, port: Number(b)}, () => {
    out(`connected ${s.localPort}`)
    let n = 0
    setInterval(() => s.write(`ping ${n++}\n`), 50)
  })
  let buf = ''
  s.on('data', d => {
    buf += d
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      out(buf.slice(0, i).replace('ping', 'pong'))
      buf = buf.slice(i + 1)
    }
  })
  s.on('error', e => {
    out(`error ${e.code}`)
    process.exit(1)
  })
} else {
  process.exit(2)
}
// Never outlive the test: exit when stdin closes (the parent died or closed it).
process.stdin.on('end', () => process.exit(0)).resume()
