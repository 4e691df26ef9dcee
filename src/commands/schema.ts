import {Args} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {deploymentJsonSchema} from '../deployment/load.js'
import {vllmDeploymentJsonSchema} from '../engines/vllm/deployment-file.js'
import {vllmSuiteJsonSchema} from '../engines/vllm/experiments/suite-file.js'
import {fleetJsonSchema} from '../suite/fleet-file.js'
import {suiteJsonSchema} from '../suite/suite-file.js'

export default class Schema extends BaseCommand<typeof Schema> {
  static override summary =
    'Print the JSON Schema of the deployment file (pdchaos.yaml), the suite file or the fleet file; for vLLM ' +
    '(engine: vllm), its deployment and suite files.'
  static override description =
    'Editors and CI can validate files against it. The same document is printed with or without --json.'
  static override examples = [
    '<%= config.bin %> schema > pdchaos.schema.json',
    '<%= config.bin %> schema deployment --json',
    '<%= config.bin %> schema vllm-deployment > pdchaos-vllm.schema.json',
  ]

  static override args = {
    kind: Args.string({
      description: 'Which file: deployment, suite or fleet; vllm-deployment or vllm-suite for an engine: vllm file.',
      options: ['deployment', 'suite', 'fleet', 'vllm-deployment', 'vllm-suite'],
      default: 'deployment',
    }),
  }

  public async run(): Promise<Record<string, unknown>> {
    const of: Record<string, () => Record<string, unknown>> = {
      suite: suiteJsonSchema,
      fleet: fleetJsonSchema,
      'vllm-deployment': vllmDeploymentJsonSchema,
      'vllm-suite': vllmSuiteJsonSchema,
    }
    const schema = (of[this.args.kind] ?? deploymentJsonSchema)()
    // With --json oclif prints the returned document itself; otherwise print it here, pretty.
    if (!this.jsonEnabled()) process.stdout.write(JSON.stringify(schema, null, 2) + '\n')
    return schema
  }
}
