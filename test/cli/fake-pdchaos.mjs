// A stand-in for `pdchaos suite ... --journal FILE --label NAME` in the fleet's unit tests (a real run needs a
// deployment). What it does is scripted per label in $FAKE_PDCHAOS_PLAN (JSON): how long it runs, what it prints on
// stderr, the journal it writes (a copy of a prepared file), its exit code, and what it does on SIGINT. Each start and
// end is appended to $FAKE_PDCHAOS_LOG, so a test sees how many ran at once from the children's side.
import {appendFileSync, copyFileSync, readFileSync, writeFileSync} from 'node:fs'

const argv = process.argv.slice(2)
const opt = name => {
  const i = argv.indexOf(name)
  return i === -1 ? undefined : argv[i + 1]
}
const label = opt('--label')
const journal = opt('--journal')
const plan = JSON.parse(process.env.FAKE_PDCHAOS_PLAN ?? '{}')[label] ?? {}
const log = what =>
  process.env.FAKE_PDCHAOS_LOG && appendFileSync(process.env.FAKE_PDCHAOS_LOG, `${what} ${label} ${Date.now()}\n`)
const end = code => {
  log('end')
  process.exit(code)
}
// The handler before the start line: a test that signals once it reads "start" must never meet the default handler.
process.on('SIGINT', () => {
  log('sigint')
  if (plan.onSigint === 'ignore') return
  if (plan.stoppedJournal) copyFileSync(plan.stoppedJournal, journal)
  end(3)
})
log('start')
if (plan.argvTo) writeFileSync(plan.argvTo, JSON.stringify(argv))
for (const line of plan.stderr ?? []) process.stderr.write(line + '\n')
/** Children started and not yet ended, by the log. */
const running = () => {
  let n = 0
  for (const l of readFileSync(process.env.FAKE_PDCHAOS_LOG, 'utf8').split('\n'))
    n += l.startsWith('start ') ? 1 : l.startsWith('end ') ? -1 : 0
  return n
}
// `peers: N`: stay until N children run at once (self included), at most 5 s, before the scripted run. On a loaded
// machine a child's Node start can take longer than another's whole run, so two children started together need not
// overlap by their own clocks; this makes them overlap whenever the fleet lets N run at once, and only then.
const by = Date.now() + 5000
while (plan.peers && running() < plan.peers && Date.now() < by) await new Promise(r => setTimeout(r, 10))
setTimeout(() => {
  if (plan.journal) copyFileSync(plan.journal, journal)
  end(plan.exit ?? 0)
}, plan.sleepMs ?? 0)
