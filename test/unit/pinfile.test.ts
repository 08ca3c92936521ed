import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { parse as parseToml, stringify as stringifyToml } from 'smol-toml';
import { effectivePins, OWNER_MARKER, PIN_FILE_PREFIX, PinFile, renderPinFile } from '../../src/crio/pinfile.ts';
import { DEFAULT_PAUSE_IMAGE } from '../../src/crio/crio-config.ts';

const ref = (name: string, c: string) => `quay.io/org/${name}@sha256:${c.repeat(64)}`;
const A = ref('a', 'a');
const B = ref('b', 'b');
const C = ref('c', 'c');
const ADMIN = 'registry.example.com/admin/tool@sha256:' + 'e'.repeat(64);
const MAIN = 'registry.example.com/main/infra@sha256:' + 'f'.repeat(64);
const EVIL = `${A}"]\n[crio.runtime]\ndefault_runtime = "evil"\n#`;
const UUID_NAME = `${PIN_FILE_PREFIX}01234567-89ab-4def-8123-456789abcdef.conf`;
const UUID_NAME_2 = `${PIN_FILE_PREFIX}fedcba98-7654-4321-8fed-cba987654321.conf`;

const toml = (pins: string[]) => stringifyToml({ crio: { image: { pinned_images: pins } } }) + '\n';
const pinsOf = (text: string) => ((parseToml(text) as { crio: { image: { pinned_images: string[] } } }).crio.image.pinned_images);

let root: string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-pinfile-'));
});
after(async () => {
  await fsp.rm(root, { recursive: true, force: true });
});

/** A fresh `<tmp>/<n>/crio.conf.d` (crio.conf would sit beside it). */
let seq = 0;
async function confDir(): Promise<string> {
  const d = path.join(root, String(seq++), 'crio.conf.d');
  await fsp.mkdir(d, { recursive: true });
  return d;
}

describe('renderPinFile', () => {
  test('reads back with smol-toml as the sorted, unique list, under the owner header', () => {
    const text = renderPinFile([C, A, B, A]);
    assert.deepEqual(pinsOf(text), [A, B, C]);
    assert.ok(text.split('\n').includes(OWNER_MARKER));
    assert.deepEqual(Object.keys(parseToml(text)), ['crio']);
  });

  test('an empty list renders an empty pinned_images (clearing pins explicitly)', () => {
    assert.deepEqual(pinsOf(renderPinFile([])), []);
  });

  test('the TOML-injection string stays one string and never opens a second table', () => {
    const text = renderPinFile([A, EVIL, 'x\u0000y\u2028z\\']);
    const doc = parseToml(text) as Record<string, Record<string, Record<string, unknown>>>;
    assert.deepEqual(Object.keys(doc), ['crio']);
    assert.deepEqual(Object.keys(doc.crio!), ['image']);
    assert.deepEqual(Object.keys(doc.crio!.image!), ['pinned_images']);
    assert.deepEqual(doc.crio!.image!.pinned_images, [A, EVIL, 'x\u0000y\u2028z\\'].sort());
    assert.ok(!/^\[crio\.runtime\]/m.test(text), 'a table header appeared at the start of a line');
  });
});

