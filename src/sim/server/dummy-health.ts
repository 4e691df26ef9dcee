import {createServer, type Server} from 'node:http'

/**
 * What a node of rank >= 1 serves on its --host/--port instead of the HTTP API: SGLang's
 * `launch_dummy_health_check_server` (utils, started by engine.py `_launch_subprocesses` once the node's schedulers
 * are ready): GET /health and /health_generate answer 200 with an empty body (newer versions add /ping); anything
 * else is FastAPI's 404. It says nothing about the instance: it answers while this node's process lives, which in the
 * twin is while its ranks and its link to node 0 are up (losing either ends the process).
 */
export function createDummyHealthServer(): Server {
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://node').pathname
    const known = path === '/health' || path === '/health_generate' || path === '/ping'
    if (known && req.method === 'GET') {
      res.writeHead(200, {'content-length': '0'}).end()
      return
    }
    const [status, detail] = known ? [405, 'Method Not Allowed'] : [404, 'Not Found']
    res.writeHead(status, {'content-type': 'application/json'}).end(JSON.stringify({detail}))
  })
  // uvicorn's timeout_keep_alive=5 in the upstream server.
  server.keepAliveTimeout = 5000
  return server
}
