/** SGLang's KVPoll (disaggregation/base/conn.py): numeric values matter, the all-reduce takes their MIN. */
export const KVPoll = {Failed: 0, Bootstrapping: 1, WaitingForInput: 2, Transferring: 3, Success: 4} as const
export type KVPollValue = (typeof KVPoll)[keyof typeof KVPoll]

const NAMES = ['Failed', 'Bootstrapping', 'WaitingForInput', 'Transferring', 'Success'] as const
export const pollName = (v: number): string => `KVPoll.${NAMES[v] ?? String(v)}`

/**
 * Status update as the NIXL manager does it: Failed is sticky, otherwise the state only moves forward.
 * (Mooncake lets a late update overwrite Failed; the twin keeps NIXL's rule for both backends.)
 */
export function nextStatus(current: number | undefined, update: number): number {
  if (current === undefined) return update
  if (current === KVPoll.Failed || update === KVPoll.Failed) return KVPoll.Failed
  return Math.max(current, update)
}
