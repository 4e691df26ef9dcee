import {createServer, connect} from 'node:net'

/**
 * docker-proxy, as Docker runs one per published port: `docker-proxy -proto tcp -host-ip H -host-port P -container-ip C
 * -container-port Q`, listening on the host port and piping each connection to the container's. The twin starts it
 * (`sim up --docker-proxy`) as a child of the server it fronts over IPC, and it exits when that channel goes away.
 */
const argv = process.argv.slice(2)
const val = (flag: string) => argv[argv.indexOf(`-${flag}`) + 1]
const hostIp = val('host-ip')
const hostPort = Number(val('host-port'))
const containerIp = val('container-ip')
const containerPort = Number(val('container-port'))
if (!hostIp || !containerIp || !Number.isInteger(hostPort) || !Number.isInteger(containerPort) || !process.send) {
  process.stderr.write(
    'usage: docker-proxy-main -proto tcp -host-ip H -host-port P -container-ip C -container-port Q (with an IPC ' +
      'channel)\n',
  )
  process.exit(2)
}
process.title =
  `docker-proxy -proto tcp -host-ip ${hostIp} -host-port ${hostPort} -container-ip ${containerIp} ` +
  `-container-port ${containerPort}`

const server = createServer(client => {
  const upstream = connect(containerPort, containerIp)
  client.pipe(upstream).pipe(client)
  const close = () => {
    client.destroy()
    upstream.destroy()
  }
  client.on('error', close)
  upstream.on('error', close)
  client.on('close', close)
  upstream.on('close', close)
})
process.on('disconnect', () => process.exit(0))
process.on('SIGTERM', () => process.exit(0))
server.once('error', err => {
  try {
    process.send!({t: 'fatal', message: String(err)})
  } catch {
    /* parent gone */
  }
  process.exit(1)
})
server.listen(hostPort, hostIp, () => {
  try {
    process.send!({t: 'ready'})
  } catch {
    /* parent gone */
  }
})
