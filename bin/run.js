#!/usr/bin/env node
// The compiled CLI (npm run build). Errors are rendered by pdchaos's own main (src/cli/main.ts), also those oclif
// raises before a command runs, so every error has the same one-line and --json shape.
import {main, settings} from '../dist/cli/main.js'

// The built CLI runs what was built. Under NODE_ENV=development or test (common in a Node developer's shell, and set
// by test runners) oclif would otherwise load the TypeScript sources through tsx: 2.6x the CPU per command, and not
// the code that was built.
settings.enableAutoTranspile = false

await main(import.meta.url)
