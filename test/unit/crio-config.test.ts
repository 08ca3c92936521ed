// Reading CRI-O's configuration as CRI-O 1.32 does: which files, in which
// order, and which of them CRI-O would refuse (and so refuse every reload
// and a start). The cases are those seen refused or accepted by a real
// CRI-O 1.32.13 (facts/crio-pinning.md) plus the typed keys of its config.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { decodeCrioConfig, DEFAULT_PAUSE_IMAGE, readCrioConfig } from '../../src/crio/crio-config.ts';
import { anyPinMatches, pinMatches } from '../../src/crio/pin-match.ts';

let root: string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-crio-config-'));
});
after(() => fsp.rm(root, { recursive: true, force: true }));

let n = 0;
async function folder(): Promise<{ dir: string; main: string }> {
  const base = path.join(root, String(n++));
  await fsp.mkdir(path.join(base, 'crio.conf.d'), { recursive: true });
  return { dir: path.join(base, 'crio.conf.d'), main: path.join(base, 'crio.conf') };
}

const refused = (text: string) => assert.throws(() => decodeCrioConfig(text));

describe('decodeCrioConfig: what CRI-O refuses to decode', () => {
  test('TOML syntax errors', () => {
    refused('[crio.image\npinned_images = [');
    refused('[crio.image]\npinned_images = ["unterminated');
    refused('a = 1\na = 2');
  });

  test('pinned_images must be a list of strings (CRI-O: "incompatible types ... destination has type slice")', () => {
    assert.throws(() => decodeCrioConfig('[crio.image]\npinned_images = "notalist"\n'), /crio\.image\.pinned_images: incompatible types: TOML value has type string; destination has type \[\]string/);
    refused('[crio.image]\npinned_images = ["a", 1]\n');
    refused('[crio.image.pinned_images]\nx = "y"\n');
  });

  test('other typed keys: strings, booleans, integers, durations, tables', () => {
    refused('[crio.runtime]\nlog_level = 5\n');
    refused('[crio.api]\nstream_port = 10010\n');
    refused('[crio.metrics]\nmetrics_port = "9090"\n');
    refused('[crio.metrics]\nmetrics_port = 9090.0\n');
    refused('[crio.runtime]\nselinux = "yes"\n');
    refused('[crio.image]\npull_progress_timeout = "ten seconds"\n');
    refused('[crio]\nruntime = "crun"\n');
    refused('crio = 1\n');
    refused('[crio.runtime.runtimes.crun]\nruntime_path = ["/usr/bin/crun"]\n');
    refused('[crio.runtime.runtimes]\ncrun = "x"\n');
    refused('[crio.runtime.runtimes.crun.platform_runtime_paths]\n"linux/amd64" = 1\n');
  });

  test('accepted: unknown keys and tables, an empty file, durations as strings or integers, other top-level keys', () => {
    assert.deepEqual(decodeCrioConfig(''), {});
    assert.deepEqual(decodeCrioConfig('[crio.nosuchtable]\nx = 1\n[crio.image]\nno_such_key = 2\n'), {});
    assert.deepEqual(decodeCrioConfig('[crio.image]\npull_progress_timeout = "1m30s"\n'), {});
    assert.deepEqual(decodeCrioConfig('[crio.image]\npull_progress_timeout = 0\n'), {});
    assert.deepEqual(decodeCrioConfig('[crio.runtime.workloads.x]\nactivation_annotation = "a"\n'), {});
    assert.deepEqual(decodeCrioConfig('[other]\npinned_images = 5\n'), {});
    assert.deepEqual(decodeCrioConfig('[crio.image]\npinned_images = []\npause_image = "r.test/pause:1"\n'), { pinnedImages: [], pauseImage: 'r.test/pause:1' });
  });
});

