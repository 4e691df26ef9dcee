#!/usr/bin/env node
// pdchaos from its TypeScript sources (oclif's development mode registers tsx). The commands are read from src/
// on every run, never from oclif.manifest.json: `npm run build` writes that file for the compiled CLI, and oclif 4
// would otherwise read it in development mode too, with the flags and commands of the last build.
import {dirname} from 'node:path'
import {fileURLToPath} from 'node:url'

import {Config, Plugin, settings} from '@oclif/core'

const root = dirname(dirname(fileURLToPath(import.meta.url)))

async function sourceConfig() {
  // What execute({development: true}) sets, needed before the commands are loaded from src/.
  process.env.NODE_ENV = 'development'
  settings.debug = true
  const plugin = new Plugin({root, isRoot: true, ignoreManifest: true})
  await plugin.load()
  const config = new Config({root, plugins: new Map([[plugin.name, plugin]])})
  await config.load()
  // Given its plugins, a Config loads no others: load the core ones (the help plugin) as it would without them.
  await config.loadPluginsAndCommands({force: true})
  return config
}

const config = await sourceConfig()
// pdchaos's own entry (src/cli/main.ts), loaded once oclif has registered tsx for the sources.
const {main} = await import('../src/cli/main.ts')
await main(config)
