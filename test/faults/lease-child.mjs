/**
 * A stand-in pdchaos process for the lease tests: creates one lease whose revert appends a line to a marker file,
 * prints "LEASE <json>" once it is armed, then waits (bounded) to be signalled or killed.
 *   lease-child.mjs plain|guard STATE_DIR MARKER TTL_MS [REVERT_DELAY_S]
 * The host is local, or ssh when PDCHAOS_TEST_SSH holds an ssh host config (JSON).
 *
 * Plain JavaScript on the compiled code (dist/, built by `npm run test:all` before the system level), as pdchaos
 * itself runs: through tsx each child cost 1.1 CPU-s to start, 33 of them per run on a 2-core machine.
 */
import {createLease} from '../../dist/faults/lease/lease.js'
import {withLeases} from '../../dist/faults/lease/lease-guard.js'
import {LocalHost} from '../../dist/hosts/local-host.js'
import {SshHost, resolveSshEndpoint} from '../../dist/hosts/ssh-host.js'

const [mode, stateDir, marker, ttl, delay] = process.argv.slice(2)
const sshConfig = process.env.PDCHAOS_TEST_SSH
const host = sshConfig
  ? new SshHost(await resolveSshEndpoint(JSON.parse(sshConfig), {sshConfigPath: '/nonexistent'}))
  : new LocalHost()
const spec = {
  fault: 'test-fault',
  params: {marker},
  ttlMs: Number(ttl),
  revert: [['sh', '-c', `sleep ${delay ?? 0}; echo reverted >> "$1"`, 'sh', marker]],
  command: 'lease-child',
}
const hold = () => new Promise(resolve => setTimeout(resolve, 60_000))
process.stderr.write('START\n')
if (mode === 'plain') {
  const lease = await createLease(host, stateDir, spec)
  process.stdout.write(`LEASE ${JSON.stringify(lease)}\n`)
  await hold()
} else {
  await withLeases(host, stateDir, async guard => {
    const lease = await guard.create(spec)
    process.stdout.write(`LEASE ${JSON.stringify(lease)}\n`)
    await hold()
  })
}
await host.close()
