// `pinset kubelet-allowlist` as a user runs it: set files and folders, and
// --node against the in-process API server. What it prints is read back as
// the kubelet reads a drop-in (src/agent/kubelet-config.ts) and checked
// with the kubelet's rules: every image of the sets is exempt, none other
// than those under the printed prefixes.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parse, stringify } from 'yaml';
import { readKubeletVerification } from '../../src/agent/kubelet-config.ts';
import { allowlistMatches, offlineVerdict } from '../../src/api/kubelet-verification.ts';
import { run } from '../../src/cli/kubelet-allowlist.ts';
import { ApiServer } from '../support/apiserver.ts';
import { runCli } from '../support/cli-run.ts';

const d = (c: string) => `@sha256:${c.repeat(64)}`;
const P1 = `registry.test/kep/p1${d('1')}`;
const P2 = `registry.test/kep/p2${d('2')}`;
const P3 = `registry.test/kep/sub/p3${d('3')}`;
const APP = `quay.io/org/app${d('4')}`;
const SOLO = `registry.test:5000/solo${d('5')}`;
const FAR = `far.example/team/tool${d('6')}`;

function set(name: string, images: string[], nodeSelector?: Record<string, unknown>) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { ...(nodeSelector ? { nodeSelector } : {}), pinnedImages: images.map((n) => ({ name: n })) } };
}

let dir: string;
let api: ApiServer;
let kubeconfig: string;
before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-kubelet-allowlist-'));
  await mkdir(path.join(dir, 'static'));
  await writeFile(path.join(dir, 'sets.yaml'), [set('kep', [P1, P2]), set('tools', [P3, APP, SOLO])].map((s) => stringify(s)).join('---\n'));
  await writeFile(path.join(dir, 'static', 'local.yaml'), stringify(set('local', [SOLO])));
  await writeFile(path.join(dir, 'static', '.hidden.yaml'), 'not: [yaml');
  await writeFile(path.join(dir, 'static', 'notes.txt'), 'not a set file');
  api = await ApiServer.start();
  kubeconfig = await api.writeKubeconfig(dir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'edge-1', labels: { role: 'edge' } } });
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'core-1', labels: { role: 'core' } } });
  api.create(set('edge-apps', [P1, P2], { matchLabels: { role: 'edge' } }));
  api.create(set('core-tools', [FAR], { matchLabels: { role: 'core' } }));
});
after(async () => {
  await api?.stop();
  await rm(dir, { recursive: true, force: true });
});

/** The printed drop-in as the agent reads it from a --config-dir: policy and allowlist. */
async function asKubeletReadsIt(text: string): Promise<ReturnType<typeof readKubeletVerification>> {
  const confDir = await mkdtemp(path.join(dir, 'conf.d-'));
  await writeFile(path.join(confDir, '50-pinset.conf'), text);
  return readKubeletVerification({ configDir: confDir }, 'v1.35.6');
}

describe('pinset kubelet-allowlist FILE|DIR', () => {
  test('one "/*" entry per parent path, minimal and sorted, each with what it covers; every image of the sets exempt', async () => {
    const r = await runCli(run, [path.join(dir, 'sets.yaml')]);
    assert.equal(r.code, 0, r.stderr);
    const doc = parse(r.stdout);
    assert.deepEqual(doc, {
      apiVersion: 'kubelet.config.k8s.io/v1beta1',
      kind: 'KubeletConfiguration',
      imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages',
      preloadedImagesVerificationAllowlist: ['quay.io/org/*', 'registry.test/kep/*', 'registry.test:5000/*'],
    });
    assert.match(r.stdout, /# sets kep, tools: covers registry\.test\/kep\/p1, registry\.test\/kep\/p2, registry\.test\/kep\/sub\/p3\n\s+# and any other repository under registry\.test\/kep\/\n\s+- registry\.test\/kep\/\*/);
    assert.match(r.stdout, /sibling repositories/);
    assert.match(r.stdout, /pods must spell registry host and path as the sets do/);
    const read = await asKubeletReadsIt(r.stdout);
    assert.equal(read.policy, 'NeverVerifyAllowlistedImages');
    for (const image of [P1, P2, P3, APP, SOLO, 'registry.test/kep/p1:v2']) assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', read.allowlist, image), 'starts', image);
    assert.equal(allowlistMatches(read.allowlist, FAR), false);
  });

  test('the same input prints the same bytes; a folder is read as the static folder is (set files only, no hidden ones)', async () => {
    const a = await runCli(run, [path.join(dir, 'sets.yaml')]);
    const b = await runCli(run, [path.join(dir, 'sets.yaml')]);
    assert.equal(a.stdout, b.stdout);
    const folder = await runCli(run, [path.join(dir, 'static')]);
    assert.equal(folder.code, 0, folder.stderr);
    assert.deepEqual(parse(folder.stdout).preloadedImagesVerificationAllowlist, ['registry.test:5000/*']);
  });

  test('an invalid set prints nothing, names the file and field, and exits 1', async () => {
    const bad = path.join(dir, 'bad.yaml');
    await writeFile(bad, stringify(set('bad', ['registry.test/kep/p1:latest'])));
    const r = await runCli(run, [path.join(dir, 'sets.yaml'), bad]);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /bad\.yaml: document 1: .*pinnedImages\[0\]/);
    assert.match(r.stderr, /nothing printed/);
  });

  test('usage errors: nothing given, a missing file', async () => {
    await assert.rejects(runCli(run, []), /give set files or folders, or --node/);
    await assert.rejects(runCli(run, [path.join(dir, 'nope.yaml')]), /cannot read .*nope\.yaml: no such file or folder/);
  });
});

