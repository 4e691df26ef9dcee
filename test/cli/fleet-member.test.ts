import {existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'

import {afterAll, describe, expect, it} from 'vitest'

import {errorDocument} from '../../src/cli/error-output.js'
import {memberArgv, runMemberChild} from '../../src/cli/fleet-member.js'
import {runFleetHere} from '../../src/cli/fleet-run.js'
import type {Progress} from '../../src/cli/progress.js'
import {DeploymentSchema} from '../../src/deployment/config.js'
import {unreachable} from '../../src/errors.js'
import type {SuiteRun} from '../../src/model/run.js'
import {writeJournal} from '../../src/report/journal.js'
import {failureJournal, runJournal} from '../../src/report/journal-fields.js'
import type {FleetEntry, FleetPlan} from '../../src/suite/fleet-file.js'
import {defaultSuite} from '../../src/suite/suite-file.js'
import {syntheticRun, T0} from '../report/synthetic-run.js'

/**
 * `suite --fleet` runs each deployment as its own pdchaos process. Here the process is a stand-in (fake-pdchaos.mjs,
 * scripted per deployment) so the fleet's side is tested as it is: the command line each run gets, the bound on runs
 * at once as the children see it, journals read back, an unreachable deployment and a crashed one reported with their
 * reasons, one SIGINT per child on a stop, and a child that will not stop killed at its deadline.
 */

const root = mkdtempSync(join(tmpdir(), 'pdchaos-fleet-member-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))
const FAKE = [process.execPath, fileURLToPath(new URL('fake-pdchaos.mjs', import.meta.url))]
let n = 0

function entry(name: string, suiteFile?: string): FleetEntry {
  const deployment = DeploymentSchema.parse({
    name: `pd-${name}`,
    host: {kind: 'local'},
    stateDir: `/tmp/x/${name}`,
    backend: 'nixl',
    watchdog: {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5},
    services: {
      prefill: {url: 'http://127.0.0.1:1', bootstrapPort: 8998},
      decode: {url: 'http://127.0.0.1:2'},
      router: {url: 'http://127.0.0.1:3'},
    },
  })
  return {
    name,
    deploymentFile: `/etc/pdchaos/${name}.yaml`,
    ...(suiteFile ? {suiteFile} : {}),
    deployment,
    suite: defaultSuite(),
  }
}

/** A fresh directory, the journals the stand-in copies, and its log. */
function setup() {
  const dir = join(root, `t${++n}`)
  const fixtures = join(dir, 'fixtures')
  const write = (name: string, body: Record<string, unknown>) => {
    writeJournal(join(fixtures, name), body)
    return join(fixtures, name)
  }
  const run = (deployment: string, o: {failing?: boolean; stopped?: string} = {}): SuiteRun => ({
    ...syntheticRun({failing: o.failing ?? false}),
    deployment,
    ...(o.stopped ? {stopped: {reason: o.stopped}} : {}),
  })
  return {
    dir,
    log: join(dir, 'children.log'),
    runJournal: (name: string, deployment: string, o: {failing?: boolean; stopped?: string} = {}) =>
      write(name, runJournal(run(deployment, o), 'suite', {label: name})),
    failureJournal: (name: string, error: Error) =>
      write(
        name,
        failureJournal(
          'suite',
          {name: 'default', label: name, startedAt: T0, finishedAt: T0 + 1},
          errorDocument(error, 'suite').error,
        ),
      ),
  }
}

function recorder(): {progress: Progress; lines: string[]} {
  const lines: string[] = []
  const progress = {
    say: (l: string) => lines.push(l),
    print: (ls: string[]) => lines.push(...ls),
    setPhase: () => {},
    stop: () => {},
  } as unknown as Progress
  return {progress, lines}
}

/** The most children alive at once, from their own start/end lines. */
function peak(log: string): number {
  const events = readFileSync(log, 'utf8')
    .trim()
    .split('\n')
    .map(l => l.split(' '))
    .filter(([what]) => what === 'start' || what === 'end')
    .map(([what, , t]) => ({what, t: Number(t)}))
    .sort((a, b) => a.t - b.t || (a.what === 'end' ? -1 : 1))
  let now = 0
  let most = 0
  for (const e of events) {
    now += e.what === 'start' ? 1 : -1
    most = Math.max(most, now)
  }
  return most
}

describe.concurrent('a fleet deployment as its own pdchaos process', () => {
  it(
    'gets the command line of a single run: its suite, deployment file, journal, label, run id and the flags ' +
      'every run gets',
    () => {
      expect(
        memberArgv(entry('eu1', '/etc/pdchaos/nightly.yaml'), {
          journalDir: '/var/lib/pdchaos/n',
          runId: 'fleet-1',
          pass: {gate: true, allowProduction: true},
        }),
      ).toEqual([
        'suite',
        '/etc/pdchaos/nightly.yaml',
        '-c',
        '/etc/pdchaos/eu1.yaml',
        '--journal',
        '/var/lib/pdchaos/n/eu1.json',
        '--label',
        'eu1',
        '--run-id',
        'fleet-1.eu1',
        '--gate',
        '--allow-production',
      ])
      expect(memberArgv(entry('us2'), {journalDir: '/j', pass: {}})).toEqual([
        'suite',
        '-c',
        '/etc/pdchaos/us2.yaml',
        '--journal',
        '/j/us2.json',
        '--label',
        'us2',
      ])
    },
  )

  it(
    'at most --max-parallel at once; each judged from its journal, the unreachable and the crashed ones with ' +
      'their reasons',
    async () => {
      const s = setup()
      const journalDir = join(s.dir, 'journals')
      const plan = {
        // a and b start together (the first two) and each waits to see the other running: two at once, whatever the
        // load.
        a: {sleepMs: 250, peers: 2, journal: s.runJournal('a', 'pd-a'), stderr: ['calibrating on unfaulted requests']},
        b: {sleepMs: 250, peers: 2, exit: 1, journal: s.runJournal('b', 'pd-b', {failing: true})},
        c: {
          sleepMs: 100,
          exit: 5,
          journal: s.failureJournal(
            'c',
            unreachable('router at http://10.0.0.3:8000 refused the connection', 'is it up?'),
          ),
          stderr: ['Error: router at http://10.0.0.3:8000 refused the connection'],
        },
        d: {
          sleepMs: 100,
          exit: 5,
          stderr: ['Error: ssh root@10.0.0.9:22: connect ECONNREFUSED', 'Try this: check that sshd runs on 10.0.0.9'],
        },
      }
      // A journal left by yesterday's run of d must not be taken for today's.
      writeJournal(
        join(journalDir, 'd.json'),
        runJournal({...syntheticRun({failing: false}), deployment: 'pd-d'}, 'suite'),
      )
      const fleetPlan: FleetPlan = {
        file: '/f.yaml',
        name: 'nightly',
        maxParallel: 4,
        entries: ['a', 'b', 'c', 'd'].map(x => entry(x)),
      }
      const {progress, lines} = recorder()
      const fleet = await runFleetHere(fleetPlan, {
        maxParallel: 2,
        journalDir,
        runId: 'fleet-t',
        pass: {},
        progress,
        cli: FAKE,
        child: {env: {...process.env, FAKE_PDCHAOS_PLAN: JSON.stringify(plan), FAKE_PDCHAOS_LOG: s.log}},
      })

      expect(peak(s.log)).toBe(2)
      expect(fleet.members.map(m => [m.name, m.status, m.exitCode])).toEqual([
        ['a', 'pass', 0],
        ['b', 'fail', 1],
        ['c', 'unreachable', 5],
        ['d', 'unreachable', 5],
      ])
      expect(fleet.exitCode).toBe(1)
      expect(fleet.members[0]).toMatchObject({deployment: 'pd-a', journal: join(journalDir, 'a.json')})
      expect(fleet.members[0]!.run!.scenarios).toHaveLength(3)
      expect(fleet.members[2]).toMatchObject({
        reason: 'router at http://10.0.0.3:8000 refused the connection',
        suggestion: 'is it up?',
      })
      expect(fleet.members[3]).toMatchObject({
        reason: 'ssh root@10.0.0.9:22: connect ECONNREFUSED',
        suggestion: 'check that sshd runs on 10.0.0.9',
        deployment: 'pd-d',
      })
      expect(fleet.members[3]!.run).toBeUndefined()
      expect(existsSync(join(journalDir, 'd.json'))).toBe(false)
      // Each child's progress, named; each end on a line of its own.
      expect(lines).toContain('[a] calibrating on unfaulted requests')
      expect(lines).toContain('[d] UNREACHABLE (exit 5): ssh root@10.0.0.9:22: connect ECONNREFUSED')
    },
  )

  it(
    'without --journal-dir the journals live in a temporary directory, removed at the end, and are not ' + 'named',
    async () => {
      const s = setup()
      const plan = {a: {journal: s.runJournal('a', 'pd-a')}}
      let argv: string[] = []
      const {progress} = recorder()
      const fleet = await runFleetHere(
        {file: '/f.yaml', name: 'f', maxParallel: 1, entries: [entry('a')]},
        {
          runId: 'r',
          pass: {},
          progress,
          cli: FAKE,
          child: {
            env: {
              ...process.env,
              FAKE_PDCHAOS_PLAN: JSON.stringify({a: {...plan.a, argvTo: join(s.dir, 'argv.json')}}),
            },
          },
        },
      )
      argv = JSON.parse(readFileSync(join(s.dir, 'argv.json'), 'utf8')) as string[]
      const journal = argv[argv.indexOf('--journal') + 1]!
      expect(fleet.members[0]).toMatchObject({status: 'pass', exitCode: 0})
      expect(fleet.members[0]!.journal).toBeUndefined()
      expect(existsSync(journal)).toBe(false)
    },
  )

  it(
    'a child stopped before its run began (SIGINT before pdchaos handles it) is stopped, exit 3, not ' + 'unreachable',
    async () => {
      const s = setup()
      const stop = new AbortController()
      stop.abort('interrupted (SIGINT)')
      const m = await runMemberChild(
        entry('a'),
        {
          cli: [process.execPath, '-e', 'setTimeout(() => {}, 20000)', '--'],
          journalDir: s.dir,
          keepJournal: false,
          pass: {},
        },
        {signal: stop.signal},
      )
      expect(m).toMatchObject({
        status: 'stopped',
        exitCode: 3,
        reason: 'stopped before its run began (stopped: the fleet was stopped)',
      })
    },
  )

  it('a stop sends each running child one SIGINT; it reverts, journals the stopped run and exits 3', async () => {
    const s = setup()
    const stop = new AbortController()
    const plan = {a: {sleepMs: 20_000, stoppedJournal: s.runJournal('a', 'pd-a', {stopped: 'interrupted (SIGINT)'})}}
    // Once the run is under way (its SIGINT handler installed).
    const poll = setInterval(() => {
      if (existsSync(s.log) && readFileSync(s.log, 'utf8').startsWith('start a')) {
        clearInterval(poll)
        stop.abort('interrupted (SIGINT)')
      }
    }, 20)
    const t0 = Date.now()
    const m = await runMemberChild(
      entry('a'),
      {
        cli: FAKE,
        journalDir: s.dir,
        keepJournal: true,
        pass: {},
        env: {...process.env, FAKE_PDCHAOS_PLAN: JSON.stringify(plan), FAKE_PDCHAOS_LOG: s.log},
      },
      {signal: stop.signal},
    )
    expect(Date.now() - t0).toBeLessThan(10_000)
    expect(m).toMatchObject({status: 'stopped', exitCode: 3})
    expect(m.run!.stopped).toEqual({reason: 'interrupted (SIGINT)'})
    expect(readFileSync(s.log, 'utf8').match(/^sigint /gm)).toHaveLength(1)
  })

  it(
    "a run that exits without its journal (its lease guard ended the process): the guard's last word is the " +
      'reason',
    async () => {
      const s = setup()
      mkdirSync(s.dir, {recursive: true})
      const plan = {
        a: {
          exit: 4,
          stderr: [
            'pdchaos: SIGINT: reverting 1 lease(s) before exit',
            'pdchaos: cleanup unverified, the host may still be faulted: lease drop-dest-info-x (its revert script ' +
              'exited 1; the host reverts it by itself in 40 s)',
          ],
        },
      }
      const m = await runMemberChild(
        entry('a'),
        {
          cli: FAKE,
          journalDir: s.dir,
          keepJournal: false,
          pass: {},
          env: {...process.env, FAKE_PDCHAOS_PLAN: JSON.stringify(plan)},
        },
        {signal: new AbortController().signal},
      )
      expect(m).toMatchObject({status: 'cleanup-unverified', exitCode: 4})
      expect(m.reason).toBe(
        'exited 4 without a journal: cleanup unverified, the host may still be faulted: lease drop-dest-info-x (its ' +
          'revert script exited 1; the host reverts it by itself in 40 s)',
      )
    },
  )

  it('a child that does not finish by its deadline gets SIGINT, then SIGKILL: cleanup unverified, exit 4', async () => {
    const s = setup()
    mkdirSync(s.dir, {recursive: true})
    const plan = {a: {sleepMs: 60_000, onSigint: 'ignore'}}
    // A deadline past the child's start (a Node start takes up to a second on a loaded machine).
    const m = await runMemberChild(
      entry('a'),
      {
        cli: FAKE,
        journalDir: s.dir,
        keepJournal: false,
        pass: {},
        deadlineMs: 1500,
        killGraceMs: 300,
        env: {...process.env, FAKE_PDCHAOS_PLAN: JSON.stringify(plan), FAKE_PDCHAOS_LOG: s.log},
      },
      {signal: new AbortController().signal},
    )
    expect(m).toMatchObject({status: 'cleanup-unverified', exitCode: 4, suggestion: 'run `pdchaos recover` against it'})
    expect(readFileSync(s.log, 'utf8').match(/^sigint /gm)).toHaveLength(1)
    expect(m.reason).toMatch(
      /^killed after it did not stop in time \(stopped: it did not finish within 2 s\): any fault it held is reverted by the host at its lease's expiry$/,
    )
  })
})
