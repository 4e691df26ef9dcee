/**
 * Every benchmark, one after the other (`npm run bench`), each in its own process as `node --import tsx
 * scripts/bench-<name>.ts` and each rewriting its own section of BENCHMARKS.md. A benchmark that fails does not
 * stop the others; the run fails (exit 1) when any did, naming them. Interrupted, it starts no further one.
 *   npm run bench                 all of them, in the order of BENCHMARKS.md
 *   npm run bench -- cli faults   only those
 * The sshd and namespace ones (ssh, cli, faults, suite, accuracy) run as root, like the e2e tests.
 */
import {type ChildProcess, spawn} from 'node:child_process'
import {fileURLToPath} from 'node:url'

const BENCHMARKS = ['ssh', 'sim', 'cli', 'faults', 'suite', 'accuracy', 'fleet'] as const

const asked = process.argv.slice(2)
const unknown = asked.filter(name => !(BENCHMARKS as readonly string[]).includes(name))
if (unknown.length > 0) {
  process.stderr.write(`unknown benchmark: ${unknown.join(', ')} (known: ${BENCHMARKS.join(', ')})\n`)
  process.exit(2)
}
const chosen = asked.length > 0 ? BENCHMARKS.filter(name => asked.includes(name)) : [...BENCHMARKS]

let current: ChildProcess | undefined
let interrupted: NodeJS.Signals | undefined
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    interrupted = signal
    current?.kill(signal) // a Ctrl-C reached it already; a SIGTERM sent to this process alone has not
  })
}

function run(script: string): Promise<{code: number | null; signal: NodeJS.Signals | null; error?: Error}> {
  return new Promise(resolve => {
    current = spawn(process.execPath, ['--import', 'tsx', script], {stdio: 'inherit'})
    current.once('error', error => resolve({code: null, signal: null, error}))
    current.once('exit', (code, signal) => resolve({code, signal}))
  })
}

const failed: string[] = []
for (const name of chosen) {
  process.stderr.write(`\n=== bench ${name}: node --import tsx scripts/bench-${name}.ts\n`)
  const t0 = performance.now()
  const r = await run(fileURLToPath(new URL(`./bench-${name}.ts`, import.meta.url)))
  const took = `${((performance.now() - t0) / 1000).toFixed(0)} s`
  if (interrupted) {
    process.stderr.write(`=== bench ${name}: interrupted (${interrupted}) after ${took}; the rest are not run\n`)
    process.exit(130)
  }
  if (r.code === 0) {
    process.stderr.write(`=== bench ${name}: done in ${took}\n`)
  } else {
    process.stderr.write(
      `=== bench ${name}: FAILED ` +
        `(${r.error ? r.error.message : r.signal ? `signal ${r.signal}` : `exit ${r.code}`}) after ${took}\n`,
    )
    failed.push(name)
  }
}
if (failed.length > 0) {
  process.stderr.write(`\nbench: ${failed.length} of ${chosen.length} failed: ${failed.join(', ')}\n`)
  process.exit(1)
}
process.stderr.write(
  `\nbench: ${chosen.length} done; their sections are in ${process.env.BENCHMARKS_FILE || 'BENCHMARKS.md'}\n`,
)