describe('pinset kubelet-allowlist --node NAME', () => {
  test('the sets that select the node, from the API and the files', async () => {
    const r = await runCli(run, ['--node', 'edge-1', '--kubeconfig', kubeconfig, path.join(dir, 'static')]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(parse(r.stdout).preloadedImagesVerificationAllowlist, ['registry.test/kep/*', 'registry.test:5000/*']);
    assert.match(r.stdout, /Sets: edge-apps, local \(those selecting node edge-1\)/);
    const core = await runCli(run, ['--node', 'core-1', '--kubeconfig', kubeconfig]);
    assert.deepEqual(parse(core.stdout).preloadedImagesVerificationAllowlist, ['far.example/team/*']);
  });

  test("the node's kubelet version: 1.35 and later get the drop-in; 1.33 and 1.34 refuse it unless their gate is on (--kubelet-gate-on); before 1.33 nothing is needed", async () => {
    const versions = { 'v1.35.6': 'kube-135', 'v1.34.9': 'kube-134', 'v1.33.12': 'kube-133', 'v1.32.13': 'kube-132' };
    for (const [v, name] of Object.entries(versions)) {
      api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { role: 'edge' } }, status: { nodeInfo: { kubeletVersion: v } } });
    }
    const at = (name: string, ...more: string[]) => runCli(run, ['--node', name, '--kubeconfig', kubeconfig, ...more]);
    const on135 = await at('kube-135');
    assert.equal(on135.code, 0, on135.stderr);
    assert.deepEqual(parse(on135.stdout).preloadedImagesVerificationAllowlist, ['registry.test/kep/*']);
    for (const name of ['kube-134', 'kube-133']) {
      const refused = await at(name);
      assert.equal(refused.code, 1);
      assert.equal(refused.stdout, '');
      assert.match(refused.stderr, new RegExp(`node ${name} runs kubelet v1\\.3[34]\\.\\d+: there the feature gate KubeletEnsureSecretPulledImages is off .* refuses these fields and does not start.*add --kubelet-gate-on; nothing printed`));
      const gateOn = await at(name, '--kubelet-gate-on');
      assert.equal(gateOn.code, 0, gateOn.stderr);
      assert.equal(gateOn.stdout, on135.stdout.replaceAll('kube-135', name));
    }
    const old = await at('kube-132', '--kubelet-gate-on');
    assert.equal(old.code, 1);
    assert.equal(old.stdout, '');
    assert.match(old.stderr, /node kube-132 runs kubelet v1\.32\.13, which does not verify .*: it needs no drop-in; nothing printed/);
    await assert.rejects(runCli(run, ['--kubelet-gate-on', path.join(dir, 'sets.yaml')]), /--kubelet-gate-on goes with --node/);
  });

  test('a node that does not exist: exit 1, said plainly', async () => {
    const r = await runCli(run, ['--node', 'ghost', '--kubeconfig', kubeconfig]);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /Node ghost does not exist/);
  });
});
