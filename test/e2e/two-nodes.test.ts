import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'

/**
 * A deployment over two nodes (issue 13): prefill and the router on one namespace host, decode on another, each with
 * its own sshd, the twin started on each as SGLang is started per node.
 */
let c: TestCluster
beforeAll(async () => { c = await createTestCluster() }, 180_000)
afterAll(async () => { await c?.destroy() }, 60_000)

describe('a twin over two nodes', () => {
  it('serves a request through the router, its KV crossing from the prefill node to the decode node', async () => {
    const res = await fetch(`${c.endpoints.router}/generate`, {method: 'POST', headers: {'content-type': 'application/json'}, body: JSON.stringify({text: 'two nodes '.repeat(20), max_new_tokens: 2}), signal: AbortSignal.timeout(30_000)})
    expect(res.status, await res.clone().text()).toBe(200)
    expect(c.endpoints.decode).toContain(c.decodeNode.netns.address)
    expect(c.endpoints.prefill).toContain(c.prefillNode.netns.address)
  }, 60_000)
})
