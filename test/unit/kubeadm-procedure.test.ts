// The kubeadm procedure of docs/kubelet-credential-verification.md ("Rolling
// the drop-in out to a fleet", kubeadm), run as written on kubeadm nodes laid
// out under a temporary host root: its script, with only the paths it acts on
// moved under the root (the value it writes stays the node's own path) and
// without the kubelet's restart, gives the kubelet a --config-dir through
// KUBELET_EXTRA_ARGS whatever /etc/default/kubelet (or the .rpm's
// /etc/sysconfig/kubelet) held, keeps one that is there, and changes nothing
// when run again. The agent then finds the folder and the drop-in in it
// (src/kubelet/layouts.ts, src/agent/kubelet-config.ts), as the node suite
// checks on a real kubelet started from the same files.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { readKubeletVerification } from '../../src/agent/kubelet-config.ts';
import { findKubeletConfig } from '../../src/kubelet/layouts.ts';
import { KUBEADM_CONFIG, KUBEADM_FLAGS, kubeletDropIn, writeNode, type NodeFiles } from '../support/kubelet-nodes.ts';

const run = promisify(execFile);
const DOC = fileURLToPath(new URL('../../docs/kubelet-credential-verification.md', import.meta.url));
const DROPIN = kubeletDropIn('NeverVerifyAllowlistedImages', ['registry.test/kep/*']);
let tmp: string;
let n = 0;
before(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-kubeadm-procedure-'));
});
after(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

/** The kubeadm section's shell block, as the page shows it. */
async function documentedScript(): Promise<string> {
  const text = await fsp.readFile(DOC, 'utf8');
  const section = text.slice(text.indexOf('\n### kubeadm\n'), text.indexOf('\n### EKS'));
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(block, 'the kubeadm section has a sh block');
  return block;
}

/** Runs the script on the node at `root`: the files it reads and writes put under the root; the kubelet not restarted. */
async function runOn(root: string): Promise<void> {
  const lines = (await documentedScript()).split('\n');
  assert.match(lines.at(-2) ?? '', /^systemctl restart kubelet$/, 'the script ends with the kubelet\'s restart');
  const underRoot = (l: string) => l.replaceAll('/etc/', `${root}/etc/`);
  const script = lines
    .filter((l) => !l.startsWith('systemctl '))
    .map((l, i) => (i === 0 || l.startsWith('install ') ? underRoot(l) : l))
    .join('\n');
  const work = path.join(root, 'work');
  await fsp.mkdir(work, { recursive: true });
  await fsp.writeFile(path.join(work, '50-pinset.conf'), DROPIN);
  await run('bash', ['-euc', script], { cwd: work });
}

async function kubeadmNodeWith(files: NodeFiles): Promise<string> {
  return writeNode(path.join(tmp, `node${++n}`), { '/var/lib/kubelet/config.yaml': KUBEADM_CONFIG, '/var/lib/kubelet/kubeadm-flags.env': KUBEADM_FLAGS, ...files });
}

describe('the kubeadm procedure, as documented, on kubeadm nodes', () => {
  const cases: [string, NodeFiles, string, string][] = [
    ['the .deb\'s empty KUBELET_EXTRA_ARGS=', { '/etc/default/kubelet': 'KUBELET_EXTRA_ARGS=\n' }, '/etc/default/kubelet', 'KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d \n'],
    ['a double-quoted value', { '/etc/default/kubelet': 'KUBELET_EXTRA_ARGS="--v=2 --node-ip=10.0.0.5"\n' }, '/etc/default/kubelet', 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d --v=2 --node-ip=10.0.0.5"\n'],
    ['a single-quoted value', { '/etc/default/kubelet': "KUBELET_EXTRA_ARGS='--v=2'\n" }, '/etc/default/kubelet', "KUBELET_EXTRA_ARGS='--config-dir=/etc/kubernetes/kubelet.conf.d --v=2'\n"],
    ['no KUBELET_EXTRA_ARGS line', { '/etc/default/kubelet': '# kubelet options\n' }, '/etc/default/kubelet', '# kubelet options\nKUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n'],
    ['the .rpm\'s /etc/sysconfig/kubelet, no /etc/default/kubelet', { '/etc/sysconfig/kubelet': 'KUBELET_EXTRA_ARGS=\n' }, '/etc/sysconfig/kubelet', 'KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d \n'],
    ['neither file (in the /etc/default every Debian-based node has)', { '/etc/default/': '' }, '/etc/default/kubelet', 'KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n'],
  ];
  for (const [what, files, envFile, expected] of cases) {
    test(`${what}: --config-dir added, the drop-in installed, the agent finds both; run again, nothing changes`, async () => {
      const root = await kubeadmNodeWith(files);
      await runOn(root);
      assert.equal(await fsp.readFile(path.join(root, envFile), 'utf8'), expected);
      const loc = await findKubeletConfig(root);
      assert.equal(loc.layout, 'kubeadm');
      assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
      assert.deepEqual(loc.problems, []);
      const reading = readKubeletVerification(loc, 'v1.35.6');
      assert.deepEqual([reading.policy, reading.source], ['NeverVerifyAllowlistedImages', path.join(root, '/etc/kubernetes/kubelet.conf.d/50-pinset.conf')]);
      await runOn(root);
      assert.equal(await fsp.readFile(path.join(root, envFile), 'utf8'), expected, 'idempotent');
    });
  }

  test('a --config-dir already given is kept (the drop-in belongs in that folder instead)', async () => {
    const root = await kubeadmNodeWith({ '/etc/default/kubelet': 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubelet.d"\n', '/etc/kubelet.d/': '' });
    await runOn(root);
    assert.equal(await fsp.readFile(path.join(root, '/etc/default/kubelet'), 'utf8'), 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubelet.d"\n');
    assert.equal((await findKubeletConfig(root)).configDir, path.join(root, '/etc/kubelet.d'));
  });
});
