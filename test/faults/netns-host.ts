import type {DetachedOptions, Host, RunOptions, RunResult, UploadOptions} from '../../src/hosts/host.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import type {Netns} from '../harness/netns.js'

/** A Host whose every command runs inside a test network namespace: `ip netns exec NAME argv...`. */
export class NetnsHost implements Host {
  private readonly local = new LocalHost('never')

  constructor(private readonly ns: Netns) {}

  run(argv: string[], opts: RunOptions): Promise<RunResult> {
    return this.local.run([...this.ns.prefix, ...argv], opts)
  }

  upload(path: string, content: string | Buffer, mode?: number, opts?: UploadOptions): Promise<void> {
    return this.local.upload(path, content, mode, opts)
  }

  startDetached(argv: string[], opts?: DetachedOptions): Promise<{pid: number}> {
    return this.local.startDetached([...this.ns.prefix, ...argv], opts)
  }

  describe(): string {
    return `netns ${this.ns.name}`
  }

  async close(): Promise<void> {}
}
