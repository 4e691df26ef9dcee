import {execFileSync, spawn, spawnSync} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync, existsSync} from 'node:fs'
import net from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'
import {parse, stringify} from 'yaml'

import {fromSimError} from '../../src/cli/twin.js'
import {DeploymentSchema} from '../../src/deployment/config.js'
import {PdError} from '../../src/errors.js'
import {acquireLock, readLock, removeLock} from '../../src/sim/lifecycle/lock.js'
import {gpuUuid, writeNvidiaSmi} from '../../src/sim/lifecycle/nvidia-smi.js'
import {buildSimConfig, portsFor} from '../../src/sim/lifecycle/options.js'
import {assertPortsFree} from '../../src/sim/lifecycle/ports.js'
import {isSameProcess, refOf, spawnDetached, stopGroup} from '../../src/sim/lifecycle/procs.js'
import {twinDeployment, WATCHDOG_LOG_PATTERN, writeDeploymentFile} from '../../src/sim/lifecycle/deployment-file.js'
import {watchdogLogLine} from '../../src/sim/server/prefill-scheduler.js'
import {serviceEnvFor} from '../../src/sim/lifecycle/services.js'
import {simDown} from '../../src/sim/lifecycle/down.js'
import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {eventually} from '../hosts/proc.js'

const dirs: string[] = []
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'pdchaos-test-units-'))
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) rmSync(d, {recursive: true, force: true})
})

function expectBadInput(fn: () => unknown, text: RegExp): void {
  try {
    fn()
  } catch (raw) {
    // The twin's own error, which the CLI turns into its PdError.
    expect(raw).toBeInstanceOf(SimError)
    expect((raw as SimError).kind).toBe('bad-input')
    const error = fromSimError(raw)
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(2)
    expect((error as PdError).message).toMatch(text)
    expect((error as PdError).suggestion).toBeTruthy()
    return
  }
  throw new Error('expected bad input')
}

describe('twin errors as the CLI reports them', () => {
  it('keeps message, suggestion and cause, with the exit code of the kind', () => {
    const cause = new Error('underneath')
    const cases: Array<[SimError, number, string]> = [
      [new SimError('bad-input', 'a', {suggestion: 'x'}), 2, 'E_INPUT'],
      [new SimError('unavailable', 'b', {suggestion: 'y', cause}), 5, 'E_UNREACHABLE'],
      [new SimError('cleanup-unverified', 'c', {suggestion: 'z'}), 4, 'E_CLEANUP'],
    ]
    for (const [sim, exit, code] of cases) {
      const pd = fromSimError(sim) as PdError
      expect(pd).toBeInstanceOf(PdError)
      expect([pd.exitCode, pd.code, pd.message, pd.suggestion, pd.cause]).toEqual([
        exit,
        code,
        sim.message,
        sim.suggestion,
        sim.cause,
      ])
    }
    const other = new Error('not the twin')
    expect(fromSimError(other)).toBe(other)
  })
})

describe('sim up options', () => {
  it('defaults to 8 GPUs, TP 4 + 4, nixl, watchdog all, SGLang timeouts and the fixture port layout', () => {
    const c = buildSimConfig({stateDir: '/tmp/x'})
    expect(c).toMatchObject({gpus: 8, prefillTp: 4, decodeTp: 4, backend: 'nixl', host: '127.0.0.1', bugs: []})
    expect(c.watchdog.scope).toBe('all')
    expect(c.timeouts).toEqual({bootstrapS: 300, waitingS: 300, heartbeatIntervalS: 5, heartbeatMaxFailure: 2})
    expect(c.ports).toEqual({router: 30_000, prefill: 30_100, decode: 30_200, bootstrap: 30_500, routerMetrics: 30_900})
    expect(portsFor(21_000).bootstrap).toBe(21_500)
  })

  it('refuses bad values with exit 2, naming the flag', () => {
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', gpus: 6}), /needs 8 GPUs but --gpus is 6/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', prefillTp: 0}), /--prefill-tp/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', deadlineS: 0}), /--deadline/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', watchdogLateMs: -1}), /--watchdog-late-ms/)
    expect(buildSimConfig({stateDir: '/tmp/x', watchdogLateMs: 250}).watchdog).toEqual({
      scope: 'all',
      deadlineS: 60,
      pollS: 1,
      lateMs: 250,
    })
    expect(buildSimConfig({stateDir: '/tmp/x'}).watchdog).toEqual({scope: 'all', deadlineS: 60, pollS: 1})
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', pollS: -1}), /--poll/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', pollS: Number.NaN}), /--poll/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', basePort: 65_000}), /--base-port/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', host: 'localhost'}), /--host/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', bugs: ['nope']}), /--bug "nope"/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', heartbeatIntervalS: 1}), /at least 2 seconds/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', heartbeatMaxFailure: 0}), /--heartbeat-max-failure/)
    expectBadInput(() => buildSimConfig({stateDir: '/tmp/x', waitS: 0}), /--wait/)
  })
})