describe('PinFile.open', () => {
  test('chooses a new UUID name after the usual drop-ins, and reuses it across instances', async () => {
    const dir = await confDir();
    const first = await PinFile.open(dir);
    assert.match(first.name, /^99-pinset-[0-9a-f-]{36}\.conf$/);
    // Sorts after the usual numbered drop-ins, so it reads their pins before replacing the list.
    for (const usual of ['00-default.conf', '10-crio.conf', '50-admin.conf', '98-local.conf', '99-local.conf']) assert.ok(first.name > usual, usual);
    assert.equal(first.path, path.join(dir, first.name));
    await first.write(renderPinFile([A]));
    const second = await PinFile.open(dir);
    assert.equal(second.name, first.name);
    const other = await PinFile.open(await confDir());
    assert.notEqual(other.name, first.name, 'a new folder gets a new name');
  });

  test('a missing folder is not an error; the first write creates it', async () => {
    const dir = path.join(await confDir(), 'not-yet');
    const pf = await PinFile.open(dir);
    assert.deepEqual((await pf.scan()).before, []);
    await pf.write(renderPinFile([A]));
    assert.deepEqual(pinsOf(await fsp.readFile(pf.path, 'utf8')), [A]);
  });

  test('a file with the same prefix but no owner marker is not ours: not reused, not touched', async () => {
    const dir = await confDir();
    const foreign = toml([ADMIN]);
    await fsp.writeFile(path.join(dir, UUID_NAME), foreign);
    const pf = await PinFile.open(dir);
    assert.notEqual(pf.name, UUID_NAME);
    await pf.write(renderPinFile([A]));
    assert.deepEqual(await pf.removeStaleOwnedFiles(), []);
    assert.equal(await fsp.readFile(path.join(dir, UUID_NAME), 'utf8'), foreign);
    // It is an ordinary drop-in to the scan.
    const scan = await pf.scan();
    const all = [...scan.before, ...scan.overriding].map((d) => d.file);
    assert.ok(all.includes(UUID_NAME));
  });

  test('removes only the temp files whose exact names it generates; look-alikes stay', async () => {
    const dir = await confDir();
    const staging = path.join(path.dirname(dir), '.pinset');
    await fsp.mkdir(staging);
    await fsp.writeFile(path.join(dir, UUID_NAME), renderPinFile([A]));
    // Its own: the temp in the staging folder, and an older version's temp beside its own file.
    await fsp.writeFile(path.join(staging, `${UUID_NAME}.tmp`), 'half a fi');
    await fsp.writeFile(path.join(dir, `.${UUID_NAME}.4242.tmp`), 'half a fi');
    // Someone else's, however alike.
    const lookAlikes = [
      '.hidden.tmp',
      '.99-pinset-notes.tmp',
      `.${UUID_NAME_2}.4242.tmp`,
      `.${UUID_NAME}.tmp`,
      `.${UUID_NAME}.42x.tmp`,
      `.${UUID_NAME}.4242.tmp.bak`,
      `x.${UUID_NAME}.4242.tmp`,
      '10-admin.conf',
    ];
    for (const n of lookAlikes) await fsp.writeFile(path.join(dir, n), n === '10-admin.conf' ? toml([ADMIN]) : 'x');
    const stagingAlikes = [`${UUID_NAME}.tmp.1`, `${UUID_NAME_2}.tmp`, 'agent.lock', 'notes'];
    for (const n of stagingAlikes) await fsp.writeFile(path.join(staging, n), 'x');

    const pf = await PinFile.open(dir);
    assert.equal(pf.name, UUID_NAME);
    assert.equal(pf.tempPath, path.join(staging, `${UUID_NAME}.tmp`));
    assert.deepEqual((await fsp.readdir(dir)).sort(), [...lookAlikes, UUID_NAME].sort());
    assert.deepEqual((await fsp.readdir(staging)).sort(), stagingAlikes.sort());
  });

  test('a link or a folder at its own temp name is not its file: left alone', async () => {
    const dir = await confDir();
    const staging = path.join(path.dirname(dir), '.pinset');
    await fsp.mkdir(staging);
    await fsp.writeFile(path.join(dir, UUID_NAME), renderPinFile([A]));
    const precious = path.join(path.dirname(dir), 'precious');
    await fsp.writeFile(precious, 'keep me');
    await fsp.symlink(precious, path.join(staging, `${UUID_NAME}.tmp`));
    await fsp.mkdir(path.join(dir, `.${UUID_NAME}.1.tmp`));
    await PinFile.open(dir);
    assert.equal(await fsp.readFile(precious, 'utf8'), 'keep me');
    assert.ok((await fsp.lstat(path.join(staging, `${UUID_NAME}.tmp`))).isSymbolicLink());
    assert.ok((await fsp.stat(path.join(dir, `.${UUID_NAME}.1.tmp`))).isDirectory());
  });

  test('a link named like its own file is not its file', async () => {
    const dir = await confDir();
    const elsewhere = path.join(path.dirname(dir), 'someones.conf');
    await fsp.writeFile(elsewhere, renderPinFile([A]));
    await fsp.symlink(elsewhere, path.join(dir, UUID_NAME));
    const pf = await PinFile.open(dir);
    assert.notEqual(pf.name, UUID_NAME, 'a new name: the link is not provably its own file');
    await pf.write(renderPinFile([B]));
    assert.deepEqual(await pf.removeStaleOwnedFiles(), []);
    assert.ok((await fsp.lstat(path.join(dir, UUID_NAME))).isSymbolicLink(), 'the link stays');
    assert.equal(await fsp.readFile(elsewhere, 'utf8'), renderPinFile([A]));
  });
});

