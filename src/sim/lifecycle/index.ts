/** The twin's lifecycle: what `pdchaos sim up|down|status|restart` call. */
export {simUp, type SimUpResult} from './up.js'
export {simDown, type SimDownResult} from './down.js'
export {simRestart, type SimRestartResult} from './restart.js'
export {simStatus, type SimStatusResult, type ServiceStatus} from './status.js'
export {buildSimConfig, portsFor, type RouterUpOptions, type SimUpOptions, UP_DEFAULTS} from './options.js'
export {twinDeployment, type TwinDeployment} from './deployment-file.js'
export {EXIT_INTERRUPTED, SimError, type SimErrorKind} from './sim-error.js'
export {gpuUuid, GPU_NAME} from './nvidia-smi.js'