describe('ports', () => {
  it('names the port in use and the process that holds it', async () => {
    const s = net.createServer()
    await new Promise<void>(r => s.listen(0, '127.0.0.1', r))
    const port = (s.address() as net.AddressInfo).port
    try {
      await assertPortsFree('127.0.0.1', {decode: port}, 'x').then(
        () => {
          throw new Error('expected a port error')
        },
        (raw: unknown) => {
          const error = fromSimError(raw) as PdError
          expect(error.exitCode).toBe(2)
          expect(error.message).toContain(`port ${port} (decode)`)
          expect(error.message).toContain(`pid ${process.pid}`)
        },
      )
    } finally {
      s.close()
    }
  })
})

describe('deployment file', () => {
  it('is valid under DeploymentSchema and carries the restart commands, logs and watchdog contract', async () => {
    const dir = tmp()
    const c = buildSimConfig({stateDir: dir, deadlineS: 12, pollS: 0.5, basePort: 41_000, backend: 'mooncake'})
    const file = await writeDeploymentFile(c)
    const text = readFileSync(file, 'utf8')
    const parsed = DeploymentSchema.parse(parse(text))
    expect(parsed).toEqual(twinDeployment(c))
    // The schema reads it back to the very same document, key for key: the file is what the schema would write.
    expect(text).toBe(
      `# Written by \`pdchaos sim up\` for the twin in ${dir}. Rewritten on every up.\n` + stringify(parsed),
    )
    expect(parsed.host).toEqual({kind: 'local'})
    expect(parsed.labels).toEqual({environment: 'twin'})
    expect(parsed.backend).toBe('mooncake')
    expect(parsed.watchdog).toEqual({
      scope: 'all',
      deadlineSeconds: 12,
      pollSeconds: 0.5,
      logPattern: WATCHDOG_LOG_PATTERN,
    })
    // The pattern reads the rid and the held seconds from the twin watchdog's own line.
    const line =
      `[2026-12-01 ` +
      `18:00:02] ${watchdogLogLine({rid: 'pdchaos-pin-a1', room: '77', queue: 'inflight', state: 'KVPoll.Transferring', heldS: 12.3456, deadlineS: 12, scope: 'all'})}`
    expect(new RegExp(parsed.watchdog.logPattern!).exec(line)?.groups).toEqual({rid: 'pdchaos-pin-a1', held: '12.346'})
    expect(parsed.services.prefill).toMatchObject({
      url: 'http://127.0.0.1:41100',
      bootstrapPort: 41_500,
      logs: {file: join(dir, 'logs', 'prefill.log')},
    })
    expect(parsed.services.router.metricsUrl).toBe('http://127.0.0.1:41900/metrics')
    const restart = parsed.services.decode.restart!
    expect(restart.slice(2)).toEqual(['sim', 'restart', 'decode', '--state-dir', dir])
    expect(existsSync(restart[1])).toBe(true)
  })
})

describe("decode's own waiting timeout", () => {
  it("--decode-waiting-timeout sets SGLANG_DISAGGREGATION_WAITING_TIMEOUT in decode's environment only", () => {
    const c = buildSimConfig({stateDir: tmp(), waitingTimeoutS: 600, decodeWaitingTimeoutS: 1.75})
    expect(serviceEnvFor(c, 'decode', {}).SGLANG_DISAGGREGATION_WAITING_TIMEOUT).toBe('1.75')
    expect(serviceEnvFor(c, 'prefill', {}).SGLANG_DISAGGREGATION_WAITING_TIMEOUT).toBe('600')
    expect(
      serviceEnvFor(buildSimConfig({stateDir: tmp(), waitingTimeoutS: 30}), 'decode', {})
        .SGLANG_DISAGGREGATION_WAITING_TIMEOUT,
    ).toBe('30')
    expect(() => buildSimConfig({stateDir: tmp(), decodeWaitingTimeoutS: 0})).toThrow(
      /--decode-waiting-timeout must be a number of seconds greater than 0/,
    )
  })
})