describe('PinFile.scan', () => {
  test('splits the folder around the agent’s file in byte order, as CRI-O reads it', async () => {
    const dir = await confDir();
    await fsp.writeFile(path.join(path.dirname(dir), 'crio.conf'), `[crio]\nlog_level = "info"\n[crio.image]\npinned_images = ["${MAIN}"]\n`);
    await fsp.writeFile(path.join(dir, '10-admin.conf'), toml([ADMIN]));
    await fsp.writeFile(path.join(dir, '20-runtime.conf'), '[crio.runtime]\ndefault_runtime = "crun"\n');
    await fsp.writeFile(path.join(dir, '99-pinset-.conf'), toml([B])); // '.' sorts before every UUID
    await fsp.writeFile(path.join(dir, '99-pinset-~.conf'), toml([C])); // '~' sorts after
    // U+FF21 is EF BC A1 in UTF-8, U+1F600 is F0 9F 98 80: byte order puts U+FF21
    // first, while UTF-16 order (JavaScript's default) would put U+1F600 first.
    await fsp.writeFile(path.join(dir, 'zz-\uFF21.conf'), toml([A]));
    await fsp.writeFile(path.join(dir, 'zz-\u{1F600}.conf'), toml([B]));
    await fsp.mkdir(path.join(dir, '50-a-directory.conf'));
    const pf = await PinFile.open(dir);
    // A temp file of another writer, mid-write: CRI-O reads dotfiles too, and would refuse it.
    await fsp.writeFile(path.join(dir, '.99-pinset-x.conf.1.tmp'), '[crio.image]\npinned_images = [');
    await pf.write(renderPinFile([A, MAIN]));

    const scan = await pf.scan();
    assert.deepEqual(scan.before, [
      { file: path.join(path.dirname(dir), 'crio.conf'), pins: [MAIN] },
      { file: '10-admin.conf', pins: [ADMIN] },
      { file: '99-pinset-.conf', pins: [B] },
    ]);
    assert.deepEqual(scan.overriding, [
      { file: '99-pinset-~.conf', pins: [C] },
      { file: 'zz-\uFF21.conf', pins: [A] },
      { file: 'zz-\u{1F600}.conf', pins: [B] },
    ]);
    assert.deepEqual(scan.ownPins, [A, MAIN]);
    assert.equal(scan.ownContent, renderPinFile([A, MAIN]));
    assert.deepEqual(scan.rejected.map((r) => r.path), [path.join(dir, '.99-pinset-x.conf.1.tmp')]);
  });

  test('walks subfolders as CRI-O does: a subfolder is read where its name sorts; links are read', async () => {
    const dir = await confDir();
    await fsp.mkdir(path.join(dir, '10-team'));
    await fsp.writeFile(path.join(dir, '10-team', 'pins.conf'), toml([ADMIN]));
    await fsp.mkdir(path.join(dir, 'zz-late'));
    await fsp.writeFile(path.join(dir, 'zz-late', 'override.conf'), toml([C]));
    const target = path.join(path.dirname(dir), 'shared.toml');
    await fsp.writeFile(target, toml([B]));
    await fsp.symlink(target, path.join(dir, '20-linked.conf'));
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A]));
    const scan = await pf.scan();
    assert.deepEqual(scan.before, [
      { file: '10-team/pins.conf', pins: [ADMIN] },
      { file: '20-linked.conf', pins: [B] },
    ]);
    assert.deepEqual(scan.overriding, [{ file: 'zz-late/override.conf', pins: [C] }]);
  });

  test('carries crio.conf pins from an explicit main config path', async () => {
    const dir = await confDir();
    const main = path.join(root, 'elsewhere-crio.conf');
    await fsp.writeFile(main, toml([MAIN]));
    const pf = await PinFile.open(dir, { mainConfig: main });
    const scan = await pf.scan();
    assert.deepEqual(scan.before, [{ file: main, pins: [MAIN] }]);
    assert.equal(scan.ownContent, null);
  });

  test('an empty pinned_images list counts: it clears every pin before it', async () => {
    const dir = await confDir();
    await fsp.writeFile(path.join(dir, 'zz-clear.conf'), toml([]));
    const pf = await PinFile.open(dir);
    assert.deepEqual((await pf.scan()).overriding, [{ file: 'zz-clear.conf', pins: [] }]);
  });

  test('reports files CRI-O would refuse, by path, with the reason on one line', async () => {
    const dir = await confDir();
    await fsp.writeFile(path.join(dir, '30-broken.conf'), '[crio.image\npinned_images = [');
    await fsp.writeFile(path.join(dir, '31-typed.conf'), '[crio.image]\npinned_images = "quay.io/a"\n');
    await fsp.writeFile(path.join(dir, '32-fine.conf'), toml([ADMIN]));
    const pf = await PinFile.open(dir);
    const scan = await pf.scan();
    assert.deepEqual(
      scan.rejected.map((p) => p.path),
      [path.join(dir, '30-broken.conf'), path.join(dir, '31-typed.conf')],
    );
    assert.match(scan.rejected[1]!.error, /crio\.image\.pinned_images: incompatible types: TOML value has type string; destination has type \[\]string/);
    for (const p of scan.rejected) assert.ok(!p.error.includes('\n'));
    assert.deepEqual(scan.before, [{ file: '32-fine.conf', pins: [ADMIN] }]);
  });

  test('effectivePins: the last file that sets pinned_images decides; the agent file always sets it', async () => {
    const dir = await confDir();
    await fsp.writeFile(path.join(dir, '10-admin.conf'), toml([ADMIN]));
    const pf = await PinFile.open(dir);
    let scan = await pf.scan();
    assert.deepEqual(effectivePins(scan, null), [ADMIN], 'no agent file yet: the admin list');
    assert.deepEqual(effectivePins(scan, [A, ADMIN]), [A, ADMIN]);
    await fsp.writeFile(path.join(dir, 'zz-clear.conf'), toml([]));
    scan = await pf.scan();
    assert.deepEqual(effectivePins(scan, [A, ADMIN]), [], 'a later file overrides it');
  });

  test('an own file someone broke is reported by its raw content so the agent rewrites it', async () => {
    const dir = await confDir();
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A]));
    const broken = (await fsp.readFile(pf.path, 'utf8')) + '\n[[[ nonsense\n';
    await fsp.writeFile(pf.path, broken);
    const scan = await pf.scan();
    assert.equal(scan.ownContent, broken);
    assert.deepEqual(scan.ownPins, []);
    assert.notEqual(scan.ownContent, renderPinFile([A]));
  });

  test('a missing folder scans as empty', async () => {
    const pf = await PinFile.open(path.join(root, 'no-such-dir', 'crio.conf.d'));
    const scan = await pf.scan();
    assert.deepEqual(scan, { ownContent: null, ownPins: [], before: [], overriding: [], rejected: [], pauseImage: DEFAULT_PAUSE_IMAGE });
  });
});

