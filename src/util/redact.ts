/**
 * Credentials never reach a terminal, a log or a JSON document: the user-info part of any URL
 * (`http://admin:S3cret@host` → `http://***@host`) is replaced wherever text leaves pdchaos.
 */

// scheme://, then everything up to the last @ before the host (WHATWG parsers allow @ inside a password).
const USERINFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#@'"<>`]*(?:@[^\s/?#@'"<>`]*)*@/gi

/** The text with every URL's user:password@ replaced by ***@. */
export function redactText(text: string): string {
  return text.includes('@') ? text.replace(USERINFO, '$1***@') : text
}

/** A URL safe to print: its credentials replaced. */
export const redactUrl = redactText

/** A JSON-like value with every string in it redacted (objects and arrays are copied, not changed). */
export function redactDeep<T>(value: T): T {
  if (typeof value === 'string') return redactText(value) as T
  if (Array.isArray(value)) return value.map(v => redactDeep(v)) as T
  if (value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactDeep(v)])) as T
  }
  return value
}