describe('readCrioConfig: the files CRI-O reads, in its order', () => {
  test('crio.conf first, then every file in filepath.Walk order: dotfiles, names without .conf, subfolders where they sort', async () => {
    const { dir, main } = await folder();
    await fsp.writeFile(main, '[crio.image]\npinned_images = ["main"]\n');
    await fsp.writeFile(path.join(dir, '50-pins'), '[crio.image]\npinned_images = ["fifty"]\n');
    await fsp.writeFile(path.join(dir, '50-pins.conf'), '[crio.image]\npinned_images = ["fifty-conf"]\n');
    await fsp.writeFile(path.join(dir, '.hidden'), '[crio.image]\npinned_images = ["hidden"]\n');
    await fsp.mkdir(path.join(dir, 'sub', 'deeper'), { recursive: true });
    await fsp.writeFile(path.join(dir, 'sub', 'deeper', 'x'), '[crio.image]\npinned_images = ["deep"]\n');
    const r = await readCrioConfig(main, dir);
    assert.deepEqual(r.files.map((f) => f.file), [main, '.hidden', '50-pins', '50-pins.conf', 'sub/deeper/x']);
    assert.deepEqual(r.pinnedImages, ['deep'], 'the last file that sets the key wins');
    assert.deepEqual(r.rejected, []);
    assert.equal(r.pauseImage, DEFAULT_PAUSE_IMAGE);
  });

  test('a link to a file is read through; a dangling link, a link to a folder and a link loop are refused', async () => {
    const { dir, main } = await folder();
    const target = path.join(path.dirname(dir), 'target.conf');
    await fsp.writeFile(target, '[crio.image]\npinned_images = ["linked"]\n');
    await fsp.symlink(target, path.join(dir, '10-link'));
    let r = await readCrioConfig(main, dir);
    assert.deepEqual(r.pinnedImages, ['linked']);
    assert.deepEqual(r.rejected, []);
    await fsp.symlink(path.join(root, 'nowhere'), path.join(dir, '20-dangling'));
    await fsp.symlink(path.dirname(dir), path.join(dir, '30-folder'));
    await fsp.symlink(path.join(dir, '40-loop'), path.join(dir, '40-loop'));
    r = await readCrioConfig(main, dir);
    assert.deepEqual(
      r.rejected.map((x) => [path.basename(x.path), /ENOENT|EISDIR|ELOOP/.exec(x.error)?.[0]]),
      [['20-dangling', 'ENOENT'], ['30-folder', 'EISDIR'], ['40-loop', 'ELOOP']],
    );
  });

  test('an unreadable or undecodable file is refused with its path and CRI-O-style reason; the others still count', async () => {
    const { dir, main } = await folder();
    await fsp.writeFile(path.join(dir, '10-bad'), '[crio.image\n');
    await fsp.writeFile(path.join(dir, '20-good'), '[crio.image]\npinned_images = ["good"]\n');
    const r = await readCrioConfig(main, dir);
    assert.equal(r.rejected.length, 1);
    assert.equal(r.rejected[0]!.path, path.join(dir, '10-bad'));
    assert.match(r.rejected[0]!.error, /^unable to decode configuration .*10-bad: toml: /);
    assert.deepEqual(r.pinnedImages, ['good']);
  });

  test('checks Reload() makes after decoding: log_level and pause_image', async () => {
    const { dir, main } = await folder();
    await fsp.writeFile(path.join(dir, '10-level'), '[crio.runtime]\nlog_level = "loud"\n');
    await fsp.writeFile(path.join(dir, '20-pause'), '[crio.image]\npause_image = "Not A Reference"\n');
    const r = await readCrioConfig(main, dir);
    assert.deepEqual(r.rejected.map((x) => path.basename(x.path)), ['10-level', '20-pause']);
    await fsp.writeFile(path.join(dir, '10-level'), '[crio.runtime]\nlog_level = "WARN"\n');
    await fsp.writeFile(path.join(dir, '20-pause'), '[crio.image]\npause_image = "registry.test/pause:3.10"\n');
    const ok = await readCrioConfig(main, dir);
    assert.deepEqual(ok.rejected, []);
    assert.equal(ok.pauseImage, 'registry.test/pause:3.10');
  });

  test('missing crio.conf and missing folder: nothing to read, nothing refused', async () => {
    const r = await readCrioConfig(path.join(root, 'none', 'crio.conf'), path.join(root, 'none', 'crio.conf.d'));
    assert.deepEqual(r, { files: [], rejected: [], pinnedImages: null, pauseImage: DEFAULT_PAUSE_IMAGE });
  });
});

describe('pinMatches: CRI-O 1.32 pattern matching against stored names', () => {
  const name = 'registry.test/org/glob@sha256:' + 'a'.repeat(64);
  test('exact, case-insensitive', () => {
    assert.ok(pinMatches(name.toUpperCase().replace('SHA256', 'sha256'), name));
    assert.ok(!pinMatches('registry.test/org/glob', name), 'a bare repo pins nothing');
    assert.ok(!pinMatches('registry.test/org/glob:v1', name));
  });
  test('prefix* is not anchored; *kw* anywhere', () => {
    assert.ok(pinMatches('org/gl*', name), 'observed on 1.32.13: an unanchored prefix');
    assert.ok(pinMatches('lob@sha256:*', name));
    assert.ok(pinMatches('*GLOB*', name));
    assert.ok(!pinMatches('other/*', name));
  });
  test('anyPinMatches', () => {
    assert.ok(anyPinMatches(['x', 'registry.test/*'], ['a', name]));
    assert.ok(!anyPinMatches([], [name]));
  });
});
