// The agent as a user runs it (`pinset agent --once`, its own process) on
// the containerd twin, given a kubelet's configuration files: the node
// status it writes says which sets the kubelet's credential verification
// will refuse offline. The drop-in `pinset kubelet-allowlist` prints for the
// same sets, put in the kubelet's --config-dir, leaves none refused.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import type { KubeletVerificationStatus, NodeStatus } from '../../src/api/types.ts';
import { run as kubeletAllowlist } from '../../src/cli/kubelet-allowlist.ts';
import { runAgentOnce } from '../support/agent-process.ts';
import { runCli } from '../support/cli-run.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';

const hex = () => randomBytes(32).toString('hex');
const P1 = `registry.test/kep/p1@sha256:${hex()}`;
const P2 = `registry.test/kep/p2@sha256:${hex()}`;
const APP = `quay.io/org/app@sha256:${hex()}`;
const HEAD = { apiVersion: 'kubelet.config.k8s.io/v1beta1', kind: 'KubeletConfiguration' };

const set = (name: string, images: string[]) => ({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: images.map((n) => ({ name: n })) } });

let dir: string;
let c: FakeContainerd;
let sets: string;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'pinset-agent-kubelet-'));
  c = await startFakeContainerd({ version: '1.7.24', catalogue: { [P1]: { size: 10 }, [P2]: { size: 10 }, [APP]: { size: 10 } } });
  for (const ref of [P1, P2, APP]) c.preload(ref);
  sets = join(dir, 'sets.d');
  await mkdir(sets);
  await writeFile(join(sets, 'sets.yaml'), [set('kep', [P1, P2]), set('tools', [APP])].map((s) => stringify(s)).join('---\n'));
});
after(async () => {
  await c?.stop();
  await rm(dir, { recursive: true, force: true });
});

/** The node status the agent wrote (logged, as there is no API), from its log lines. */
function nodeStatus(stderr: string): NodeStatus {
  const line = stderr.split('\n').filter((l) => l.includes('"node status"')).pop();
  assert.ok(line, `no node status logged:\n${stderr}`);
  return (JSON.parse(line) as { status: NodeStatus }).status;
}

async function agentWith(configFile: string, configDir: string): Promise<KubeletVerificationStatus | undefined> {
  const r = await runAgentOnce([
    '--node-name', 'n1', '--static-dir', sets, '--cri-endpoint', c.endpoint, '--pin-backend', 'containerd',
    '--state-dir', join(dir, 'state'), '--auth-file', join(dir, 'none.json'), '--metrics-addr', '',
    '--kubelet-config', configFile, '--kubelet-config-dir', configDir,
  ]);
  assert.equal(r.code, 0, r.stderr);
  return nodeStatus(r.stderr).kubeletVerification;
}

describe('pinset agent: the kubelet\'s credential verification in the node status', () => {
  test('no files: cannot tell, and says where it looked', async () => {
    const kv = await agentWith(join(dir, 'absent.yaml'), join(dir, 'absent.d'));
    assert.equal(kv?.policy, 'Unknown');
    assert.match(kv!.source, /no kubelet configuration at .*absent\.yaml and .*absent\.d/);
  });

  test('AlwaysVerify names every set; the drop-in pinset kubelet-allowlist prints for them leaves none refused; a set it left out is named', async () => {
    const node = join(dir, 'node');
    const confDir = join(node, 'conf.d');
    await mkdir(confDir, { recursive: true });
    await writeFile(join(node, 'config.yaml'), stringify({ ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' }));
    const given = `flags: --kubelet-config ${join(node, 'config.yaml')}; --kubelet-config-dir ${confDir}`;
    assert.deepEqual(await agentWith(join(node, 'config.yaml'), confDir), { policy: 'AlwaysVerify', source: `${join(node, 'config.yaml')}; ${given}`, refuses: ['kep (static)', 'tools (static)'] });

    const printed = await runCli(kubeletAllowlist, [sets]);
    assert.equal(printed.code, 0, printed.stderr);
    await writeFile(join(confDir, '50-pinset.conf'), printed.stdout);
    assert.deepEqual(await agentWith(join(node, 'config.yaml'), confDir), { policy: 'NeverVerifyAllowlistedImages', source: `${join(confDir, '50-pinset.conf')}; ${given}` });

    const kepOnly = join(dir, 'kep-only');
    await mkdir(kepOnly);
    await writeFile(join(kepOnly, 'kep.yaml'), stringify(set('kep', [P1, P2])));
    await writeFile(join(confDir, '50-pinset.conf'), (await runCli(kubeletAllowlist, [kepOnly])).stdout);
    const kv = await agentWith(join(node, 'config.yaml'), confDir);
    assert.deepEqual(kv?.refuses, ['tools (static)']);
  });
});
