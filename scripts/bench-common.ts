/**
 * Shared by the benchmarks (scripts/bench-*.ts, not tests; `npm run bench` runs them all): the CLI compiled into a
 * private dir as an installed pdchaos runs it, a bounded CLI runner that timestamps stderr lines, quantiles, and
 * rewriting one `## Section` of BENCHMARKS.md (every benchmark writes through writeSection).
 */
import {execFileSync, spawn} from 'node:child_process'
import {copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'

export const repo = fileURLToPath(new URL('../', import.meta.url))

/**
 * Build src/ as `npm run build` does (tsc, then scripts/bundle.mjs) into node_modules/.cache/<name> (never dist/, which
 * others use) next to a copy of bin/run.js
 * and package.json, so oclif finds the commands at ./dist/commands of that private root, and write its
 * oclif.manifest.json as `npm run build` does. Dependencies resolve from the repo's node_modules (a parent directory).
 * Returns the path of the private bin/run.js.
 */
export function compiledCli(name = 'pdchaos-bench-cli'): string {
  const out = join(repo, 'node_modules', '.cache', name)
  rmSync(out, {recursive: true, force: true})
  mkdirSync(join(out, 'bin'), {recursive: true})
  const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as Record<string, unknown>
  writeFileSync(
    join(out, 'package.json'),
    JSON.stringify(
      {name: pkg.name, version: pkg.version, type: 'module', files: pkg.files, oclif: pkg.oclif},
      null,
      2,
    ) + '\n',
  )
  copyFileSync(join(repo, 'bin', 'run.js'), join(out, 'bin', 'run.js'))
  try {
    execFileSync(
      join(repo, 'node_modules', '.bin', 'tsc'),
      ['-p', repo, '--outDir', join(out, 'dist'), '--declaration', 'false', '--sourceMap', 'false'],
      {stdio: 'pipe'},
    )
  } catch {
    // Type errors elsewhere in the tree (other work in progress) do not stop tsc from emitting.
  }
  if (!existsSync(join(out, 'dist', 'commands', 'status.js')))
    throw new Error(`tsc emitted no commands into ${out}/dist`)
  // Bundled as `npm run build` bundles it: the figures are those of the CLI users run.
  execFileSync(process.execPath, [join(repo, 'scripts', 'bundle.mjs'), join(out, 'dist')], {stdio: 'pipe'})
  // In the private root: `oclif manifest` first deletes ./oclif.manifest.json of its working directory.
  execFileSync(join(repo, 'node_modules', '.bin', 'oclif'), ['manifest', out], {
    cwd: out,
    stdio: 'pipe',
    env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1'},
  })
  return join(out, 'bin', 'run.js')
}

/** The manifest of a compiledCli's root (rename it away to time oclif without one). */
export const manifestOf = (cli: string): string => join(cli, '..', '..', 'oclif.manifest.json')

export interface Line {
  t: number
  line: string
}
export interface Run {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  ms: number
  lines: Line[]
}

/** node <entry> args, with a deadline (SIGKILL); every stderr line stamped with Date.now() when it arrives. */
export function runNode(entryArgs: string[], opts: {timeoutMs?: number; env?: NodeJS.ProcessEnv} = {}): Promise<Run> {
  return new Promise(resolve => {
    const t0 = performance.now()
    const child = spawn(process.execPath, entryArgs, {
      env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1', NO_COLOR: '1', ...opts.env},
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    let partial = ''
    const lines: Line[] = []
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString()
    })
    child.stderr.on('data', (d: Buffer) => {
      const t = Date.now()
      stderr += d.toString()
      const parts = (partial + d.toString()).split('\n')
      partial = parts.pop() ?? ''
      for (const line of parts) lines.push({t, line})
    })
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000)
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({code, signal, stdout, stderr, ms: performance.now() - t0, lines})
    })
  })
}

export interface Stats {
  n: number
  min: number
  p50: number
  p90: number
  p99: number
  max: number
  mean: number
}
export function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!
}
export function stats(xs: number[]): Stats {
  const s = [...xs].sort((a, b) => a - b)
  return {
    n: s.length,
    min: s[0]!,
    p50: quantile(s, 0.5),
    p90: quantile(s, 0.9),
    p99: quantile(s, 0.99),
    max: s.at(-1)!,
    mean: s.reduce((a, b) => a + b, 0) / s.length,
  }
}
export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

export const verdict = (met: boolean): string => (met ? 'met' : '**not met**')

/** The file the benchmarks write: BENCHMARKS.md, or $BENCHMARKS_FILE (to try a benchmark without touching it). */
export const benchmarksFile = (): string => process.env.BENCHMARKS_FILE || join(repo, 'BENCHMARKS.md')

/**
 * Replace (or append) the `## <name>` section of BENCHMARKS.md with `body`, keeping every other section; the one
 * table writer of every scripts/bench-*.ts. Returns the section as written.
 */
export function writeSection(name: string, body: string): string {
  const file = benchmarksFile()
  const section = `## ${name}\n\n${body.trim()}\n`
  const current = existsSync(file) ? readFileSync(file, 'utf8') : '# Benchmarks\n'
  const title = name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  const re = new RegExp(`^## ${title}\\n[\\s\\S]*?(?=^## |(?![\\s\\S]))`, 'm')
  // A function, so a `$` in the body is never read as a replacement pattern.
  const next = re.test(current) ? current.replace(re, () => section + '\n') : current.trimEnd() + '\n\n' + section
  writeFileSync(file, next.trimEnd() + '\n')
  return section
}

/** A numeric `--name N` flag of a bench script, or its default. */
export const arg = (name: string, d: number): number => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : d
}
