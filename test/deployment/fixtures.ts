/** A deployment file on one GPU host with every optional part: load.system.test.ts's and deployment-model.test.ts's. */
export const GOOD = `# a deployment on one GPU host
name: h100-pd
labels: {environment: staging}
host:
  kind: ssh
  alias: gpu-1
sudo: passwordless
services:
  prefill:
    url: http://10.0.0.5:30000
    bootstrapPort: 8998
    restart: [systemctl, restart, sglang-prefill]
    logs: {journald: sglang-prefill}
  decode:
    url: http://10.0.0.5:30001
    logs: {file: /var/log/sglang/decode.log}
  router:
    url: http://10.0.0.5:8000
    metricsUrl: http://10.0.0.5:29000
backend: nixl
watchdog: {scope: inflight, deadlineSeconds: 30, pollSeconds: 5}
sglangVersion: 0.5.10
`
