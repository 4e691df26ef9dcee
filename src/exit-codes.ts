/** The exit codes (the README's table): scripts and CI gate on these, with or without --json. */
export const ExitCode = {
  ok: 0,
  checkFailed: 1,
  badInput: 2,
  stopped: 3,
  cleanupUnverified: 4,
  unreachable: 5,
} as const

export type ExitCodeValue = (typeof ExitCode)[keyof typeof ExitCode]
