import {isIP} from 'node:net'

import {badInput} from './sim-error.js'
import {distEndpoint, type DistConfig, type Role, type SimConfig} from '../sim-config.js'

/** `sim up --nnodes N --node-rank K --dist-init-addr HOST:PORT`, SGLang's flags for one instance over N nodes. */
export interface DistUpOptions {
  nnodes?: number
  nodeRank?: number
  distInitAddr?: string
}

/**
 * Check the multi-node flags the way SGLang's launcher needs them, and place this node's part: one server (prefill or
 * decode, `--only`), its TOTAL TP split evenly over the nodes (engine.py: tp_size // nnodes per node), the
 * dist-init-addr an IP address and port (node 0's own address on node 0). Undefined for a one-node instance.
 */
export function buildDist(
  o: DistUpOptions & {only?: string[]; prefillTp: number; decodeTp: number; host: string},
  node: SimConfig['node'],
): DistConfig | undefined {
  const nnodes = o.nnodes ?? 1
  if (!Number.isInteger(nnodes) || nnodes < 1 || nnodes > 64)
    throw badInput(`--nnodes must be an integer from 1 to 64, got ${nnodes}`, 'pass --nnodes 2')
  if (nnodes === 1) {
    if (o.nodeRank !== undefined && o.nodeRank !== 0)
      throw badInput(
        `--node-rank ${o.nodeRank} is out of range for --nnodes 1 (0 only)`,
        'pass --nnodes N with the number of nodes the instance spans',
      )
    if (o.distInitAddr !== undefined)
      throw badInput(
        '--dist-init-addr joins the nodes of one instance, but --nnodes is 1',
        'pass --nnodes N (N > 1), or drop --dist-init-addr',
      )
    return undefined
  }
  const roles = node?.services ?? []
  if (roles.length !== 1 || (roles[0] !== 'prefill' && roles[0] !== 'decode')) {
    throw badInput(
      `--nnodes ${nnodes} spans one server over nodes: --only must name exactly one of prefill, decode ` +
        `(got ${o.only?.length ? `--only ${o.only.join(',')}` : 'no --only'})`,
      'pass --only prefill or --only decode, with --prefill-host/--decode-host/--router-host for the other services',
    )
  }
  const role = roles[0] as Role
  const nodeRank = o.nodeRank ?? 0
  if (!Number.isInteger(nodeRank) || nodeRank < 0 || nodeRank >= nnodes)
    throw badInput(
      `--node-rank must be an integer from 0 to ${nnodes - 1} (--nnodes ${nnodes}), got ${nodeRank}`,
      `pass --node-rank 0 on the first node, 1..${nnodes - 1} on the others`,
    )
  const tp = role === 'prefill' ? o.prefillTp : o.decodeTp
  if (tp % nnodes !== 0)
    throw badInput(
      `--${role}-tp ${tp} is the instance's total TP and must split evenly over --nnodes ${nnodes}`,
      `pass --${role}-tp ${nnodes * Math.max(1, Math.round(tp / nnodes))}`,
    )
  if (o.distInitAddr === undefined || o.distInitAddr.trim() === '')
    throw badInput(
      `--nnodes ${nnodes} needs --dist-init-addr HOST:PORT (node rank 0's address and a free port)`,
      `pass --dist-init-addr ${nodeRank === 0 ? o.host : 'NODE0_ADDR'}:5000`,
    )
  const distInitAddr = o.distInitAddr.trim()
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+):(\d{1,5})$/.exec(distInitAddr)
  const d: DistConfig = {role, nnodes, nodeRank, distInitAddr}
  const ep = m ? distEndpoint(d) : undefined
  if (!ep || isIP(ep.host) === 0 || ep.port < 1 || ep.port > 65_535)
    throw badInput(
      `--dist-init-addr must be IP:PORT (node rank 0's address), got "${distInitAddr}"`,
      'pass for example --dist-init-addr 10.0.0.2:5000',
    )
  if (nodeRank === 0 && ep.host !== o.host)
    throw badInput(
      `--dist-init-addr ${distInitAddr} must be this node's own address on node rank 0 (--host ${o.host}): node 0 ` +
        `listens there`,
      `pass --dist-init-addr ${o.host}:${ep.port}`,
    )
  if (nodeRank > 0 && ep.host === o.host)
    throw badInput(
      `--dist-init-addr ${distInitAddr} is this node's own address (--host ${o.host}), but node rank ${nodeRank} ` +
        `joins node 0 there`,
      "pass node rank 0's address in --dist-init-addr",
    )
  return d
}
