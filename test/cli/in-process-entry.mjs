// Loaded by node itself (not the test runner's module graph), so that it shares one copy of every module with the
// commands oclif imports from dist/: the built CLI's main, as bin/run.js calls it.
import {settings} from '@oclif/core'

import {main} from '../../dist/cli/main.js'

settings.enableAutoTranspile = false

const bin = new URL('../../bin/run.js', import.meta.url).href

export async function runMain(argv) {
  await main(bin, argv)
}
