import {RestartCommand} from '../cli/restart-command.js'
import {vllmTarget} from '../cli/engine-target.js'
import {badInput} from '../errors.js'
import type {RestartResult, ServiceName} from '../restart/co-restart.js'

export default class Restart extends RestartCommand {
  static override summary =
    'Co-restart prefill → decode → router behind health gates, send canaries, then watch for pins.'
  static override description =
    'Each service is restarted by the restart command of the deployment file and must pass its health gate (GET ' +
    '/health = 200; /readiness for the router) before the next starts. Where the deployment file lists several ' +
    "instances of a role, each is restarted behind its own gate, on its own host, in the file's order (its " +
    'restartOrder: when it states one). An `engine: vllm` file: prefill, decode, then the proxy (GET /health; ' +
    '/healthcheck), then canaries POST /v1/completions through the proxy. Exit 1 when a gate, a canary or the pin ' +
    'watch fails.'
  static override examples = [
    '<%= config.bin %> restart --sim',
    '<%= config.bin %> restart -c pdchaos.yaml --service prefill --watch 120',
  ]
  async run(): Promise<RestartResult | {plan: string[]}> {
    const f = this.flags
    // An `engine: vllm` file, or --sim --engine vllm (its twin's file): vLLM's co-restart (prefill, decode, proxy;
    // issue 31); --only and --service are SGLang's.
    const refuse = (): void => {
      if (f.only || f.service)
        throw badInput('--only and --service are not built for a vLLM deployment', 'run `pdchaos restart -c FILE`')
    }
    const vllm = await vllmTarget(f, {say: l => this.progress(l), before: refuse})
    if (vllm) {
      refuse()
      return this.vllmRun(vllm.file)
    }
    if (f.only) return this.runAlone(f.only)
    if (f['dry-run'])
      throw badInput('--dry-run needs --only on an SGLang deployment', 'add --only prefill or --only decode')
    // --service picks roles in the order given; by default the file's order (restartOrder:, else prefill, decode,
    // router).
    const order = (f.service ?? ['prefill', 'decode', 'router']) as ServiceName[]
    // A service named twice would be restarted twice behind two gates: a typo, not a plan.
    const twice = order.find((s, i) => order.indexOf(s) !== i)
    if (twice) {
      throw badInput(
        `--service ${twice} is given twice`,
        `name each service once, in the order to restart them: --service ${[...new Set(order)].join(' --service ')}`,
      )
    }
    return this.coRestartRun(order)
  }
}
