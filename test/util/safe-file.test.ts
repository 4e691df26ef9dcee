import {execFileSync} from 'node:child_process'
import {existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {decodeUtf8, readInputFile, readInputText, writeOutputFile} from '../../src/util/safe-file.js'

/**
 * Issue 28: the one reader of input files and the one writer of output files. FIFOs only (mkfifo needs no root):
 * the device nodes are in the bad-input table (test/cli/bad-input.system.test.ts), made there with mknod.
 */
const dir = mkdtempSync(join(tmpdir(), 'pdchaos-safe-file-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))
const at = (n: string): string => join(dir, n)
const KIND = {what: 'test file', maxBytes: 64, missing: {suggestion: 'make it'}}

describe('readInputFile: only a regular file, bounded, never blocking', () => {
  it('refuses a FIFO at once (no writer: a blocking open would wait forever), and a directory', () => {
    execFileSync('mkfifo', [at('fifo')])
    const t0 = Date.now()
    expect(() => readInputFile(at('fifo'), KIND)).toThrow(/fifo is a FIFO \(named pipe\), not a test file/)
    expect(Date.now() - t0).toBeLessThan(2000)
    expect(() => readInputFile(dir, KIND)).toThrow(/is a directory, not a test file/)
  })

  it('reads a file up to its cap and refuses one larger; a missing file is named, or undefined when optional', () => {
    writeFileSync(at('small'), 'x'.repeat(64))
    expect(readInputFile(at('small'), KIND)!.length).toBe(64)
    writeFileSync(at('big'), 'x'.repeat(65))
    expect(() => readInputFile(at('big'), KIND)).toThrow(
      /big is larger than 64 bytes, the most pdchaos reads from a test file/,
    )
    expect(() => readInputFile(at('nope'), KIND)).toThrow(/no test file at .*nope/)
    expect(readInputFile(at('nope'), {what: 'test file', maxBytes: 64})).toBeUndefined()
    expect(() => readInputFile(join(at('small'), 'under'), KIND)).toThrow(
      /a part of its path is a file, not a directory \(ENOTDIR\)/,
    )
  })

  it('refuses bytes that are not UTF-8, naming line and column, instead of replacing them', () => {
    writeFileSync(at('latin1'), Buffer.from('a: 1\nname: caf\xe9\n', 'latin1'))
    expect(() => readInputText(at('latin1'), KIND)).toThrow(/latin1:2:10: not UTF-8 \(byte 0xe9 at offset 14\)/)
    expect(decodeUtf8(Buffer.from('name: café ✓\n'), 'f')).toBe('name: café ✓\n')
    // A sequence cut short at the end is not UTF-8 either.
    expect(() => decodeUtf8(Buffer.from([0x61, 0xe2, 0x9c]), 'f')).toThrow(/f:1:2: not UTF-8 \(byte 0xe2 at offset 1\)/)
  })
})

describe('writeOutputFile: only regular files, never replacing another node', () => {
  it('writes a file in new directories, and replaces a regular file whole', () => {
    writeOutputFile(at('new/sub/out.json'), '{"a":1}\n')
    expect(readFileSync(at('new/sub/out.json'), 'utf8')).toBe('{"a":1}\n')
    writeOutputFile(at('new/sub/out.json'), '{}\n')
    expect(readFileSync(at('new/sub/out.json'), 'utf8')).toBe('{}\n')
  })

  it(
    'refuses a FIFO or a directory that appeared after the up-front check, leaving it as it was, without ' + 'blocking',
    () => {
      execFileSync('mkfifo', [at('out-fifo')])
      expect(() => writeOutputFile(at('out-fifo'), 'x')).toThrow(
        /out-fifo is a FIFO \(named pipe\), not a regular file: pdchaos does not write or replace it/,
      )
      expect(lstatSync(at('out-fifo')).isFIFO()).toBe(true)
      mkdirSync(at('out-dir'))
      expect(() => writeOutputFile(at('out-dir'), 'x')).toThrow(/is a directory/)
      expect(lstatSync(at('out-dir')).isDirectory()).toBe(true)
    },
  )

  it('follows a symbolic link to a regular file (the link stays), and refuses a link to a FIFO or to nothing', () => {
    writeFileSync(at('real.json'), 'old')
    symlinkSync(at('real.json'), at('link.json'))
    writeOutputFile(at('link.json'), 'new')
    expect(lstatSync(at('link.json')).isSymbolicLink()).toBe(true)
    expect(readFileSync(at('real.json'), 'utf8')).toBe('new')
    symlinkSync(at('out-fifo'), at('link-fifo'))
    expect(() => writeOutputFile(at('link-fifo'), 'x')).toThrow(/is a FIFO/)
    symlinkSync(at('nowhere'), at('link-nothing'))
    expect(() => writeOutputFile(at('link-nothing'), 'x')).toThrow(/is a symbolic link to nothing/)
    expect(existsSync(at('nowhere'))).toBe(false)
  })

  it('a write that fails removes the directories it made, and leaves no temporary file', () => {
    // A name of 256 bytes is one byte too long: the write fails at the rename, after the directories were made.
    const out = join(at('made'), 'deeper', 'x'.repeat(256))
    expect(() => writeOutputFile(out, 'x')).toThrow(/ENAMETOOLONG/)
    expect(existsSync(at('made')), 'the directories made for the write are gone').toBe(false)
    // A name as long as a name can be is written (its temporary file has a short name of its own).
    writeOutputFile(join(at('long'), 'x'.repeat(255)), 'x')
    expect(readFileSync(join(at('long'), 'x'.repeat(255)), 'utf8')).toBe('x')
  })
})
