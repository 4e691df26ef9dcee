/**
 * SGLang's own timeouts that could release a pin instead of the watchdog, as the plan found them on the servers. A
 * pass needs the watchdog named by the evidence, or each of these excluded: shown to fire only after the pin's window.
 */

export type CompetingCause = 'bootstrap-timeout' | 'waiting-timeout' | 'heartbeat'

export interface CompetingTimeout {
  cause: CompetingCause
  /** For people: "decode's waiting timeout". */
  name: string
  /** The variable(s) SGLang reads. */
  setting: string
  /** The earliest it releases a request, in seconds after the request reached the server; null: not in force. */
  seconds: number | null
  /** Where it was read: the environment of pid N, the launch command, SGLang's default for the version found. */
  source: string
  /** False: the reader's environment could not be read, so the value is only SGLang's default: it excludes nothing. */
  known: boolean
}
