import {mkdtempSync, readFileSync, rmSync, statSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, afterEach, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {openHost} from '../../src/hosts/open-host.js'
import {alive, eventually, killAll, marker, pidsMatching} from './proc.js'

describe('LocalHost', () => {
  const host = new LocalHost()
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-local-'))
  const started: number[] = []
  afterEach(() => killAll(started.splice(0)))
  afterAll(() => rmSync(dir, {recursive: true, force: true}))

  it('describes itself and comes from openHost', async () => {
    expect(host.describe()).toBe('local')
    expect((await openHost({kind: 'local'})).describe()).toBe('local')
  })

  it('runs argv without a shell: exit code, stdout, stderr, stdin, env', async () => {
    const res = await host.run(['sh', '-c', 'cat; echo "[$X]"; echo oops >&2; exit 7'], {
      timeoutMs: 5000,
      stdin: 'in\n',
      env: {X: '$HOME; rm -rf /'},
    })
    expect(res).toMatchObject({code: 7, stdout: 'in\n[$HOME; rm -rf /]\n', stderr: 'oops\n'})
    expect(res.durationMs).toBeGreaterThan(0)
    expect((await host.run(['echo', '$(id)'], {timeoutMs: 5000})).stdout).toBe('$(id)\n')
  })

  it('reports a missing program as exit 127, and a signal as signal', async () => {
    expect((await host.run(['/nonexistent/pdchaos-x'], {timeoutMs: 5000})).code).toBe(127)
    const res = await host.run(['sh', '-c', 'kill -TERM $$'], {timeoutMs: 5000})
    expect(res).toMatchObject({code: null, signal: 'SIGTERM'})
  })

  it('survives a command that reads none of a large input, and keeps a large UTF-8 output whole', async () => {
    expect((await host.run(['true'], {timeoutMs: 5000, stdin: 'x'.repeat(4 * 1024 * 1024)})).code).toBe(0)
    // 3 MB of a 3-byte character: pipe chunks split characters, the text must not.
    const text = '€'.repeat(1_000_000)
    const res = await host.run(['cat'], {timeoutMs: 10_000, stdin: text})
    expect(res.code).toBe(0)
    expect(res.stdout === text).toBe(true)
    // An argument list the kernel refuses is a result (126), as a shell would say, not a crash.
    const big = await host.run(['echo', 'x'.repeat(200_000)], {timeoutMs: 5000})
    expect(big).toMatchObject({code: 126, stdout: ''})
    expect(big.stderr).toMatch(/E2BIG/)
  })

  it("a stop (the run's signal) rejects at once with exit 3 and kills the whole process group (issue 28)", async () => {
    const m = marker()
    const stop = new AbortController()
    const running = host
      .run(['sh', '-c', `sleep ${m} & sleep ${m}; wait`], {timeoutMs: 60_000, signal: stop.signal})
      .catch((e: unknown) => e)
    // The shell and its two sleeps (the shell's command line names them too).
    await eventually(() => pidsMatching(`sleep ${m}`).length >= 3, 5000)
    const t0 = performance.now()
    stop.abort('interrupted (SIGINT)')
    const err = await running
    const elapsed = performance.now() - t0
    expect(err).toBeInstanceOf(PdError)
    expect((err as PdError).exitCode).toBe(3)
    expect((err as PdError).message).toMatch(
      /^interrupted \(SIGINT\) during `sh -c .*` on local \(its process group was killed\)/,
    )
    expect(elapsed).toBeLessThan(1000)
    const gone = await eventually(() => pidsMatching(`sleep ${m}`).length === 0, 3000)
    killAll(pidsMatching(`sleep ${m}`))
    expect(gone).toBe(true)
  })

  it('a timeout rejects fast with exit 5 and kills the whole process group', async () => {
    const m = marker()
    const t0 = performance.now()
    const err = await host.run(['sh', '-c', `sleep ${m} & sleep ${m}; wait`], {timeoutMs: 500}).catch((e: unknown) => e)
    const elapsed = performance.now() - t0
    expect(err).toBeInstanceOf(PdError)
    expect((err as PdError).exitCode).toBe(5)
    expect((err as PdError).message).toMatch(/timed out after 500 ms on local/)
    expect(elapsed).toBeLessThan(5000)
    const gone = await eventually(() => pidsMatching(`sleep ${m}`).length === 0, 3000)
    killAll(pidsMatching(`sleep ${m}`))
    expect(gone).toBe(true)
  })

  it('uploads atomically with the mode asked for', async () => {
    const path = join(dir, 'up.bin')
    const content = Buffer.from([0, 1, 2, 255, 10, 39])
    await host.upload(path, content, 0o640)
    expect(readFileSync(path)).toEqual(content)
    expect(statSync(path).mode & 0o777).toBe(0o640)
    await expect(host.upload(join(dir, 'missing-dir', 'x'), 'x')).rejects.toMatchObject({exitCode: 5})
  })

  it('starts a detached process in its own session with its output in the log', async () => {
    const log = join(dir, 'detached.log')
    const {pid} = await host.startDetached(['sh', '-c', 'echo started; exec sleep 30'], {logFile: log})
    started.push(pid)
    expect(alive(pid)).toBe(true)
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1')
    const sid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[3])
    expect(sid).toBe(pid)
    expect(await eventually(() => readFileSync(log, 'utf8') === 'started\n', 3000)).toBe(true)
  })
})
