#!/usr/bin/env node
// The compiled CLI (npm run build). Errors are rendered by pdchaos's own main (src/cli/main.ts), also those oclif
// raises before a command runs, so every error has the same one-line and --json shape.
import {main} from '../dist/cli/main.js'

await main(import.meta.url)
