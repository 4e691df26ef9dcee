import {execFile, spawn} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parse} from 'yaml'

import {fromSimError} from '../../src/cli/twin.js'
import {DeploymentSchema} from '../../src/deployment/config.js'
import {PdError} from '../../src/errors.js'
import {simDown} from '../../src/sim/lifecycle/down.js'
import {readLock} from '../../src/sim/lifecycle/lock.js'
import {gpuUuid} from '../../src/sim/lifecycle/nvidia-smi.js'
import {probeBind} from '../../src/sim/lifecycle/ports.js'
import {procStart, stopGroup} from '../../src/sim/lifecycle/procs.js'
import {simRestart} from '../../src/sim/lifecycle/restart.js'
import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {simStatus} from '../../src/sim/lifecycle/status.js'
import {simUp, type SimUpResult} from '../../src/sim/lifecycle/up.js'
import {simPaths} from '../../src/sim/sim-config.js'
import {freeBasePort, pidsMentioning, post, readLines, sleep, sweep, upOnFreePorts} from './lifecycle-helpers.js'

/** The twin's lifecycle with its real processes: T1's servers and ranks, the router, ZMQ and TCP on loopback. */

const repo = fileURLToPath(new URL('../../', import.meta.url))
function cli(args: string[]): Promise<{code: number; stdout: string; stderr: string}> {
  return new Promise(resolve => {
    execFile(
      process.execPath,
      [join(repo, 'bin', 'dev.js'), ...args],
      {timeout: 60_000, env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1'}},
      (error, stdout, stderr) => {
        resolve({code: error ? (typeof error.code === 'number' ? error.code : 1) : 0, stdout, stderr})
      },
    )
  })
}

const alive = (pid: number): boolean => procStart(pid) !== undefined

describe('twin lifecycle (8 ranks)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-twin-'))
  const otherDir = mkdtempSync(join(tmpdir(), 'pdchaos-test-twin-other-'))
  let up: SimUpResult
  const allPids = (): number[] => [...Object.values(up.pids), ...up.rankPids.prefill, ...up.rankPids.decode]

  beforeAll(async () => {
    up = await upOnFreePorts({stateDir: dir, deadlineS: 300, pollS: 1, routerHealthIntervalS: 1, heartbeatIntervalS: 2})
  })

  afterAll(async () => {
    await simDown(dir).catch(() => undefined)
    await simDown(otherDir).catch(() => undefined)
    sweep(dir)
    sweep(otherDir)
    rmSync(dir, {recursive: true, force: true})
    rmSync(otherDir, {recursive: true, force: true})
  })

  it('comes up healthy with 8 rank processes and writes a valid deployment file', () => {
    expect(up.stateDir).toBe(dir)
    expect(up.rankPids.prefill).toHaveLength(4)
    expect(up.rankPids.decode).toHaveLength(4)
    for (const pid of allPids()) expect(alive(pid)).toBe(true)
    const deployment = DeploymentSchema.parse(parse(readFileSync(up.deploymentFile, 'utf8')))
    expect(deployment.services.router.url).toBe(up.endpoints.router)
    expect(deployment.services.prefill.bootstrapPort).toBe(Number(new URL(up.endpoints.bootstrap).port))
    const titles = up.rankPids.prefill.map(pid => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0])
    expect(titles).toEqual([
      'sglang::scheduler_TP0',
      'sglang::scheduler_TP1',
      'sglang::scheduler_TP2',
      'sglang::scheduler_TP3',
    ])
    // The router shows sgl-model-gateway's launch command, retry and breaker flags at upstream's defaults included.
    const gateway = readFileSync(`/proc/${up.pids.router}/cmdline`, 'utf8').split('\0')[0]
    expect(gateway).toMatch(
      new RegExp(
        `^sgl-model-gateway --pd-disaggregation ` +
          `--prefill ${up.endpoints.prefill} ${new URL(up.endpoints.bootstrap).port} --decode ${up.endpoints.decode} `,
      ),
    )
    for (const flag of [
      '--retry-max-retries 5 ',
      '--retry-initial-backoff-ms 50 ',
      '--retry-backoff-multiplier 1.5 ',
      '--retry-jitter-factor 0.2 ',
      '--cb-failure-threshold 10 ',
      '--cb-success-threshold 3 ',
      '--cb-timeout-duration-secs 60 ',
    ])
      expect(gateway).toContain(flag)
    expect(gateway).not.toContain('--disable-retries')
  })

  it(
    'serves a request through the router, and the router ground truth has it with the room both ' + 'servers saw',
    async () => {
      const r = await post(up.endpoints.router, {
        rid: 'twin-1',
        text: 'x'.repeat(512),
        sampling_params: {max_new_tokens: 4},
      })
      expect(r.status).toBe(200)
      expect(typeof JSON.parse(r.text).text).toBe('string')
      const answered = readLines(simPaths(dir).truth('router')).find(l => l.rid === 'twin-1' && l.event === 'answered')
      expect(answered).toMatchObject({status: 200, prefillStatus: 200, decodeStatus: 200})
      const room = answered!.room as string
      expect(readLines(simPaths(dir).truth('prefill')).some(l => l.rid === 'twin-1' && String(l.room) === room)).toBe(
        true,
      )
      expect(readLines(simPaths(dir).truth('decode')).some(l => l.rid === 'twin-1' && String(l.room) === room)).toBe(
        true,
      )
    },
  )

  it(
    'puts the nvidia-smi stand-in and SGLang variables in the services environment, and maps every rank pid to ' +
      'its GPU',
    async () => {
      const env = readFileSync(`/proc/${up.rankPids.prefill[0]}/environ`, 'utf8').split('\0')
      expect(env.find(e => e.startsWith('PATH='))).toMatch(new RegExp(`^PATH=${simPaths(dir).bin}:`))
      expect(env).toContain('SGLANG_DISAGGREGATION_WATCHDOG_TIMEOUT=300')
      expect(env).toContain('SGLANG_DISAGGREGATION_TRANSFER_BACKEND=nixl')
      const out = await new Promise<string>((resolve, reject) =>
        execFile(
          join(simPaths(dir).bin, 'nvidia-smi'),
          ['--query-compute-apps=pid,gpu_uuid', '--format=csv,noheader'],
          (e, so) => (e ? reject(e) : resolve(so)),
        ),
      )
      const map = new Map(
        out
          .trim()
          .split('\n')
          .map(l => l.split(', '))
          .map(([pid, uuid]) => [Number(pid), uuid]),
      )
      for (const [k, pid] of up.rankPids.prefill.entries()) expect(map.get(pid)).toBe(gpuUuid(dir, k))
      for (const [k, pid] of up.rankPids.decode.entries()) expect(map.get(pid)).toBe(gpuUuid(dir, 4 + k))
      expect(map.size).toBe(8)
    },
  )

  it('status shows every service running and healthy, with ranks and GPUs', async () => {
    const s = await simStatus(dir)
    expect(s.running).toBe(true)
    expect(s.services.map(x => [x.service, x.running, x.health])).toEqual([
      ['prefill', true, 200],
      ['decode', true, 200],
      ['router', true, 200],
    ])
    expect(s.services[0].ranks.map(r => r.gpu)).toEqual([0, 1, 2, 3])
    expect(s.gpus.filter(g => g.pid !== null)).toHaveLength(8)
  })

  it(
    'a second up on the same state dir is refused with exit 2 and the down suggestion, and leaves the twin as ' +
      'it was',
    async () => {
      const raw = await simUp({stateDir: dir, basePort: 21_000}).catch((e: unknown) => e)
      expect(raw).toBeInstanceOf(SimError)
      expect((raw as SimError).kind).toBe('bad-input')
      const err = fromSimError(raw) // as the CLI reports it
      expect(err).toBeInstanceOf(PdError)
      expect((err as PdError).exitCode).toBe(2)
      expect((err as PdError).suggestion).toBe(`pdchaos sim down --state-dir ${dir}`)
      // Through the CLI too, with --json: one JSON document on stdout, exit 2.
      const r = await cli(['sim', 'up', '--state-dir', dir, '--json'])
      expect(r.code).toBe(2)
      expect(JSON.parse(r.stdout).error).toMatchObject({code: 'E_INPUT', exitCode: 2})
      for (const pid of allPids()) expect(alive(pid)).toBe(true)
      expect(readLock(dir)?.services.prefill?.pid).toBe(up.pids.prefill)
    },
  )

  it('up on ports in use is refused with exit 2 naming the port and its holder, and starts nothing', async () => {
    const base = Number(new URL(up.endpoints.router).port)
    const raw = await simUp({stateDir: otherDir, basePort: base}).catch((e: unknown) => e)
    expect(raw).toBeInstanceOf(SimError)
    expect((raw as SimError).kind).toBe('bad-input')
    const err = fromSimError(raw) // as the CLI reports it
    expect(err).toBeInstanceOf(PdError)
    expect((err as PdError).exitCode).toBe(2)
    expect((err as PdError).message).toContain(`port ${base} (router)`)
    expect((err as PdError).message).toContain(`pid ${up.pids.router}`)
    expect(pidsMentioning(otherDir)).toEqual([])
    expect(existsSync(simPaths(otherDir).lock)).toBe(false)
  })

  it(
    'retries a prefill failure through the router with the same rid and a new room (sgl-model-gateway ' +
      'retries 500)',
    async () => {
      // SIGSTOP decode rank 0: the request cannot complete its KV handshake/transfer, so prefill holds it.
      const stopped = up.rankPids.decode[0]
      process.kill(stopped, 'SIGSTOP')
      let continued = false
      try {
        const pending = post(
          up.endpoints.router,
          {rid: 'twin-abort', text: 'y'.repeat(256), sampling_params: {max_new_tokens: 2}},
          45_000,
        )
        await sleep(700)
        const abort = (url: string) =>
          fetch(url + '/abort_request', {
            method: 'POST',
            body: JSON.stringify({rid: 'twin-abort'}),
            headers: {'content-type': 'application/json'},
          })
        expect((await abort(up.endpoints.prefill)).status).toBe(200)
        // Prefill has answered 500: the router drops decode and ends the attempt at once (pd_router/dispatch.rs), then
        // retries it with a new room. Release decode and abort its side, as SGLang's own abort test does.
        await sleep(300)
        const first = readLines(simPaths(dir).truth('router')).find(
          l => l.rid === 'twin-abort' && l.event === 'attempt',
        )
        expect(first).toMatchObject({attempt: 0, prefillStatus: 500, decodeStatus: null})
        process.kill(stopped, 'SIGCONT')
        continued = true
        expect((await abort(up.endpoints.decode)).status).toBe(200)
        const r = await pending
        expect(r.status).toBe(200)
        const router = readLines(simPaths(dir).truth('router')).filter(l => l.rid === 'twin-abort')
        const attempts = router.filter(l => l.event === 'attempt')
        expect(attempts.length).toBeGreaterThanOrEqual(2)
        expect(attempts[0]).toMatchObject({attempt: 0, prefillStatus: 500})
        expect([500, 502]).toContain(attempts[0].status)
        expect(attempts.at(-1)).toMatchObject({status: 200})
        const rooms = router.filter(l => l.event === 'sent').map(l => l.room)
        expect(new Set(rooms).size).toBe(rooms.length)
        // Prefill saw the same rid under each room the router sent.
        const prefillRooms = new Set(
          readLines(simPaths(dir).truth('prefill'))
            .filter(l => l.rid === 'twin-abort')
            .map(l => String(l.room)),
        )
        for (const room of rooms) expect(prefillRooms.has(room as string)).toBe(true)
        expect(router.find(l => l.event === 'answered')).toMatchObject({status: 200, attempts: attempts.length})
      } finally {
        if (!continued) process.kill(stopped, 'SIGCONT')
      }
    },
  )

  it(
    'answers 503 once the prefill is down and unhealthy; restart brings it back on new rank ports and requests ' +
      'succeed',
    async () => {
      const before = JSON.parse(readFileSync(simPaths(dir).service('prefill'), 'utf8')) as {
        rankPorts: Array<{zmqPort: number}>
      }
      const lock = readLock(dir)!
      expect(await stopGroup(lock.services.prefill!)).toBe(true)
      // The router's own probes (interval 1 s here, failure threshold 3) take the dead prefill out of readiness;
      // liveness stays. Until then an attempt fails at once (connection refused: 502, decode dropped,
      // pd_router/dispatch.rs).
      const notReadyBy = Date.now() + 10_000
      let readiness = 200
      while (readiness === 200 && Date.now() < notReadyBy) {
        await sleep(200)
        readiness = (await fetch(up.endpoints.router + '/readiness')).status
      }
      expect(readiness).toBe(503)
      // Out of rotation: every attempt finds no available prefill worker (503, retryable, nothing sent).
      const down = await post(
        up.endpoints.router,
        {rid: 'twin-noprefill', text: 'z', sampling_params: {max_new_tokens: 1}},
        50_000,
      )
      expect(down.status).toBe(503)
      expect(JSON.parse(down.text).error).toMatchObject({code: 'server_selection_failed'})
      const attempts = readLines(simPaths(dir).truth('router')).filter(
        l => l.rid === 'twin-noprefill' && l.event === 'attempt',
      )
      expect(attempts).toHaveLength(5)
      expect(
        attempts.every(a => Number(a.status) === 503),
        JSON.stringify(attempts),
      ).toBe(true)
      expect((await fetch(up.endpoints.router + '/liveness')).status).toBe(200)
      const metrics = await fetch(up.endpoints.routerMetrics).then(r => r.text())
      expect(metrics).toContain(`smg_worker_health{worker="${up.endpoints.prefill}"} 0`)
      expect(metrics).toMatch(/smg_router_request_errors_total\{error_type="503",route="\/generate"\} [1-9]/)
      expect(metrics).toMatch(/smg_worker_retries_total\{endpoint="generate",worker_type="prefill"\} [1-9]/)

      const r = await simRestart(dir, 'prefill')
      expect(r.previousPid).toBe(up.pids.prefill)
      expect(r.pid).not.toBe(up.pids.prefill)
      expect(r.rankPids).toHaveLength(4)
      const oldPorts = before.rankPorts.map(p => p.zmqPort)
      expect(r.rankPorts.map(p => p.zmqPort)).not.toEqual(oldPorts)
      for (const pid of up.rankPids.prefill) expect(alive(pid)).toBe(false)
      up.pids.prefill = r.pid
      up.rankPids.prefill = r.rankPids
      // Decode still holds the old rank ports until its heartbeat sees the new bootstrap instance (the #36029 fix);
      // a request sent before that would be pinned on prefill, as in SGLang. Wait for decode to notice.
      const until = Date.now() + 15_000
      while (
        !readFileSync(simPaths(dir).log('decode'), 'utf8').includes('Lost connection with prefill instance') &&
        Date.now() < until
      )
        await sleep(100)
      expect(readFileSync(simPaths(dir).log('decode'), 'utf8')).toContain('Lost connection with prefill instance')
      // The router routes to prefill again once its probes see it healthy (2 good probes): until then it answers 503.
      const readyBy = Date.now() + 15_000
      while ((await fetch(up.endpoints.router + '/readiness')).status !== 200 && Date.now() < readyBy) await sleep(200)
      const ok = await post(
        up.endpoints.router,
        {rid: 'twin-after-prefill', text: 'hello', sampling_params: {max_new_tokens: 2}},
        30_000,
      )
      expect(ok.status).toBe(200)
    },
  )

  it('restarts decode and the router with new pids on the same ports', async () => {
    for (const service of ['decode', 'router'] as const) {
      const r = await simRestart(dir, service)
      expect(r.previousPid).toBe(up.pids[service])
      expect(alive(up.pids[service])).toBe(false)
      expect(alive(r.pid)).toBe(true)
      up.pids[service] = r.pid
      if (service === 'decode') up.rankPids.decode = r.rankPids
    }
    const ok = await post(
      up.endpoints.router,
      {rid: 'twin-after-all', text: 'hello', sampling_params: {max_new_tokens: 2}},
      30_000,
    )
    expect(ok.status).toBe(200)
    const s = await cli(['sim', 'status', '--state-dir', dir, '--json'])
    expect(s.code).toBe(0)
    expect(JSON.parse(s.stdout).services.map((x: {pid: number}) => x.pid)).toEqual([
      up.pids.prefill,
      up.pids.decode,
      up.pids.router,
    ])
  })

  it('down stops every process (even SIGSTOPped ones) and frees every port; a second down is a no-op', async () => {
    const pids = allPids()
    process.kill(up.rankPids.decode[1], 'SIGSTOP')
    process.kill(up.pids.prefill, 'SIGSTOP')
    const r = await cli(['sim', 'down', '--state-dir', dir, '--json'])
    expect(r.code).toBe(0)
    expect(
      JSON.parse(r.stdout)
        .stopped.map((s: {service: string}) => s.service)
        .sort(),
    ).toEqual(['decode', 'prefill', 'router'])
    for (const pid of pids) expect(alive(pid)).toBe(false)
    expect(pidsMentioning(dir)).toEqual([])
    for (const url of Object.values(up.endpoints))
      expect(await probeBind('127.0.0.1', Number(new URL(url).port))).toBeUndefined()
    expect(existsSync(simPaths(dir).lock)).toBe(false)
    const again = await simDown(dir)
    expect(again.wasRunning).toBe(false)
  })
})