describe('PinFile.write', () => {
  test('replaces the content and leaves no temp file behind', async () => {
    const dir = await confDir();
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A]));
    await pf.write(renderPinFile([A, B]));
    assert.deepEqual(pinsOf(await fsp.readFile(pf.path, 'utf8')), [A, B]);
    assert.deepEqual(await fsp.readdir(dir), [pf.name]);
  });

  test('the temp file is written in the staging folder beside crio.conf.d, never inside it', async () => {
    const dir = await confDir();
    const seen: { step: string; dropIns: string[]; staging: string[] }[] = [];
    const pf = await PinFile.open(dir, {
      hooks: {
        afterStep: async (step) => {
          seen.push({ step, dropIns: await fsp.readdir(dir), staging: await fsp.readdir(pf.stagingDir) });
        },
      },
    });
    await pf.write(renderPinFile([A]));
    assert.equal(pf.stagingDir, path.join(path.dirname(dir), '.pinset'));
    assert.deepEqual(seen, [
      { step: 'temp-created', dropIns: [], staging: [`${pf.name}.tmp`] },
      { step: 'temp-written', dropIns: [], staging: [`${pf.name}.tmp`] },
      { step: 'temp-fsynced', dropIns: [], staging: [`${pf.name}.tmp`] },
      { step: 'renamed', dropIns: [pf.name], staging: [] },
      { step: 'folder-fsynced', dropIns: [pf.name], staging: [] },
    ]);
    assert.equal((await fsp.stat(pf.stagingDir)).mode & 0o777, 0o700);
  });

  test('a failure between temp write and rename leaves the previous file intact and no temp', async () => {
    const dir = await confDir();
    const good = await PinFile.open(dir);
    await good.write(renderPinFile([A]));
    const before = await fsp.readFile(good.path, 'utf8');
    let tempSeen = '';
    const failing = await PinFile.open(dir, {
      hooks: {
        afterStep: async (step, temp) => {
          if (step !== 'temp-fsynced') return;
          tempSeen = await fsp.readFile(temp, 'utf8');
          throw new Error('disk went away');
        },
      },
    });
    assert.equal(failing.name, good.name);
    await assert.rejects(failing.write(renderPinFile([B])), /disk went away/);
    assert.deepEqual(pinsOf(tempSeen), [B], 'the temp file held the full new content');
    assert.equal(await fsp.readFile(good.path, 'utf8'), before);
    assert.deepEqual(await fsp.readdir(dir), [good.name]);
    assert.deepEqual(await fsp.readdir(good.stagingDir), [], 'the temp file is removed');
  });

  test('a temp file that cannot be created leaves the previous file intact', async () => {
    const dir = await confDir();
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A]));
    const before = await fsp.readFile(pf.path, 'utf8');
    // A directory where the temp file goes: open(O_CREAT) fails even for root.
    const temp = pf.tempPath;
    await fsp.mkdir(temp);
    try {
      await assert.rejects(pf.write(renderPinFile([B])), (e: NodeJS.ErrnoException) => e.code === 'EISDIR');
      assert.equal(await fsp.readFile(pf.path, 'utf8'), before);
    } finally {
      await fsp.rm(temp, { recursive: true, force: true });
    }
  });

  test('a hard link or a symbolic link planted at the temp name after open(): what it points at stays as it was, the pin file is written', async () => {
    for (const plant of ['link', 'symlink'] as const) {
      const dir = await confDir();
      const pf = await PinFile.open(dir);
      await pf.write(renderPinFile([A]));
      // Someone else's file on the same file system (a hard link cannot cross file systems).
      const victim = path.join(path.dirname(dir), 'victim');
      await fsp.writeFile(victim, 'keep me');
      await fsp[plant](victim, pf.tempPath);
      await pf.write(renderPinFile([A, B]));
      assert.equal(await fsp.readFile(victim, 'utf8'), 'keep me', `${plant}: its target is not written`);
      assert.equal((await fsp.stat(victim)).nlink, 1, `${plant}: the planted name is gone, the target left with its own name only`);
      assert.deepEqual(pinsOf(await fsp.readFile(pf.path, 'utf8')), [A, B].sort());
      assert.deepEqual(await fsp.readdir(pf.stagingDir), [], 'no temp file left');
    }
  });

  test('a staging folder that is a symbolic link is refused before anything is written through it', async () => {
    const dir = await confDir();
    const pf = await PinFile.open(dir);
    const elsewhere = path.join(path.dirname(dir), 'elsewhere');
    await fsp.mkdir(elsewhere);
    await fsp.symlink(elsewhere, pf.stagingDir);
    await assert.rejects(pf.write(renderPinFile([A])), /the staging folder .*\.pinset is a symbolic link, not a folder/);
    assert.deepEqual(await fsp.readdir(elsewhere), []);
    assert.equal(await fsp.readFile(pf.path, 'utf8').catch(() => null), null, 'no pin file');
  });

  test('a folder that cannot be created (its parent is a regular file) fails the write', async () => {
    const parent = path.join(await confDir(), 'etc-crio');
    const pf = await PinFile.open(path.join(parent, 'crio.conf.d'));
    await fsp.writeFile(parent, 'not a folder');
    await assert.rejects(pf.write(renderPinFile([A])), (e: NodeJS.ErrnoException) => e.code === 'ENOTDIR' || e.code === 'EEXIST');
    assert.equal(await fsp.readFile(parent, 'utf8'), 'not a folder');
  });

  test('killed (SIGKILL) between temp write and rename: the previous file is intact and valid; the next open cleans up', async () => {
    const dir = await confDir();
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A, ADMIN]));
    const before = await fsp.readFile(pf.path, 'utf8');

    const scriptDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-kill-'));
    try {
      const script = path.join(scriptDir, 'write-and-die.mjs');
      await fsp.writeFile(
        script,
        [
          'const [moduleUrl, dir, pins] = process.argv.slice(2);',
          'const { PinFile, renderPinFile } = await import(moduleUrl);',
          "const pf = await PinFile.open(dir, { hooks: { afterStep: (step) => { if (step === 'temp-fsynced') process.kill(process.pid, 'SIGKILL'); } } });",
          'await pf.write(renderPinFile(JSON.parse(pins)));',
          "process.stdout.write('survived');",
          '',
        ].join('\n'),
      );
      const moduleUrl = pathToFileURL(path.resolve(import.meta.dirname, '../../src/crio/pinfile.ts')).href;
      const child = spawn(process.execPath, [script, moduleUrl, dir, JSON.stringify([B, C])], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d));
      child.stderr.on('data', (d: Buffer) => (err += d));
      const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
      const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => child.on('exit', (c, s) => resolve([c, s])));
      clearTimeout(timer);
      assert.equal(signal, 'SIGKILL', `child exited ${code}: ${err}`);
      assert.equal(out, '', 'the child got past the rename');

      // The kill landed between the temp write and the rename: the temp file is in the staging folder, complete.
      assert.deepEqual(await fsp.readdir(dir), [pf.name], 'nothing but the pin file in crio.conf.d');
      assert.deepEqual(await fsp.readdir(pf.stagingDir), [`${pf.name}.tmp`]);
      assert.deepEqual(pinsOf(await fsp.readFile(pf.tempPath, 'utf8')), [B, C]);
      // The pin file is the previous one, byte for byte, and valid TOML.
      assert.equal(await fsp.readFile(pf.path, 'utf8'), before);
      assert.deepEqual(pinsOf(before), [A, ADMIN]);
    } finally {
      await fsp.rm(scriptDir, { recursive: true, force: true });
    }

    const next = await PinFile.open(dir);
    assert.equal(next.name, pf.name);
    assert.deepEqual(await fsp.readdir(next.stagingDir), [], 'open() removed the temp file');
    await next.write(renderPinFile([B, C]));
    assert.deepEqual((await next.scan()).ownPins, [B, C]);
  });
});

