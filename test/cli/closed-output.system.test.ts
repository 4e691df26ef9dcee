import {spawn} from 'node:child_process'

import {describe, expect, it} from 'vitest'

import {requireSystemLevel} from '../harness/level.js'
import {cliEntry} from '../harness/test-host.js'

/**
 * A reader that goes away (`pdchaos schema | head -1`, an SSH session cut while a command prints): the CLI's next
 * write fails with EPIPE. Node raises that as an uncaught error (a stack trace, exit 1, the command killed halfway);
 * pdchaos finishes what it was doing and keeps its exit code.
 */
describe('output whose reader has gone', () => {
  it('schema into a closed pipe: exit 0 and no stack trace', async () => {
    requireSystemLevel('pdchaos as a subprocess')
    const child = spawn(process.execPath, [cliEntry(), 'schema'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1'},
    })
    // Close the read end before the CLI writes: its write then fails with EPIPE.
    child.stdout!.destroy()
    let stderr = ''
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString()
    })
    const code = await new Promise<number | null>(resolve => child.on('close', c => resolve(c)))
    expect(stderr).not.toMatch(/EPIPE|^\s+at /m)
    expect(code).toBe(0)
  }, 60_000)
})
