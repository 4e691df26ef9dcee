import {Flags} from '@oclif/core'

/** The flags that choose the target deployment: shared by every command that reaches a host. */
export const targetFlags = {
  // --sim targets the twin's own file: a -c given with it would be silently ignored, so the two are refused together.
  config: Flags.string({
    char: 'c',
    helpGroup: 'TARGET',
    summary: 'Deployment file (YAML).',
    default: './pdchaos.yaml',
    exclusive: ['sim'],
  }),
  sim: Flags.boolean({helpGroup: 'TARGET', summary: 'Target the embedded twin (started if needed).'}),
  // No env here: $PDCHAOS_SIM_DIR is read only with --sim (a flag from the environment would refuse every -c run).
  'state-dir': Flags.string({
    helpGroup: 'TARGET',
    summary: "With --sim only: the twin's state dir (default $PDCHAOS_SIM_DIR or ~/.local/state/pdchaos/sim).",
  }),
}

/**
 * Which prefill and decode instance a run acts on, where the deployment file lists several of a role: numbered from
 * 0 in the file's order, as `pdchaos status` lists them. The pair's own servers get the pins and the faults.
 */
export const instanceFlags = {
  'prefill-instance': Flags.integer({
    helpGroup: 'TARGET',
    summary: 'The prefill instance to act on: its number in services.prefill (from 0).',
    default: 0,
    min: 0,
    max: 255,
  }),
  'decode-instance': Flags.integer({
    helpGroup: 'TARGET',
    summary: 'The decode instance to act on: its number in services.decode (from 0).',
    default: 0,
    min: 0,
    max: 255,
  }),
}
