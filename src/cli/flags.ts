import {Flags} from '@oclif/core'

/** The flags that choose the target deployment: shared by every command that reaches a host. */
export const targetFlags = {
  config: Flags.string({char: 'c', helpGroup: 'TARGET', summary: 'Deployment file (YAML).', default: './pdchaos.yaml'}),
  sim: Flags.boolean({helpGroup: 'TARGET', summary: 'Target the embedded twin (started if needed).'}),
  // No env here: $PDCHAOS_SIM_DIR is read only with --sim (a flag from the environment would refuse every -c run).
  'state-dir': Flags.string({helpGroup: 'TARGET', summary: "With --sim only: the twin's state dir (default $PDCHAOS_SIM_DIR or ~/.local/state/pdchaos/sim)."}),
}
