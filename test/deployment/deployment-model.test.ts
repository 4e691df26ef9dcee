import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, expect, it} from 'vitest'
import {parse as parseYaml, stringify} from 'yaml'
import {z} from 'zod'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {deploymentJsonSchema, parseDeployment, parseDeploymentModel} from '../../src/deployment/load.js'
import {
  acrossHosts,
  hostView,
  instancesOn,
  pairPaths,
  pairRefusal,
  singleHostRefusal,
  singleHostView,
} from '../../src/deployment/single-host.js'
import {parseYamlText} from '../../src/deployment/yaml-file.js'
import {PdError} from '../../src/errors.js'
import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {twinDeployment} from '../../src/sim/lifecycle/deployment-file.js'
import {GOOD} from './fixtures.js'

/**
 * The deployment file's forms (issue 13, item 1): every file that loaded before loads to the very same single-host
 * view, the new forms (hosts:, lists of instances, multi-node instances) load to the right model, and each mistake
 * is one line naming its path.
 */

const root = join(import.meta.dirname, '..', '..')

/** The README's yaml blocks: the single-host example and the two-host one. */
function readmeExamples(): {single: string; twoHost: string} {
  const blocks = [...readFileSync(join(root, 'README.md'), 'utf8').matchAll(/```yaml\n([\s\S]*?)```/g)].map(m => m[1])
  const single = blocks.find(b => /^host: /m.test(b) && b.includes('services:'))
  const twoHost = blocks.find(b => /^hosts:/m.test(b))
  if (!single || !twoHost) throw new Error('README: expected a single-host and a two-host deployment example')
  return {single, twoHost}
}

/** Deployment files the other tests use (as text, or as the object they parse), each a form that loaded before. */
function existingFixtures(): [string, string][] {
  const local = (p: string, d: string, r: string, extra = '') =>
    [
      'host: {kind: local}',
      'stateDir: /tmp/pdchaos-fixture/host-state',
      'services:',
      `  prefill: {url: "${p}"}`,
      `  decode: {url: "${d}"}`,
      `  router: {url: "${r}"}`,
      'watchdog: {deadlineSeconds: 2, pollSeconds: 0.5}',
      'probeTimeoutSeconds: 0.5',
      extra,
    ].join('\n')
  const twin = twinDeployment(
    buildSimConfig({
      stateDir: '/tmp/pdchaos-fixture-twin',
      deadlineS: 12,
      pollS: 0.5,
      basePort: 41_000,
      backend: 'mooncake',
    }),
  )
  const objects: [string, unknown][] = [
    ["the twin's generated file", twin],
    [
      'test-host without a twin (ssh)',
      {
        name: 'test-host-x',
        labels: {environment: 'test'},
        stateDir: '/tmp/lease-dir',
        host: {
          kind: 'ssh',
          hostname: '10.200.0.2',
          port: 22,
          user: 'root',
          identityFile: '/tmp/id',
          knownHosts: '/tmp/kh',
          fingerprint: `SHA256:${'A'.repeat(43)}`,
        },
        services: {
          prefill: {url: 'http://10.200.0.2:30100', bootstrapPort: 30_500},
          decode: {url: 'http://10.200.0.2:30200'},
          router: {url: 'http://10.200.0.2:30000'},
        },
        watchdog: {scope: 'all', deadlineSeconds: 10, pollSeconds: 1},
      },
    ],
    [
      'co-restart (a forged restart argv, one URL for all)',
      {
        host: {kind: 'local'},
        sudo: 'passwordless',
        services: {
          prefill: {
            url: 'http://127.0.0.1:1',
            restart: ['/usr/bin/restart-prefill', 'x\n2026 healthy\u001b[2K', "it's"],
          },
          decode: {url: 'http://127.0.0.1:1'},
          router: {url: 'http://127.0.0.1:1'},
        },
        watchdog: {deadlineSeconds: 2, pollSeconds: 1},
      },
    ],
    [
      'fleet member',
      {
        name: 'pd-a',
        host: {kind: 'local'},
        stateDir: '/tmp/x/a',
        backend: 'nixl',
        watchdog: {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5},
        services: {
          prefill: {url: 'http://127.0.0.1:1', bootstrapPort: 8998},
          decode: {url: 'http://127.0.0.1:2'},
          router: {url: 'http://127.0.0.1:3'},
        },
      },
    ],
    [
      'service logs and a watchdog log pattern',
      {
        host: {kind: 'local'},
        services: {
          prefill: {url: 'http://127.0.0.1:1', logs: {file: '/tmp/p.log'}},
          decode: {url: 'http://127.0.0.1:2', logs: {journald: 'sglang-decode'}},
          router: {url: 'http://127.0.0.1:3'},
        },
        watchdog: {
          deadlineSeconds: 2,
          pollSeconds: 0.5,
          logPattern: String.raw`evicted rid='(?<rid>[^']+)'.* held=(?<held>[0-9.]+)s`,
        },
      },
    ],
  ]
  return [
    ['test/deployment/load.system.test.ts GOOD', GOOD],
    ['README single-host example', readmeExamples().single],
    ['bad-input good.yaml', local('http://127.0.0.1:40001', 'http://127.0.0.1:40002', 'http://127.0.0.1:40003')],
    [
      'bad-input hang.yaml (one server for all three)',
      local('http://127.0.0.1:40009', 'http://127.0.0.1:40009', 'http://127.0.0.1:40009'),
    ],
    [
      'tools, sudo, labels, probe timeout',
      local(
        'http://127.0.0.1:1',
        'http://127.0.0.1:2',
        'http://127.0.0.1:3',
        'tools: {nvidiaSmi: /opt/bin/nvidia-smi}\nsudo: passwordless\nlabels: {team: infra}',
      ),
    ],
    ...objects.map(([name, o]): [string, string] => [name, stringify(o)]),
  ]
}