describe('nvidia-smi stand-in', () => {
  const dir = tmp()
  writeNvidiaSmi(dir, 8)
  const smi = join(dir, 'bin', 'nvidia-smi')
  const run = (...args: string[]) => spawnSync(smi, args, {encoding: 'utf8', timeout: 10_000})

  it('lists GPUs in CSV with stable uuids', () => {
    const r = run('--query-gpu=index,uuid,name', '--format=csv')
    expect(r.status).toBe(0)
    const lines = r.stdout.trim().split('\n')
    expect(lines[0]).toBe('index, uuid, name')
    expect(lines).toHaveLength(9)
    expect(lines[1]).toBe(`0, ${gpuUuid(dir, 0)}, NVIDIA H100 80GB HBM3`)
    expect(gpuUuid(dir, 3)).toMatch(/^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
    expect(gpuUuid(dir, 3)).not.toBe(gpuUuid(dir, 4))
    expect(run('--query-gpu=index,uuid', '--format=csv,noheader').stdout.split('\n')[0]).toBe(`0, ${gpuUuid(dir, 0)}`)
  })

  it('maps live rank pids to their GPU uuid and ignores dead ones', () => {
    mkdirSync(join(dir, 'gpus'), {recursive: true})
    writeFileSync(join(dir, 'gpus', '2.json'), JSON.stringify({pid: process.pid, role: 'prefill', tpRank: 2}))
    writeFileSync(join(dir, 'gpus', '5.json'), JSON.stringify({pid: 2 ** 22 + 7, role: 'decode', tpRank: 1}))
    expect(run('--query-compute-apps=pid,gpu_uuid', '--format=csv').stdout).toBe(
      `pid, gpu_uuid\n${process.pid}, ${gpuUuid(dir, 2)}\n`,
    )
    expect(run('--query-compute-apps=pid,gpu_uuid', '--format=csv,noheader,nounits').stdout).toBe(
      `${process.pid}, ${gpuUuid(dir, 2)}\n`,
    )
    expect(run('--query-compute-apps=pid,used_memory', '--format=csv').stdout.split('\n')[0]).toBe(
      'pid, used_memory [MiB]',
    )
  })

  it('prints a table without arguments and refuses unknown flags and fields like nvidia-smi', () => {
    const t = run()
    expect(t.status).toBe(0)
    expect(t.stdout).toContain('NVIDIA-SMI')
    expect(t.stdout).toContain(String(process.pid))
    const bad = run('--bogus')
    expect(bad.status).toBe(2)
    expect(bad.stdout).toContain('Invalid combination of input arguments')
    const field = run('--query-gpu=index,foo', '--format=csv')
    expect(field.status).toBe(2)
    expect(field.stdout).toContain('Field "foo" is not a valid field to query.')
    expect(run('--query-gpu=index').status).toBe(2)
    expect(run('-L').stdout).toContain(`GPU 7: NVIDIA H100 80GB HBM3 (UUID: ${gpuUuid(dir, 7)})`)
  })
})

describe('nvidia-smi topo -m', () => {
  const gpusOnly = tmp()
  writeNvidiaSmi(gpusOnly, 8)
  const railed = tmp()
  writeNvidiaSmi(
    railed,
    8,
    Array.from({length: 8}, (_, g) => `rail${g}`),
  )
  const run = (dir: string, ...args: string[]) =>
    spawnSync(join(dir, 'bin', 'nvidia-smi'), args, {encoding: 'utf8', timeout: 10_000})
  /** A parser as a script would write one: drop the SGR underline, split rows on tabs, read the NIC Legend. */
  function parseTopo(text: string) {
    const lines = text.replace(/\u001b\[[0-9;]*m/g, '').split('\n')
    const header = lines[0]!.split('\t').slice(1)
    const rows = new Map<string, string[]>()
    for (const l of lines.slice(1)) {
      if (l === '') break
      const [label, ...cells] = l.split('\t')
      rows.set(label!, cells)
    }
    const legend = new Map<string, string>()
    for (const l of lines.slice(lines.indexOf('NIC Legend:') + 1)) {
      const m = /^ {2}(NIC\d+): (\S+)$/.exec(l)
      if (m) legend.set(m[1]!, m[2]!)
    }
    return {header, rows, legend, hasNicLegend: lines.includes('NIC Legend:')}
  }

  it('prints a rail-optimized host: GPU g is PIX to NIC g (rail<g>), NODE on its socket, SYS across', () => {
    const r = run(railed, 'topo', '-m')
    expect(r.status).toBe(0)
    // Byte for byte as nvidia-smi prints it: a tab first, the header underlined with SGR escapes.
    expect(r.stdout.split('\n')[0]).toBe(
      `\t\u001b[4m${[...Array.from({length: 8}, (_, i) => `GPU${i}`), ...Array.from({length: 8}, (_, i) => `NIC${i}`), 'CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID'].join('\t')}\u001b[0m`,
    )
    const t = parseTopo(r.stdout)
    expect(t.header.slice(0, 16)).toEqual([
      ...Array.from({length: 8}, (_, i) => `GPU${i}`),
      ...Array.from({length: 8}, (_, i) => `NIC${i}`),
    ])
    for (let g = 0; g < 8; g++) {
      const row = t.rows.get(`GPU${g}`)!
      expect(row[g]).toBe(' X ')
      expect(row.filter((_c, i) => i < 8 && i !== g).every(c => c === 'NV18')).toBe(true)
      const nicCells = row.slice(8, 16)
      expect(nicCells.indexOf('PIX')).toBe(g)
      expect(nicCells.filter(c => c === 'PIX')).toHaveLength(1)
      expect(
        nicCells.every((c, n) => n === g || c === (Math.floor(n / 4) === Math.floor(g / 4) ? 'NODE' : 'SYS')),
      ).toBe(true)
      expect(row.slice(16)).toEqual([g < 4 ? '0-55,112-167' : '56-111,168-223', g < 4 ? '0' : '1', '', 'N/A'])
      expect(t.legend.get(`NIC${g}`)).toBe(`rail${g}`)
      // The NIC's row mirrors it and ends in the empty affinity columns.
      expect(t.rows.get(`NIC${g}`)![g]).toBe('PIX')
      expect(t.rows.get(`NIC${g}`)!.slice(16)).toEqual(['', '', '', ''])
    }
    expect(r.stdout).toContain(
      '\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between ' +
        'NUMA nodes (e.g., QPI/UPI)\n',
    )
    expect(r.stdout.endsWith('  NIC7: rail7\n\n')).toBe(true)
  })

  it(
    'a decode node of a twin that spans nodes has the NICs of its own GPUs: NIC0 (rail4) is PIX to GPU4, on ' +
      "GPU4's socket",
    () => {
      const node = tmp()
      writeNvidiaSmi(
        node,
        8,
        [4, 5, 6, 7].map(g => ({name: `rail${g}`, gpu: g})),
      )
      const t = parseTopo(run(node, 'topo', '-m').stdout)
      expect(t.header.slice(8, 12)).toEqual(['NIC0', 'NIC1', 'NIC2', 'NIC3'])
      for (let g = 0; g < 8; g++) {
        const nicCells = t.rows.get(`GPU${g}`)!.slice(8, 12)
        expect(nicCells).toEqual([0, 1, 2, 3].map(n => (n + 4 === g ? 'PIX' : g < 4 ? 'SYS' : 'NODE')))
      }
      expect([...t.legend]).toEqual([
        ['NIC0', 'rail4'],
        ['NIC1', 'rail5'],
        ['NIC2', 'rail6'],
        ['NIC3', 'rail7'],
      ])
    },
  )

  it(
    'without rail NICs: GPUs only, no NIC column and no NIC Legend; -mp shows PCIe paths; bad arguments are ' +
      'refused',
    () => {
      const t = parseTopo(run(gpusOnly, 'topo', '-m').stdout)
      expect(t.header).toEqual([
        ...Array.from({length: 8}, (_, i) => `GPU${i}`),
        'CPU Affinity',
        'NUMA Affinity',
        'GPU NUMA ID',
      ])
      expect(t.hasNicLegend).toBe(false)
      expect([...t.rows.keys()]).toEqual(Array.from({length: 8}, (_, i) => `GPU${i}`))
      const mp = parseTopo(run(railed, 'topo', '-mp').stdout)
      expect(mp.rows.get('GPU0')!.slice(0, 8)).toEqual([' X ', 'NODE', 'NODE', 'NODE', 'SYS', 'SYS', 'SYS', 'SYS'])
      expect(mp.rows.get('GPU0')![8]).toBe('PIX')
      expect(run(railed, 'topo').status).toBe(2)
      expect(run(railed, 'topo', '-x').stdout).toContain('Invalid combination of input arguments')
    },
  )
})

describe('sim up options: rail NICs and UCX RC settings', () => {
  it('plans one rail per GPU only with --rail-nics, and keeps the UCX values as given', () => {
    expect(buildSimConfig({stateDir: tmp()}).rails).toBeUndefined()
    const c = buildSimConfig({stateDir: tmp(), railNics: true, ucxRcTimeout: '300ms', ucxRcRetryCount: 2})
    expect(c.rails!.nics.map(n => `${n.name}=${n.addr}`)).toEqual(
      Array.from({length: 8}, (_, g) => `rail${g}=198.18.${g}.1`),
    )
    expect(c.ucx).toEqual({rcTimeout: '300ms', rcRetryCount: 2})
  })

  it('refuses a timeout UCX would not parse and a negative retry count, naming the flag', () => {
    expectBadInput(
      () => buildSimConfig({stateDir: tmp(), ucxRcTimeout: 'soon'}),
      /--ucx-rc-timeout must be a UCX time value/,
    )
    expectBadInput(() => buildSimConfig({stateDir: tmp(), ucxRcTimeout: '0'}), /--ucx-rc-timeout/)
    expectBadInput(
      () => buildSimConfig({stateDir: tmp(), ucxRcRetryCount: -1}),
      /--ucx-rc-retry-count must be an integer from 0 to 255/,
    )
  })
})

describe('lock and processes', () => {
  it('a second holder of a state dir gets exit 2 with the down suggestion; a dead lock is taken over', () => {
    const dir = tmp()
    const lock = acquireLock(dir)
    expect(lock.owner.pid).toBe(process.pid)
    expectBadInput(() => acquireLock(dir), /in use by a running twin/)
    try {
      acquireLock(dir)
    } catch (error) {
      expect((fromSimError(error) as PdError).suggestion).toBe(`pdchaos sim down --state-dir ${dir}`)
    }
    // A lock whose processes are all gone is stale.
    writeFileSync(
      join(dir, 'sim.lock'),
      JSON.stringify({owner: {pid: 2 ** 22 + 9, start: '1'}, createdAt: 0, services: {}}),
    )
    expect(acquireLock(dir).owner.pid).toBe(process.pid)
    removeLock(dir)
    expect(readLock(dir)).toBeUndefined()
  })

  it('stops a detached process group, never a pid whose start time differs', async () => {
    const dir = tmp()
    const ref = spawnDetached('sh', ['-c', 'sleep 30 & sleep 30; wait'], {
      env: process.env,
      logFile: join(dir, 'log'),
      cwd: dir,
    })
    try {
      expect(isSameProcess(ref)).toBe(true)
      expect(await stopGroup({pid: ref.pid, start: String(Number(ref.start) + 1)}, 200)).toBe(true)
      expect(isSameProcess(ref)).toBe(true) // wrong start time: untouched
      expect(await stopGroup(ref, 2000)).toBe(true)
      expect(isSameProcess(ref)).toBe(false)
      // Nothing of the group runs: what is left is zombies waiting for init to collect them (stopGroup does not wait
      // for that; in a container init may take a second or more).
      const left = execFileSync('sh', ['-c', `ps -o stat= -g ${ref.pid} || true`], {encoding: 'utf8'})
        .split('\n')
        .map(l => l.trim())
        .filter(Boolean)
      expect(left.filter(stat => !stat.startsWith('Z'))).toEqual([])
    } finally {
      try {
        process.kill(-ref.pid, 'SIGKILL')
      } catch {}
    }
  })

  it(
    'a group left with only a zombie is stopped: its process exited, and nothing waits for its parent to ' +
      'collect it',
    async () => {
      // The zombie's parent (perl) lives outside the group and never collects it, as init may not for a second or more.
      const parent = spawn(
        'perl',
        ['-e', 'my $p = fork; if (!$p) { setpgrp(0, 0); exit 0 } $| = 1; print "$p\\n"; sleep 30'],
        {stdio: ['ignore', 'pipe', 'ignore']},
      )
      try {
        const pid = Number(
          await new Promise<string>(resolve => parent.stdout!.once('data', (d: Buffer) => resolve(d.toString()))),
        )
        await eventually(() => readFileSync(`/proc/${pid}/stat`, 'latin1').includes(') Z '), 5000)
        // a zombie has no start time to prove it ours: it cannot be signalled by mistake
        expect(refOf(pid)).toBeUndefined()
        expect(await stopGroup({pid, start: '1'}, 5000, 3000)).toBe(true)
        // still there, uncollected: not waited for
        expect(readFileSync(`/proc/${pid}/stat`, 'latin1')).toContain(') Z ')
      } finally {
        parent.kill('SIGKILL')
      }
    },
  )

  it('down with nothing running is a no-op and exits cleanly', async () => {
    const dir = tmp()
    const r = await simDown(dir)
    expect(r.stopped).toEqual([])
    expect(r.wasRunning).toBe(false)
    expect(refOf(process.pid)).toBeDefined()
  })
})
