/** Tiny argv reader for the twin's process entry points (`--name value`). */
export function argValue(argv: string[], name: string): string | undefined {
  const i = argv.indexOf(`--${name}`)
  return i >= 0 ? argv[i + 1] : undefined
}
