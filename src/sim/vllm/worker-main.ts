/**
 * An engine-core or TP-worker process of the vLLM twin: it carries vLLM's process title (`setproctitle` in
 * vllm/utils/system_utils.py `set_process_title`: "VLLM::EngineCore", "VLLM::Worker_TP<k>"; the DP/PP suffixes of
 * PR #22205 appear only when those sizes are above 1) and answers every engine step, so stopping it wedges the
 * engine as a stopped GPU worker does. It exits with its server.
 */
const i = process.argv.indexOf('--title')
const title = i >= 0 ? process.argv[i + 1] : undefined
if (title) process.title = title

process.on('message', (m: {t?: string; seq?: number}) => {
  if (m?.t === 'step') process.send?.({t: 'stepped', seq: m.seq})
})
process.on('disconnect', () => process.exit(0))
