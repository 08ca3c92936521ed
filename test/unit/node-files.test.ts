// Every reader of a node-local file outside the agent's own folder refuses a
// FIFO (and a file over its limit) at once with a message that names it,
// instead of waiting for ever on it: CRI-O's drop-ins, the auth file,
// containerd's hosts.toml and the certificate files it names, registries.conf
// and its drop-ins, the kubelet's credential provider config. Each goes on
// as it does for any other unreadable file.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { readCrioConfig } from '../../src/crio/crio-config.ts';
import { AuthFile, AUTH_FILE_MAX_BYTES } from '../../src/registry/auth.ts';
import { ContainerdHosts } from '../../src/registry/containerd-hosts.ts';
import { loadCredentialProviderConfig } from '../../src/registry/credential-provider-config.ts';
import { loadRegistriesConf } from '../../src/registry/registries-conf.ts';

let root: string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-node-files-'));
});
after(async () => {
  await fsp.rm(root, { recursive: true, force: true });
});

async function fifo(...parts: string[]): Promise<string> {
  const p = path.join(root, ...parts);
  await fsp.mkdir(path.dirname(p), { recursive: true });
  execFileSync('mkfifo', [p]);
  return p;
}

/** Fails the test if `p` takes longer than a FIFO refused at once would. */
async function quickly<T>(p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('still waiting after 3 s: the reader blocked on the FIFO')), 3_000)))]);
  } finally {
    clearTimeout(timer);
  }
}

describe('node-local files that are not regular files are refused, not waited on', () => {
  test("CRI-O's drop-in folder: a FIFO is a file CRI-O cannot read, named with why; the other files are read", async () => {
    const dir = path.join(root, 'crio', 'crio.conf.d');
    await fsp.mkdir(dir, { recursive: true });
    await fsp.writeFile(path.join(dir, '10-ok.conf'), '[crio.image]\npinned_images = ["a"]\n');
    const pipe = await fifo('crio', 'crio.conf.d', '20-pipe.conf');
    const r = await quickly(readCrioConfig(path.join(root, 'crio', 'crio.conf'), dir));
    assert.deepEqual(r.rejected, [{ path: pipe, error: `${pipe} is a FIFO (named pipe), not a regular file (EFTYPE): not read` }]);
    assert.deepEqual(r.pinnedImages, ['a']);
  });

  test('the auth file: a FIFO or an oversized file means anonymous pulls, with the problem said', async () => {
    const pipe = await fifo('auth', 'config.json');
    const f = new AuthFile(pipe);
    await quickly(f.refresh());
    assert.equal(f.problem, `the auth file ${pipe} is a FIFO (named pipe), not a regular file (EFTYPE): not read; pulling anonymously`);
    assert.equal(f.size, 0);

    const big = path.join(root, 'auth', 'big.json');
    await fsp.writeFile(big, ' '.repeat(AUTH_FILE_MAX_BYTES + 1));
    const g = new AuthFile(big);
    await g.refresh();
    assert.match(g.problem ?? '', /^the auth file .*big\.json is \d+ bytes, more than the \d+-byte limit for it: not read; pulling anonymously$/);
  });

  test("containerd's hosts.toml, and a CA file it names: refused with containerd's own wording around why", async () => {
    const certs = path.join(root, 'certs.d');
    await fifo('certs.d', 'pipe.example', 'hosts.toml');
    const hosts = new ContainerdHosts(certs);
    const r = await quickly(hosts.hosts('pipe.example'));
    assert.match(r.error ?? '', /^cannot read it: .*pipe\.example\/hosts\.toml is a FIFO \(named pipe\), not a regular file \(EFTYPE\): not read$/);

    const ca = await fifo('certs.d', 'ca.example', 'ca.crt');
    await fsp.writeFile(path.join(certs, 'ca.example', 'hosts.toml'), `server = "https://ca.example"\n[host."https://ca.example"]\n  ca = "${ca}"\n`);
    const withCa = await quickly(hosts.hosts('ca.example'));
    assert.match(withCa.error ?? '', /unable to read CA cert ".*ca\.crt": .*ca\.crt is a FIFO \(named pipe\), not a regular file \(EFTYPE\): not read/);
  });

  test('registries.conf and a drop-in of it', async () => {
    const main = await fifo('containers', 'registries.conf');
    await assert.rejects(quickly(loadRegistriesConf({ dir: path.join(root, 'containers', 'none.d'), env: { CONTAINERS_REGISTRIES_CONF: main } })), /cannot read .*registries\.conf: .*is a FIFO \(named pipe\), not a regular file/);
    const d = path.join(root, 'containers', 'registries.conf.d');
    await fifo('containers', 'registries.conf.d', '10-pipe.conf');
    await assert.rejects(quickly(loadRegistriesConf({ defaultFile: path.join(root, 'containers', 'absent.conf'), dir: d, env: {} })), /cannot read .*10-pipe\.conf: .*is a FIFO \(named pipe\)/);
  });

  test("the kubelet's credential provider config", async () => {
    const pipe = await fifo('kubelet', 'credential-provider-config.yaml');
    await assert.rejects(quickly(loadCredentialProviderConfig(pipe, root)), /^CredentialProviderConfigError: credential provider config .* cannot be read: .* is a FIFO \(named pipe\), not a regular file \(EFTYPE\): not read$/);
  });
});
