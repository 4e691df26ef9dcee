import type {Host} from './host.js'
import type {HostConfig, SudoPolicy} from './host-spec.js'
import {LocalHost} from './local-host.js'
import {openSshHost, type SshHostOptions} from './ssh-host.js'

export interface OpenHostOptions extends SshHostOptions {
  sudo?: SudoPolicy
}

/**
 * The Host a deployment's `host:` entry describes. Opening resolves ~/.ssh/config and keys but does not
 * connect: the first command does (or SshHost.connect() to surface host key and auth errors early).
 */
export async function openHost(cfg: HostConfig, opts: OpenHostOptions = {}): Promise<Host> {
  if (cfg.kind === 'local') return new LocalHost(opts.sudo ?? 'never')
  return openSshHost(cfg, opts)
}