function refusal(fn: () => unknown): PdError {
  try {
    fn()
  } catch (error) {
    expect(error).toBeInstanceOf(PdError)
    return error as PdError
  }
  throw new Error('expected the file to be refused')
}

const modelOf = (text: string) => parseDeploymentModel(text, 'f.yaml')

describe('existing deployment files load exactly as before', () => {
  it.each(existingFixtures())(
    '%s: the single-host view is what the single-host schema made of it, key for key',
    (_name, text) => {
      const before = DeploymentSchema.parse(parseYaml(text))
      const after = parseDeployment(text, 'f.yaml')
      expect(after).toStrictEqual(before)
      expect(JSON.stringify(after)).toBe(JSON.stringify(before))
      const m = modelOf(text)
      expect(m.placement).toBe('host')
      expect(m.hosts).toEqual([{name: 'host', config: before.host}])
      expect(m.services.prefill).toEqual([
        {role: 'prefill', path: 'services.prefill', service: before.services.prefill, nodes: ['host']},
      ])
      expect(m.services.decode).toEqual([
        {role: 'decode', path: 'services.decode', service: before.services.decode, nodes: ['host']},
      ])
      expect(m.services.router).toEqual({
        role: 'router',
        path: 'services.router',
        service: before.services.router,
        nodes: ['host'],
      })
      expect(singleHostRefusal(m, 'inject')).toBeUndefined()
    },
  )

  it('a mistake in a host: file reads as it always did', () => {
    const variants = [
      GOOD.replace('url: http://10.0.0.5:30001', 'url: not a url')
        .replace('deadlineSeconds: 30', 'deadlineSeconds: "30s"')
        .replace('backend: nixl', 'backend: nixl\nextraKey: 1'),
      GOOD.replace('logs: {file: /var/log/sglang/decode.log}', 'restart: "systemctl restart x"'),
      GOOD.replace('bootstrapPort: 8998', 'bootstrapPort: 0'),
      GOOD.replace('logs: {journald: sglang-prefill}', 'logs: {syslog: x}'),
      GOOD.replace('kind: ssh', 'kind: ftp'),
      GOOD.replace('  alias: gpu-1\n', '  port: 22\n'),
      GOOD.replace('    metricsUrl: http://10.0.0.5:29000', '    metricsUrl: ftp://x:1\n    colour: blue'),
    ]
    const kind = {what: 'deployment', schemaCommand: 'pdchaos schema', hints: {missing: '', syntax: '', empty: ''}}
    for (const text of variants) {
      const before = refusal(() => parseYamlText(text, 'f.yaml', DeploymentSchema, kind))
      const after = refusal(() => parseDeploymentModel(text, 'f.yaml'))
      expect(after.message, text).toBe(before.message)
      expect(after.exitCode).toBe(2)
    }
    // The same mistake inside a list of instances names the element.
    const listed = refusal(() =>
      modelOf(
        GOOD.replace(
          '  decode:\n    url: http://10.0.0.5:30001\n    logs: {file: /var/log/sglang/decode.log}',
          '  decode:\n    - url: http://10.0.0.5:30001\n    - url: http://10.0.0.5:30003\n      restart: ' +
            '"systemctl restart x"',
        ),
      ),
    )
    expect(listed.message).toBe('f.yaml: services.decode[1].restart: Invalid input: expected array, received string')
  })
})