describe('PinFile.removeStaleOwnedFiles', () => {
  test('removes only other files the agent owns', async () => {
    const dir = await confDir();
    // Two owned files (a copy left by an older agent); open() reuses the last in byte order.
    await fsp.writeFile(path.join(dir, UUID_NAME), renderPinFile([A]));
    await fsp.writeFile(path.join(dir, UUID_NAME_2), renderPinFile([B]));
    // Same prefix, no marker; a marker but not our name pattern; an admin drop-in.
    await fsp.writeFile(path.join(dir, `${PIN_FILE_PREFIX}00000000-0000-4000-8000-000000000000.conf`), toml([C]));
    await fsp.writeFile(path.join(dir, '99-pinset-custom.conf'), renderPinFile([C]));
    await fsp.writeFile(path.join(dir, '10-admin.conf'), toml([ADMIN]));
    const pf = await PinFile.open(dir);
    assert.equal(pf.name, UUID_NAME_2);
    assert.deepEqual(await pf.removeStaleOwnedFiles(), [UUID_NAME]);
    assert.deepEqual((await fsp.readdir(dir)).sort(), ['10-admin.conf', `${PIN_FILE_PREFIX}00000000-0000-4000-8000-000000000000.conf`, '99-pinset-custom.conf', UUID_NAME_2].sort());
    assert.deepEqual(await pf.removeStaleOwnedFiles(), []);
  });
});
