// `pinset kubelet-allowlist` as a user runs it: set files and folders, and
// --node against the in-process API server. What it prints is read back as
// the kubelet reads a drop-in (src/agent/kubelet-config.ts) and checked
// with the kubelet's rules of its version: every image of the sets is
// exempt, none other than those under the printed prefixes (1.33 to 1.35)
// or the printed repositories (1.36 and later).
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

/** The drop-in's "Form:" comment as one line. */
function formOf(text: string): string {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.startsWith('# Form: '));
  const end = lines.findIndex((l) => l.startsWith('# Sets: '));
  assert.ok(start >= 0 && end > start, `a Form comment before the Sets comment in:\n${text}`);
  return lines.slice(start, end).map((l) => l.slice(2)).join(' ');
}

/** The printed drop-in as the agent reads it from a --config-dir: policy and allowlist. */
async function asKubeletReadsIt(text: string, kubeletVersion = 'v1.35.6'): Promise<ReturnType<typeof readKubeletVerification>> {
  const confDir = await mkdtemp(path.join(dir, 'conf.d-'));
  await writeFile(path.join(confDir, '50-pinset.conf'), text);
  return readKubeletVerification({ configDir: confDir }, kubeletVersion);
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
    assert.match(formOf(r.stdout), /^Form: no kubelet version given: "\/\*" entries, which kubelets 1\.33 to 1\.35 need/);
    assert.match(r.stderr, /printed for no kubelet version given: "\/\*" entries, .*for a kubelet 1\.36 or later, --kubelet-version \(or --node\) prints each repository as an exact entry instead/);
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
    assert.match(formOf(on135.stdout), /^Form: kubelet v1\.35\.6: "\/\*" entries, as before 1\.36 an exact entry is compared with the pod's whole image/);
    assert.equal(on135.stderr, '', 'with --node the form is said in the drop-in only');
    for (const name of ['kube-134', 'kube-133']) {
      const refused = await at(name);
      assert.equal(refused.code, 1);
      assert.equal(refused.stdout, '');
      assert.match(refused.stderr, new RegExp(`node ${name} runs kubelet v1\\.3[34]\\.\\d+: there the feature gate KubeletEnsureSecretPulledImages is off .* refuses these fields and does not start.*add --kubelet-gate-on; nothing printed`));
      const gateOn = await at(name, '--kubelet-gate-on');
      assert.equal(gateOn.code, 0, gateOn.stderr);
      const version = Object.entries(versions).find(([, n]) => n === name)![0];
      assert.deepEqual(parse(gateOn.stdout), parse(on135.stdout));
      assert.ok(formOf(gateOn.stdout).startsWith(`Form: kubelet ${version}: "/*" entries`), formOf(gateOn.stdout));
    }
    const old = await at('kube-132', '--kubelet-gate-on');
    assert.equal(old.code, 1);
    assert.equal(old.stdout, '');
    assert.match(old.stderr, /node kube-132 runs kubelet v1\.32\.13, which does not verify .*: it needs no drop-in; nothing printed/);
    await assert.rejects(runCli(run, ['--kubelet-gate-on', path.join(dir, 'sets.yaml')]), /--kubelet-gate-on goes with --node or --kubelet-version/);
  });

  test('a 1.36 node: each repository of its sets as an exact entry; read as a 1.36 kubelet reads it, every pinned image is exempt and a sibling repository is not', async () => {
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'kube-136', labels: { role: 'edge' } }, status: { nodeInfo: { kubeletVersion: 'v1.36.2' } } });
    const r = await runCli(run, ['--node', 'kube-136', '--kubeconfig', kubeconfig, path.join(dir, 'static')]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr, '');
    assert.deepEqual(parse(r.stdout).preloadedImagesVerificationAllowlist, ['registry.test/kep/p1', 'registry.test/kep/p2', 'registry.test:5000/solo']);
    assert.match(formOf(r.stdout), /^Form: kubelet v1\.36\.2: each repository as an exact entry, which from 1\.36 matches that repository with any tag or digest and no sibling/);
    assert.match(r.stdout, /sibling repositories stay verified/);
    assert.match(r.stdout, /# set edge-apps\n\s+- registry\.test\/kep\/p1\n/);
    assert.doesNotMatch(r.stdout, /and any other repository/);
    const read = await asKubeletReadsIt(r.stdout, 'v1.36.2');
    assert.equal(read.policy, 'NeverVerifyAllowlistedImages');
    for (const image of [P1, P2, SOLO, 'registry.test/kep/p1:v2']) assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', read.allowlist, image, 'repository'), 'starts', image);
    for (const sibling of [P3, `registry.test/kep/other${d('7')}`, `registry.test:5000/solo2${d('8')}`]) {
      assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', read.allowlist, sibling, 'repository'), 'verified', sibling);
    }
    // Given to a 1.35 kubelet, the same entries would exempt nothing: why it is printed for 1.36 only.
    for (const image of [P1, P2, SOLO]) assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', read.allowlist, image, 'image'), 'verified', image);
  });

  test('a Node that reports no kubelet version gets the "/*" form, which every version from 1.33 takes, and the drop-in says why', async () => {
    const r = await runCli(run, ['--node', 'edge-1', '--kubeconfig', kubeconfig]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(parse(r.stdout).preloadedImagesVerificationAllowlist, ['registry.test/kep/*']);
    assert.match(formOf(r.stdout), /^Form: the Node reports no kubelet version: "\/\*" entries/);
  });
});

