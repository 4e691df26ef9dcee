import {parentPort} from 'node:worker_threads'

import {parseYamlCore} from './yaml-parse.js'

/**
 * A worker thread's entry (yaml-file.ts starts it for a larger file): one parse per message, its result posted back.
 * The main thread stays free meanwhile, so a SIGINT or a deadline ends the parse at once (the worker is terminated).
 * A bundle entry of its own (scripts/bundle.mjs): it loads yaml from the bundle's chunk, not yaml's ~80 files.
 */
parentPort?.on('message', (m: {text: string; file: string}) => {
  parentPort!.postMessage(parseYamlCore(m.text, m.file))
})