/**
 * Two hosts: two prefill instances on gpu-a, a decode instance over gpu-b and gpu-c (--nnodes 2), the gateway on gpu-a.
 */
const MULTI = `name: pd-multi
hosts:
  gpu-a: {kind: ssh, hostname: 10.0.3.7, user: sre}
  gpu-b: {kind: ssh, hostname: 10.0.3.8, user: sre}
  gpu-c: {kind: local}
services:
  prefill:
    - {url: "http://10.0.3.7:30000", bootstrapPort: 8998, host: gpu-a, restart: [systemctl, restart, p0]}
    - {url: "http://10.0.3.7:30002", bootstrapPort: 8999, host: gpu-a, logs: {journald: p1}}
  decode:
    - {url: "http://10.0.3.8:30001", nodes: [gpu-b, gpu-c]}
  router: {url: "http://10.0.3.7:8000", host: gpu-a}
watchdog: {deadlineSeconds: 60, pollSeconds: 1}
`

describe('the new forms load to the model of their hosts and instances', () => {
  it('hosts by name, per role each instance with the host of each node rank', () => {
    const m = modelOf(MULTI)
    expect(m.placement).toBe('hosts')
    expect(m.hosts).toEqual([
      {name: 'gpu-a', config: {kind: 'ssh', hostname: '10.0.3.7', user: 'sre', connectTimeoutSeconds: 10}},
      {name: 'gpu-b', config: {kind: 'ssh', hostname: '10.0.3.8', user: 'sre', connectTimeoutSeconds: 10}},
      {name: 'gpu-c', config: {kind: 'local'}},
    ])
    expect(m.services.prefill).toEqual([
      {
        role: 'prefill',
        path: 'services.prefill[0]',
        nodes: ['gpu-a'],
        service: {
          url: 'http://10.0.3.7:30000',
          healthPath: '/health',
          bootstrapPort: 8998,
          restart: ['systemctl', 'restart', 'p0'],
        },
      },
      {
        role: 'prefill',
        path: 'services.prefill[1]',
        nodes: ['gpu-a'],
        service: {url: 'http://10.0.3.7:30002', healthPath: '/health', bootstrapPort: 8999, logs: {journald: 'p1'}},
      },
    ])
    expect(m.services.decode).toEqual([
      {
        role: 'decode',
        path: 'services.decode[0]',
        nodes: ['gpu-b', 'gpu-c'],
        service: {url: 'http://10.0.3.8:30001', healthPath: '/health'},
      },
    ])
    expect(m.services.router).toEqual({
      role: 'router',
      path: 'services.router',
      nodes: ['gpu-a'],
      service: {url: 'http://10.0.3.7:8000', healthPath: '/health', readinessPath: '/readiness'},
    })
    expect(m.name).toBe('pd-multi')
    expect(m.watchdog).toEqual({scope: 'all', deadlineSeconds: 60, pollSeconds: 1})
    expect(m.stateDir).toBe('/run/pdchaos')
  })

  it(
    "the README's several-host example is valid, and every command acts on it: three hosts, two prefill " + 'instances',
    () => {
      const m = modelOf(readmeExamples().twoHost)
      expect(m.hosts.map(h => h.name)).toEqual(['gpu-a', 'gpu-b', 'gpu-c'])
      expect(m.services.prefill.map(p => p.nodes)).toEqual([['gpu-a'], ['gpu-c']])
      expect(m.services.decode.map(p => p.nodes)).toEqual([['gpu-b']])
      expect(m.restartOrder).toEqual([
        'services.prefill[1]',
        'services.prefill[0]',
        'services.decode[0]',
        'services.router',
      ])
      for (const command of ['status', 'inject', 'suite', 'restart', 'recover'])
        expect(singleHostRefusal(m, command)).toBeUndefined()
    },
  )

  it("one named host, or lists of one, is today's deployment: the same single-host view as the host: file", () => {
    const expected = parseDeployment(GOOD, 'f.yaml')
    const named = GOOD.replace('host:\n  kind: ssh\n  alias: gpu-1\n', 'hosts:\n  gpu-1: {kind: ssh, alias: gpu-1}\n')
      .replace('    bootstrapPort: 8998\n', '    bootstrapPort: 8998\n    host: gpu-1\n')
      .replace('  decode:\n', '  decode:\n    host: gpu-1\n')
      .replace('  router:\n', '  router:\n    host: gpu-1\n')
    expect(parseDeployment(named, 'f.yaml')).toStrictEqual(expected)
    expect(modelOf(named).hosts.map(h => h.name)).toEqual(['gpu-1'])
    const listed = GOOD.replace('  prefill:\n    url', '  prefill:\n  - url')
      .replace(/\n {4}(bootstrapPort|restart|logs: \{journald)/g, '\n    $1')
      .replace(
        '  decode:\n    url: http://10.0.0.5:30001\n    logs',
        '  decode:\n    - url: http://10.0.0.5:30001\n      logs',
      )
    expect(modelOf(listed).services.decode[0].path).toBe('services.decode[0]')
    expect(parseDeployment(listed, 'f.yaml')).toStrictEqual(expected)
    // A one-node list is a single-node instance.
    const oneNode = named.replace('  decode:\n    host: gpu-1\n', '  decode:\n    nodes: [gpu-1]\n')
    expect(parseDeployment(oneNode, 'f.yaml')).toStrictEqual(expected)
  })

  it('pdchaos schema describes every form, and files in each validate against it', () => {
    const schema = deploymentJsonSchema() as {
      properties: Record<string, {description?: string}>
      required?: string[]
      description?: string
    }
    // host: or hosts:, never both: the loader holds it (above); the schema says it where an editor shows it.
    expect(schema.required?.sort()).toEqual(['services', 'watchdog'])
    expect(Object.keys(schema.properties)).toEqual(expect.arrayContaining(['host', 'hosts', 'services', 'watchdog']))
    for (const text of [schema.description, schema.properties.host.description, schema.properties.hosts.description])
      expect(text).toMatch(/not both/)
    const text = JSON.stringify(schema.properties.services)
    for (const field of ['nodes', '--node-rank', 'bootstrapPort', 'anyOf']) expect(text).toContain(field)
    const back = z.fromJSONSchema(schema as never)
    expect(back.safeParse(parseYaml(GOOD)).success).toBe(true)
    expect(back.safeParse(DeploymentSchema.parse(parseYaml(GOOD))).success).toBe(true)
    expect(back.safeParse(parseYaml(MULTI)).success).toBe(true)
    expect(back.safeParse({...parseYaml(MULTI), hosts: {'gpu a': {kind: 'local'}}}).success).toBe(false)
  })
})

describe('each mistake is one line naming its path (exit 2)', () => {
  const twoHosts = (services: string, hosts = '  gpu-a: {kind: local}\n  gpu-b: {kind: local}\n') =>
    `hosts:\n${hosts}services:\n${services}watchdog: {deadlineSeconds: 2, pollSeconds: 1}\n`
  const TWO_PREFILLS = twoHosts(
    '  prefill:\n    - {url: "http://a:1", host: gpu-a}\n    - {url: "http://b:1", host: gpu-b}\n  decode: {url: ' +
      '"http://b:2", host: gpu-b}\n  router: {url: "http://a:4", host: gpu-a}\n',
  )
  const cases: [string, string, string][] = [
    [
      'an unknown host name',
      twoHosts(
        [
          '  prefill: {url: "http://a:1", host: gpu-a}',
          '  decode:',
          '    - {url: "http://a:2", host: gpu-a}',
          '    - {url: "http://a:3", host: gpu-b}',
          '  router: {url: "http://a:4", host: gpu-a}',
          '',
        ].join('\n'),
        '  gpu-a: {kind: local}\n',
      ),
      'services.decode[1].host: no host named "gpu-b" in hosts (known: gpu-a)',
    ],
    [
      'a service without a host (no top-level host:)',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://a:2", host: gpu-b}\n  router: {url: ' +
          '"http://a:4"}\n',
      ),
      'services.router.host: required with hosts: name the host it runs on (known: gpu-a, gpu-b)',
    ],
    [
      'host: and hosts: both',
      `host: {kind: ` +
        `local}\n${twoHosts(
          '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://a:2", host: ' +
            'gpu-b}\n  router: {url: "http://a:4", host: gpu-a}\n',
        )}`,
      'hosts: give host: (one host, every service on it) or hosts: (named hosts, each service naming its own), ' +
        'not both',
    ],
    [
      'neither host: nor hosts:',
      'services: {prefill: {url: "http://a:1"}, decode: {url: "http://a:2"}, router: {url: ' +
        '"http://a:4"}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\n',
      'host: required: host: (the one host every service runs on) or hosts: (named hosts, each service naming its ' +
        'own with host: NAME)',
    ],
    [
      'a service naming a host in a host: file',
      'host: {kind: local}\nservices: {prefill: {url: "http://a:1"}, decode: {url: "http://a:2", host: gpu-b}, ' +
        'router: {url: "http://a:4"}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\n',
      'services.decode.host: no host named "gpu-b": this file has no hosts: map (with top-level host:, every ' +
        'service runs on that host; leave host: out)',
    ],
    [
      'two instances on one URL',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode:\n    - {url: "http://b:2", host: gpu-b}\n    - ' +
          '{url: "HTTP://B:2/", host: gpu-b}\n  router: {url: "http://a:4", host: gpu-a}\n',
      ),
      'services.decode[1].url: HTTP://B:2/ is already services.decode[0].url: each service has its own URL',
    ],
    [
      'a prefill on the URL of the router',
      twoHosts(
        '  prefill:\n    - {url: "http://a:4", host: gpu-a}\n  decode: {url: "http://b:2", host: gpu-b}\n  router: ' +
          '{url: "http://a:4", host: gpu-a}\n',
      ),
      'services.router.url: http://a:4 is already services.prefill[0].url: each service has its own URL',
    ],
    [
      'two prefills on one bootstrap address',
      twoHosts(
        '  prefill:\n    - {url: "http://a:1", host: gpu-a}\n    - {url: "http://a:5", host: gpu-a}\n  decode: ' +
          '{url: "http://b:2", host: gpu-b}\n  router: {url: "http://a:4", host: gpu-a}\n',
      ),
      'services.prefill[1].bootstrapPort: a:8998 is already the bootstrap address of services.prefill[0]: decode ' +
        'tells prefill instances apart by URL host and bootstrap port',
    ],
    [
      'a multi-node instance with no nodes',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: [{url: "http://b:2", nodes: []}]\n  router: {url: ' +
          '"http://a:4", host: gpu-b}\n',
      ),
      'services.decode[0].nodes: list the host of each node rank, rank 0 first (at least one)',
    ],
    [
      'a multi-node instance naming an unknown host',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: [{url: "http://b:2", nodes: [gpu-b, gpu-c]}]\n  ' +
          'router: {url: "http://a:4", host: gpu-a}\n',
      ),
      'services.decode[0].nodes[1]: no host named "gpu-c" in hosts (known: gpu-a, gpu-b)',
    ],
    [
      'host: and nodes: on one instance',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a, nodes: [gpu-a, gpu-b]}\n  decode: {url: "http://b:2", host: ' +
          'gpu-b}\n  router: {url: "http://a:4", host: gpu-a}\n',
      ),
      'services.prefill: give host: (a single-node instance) or nodes: (one host per --node-rank, rank 0 first), ' +
        'not both',
    ],
    [
      'a named host nothing runs on',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://b:2", host: gpu-a}\n  router: {url: ' +
          '"http://a:4", host: gpu-a}\n',
      ),
      'hosts["gpu-b"]: no service runs on this host: name it in a service\'s host: or nodes:, or remove it',
    ],
    [
      'an empty hosts map',
      'hosts: {}\nservices: {prefill: {url: "http://a:1", host: a}, decode: {url: "http://a:2", host: a}, router: ' +
        '{url: "http://a:4", host: a}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\n',
      'hosts: name at least one host',
    ],
    [
      'a host name with a space',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://b:2", host: gpu-a}\n  router: {url: ' +
          '"http://a:4", host: gpu-a}\n',
        '  gpu-a: {kind: local}\n  "gpu b": {kind: local}\n',
      ),
      'hosts["gpu b"]: Invalid key in record',
    ],
    [
      'a named ssh host without a hostname',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://b:2", host: gpu-a}\n  router: {url: ' +
          '"http://a:4", host: gpu-a}\n',
        '  gpu-a: {kind: ssh, port: 22}\n',
      ),
      'hosts["gpu-a"]: an ssh host needs alias or hostname',
    ],
    [
      'an empty list of prefill instances',
      'host: {kind: local}\nservices: {prefill: [], decode: {url: "http://a:2"}, router: {url: ' +
        '"http://a:4"}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\n',
      'services.prefill: list at least one prefill instance',
    ],
    [
      'prefill neither a map nor a list',
      'host: {kind: local}\nservices: {prefill: 3, decode: {url: "http://a:2"}, router: {url: ' +
        '"http://a:4"}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\n',
      'services.prefill: expected one prefill service (a map) or a list of prefill instances',
    ],
    [
      'nodes on the router',
      twoHosts(
        '  prefill: {url: "http://a:1", host: gpu-a}\n  decode: {url: "http://b:2", host: gpu-b}\n  router: {url: ' +
          '"http://a:4", host: gpu-a, nodes: [gpu-a]}\n',
      ),
      'services.router: Unrecognized key: "nodes"',
    ],
    [
      'a restart order naming an instance the file does not have',
      `${TWO_PREFILLS}restartOrder: ["prefill[2]", prefill, decode, router]\n`,
      'restartOrder[0]: no prefill[2]: the file has 2 prefill instances (prefill[0], prefill[1])',
    ],
    [
      'a restart order naming something that is not a service',
      `${TWO_PREFILLS}restartOrder: [gateway, prefill, decode]\n`,
      'restartOrder[0]: "gateway" is not a service: name one as prefill, decode or router, or one instance as ' +
        'prefill[1]',
    ],
    [
      'a restart order naming an instance twice',
      `${TWO_PREFILLS}restartOrder: ["prefill[1]", prefill, decode, router]\n`,
      'restartOrder[1]: services.prefill[1] is already named at restartOrder[0]: each service restarts once',
    ],
    [
      'a restart order that leaves a service out',
      `${TWO_PREFILLS}restartOrder: ["prefill[1]", decode, router]\n`,
      'restartOrder: leaves out services.prefill[0]: a co-restart restarts every service, so name each once',
    ],
    [
      'a restart order with the router before a worker',
      `${TWO_PREFILLS}restartOrder: [prefill, router, decode]\n`,
      'restartOrder[1]: the router restarts last, once every prefill and decode instance is healthy (the gateway ' +
        'waits for healthy workers): move it to the end',
    ],
  ]

  it.each(cases)('%s', (_name, text, issue) => {
    const e = refusal(() => modelOf(text))
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(`f.yaml: ${issue}`)
    expect(e.suggestion).toMatch(/pdchaos schema/)
  })
})

