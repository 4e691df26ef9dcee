import type {Host, RunOptions, RunResult} from '../../src/hosts/host.js'

/**
 * A Host whose commands are answered by a function of their argv (a throw is the transport failing): for unit tests
 * that script what a host's tools print. Uploads and detached starts do nothing.
 */
export function answeringHost(name: string, answer: (argv: string[], opts: RunOptions) => RunResult): Host {
  return {
    run: async (argv, opts) => answer(argv, opts),
    upload: async () => {},
    startDetached: async () => ({pid: 1}),
    describe: () => name,
    close: async () => {},
  }
}

/** A command's result: exit 0 with this output. */
export const answered = (stdout = ''): RunResult => ({code: 0, stdout, stderr: '', durationMs: 1})
