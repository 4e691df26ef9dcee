#!/usr/bin/env node
// The compiled CLI (npm run build). Errors are rendered by pdchaos's own main (src/cli/main.ts), also those oclif
// raises before a command runs, so every error has the same one-line and --json shape.
// A SIGINT or SIGTERM while the CLI loads (half a second on a loaded machine), or in a command that listens for none:
// exit 3 ("stopped"), not death by signal. A command that listens itself takes the signal (src/cli/main.ts).
process[Symbol.for('pdchaos.unhandled-stop')] = true
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    if (process.listenerCount(signal) === 1) process.exit(3)
  })
}

const {main, settings} = await import('../dist/cli/main.js')

// The built CLI runs what was built. Under NODE_ENV=development or test (common in a Node developer's shell, and set
// by test runners) oclif would otherwise load the TypeScript sources through tsx: 2.6x the CPU per command, and not
// the code that was built.
settings.enableAutoTranspile = false

await main(import.meta.url)