describe('a command refuses a file it cannot act on yet (exit 2), naming what is not supported', () => {
  it('several hosts', () => {
    const m = modelOf(MULTI)
    // A command that does not act across hosts is refused for the hosts; the ones that do, for these instances: two
    // prefill instances on one host (inject, suite and status tell instances apart by their host).
    const e = refusal(() => singleHostView(m, {command: 'export', file: '/etc/pdchaos/pd.yaml'}))
    expect(e.exitCode).toBe(2)
    expect(e.code).toBe('E_MULTI_HOST')
    expect(e.message).toBe(
      '/etc/pdchaos/pd.yaml: this deployment spans 3 hosts (gpu-a, gpu-b, gpu-c): export acts on one host today; ' +
        'multi-host runs come with issue 13',
    )
    for (const command of ['inject', 'suite', 'status']) {
      expect(singleHostRefusal(m, command)).toBe(
        `services.prefill[0] and services.prefill[1] both run on host gpu-a: ${command} reads several instances of ` +
          `a role only when each runs on hosts of its own (one per node, as SGLang is usually deployed)`,
      )
    }
    // restart and recover act on each instance by its restart command or its hosts; decode over two nodes is acted on
    // on both (its schedulers read on each, its restart run on each at once).
    for (const command of ['restart', 'recover']) expect(singleHostRefusal(m, command)).toBeUndefined()
    expect(acrossHosts(m)).toEqual([
      {name: 'gpu-a', roles: ['prefill', 'router'], nodeRanks: []},
      {name: 'gpu-b', roles: ['decode'], nodeRanks: []},
      {name: 'gpu-c', roles: [], nodeRanks: [{role: 'decode', path: 'services.decode[0]', nodeRank: 1}]},
    ])
    // From the follower node the view is of the instance it runs a node rank of.
    expect(hostView(m, 'gpu-c').services.decode.url).toBe('http://10.0.3.8:30001')
  })

  it(
    'several single-node instances, each on its own host: status reads them all, inject acts on a pair ' + 'of them',
    () => {
      const m = modelOf(
        MULTI.replace('host: gpu-a, logs', 'host: gpu-c, logs').replace('nodes: [gpu-b, gpu-c]', 'host: gpu-b'),
      )
      for (const command of ['status', 'inject', 'suite', 'restart', 'recover'])
        expect(singleHostRefusal(m, command)).toBeUndefined()
      expect(hostView(m, 'gpu-c').services.prefill.url).toBe('http://10.0.3.7:30002')
      expect(hostView(m, 'gpu-a').services.prefill.url).toBe('http://10.0.3.7:30000')
      expect(hostView(m, 'gpu-b').services.prefill.url).toBe('http://10.0.3.7:30000')
      expect(instancesOn(m, 'gpu-c')).toEqual([{role: 'prefill', path: 'services.prefill[1]'}])
      expect(instancesOn(m, 'gpu-b')).toEqual([{role: 'decode', path: 'services.decode[0]'}])
      // A pair: its instances in the view from every host, and the hosts with the pair's roles.
      const pair = {prefill: 1, decode: 0}
      expect(singleHostView(m, {command: 'inject', file: 'f.yaml', pair}).services.prefill).toMatchObject({
        url: 'http://10.0.3.7:30002',
        bootstrapPort: 8999,
      })
      expect(hostView(m, 'gpu-a', pair).services.prefill.url).toBe('http://10.0.3.7:30002')
      expect(acrossHosts(m, pair)).toEqual([
        {name: 'gpu-a', roles: ['router'], nodeRanks: []},
        {name: 'gpu-b', roles: ['decode'], nodeRanks: []},
        {name: 'gpu-c', roles: ['prefill'], nodeRanks: []},
      ])
      expect(acrossHosts(m)).toEqual([
        {name: 'gpu-a', roles: ['prefill', 'router'], nodeRanks: []},
        {name: 'gpu-b', roles: ['decode'], nodeRanks: []},
        {name: 'gpu-c', roles: ['prefill'], nodeRanks: []},
      ])
      expect(pairPaths(m, pair)).toEqual({prefill: 'services.prefill[1]', decode: 'services.decode[0]'})
      // A pair that names no instance: exit 2, with the numbers there are.
      const e = refusal(() => singleHostView(m, {command: 'inject', file: 'f.yaml', pair: {prefill: 2, decode: 0}}))
      expect(e.exitCode).toBe(2)
      expect(e.message).toBe(
        'f.yaml: --prefill-instance 2: the deployment has 2 prefill instances, numbered 0 to 1 (services.prefill[0] ' +
          'to services.prefill[1])',
      )
      expect(e.suggestion).toMatch(/pdchaos status/)
      expect(pairRefusal(m, {prefill: 0, decode: 1})).toBe(
        '--decode-instance 1: the deployment has one decode instance (services.decode[0]), number 0',
      )
    },
  )

  it('several instances on one host, and an instance over two nodes of one host', () => {
    const base =
      'host: {kind: local}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\nservices:\n  router: {url: "http://a:9"}\n'
    const two = modelOf(
      `${base}  prefill: [{url: "http://a:1"}, {url: "http://a:2", bootstrapPort: 8999}]\n  decode: [{url: ` +
        `"http://a:3"}, {url: "http://a:4"}, {url: "http://a:5"}]\n`,
    )
    expect(singleHostRefusal(two, 'suite')).toBe(
      'services.prefill[0] and services.prefill[1] both run on host host: suite reads several instances of a role ' +
        'only when each runs on hosts of its own (one per node, as SGLang is usually deployed)',
    )
    expect(singleHostRefusal(two, 'restart')).toBeUndefined()
    expect(singleHostRefusal(two, 'export')).toBe(
      'this deployment has 2 prefill instances (services.prefill[0], services.prefill[1]) and 3 decode instances ' +
        '(services.decode[0], services.decode[1], services.decode[2]): export acts on one prefill and one decode ' +
        'instance',
    )
    // One host named for two node ranks: each node rank runs on a host of its own (the file's mistake, at its path).
    expect(
      refusal(() =>
        parseDeployment(
          'hosts: {a: {kind: local}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\nservices:\n  router: {url: ' +
            '"http://a:9", host: a}\n  prefill: {url: "http://a:1", host: a}\n  decode: {url: "http://a:3", nodes: ' +
            '[a, a]}\n',
          'f.yaml',
        ),
      ).message,
    ).toMatch(/services\.decode\.nodes\[1\].*a is node rank 0 already: each node rank runs on a host of its own/)
    // A multi-node decode whose follower node runs a prefill instance's node rank 0: two servers of different roles
    // on one host are fine; a follower of prefill[0] beside prefill[1]'s rank 0 is two prefill servers there, refused.
    const mixed = modelOf(
      'hosts: {a: {kind: local}, b: {kind: local}}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 1}\nservices:\n  ' +
        'router: {url: "http://a:9", host: a}\n  prefill: [{url: "http://a:1", nodes: [a, b]}, {url: "http://b:2", ' +
        'host: b}]\n  decode: {url: "http://a:3", host: a}\n',
    )
    expect(singleHostRefusal(mixed, 'status')).toBe(
      'services.prefill[0] and services.prefill[1] both run on host b: status reads several instances of a role ' +
        'only when each runs on hosts of its own (one per node, as SGLang is usually deployed)',
    )
    expect(refusal(() => parseDeployment(MULTI, 'f.yaml')).message).toMatch(
      /^f\.yaml: this deployment spans 3 hosts .*: pdchaos acts on one host today/,
    )
  })
})
