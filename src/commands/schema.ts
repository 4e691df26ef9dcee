import {Args} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {deploymentJsonSchema} from '../deployment/load.js'
import {fleetJsonSchema} from '../suite/fleet-file.js'
import {suiteJsonSchema} from '../suite/suite-file.js'

export default class Schema extends BaseCommand<typeof Schema> {
  static override summary =
    'Print the JSON Schema of the deployment file (pdchaos.yaml), the suite file or the fleet file.'
  static override description =
    'Editors and CI can validate files against it. The same document is printed with or without --json.'
  static override examples = [
    '<%= config.bin %> schema > pdchaos.schema.json',
    '<%= config.bin %> schema deployment --json',
  ]

  static override args = {
    kind: Args.string({
      description: 'Which file: deployment, suite or fleet.',
      options: ['deployment', 'suite', 'fleet'],
      default: 'deployment',
    }),
  }

  public async run(): Promise<Record<string, unknown>> {
    const schema =
      this.args.kind === 'suite'
        ? suiteJsonSchema()
        : this.args.kind === 'fleet'
          ? fleetJsonSchema()
          : deploymentJsonSchema()
    // With --json oclif prints the returned document itself; otherwise print it here, pretty.
    if (!this.jsonEnabled()) process.stdout.write(JSON.stringify(schema, null, 2) + '\n')
    return schema
  }
}