describe('pinset kubelet-allowlist --kubelet-version VERSION (files, no --node)', () => {
  test('1.36: exact entries, said on the standard error; 1.35: "/*" entries, said too', async () => {
    const exact = await runCli(run, ['--kubelet-version', '1.36', path.join(dir, 'sets.yaml')]);
    assert.equal(exact.code, 0, exact.stderr);
    assert.deepEqual(parse(exact.stdout).preloadedImagesVerificationAllowlist, ['quay.io/org/app', 'registry.test/kep/p1', 'registry.test/kep/p2', 'registry.test/kep/sub/p3', 'registry.test:5000/solo']);
    assert.match(exact.stdout, /# set kep\n\s+- registry\.test\/kep\/p1\n/);
    assert.match(exact.stderr, /printed for kubelet 1\.36: each repository as an exact entry/);
    const prefix = await runCli(run, ['--kubelet-version', 'v1.35.6', path.join(dir, 'sets.yaml')]);
    assert.equal(prefix.code, 0, prefix.stderr);
    assert.deepEqual(parse(prefix.stdout).preloadedImagesVerificationAllowlist, ['quay.io/org/*', 'registry.test/kep/*', 'registry.test:5000/*']);
    assert.match(prefix.stderr, /printed for kubelet v1\.35\.6: "\/\*" entries, as before 1\.36 an exact entry is compared with the pod's whole image/);
  });

  test('1.34 as the node would: nothing without --kubelet-gate-on, the "/*" form with it; before 1.33 nothing', async () => {
    const refused = await runCli(run, ['--kubelet-version', '1.34', path.join(dir, 'sets.yaml')]);
    assert.equal(refused.code, 1);
    assert.equal(refused.stdout, '');
    assert.match(refused.stderr, /kubelet 1\.34: there the feature gate KubeletEnsureSecretPulledImages is off .*add --kubelet-gate-on; nothing printed/);
    const gateOn = await runCli(run, ['--kubelet-version', '1.34', '--kubelet-gate-on', path.join(dir, 'sets.yaml')]);
    assert.equal(gateOn.code, 0, gateOn.stderr);
    assert.deepEqual(parse(gateOn.stdout).preloadedImagesVerificationAllowlist, ['quay.io/org/*', 'registry.test/kep/*', 'registry.test:5000/*']);
    const old = await runCli(run, ['--kubelet-version', 'v1.32.13', path.join(dir, 'sets.yaml')]);
    assert.equal(old.code, 1);
    assert.match(old.stderr, /kubelet v1\.32\.13, which does not verify .*: it needs no drop-in; nothing printed/);
  });

  test('usage errors: with --node, or not a version', async () => {
    await assert.rejects(runCli(run, ['--node', 'edge-1', '--kubelet-version', '1.36']), /--kubelet-version is for files without --node/);
    await assert.rejects(runCli(run, ['--kubelet-version', 'latest', path.join(dir, 'sets.yaml')]), /--kubelet-version "latest" is not a Kubernetes version/);
  });

  test('a node that does not exist: exit 1, said plainly', async () => {
    const r = await runCli(run, ['--node', 'ghost', '--kubeconfig', kubeconfig]);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /Node ghost does not exist/);
  });
});