describe('twin lifecycle failures', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-twin-fail-'))
  afterAll(async () => {
    await simDown(dir).catch(() => undefined)
    sweep(dir)
    rmSync(dir, {recursive: true, force: true})
  })

  it(
    'a twin that is not healthy by the deadline gives exit 5 naming the service, and nothing is left ' + 'running',
    async () => {
      const raw = await upOnFreePorts({stateDir: dir, gpus: 2, prefillTp: 1, decodeTp: 1, waitS: 0.3}).catch(
        (e: unknown) => e,
      )
      expect(raw).toBeInstanceOf(SimError)
      expect((raw as SimError).kind).toBe('unavailable')
      const err = fromSimError(raw) // as the CLI reports it
      expect(err).toBeInstanceOf(PdError)
      expect((err as PdError).exitCode).toBe(5)
      expect((err as PdError).message).toMatch(/(prefill|decode) did not become healthy in time/)
      expect(pidsMentioning(dir)).toEqual([])
      expect(existsSync(simPaths(dir).lock)).toBe(false)
    },
  )

  it('an up interrupted while starting exits 3 and leaves nothing running', async () => {
    // A state dir of its own: leftovers of the test above must not look like this up's progress.
    const own = join(dir, 'interrupted')
    // Free ports: a port conflict would end the up with exit 2 before the interrupt lands.
    const child = spawn(
      process.execPath,
      [
        join(repo, 'bin', 'dev.js'),
        'sim',
        'up',
        '--state-dir',
        own,
        '--base-port',
        String(await freeBasePort()),
        '--gpus',
        '2',
        '--prefill-tp',
        '1',
        '--decode-tp',
        '1',
      ],
      {stdio: ['ignore', 'ignore', 'pipe']},
    )
    let stderr = ''
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString()
    })
    const exited = new Promise<number | null>(resolve => child.on('exit', code => resolve(code)))
    const until = Date.now() + 20_000
    while (!existsSync(simPaths(own).log('prefill')) && child.exitCode === null && Date.now() < until) await sleep(20)
    child.kill('SIGINT')
    try {
      expect(await exited, stderr).toBe(3)
      expect(pidsMentioning(own)).toEqual([])
      expect(existsSync(simPaths(own).lock)).toBe(false)
    } finally {
      await simDown(own).catch(() => undefined)
      sweep(own)
    }
  })

  it('an invalid flag value through the CLI gives exit 2 and a one-line error with a suggestion', async () => {
    const r = await cli(['sim', 'up', '--state-dir', dir, '--prefill-tp', '6', '--decode-tp', '4'])
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('Error: --prefill-tp 6 + --decode-tp 4 needs 10 GPUs but --gpus is 8')
    expect(r.stderr).toContain('Try this: pass --gpus 10 or smaller TP sizes')
    expect(r.stderr).not.toMatch(/\n\s+at /)
    expect(pidsMentioning(dir)).toEqual([])
  })
})
