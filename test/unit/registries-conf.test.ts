// registries.conf as CRI-O reads it (containers/image pkg/sysregistriesv2):
// prefix matching, mirror order and pull-from-mirror, drop-in merging,
// blocked registries, and the errors a bad file gets.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parseImageName, type ImageName } from '../../src/registry/names.ts';
import { loadRegistriesConf, parseRegistriesConf, prefixMatch, RegistriesConf, RegistriesConfError } from '../../src/registry/registries-conf.ts';

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

const conf = (text: string) => new RegistriesConf(parseRegistriesConf(text, 'r.conf'));
const where = (c: RegistriesConf, ref: string) => c.sources(name(ref)).map((s) => `${s.host}/${s.path}${s.mirror ? ' (mirror)' : ''}${s.endpoint.insecure ? ' insecure' : ''}`);

describe('registries.conf', () => {
  test('prefix matching follows containers/image: whole components, ":" "/" "@" boundaries, wildcard subdomains', () => {
    assert.equal(prefixMatch('quay.io/org/app', 'quay.io/org'), 'quay.io/org'.length);
    assert.equal(prefixMatch('quay.io/organisation/app', 'quay.io/org'), -1);
    assert.equal(prefixMatch('quay.io/org', 'quay.io/org'), 'quay.io/org'.length);
    assert.equal(prefixMatch('a.example.com/x/y', '*.example.com'), 'a.example.com'.length);
    assert.equal(prefixMatch('example.com/x', '*.example.com'), -1);
    assert.equal(prefixMatch('quay.io/a.example.com/x', '*.example.com'), -1);
  });

  test('no entry: the image is fetched from its own host, securely', () => {
    assert.deepEqual(where(RegistriesConf.empty(), 'quay.io/org/app:1'), ['quay.io/org/app']);
  });

  test('mirrors come first, in order, with the path rewritten through the prefix; the longest prefix wins', () => {
    const c = conf(`
[[registry]]
location = "quay.io"
[[registry.mirror]]
location = "mirror-a.local:5000/quay"

[[registry]]
prefix = "quay.io/org"
location = "quay.io/org"
[[registry.mirror]]
location = "mirror-b.local/org-copy"
insecure = true
[[registry.mirror]]
location = "mirror-c.local"
`);
    assert.deepEqual(where(c, 'quay.io/org/app@sha256:' + 'a'.repeat(64)), ['mirror-b.local/org-copy/app (mirror) insecure', 'mirror-c.local/app (mirror)', 'quay.io/org/app']);
    assert.deepEqual(where(c, 'quay.io/other/app:1'), ['mirror-a.local:5000/quay/other/app (mirror)', 'quay.io/other/app']);
  });

  test('pull-from-mirror and mirror-by-digest-only decide which mirrors a tag or a digest may use', () => {
    const digest = '@sha256:' + 'b'.repeat(64);
    const c = conf(`
[[registry]]
location = "r.example.com"
[[registry.mirror]]
location = "digests.local"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "tags.local"
pull-from-mirror = "tag-only"
[[registry.mirror]]
location = "both.local"

[[registry]]
location = "strict.example.com"
mirror-by-digest-only = true
[[registry.mirror]]
location = "strict-mirror.local"
`);
    assert.deepEqual(where(c, `r.example.com/a${digest}`), ['digests.local/a (mirror)', 'both.local/a (mirror)', 'r.example.com/a']);
    assert.deepEqual(where(c, 'r.example.com/a:1'), ['tags.local/a (mirror)', 'both.local/a (mirror)', 'r.example.com/a']);
    assert.deepEqual(where(c, `strict.example.com/a${digest}`), ['strict-mirror.local/a (mirror)', 'strict.example.com/a']);
    assert.deepEqual(where(c, 'strict.example.com/a:1'), ['strict.example.com/a']);
  });

  test('a wildcard prefix without a location keeps the image host; with mirrors they apply to every subdomain', () => {
    const c = conf(`
[[registry]]
prefix = "*.corp.example"
[[registry.mirror]]
location = "cache.local/corp"
`);
    assert.deepEqual(where(c, 'a.corp.example/team/app:1'), ['cache.local/corp/team/app (mirror)', 'a.corp.example/team/app']);
  });

  test('a blocked registry refuses, naming the file', () => {
    const c = conf('[[registry]]\nlocation = "docker.io"\nblocked = true\n');
    assert.throws(() => c.sources(name('docker.io/library/nginx:1')), /registry docker\.io is blocked in r\.conf/);
  });

  test('bad files get errors that name the file and the problem', () => {
    const bad: [string, RegExp][] = [
      ['[[registry]]\nlocation = "https://quay.io"\n', /URI schemes are not supported/],
      ['[[registry]]\ninsecure = true\n', /both location and prefix are unset/],
      ['[[registry]]\nprefix = "quay.io/x"\n', /location is unset and prefix is not of the form \*\.example\.com/],
      ['[[registry]]\nprefix = "*.example.com/x"\n', /wildcard prefix/],
      ['[[registry]]\nlocation = "a.io"\npull-from-mirror = "all"\n', /may be set on a mirror only/],
      ['[[registry]]\nlocation = "a.io"\n[[registry.mirror]]\nlocation = "m.io"\npull-from-mirror = "sometimes"\n', /not one of all, digest-only, tag-only/],
      ['[[registry]]\nlocation = "a.io"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "m.io"\npull-from-mirror = "all"\n', /cannot both be set/],
      ['[[registry]]\nlocation = "a.io"\ninsecure = true\n[[registry]]\nprefix = "a.io/x"\nlocation = "a.io"\n', /conflicting "insecure"/],
      ['[registries.search]\nregistries = ["docker.io"]\n', /v1 format/],
      ['[[registry]\n', /not valid TOML/],
    ];
    for (const [text, re] of bad) {
      assert.throws(
        () => parseRegistriesConf(text, '/etc/containers/registries.conf'),
        (e: Error) => e instanceof RegistriesConfError && re.test(e.message) && e.message.startsWith('/etc/containers/registries.conf'),
        text,
      );
    }
  });

  test('unqualified-search-registries and short-name settings are accepted and ignored', () => {
    const c = conf('unqualified-search-registries = ["docker.io"]\nshort-name-mode = "enforcing"\n[aliases]\n"app" = "quay.io/org/app"\n');
    assert.equal(c.entries.length, 0);
  });

  describe('files', () => {
    let dir: string;
    before(async () => {
      dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-regconf-'));
    });
    after(async () => {
      await rm(dir, { recursive: true, force: true });
    });

    test('CONTAINERS_REGISTRIES_CONF names the main file; drop-ins override by prefix in lexical order; subfolders and other names are skipped', async () => {
      const main = path.join(dir, 'main.conf');
      const d = path.join(dir, 'registries.conf.d');
      await mkdir(path.join(d, 'sub'), { recursive: true });
      await writeFile(main, '[[registry]]\nlocation = "quay.io"\n[[registry.mirror]]\nlocation = "old-mirror.local"\n\n[[registry]]\nlocation = "ghcr.io"\n');
      await writeFile(path.join(d, '10-quay.conf'), '[[registry]]\nlocation = "quay.io"\n[[registry.mirror]]\nlocation = "mirror-10.local"\n');
      await writeFile(path.join(d, '20-quay.conf'), '[[registry]]\nlocation = "quay.io"\n[[registry.mirror]]\nlocation = "mirror-20.local"\n');
      await writeFile(path.join(d, '30-ignored.conf.bak'), '[[registry]]\nlocation = "quay.io"\nblocked = true\n');
      await writeFile(path.join(d, 'sub', '40-ignored.conf'), '[[registry]]\nlocation = "quay.io"\nblocked = true\n');
      const c = await loadRegistriesConf({ dir: d, env: { CONTAINERS_REGISTRIES_CONF: main } });
      assert.deepEqual(where(c, 'quay.io/a/b:1'), ['mirror-20.local/a/b (mirror)', 'quay.io/a/b']);
      assert.deepEqual(where(c, 'ghcr.io/a/b:1'), ['ghcr.io/a/b']);
      assert.deepEqual(c.files, [main, path.join(d, '10-quay.conf'), path.join(d, '20-quay.conf')]);
    });

    test('a missing default file means no configuration; a missing named file is an error; a bad drop-in names itself', async () => {
      const empty = await loadRegistriesConf({ defaultFile: path.join(dir, 'no-such.conf'), dir: path.join(dir, 'none.d'), env: {} });
      assert.deepEqual(empty.entries, []);
      assert.deepEqual(empty.files, []);
      await assert.rejects(loadRegistriesConf({ dir: path.join(dir, 'none.d'), env: { CONTAINERS_REGISTRIES_CONF: path.join(dir, 'absent.conf') } }), /cannot read .*absent\.conf/);
      const d = path.join(dir, 'bad.d');
      await mkdir(d, { recursive: true });
      await writeFile(path.join(d, '50-bad.conf'), '[[registry]]\nlocation = "http://x"\n');
      await assert.rejects(loadRegistriesConf({ file: path.join(dir, 'main.conf'), dir: d, env: {} }), /50-bad\.conf: registry\[0\]\.location "http:\/\/x": URI schemes/);
    });
  });
});
