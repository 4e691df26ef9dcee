/**
 * Moved to util/time.ts, the CLI's one sleep and deadline helper. This re-export only keeps experiment/inject.ts and
 * suite/batch.ts building until they import util/time.js themselves; then delete this file.
 */
export {sleep, within} from '../util/time.js'
