// Reading the kubelet's --config file and --config-dir drop-ins as the 1.35
// and 1.36 kubelets merge them (cmd/kubelet/app/server.go
// mergeKubeletConfigurations, kubeletConfigFlagPrecedence, v1beta1
// defaults.go, validation.go), on real files in a temporary folder.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify } from 'yaml';
import { gateDefault } from '../../src/api/kubelet-verification.ts';
import { dropinFiles, readKubeletVerification, refusedSets, REFUSES_NAMED, verificationStatus, type KubeletVerificationReading } from '../../src/agent/kubelet-config.ts';
import type { PlannedSet } from '../../src/agent/plan.ts';
import { parseReference, type ParsedReference } from '../../src/api/reference.ts';

const HEAD = { apiVersion: 'kubelet.config.k8s.io/v1beta1', kind: 'KubeletConfiguration' };
let root: string;
let n = 0;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-kubelet-config-'));
});
after(async () => {
  await fsp.rm(root, { recursive: true, force: true });
});

/** A fresh node layout: `files` maps a path under it to a document (written as YAML) or raw text. */
async function layout(files: Record<string, unknown>): Promise<{ configFile: string; configDir: string }> {
  const dir = path.join(root, `n${++n}`);
  for (const [rel, content] of Object.entries(files)) {
    const p = path.join(dir, rel);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    await fsp.writeFile(p, typeof content === 'string' ? content : stringify(content));
  }
  return { configFile: path.join(dir, 'config.yaml'), configDir: path.join(dir, 'conf.d') };
}

describe('gateDefault: KubeletEnsureSecretPulledImages by kubelet version', () => {
  test('absent before 1.33, off in 1.33 and 1.34, on from 1.35; an unknown version is taken as 1.35', () => {
    assert.deepEqual(gateDefault('v1.32.4'), { known: false, on: false });
    assert.deepEqual(gateDefault('v1.33.1+k3s1'), { known: true, on: false });
    assert.deepEqual(gateDefault('v1.34.0'), { known: true, on: false });
    assert.deepEqual(gateDefault('v1.35.6'), { known: true, on: true });
    assert.deepEqual(gateDefault('v1.36.0-rc.1'), { known: true, on: true });
    assert.deepEqual(gateDefault(undefined), { known: true, on: true });
  });
});

describe('readKubeletVerification', () => {
  test('neither file nor folder: cannot tell, and says where it looked', async () => {
    const p = await layout({});
    const r = readKubeletVerification(p, 'v1.35.6');
    assert.equal(r.policy, 'Unknown');
    assert.match(r.source, /no kubelet configuration at .*config\.yaml and .*conf\.d/);
  });

  test('a config file naming no policy: the default of a 1.35 kubelet, Off on 1.34, Off on 1.32 whatever it says', async () => {
    const p = await layout({ 'config.yaml': { ...HEAD, failSwapOn: false } });
    assert.deepEqual(readKubeletVerification(p, 'v1.35.6'), { policy: 'NeverVerifyPreloadedImages', allowlist: [], matching: 'image', source: "the kubelet's default" });
    assert.equal(readKubeletVerification(p, 'v1.34.2').policy, 'Off');
    const named = await layout({ 'config.yaml': { ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' } });
    assert.equal(readKubeletVerification(named, 'v1.32.4').policy, 'Off');
    assert.equal(readKubeletVerification(named, 'v1.35.0').policy, 'AlwaysVerify');
    assert.equal(readKubeletVerification(named, 'v1.35.0').source, named.configFile);
  });

  test('1.34 with the gate on in its file defaults the policy; a policy with the gate off is a kubelet that does not start', async () => {
    const on = await layout({ 'config.yaml': { ...HEAD, featureGates: { KubeletEnsureSecretPulledImages: true } } });
    assert.equal(readKubeletVerification(on, 'v1.34.2').policy, 'NeverVerifyPreloadedImages');
    const off = await layout({ 'config.yaml': { ...HEAD, featureGates: { KubeletEnsureSecretPulledImages: false }, imagePullCredentialsVerificationPolicy: 'NeverVerify' } });
    const r = readKubeletVerification(off, 'v1.35.6');
    assert.equal(r.policy, 'Invalid');
    assert.match(r.source, /gate KubeletEnsureSecretPulledImages is off.*does not start/);
  });

  test('drop-ins apply in lexical order, sub-folders where they sort; only names ending in ".conf"', async () => {
    const p = await layout({
      'config.yaml': { ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' },
      'conf.d/10-a.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' },
      'conf.d/20-sub/x.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyPreloadedImages' },
      'conf.d/3-late.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' },
      'conf.d/99-z.yaml': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' },
      'conf.d/99-z.conf.bak': 'not: [valid',
    });
    const order = dropinFiles(p.configDir).map((f) => path.relative(p.configDir, f));
    assert.deepEqual(order, ['10-a.conf', '20-sub/x.conf', '3-late.conf']);
    const r = readKubeletVerification(p, 'v1.35.6');
    assert.equal(r.policy, 'AlwaysVerify');
    assert.equal(r.source, path.join(p.configDir, '3-late.conf'));
  });

  test('only drop-ins (k3s, no --config): merged over the defaults', async () => {
    const p = await layout({
      'conf.d/00-k3s-defaults.conf': { ...HEAD, cgroupDriver: 'systemd' },
      'conf.d/50-pinset.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['registry.test/kep/*'] },
    });
    assert.deepEqual(readKubeletVerification(p, 'v1.35.6'), {
      policy: 'NeverVerifyAllowlistedImages',
      allowlist: ['registry.test/kep/*'],
      matching: 'image',
      source: path.join(p.configDir, '50-pinset.conf'),
    });
  });

  test('a later list replaces the whole list (JSON merge patch), featureGates merge key by key', async () => {
    const p = await layout({
      'config.yaml': { ...HEAD, featureGates: { SomeOtherGate: true } },
      'conf.d/10.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['a.io/x/*', 'b.io/y/*'] },
      'conf.d/20.conf': { ...HEAD, preloadedImagesVerificationAllowlist: ['c.io/z/*'], featureGates: { YetAnother: false } },
    });
    const r = readKubeletVerification(p, 'v1.35.6');
    assert.deepEqual(r.allowlist, ['c.io/z/*']);
    assert.equal(r.source, path.join(p.configDir, '10.conf'));
  });

  test('a drop-in turning the gate off after the config file was defaulted: the defaulted policy stays, and the kubelet refuses it', async () => {
    const p = await layout({ 'config.yaml': { ...HEAD }, 'conf.d/10.conf': { ...HEAD, featureGates: { KubeletEnsureSecretPulledImages: false } } });
    assert.equal(readKubeletVerification(p, 'v1.35.6').policy, 'Invalid');
  });

  test('what validation refuses: an allowlist under another policy, a bare short name, an unknown policy, a drop-in of another kind', async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ ...HEAD, preloadedImagesVerificationAllowlist: ['a.io/x/*'] }, /under another policy/],
      [{ ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['nginx'] }, /"nginx": not a normalized name/],
      [{ ...HEAD, imagePullCredentialsVerificationPolicy: 'Sometimes' }, /"Sometimes" is not one of the four/],
      [{ apiVersion: 'v1', kind: 'ConfigMap' }, /is not apiVersion kubelet\.config\.k8s\.io\/v1beta1/],
    ];
    for (const [doc, why] of cases) {
      const r = readKubeletVerification(await layout({ 'config.yaml': { ...HEAD }, 'conf.d/50.conf': doc }), 'v1.35.6');
      assert.equal(r.policy, 'Invalid', JSON.stringify(doc));
      assert.match(r.source, why);
    }
  });

  test('the command line\'s --feature-gates win over the files\' featureGates for validation; the files\' gate decides the defaulting', async () => {
    const dropin = { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['registry.test/kep/*'] };
    const offInFile = await layout({ 'config.yaml': { ...HEAD, featureGates: { KubeletEnsureSecretPulledImages: false } }, 'conf.d/50-pinset.conf': dropin });
    assert.equal(readKubeletVerification(offInFile, 'v1.35.6').policy, 'Invalid', 'the file turns the gate off: the drop-in is refused');
    assert.equal(readKubeletVerification({ ...offInFile, featureGates: { KubeletEnsureSecretPulledImages: true } }, 'v1.35.6').policy, 'NeverVerifyAllowlistedImages', 'the command line turns it on again');
    const plain = await layout({ 'config.yaml': { ...HEAD }, 'conf.d/50-pinset.conf': dropin });
    const cliOff = readKubeletVerification({ ...plain, featureGates: { KubeletEnsureSecretPulledImages: false } }, 'v1.35.6');
    assert.equal(cliOff.policy, 'Invalid');
    assert.match(cliOff.source, /gate KubeletEnsureSecretPulledImages is off/);
    // 1.34, gate on only on the command line: the file is defaulted with it (no gate of its own), so the default policy holds.
    const noPolicy = await layout({ 'config.yaml': { ...HEAD } });
    assert.equal(readKubeletVerification({ ...noPolicy, featureGates: { KubeletEnsureSecretPulledImages: true } }, 'v1.34.2').policy, 'NeverVerifyPreloadedImages');
    assert.equal(readKubeletVerification(noPolicy, 'v1.34.2').policy, 'Off');
    // The file's own gate off wins at defaulting; the command line's on wins at validation: no policy is the kubelet's refusal (no --config-dir to default again).
    const fileOff = await layout({ 'config.yaml': { ...HEAD, featureGates: { KubeletEnsureSecretPulledImages: false } } });
    const r = readKubeletVerification({ configFile: fileOff.configFile, featureGates: { KubeletEnsureSecretPulledImages: true } }, 'v1.35.6');
    assert.equal(r.policy, 'Invalid');
    assert.match(r.source, /"" is not one of the four policies/);
  });

  test('a --config-dir the kubelet is started with that does not exist: it does not start; given by flag (configDirRequired false): no drop-ins', async () => {
    const p = await layout({ 'config.yaml': { ...HEAD } });
    const required = readKubeletVerification({ ...p, configDirRequired: true, onHost: (f) => f.replace(root, '/host-root') }, 'v1.35.6');
    assert.equal(required.policy, 'Invalid');
    assert.equal(required.source, `the kubelet's --config-dir ${p.configDir.replace(root, '/host-root')} does not exist: the kubelet does not start`);
    assert.equal(readKubeletVerification(p, 'v1.35.6').policy, 'NeverVerifyPreloadedImages');
  });

  test('a --config-dir that is a symbolic link is not walked, as the kubelet\'s WalkDir does not; a link inside it named *.conf is read as a file', async () => {
    const p = await layout({ 'config.yaml': { ...HEAD }, 'real.d/50-pinset.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' }, 'elsewhere/x.yaml': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' } });
    const dir = path.dirname(p.configFile);
    await fsp.symlink(path.join(dir, 'real.d'), p.configDir);
    assert.deepEqual(dropinFiles(p.configDir), []);
    const r = readKubeletVerification({ ...p, configDirRequired: true }, 'v1.35.6');
    assert.deepEqual([r.policy, r.source], ['NeverVerifyPreloadedImages', "the kubelet's default"], 'the drop-in behind the link is not the kubelet\'s');
    await fsp.symlink(path.join(dir, 'elsewhere/x.yaml'), path.join(dir, 'real.d/60-linked.conf'));
    assert.equal(readKubeletVerification({ configFile: p.configFile, configDir: path.join(dir, 'real.d') }, 'v1.35.6').policy, 'NeverVerify');
  });

  test('a FIFO named *.conf in the folder is refused at once, never waited on: cannot tell, naming it', async () => {
    const p = await layout({ 'config.yaml': { ...HEAD }, 'conf.d/10-ok.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' } });
    execFileSync('mkfifo', [path.join(p.configDir, '50-pipe.conf')]);
    const t0 = Date.now();
    const r = readKubeletVerification(p, 'v1.35.6');
    assert.ok(Date.now() - t0 < 5_000, 'returned without a writer on the FIFO');
    assert.equal(r.policy, 'Unknown');
    assert.equal(r.source, `${path.join(p.configDir, '50-pipe.conf')} is a FIFO (named pipe), not a regular file (EFTYPE): not read`);
  });

  test('the allowlist is validated with the rules of the kubelet\'s version: a short name refused by 1.35, taken by 1.36', async () => {
    const p = await layout({ 'conf.d/50.conf': { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['ubuntu', 'registry.test/kep/p1'] } });
    assert.equal(readKubeletVerification(p, 'v1.35.6').policy, 'Invalid');
    const r = readKubeletVerification(p, 'v1.36.2');
    assert.deepEqual([r.policy, r.matching], ['NeverVerifyAllowlistedImages', 'repository']);
  });

  test('a file that is not YAML: cannot tell, naming the file; never throws', async () => {
    const p = await layout({ 'config.yaml': 'apiVersion: [unclosed' });
    const r = readKubeletVerification(p, 'v1.35.6');
    assert.equal(r.policy, 'Unknown');
    assert.match(r.source, /config\.yaml: line 1: invalid YAML/);
  });
});

function planned(name: string, refs: string[], extra: Partial<PlannedSet> = {}): PlannedSet {
  const references = refs.map((r) => (parseReference(r) as { ok: true; value: ParsedReference }).value);
  return { key: `api/${name}`, name, source: 'api', origin: 'api', generation: 1, runtimeHandler: '', selection: 'selected', specErrors: [], invalidImages: [], references, pullSecrets: [], ...extra };
}

const reading = (policy: KubeletVerificationReading['policy'], allowlist: string[] = [], matching: KubeletVerificationReading['matching'] = 'image'): KubeletVerificationReading => ({ policy, allowlist, matching, source: 's' });
const statusOf = (r: KubeletVerificationReading, plan: Parameters<typeof refusedSets>[1]) => verificationStatus(r, refusedSets(r, plan));

describe('verificationStatus: the sets whose pinned images the policy verifies', () => {
  const D = '@sha256:' + 'a'.repeat(64);
  const kep = planned('kep', [`registry.test/kep/p1${D}`, `registry.test/kep/p2${D}`]);
  const mixed = planned('mixed', [`registry.test/kep/p1${D}`, `quay.io/org/app${D}`]);
  const other = planned('other', [`quay.io/org/app${D}`], { key: 'static/other', source: 'static' });
  const unselected = planned('far', [`quay.io/org/app${D}`], { selection: 'not-selected' });
  const plan = { sets: [kep, mixed, other, unselected] };

  test('NeverVerifyAllowlistedImages names the selected sets with an image outside the allowlist', () => {
    const r = { ...reading('NeverVerifyAllowlistedImages', ['registry.test/kep/*']), source: '/x.conf' };
    assert.deepEqual(statusOf(r, plan), { policy: 'NeverVerifyAllowlistedImages', source: '/x.conf', refuses: ['mixed', 'other (static)'] });
  });
  test('exact entries: matched on the repository by a 1.36 kubelet, on the whole image (so never) by a 1.35 one', () => {
    const exact = ['registry.test/kep/p1', 'registry.test/kep/p2'];
    assert.deepEqual(refusedSets(reading('NeverVerifyAllowlistedImages', exact, 'repository'), plan), ['mixed', 'other (static)']);
    assert.deepEqual(refusedSets(reading('NeverVerifyAllowlistedImages', exact, 'image'), plan), ['kep', 'mixed', 'other (static)']);
    const oneOnly = planned('sibling', [`registry.test/kep/p3${D}`]);
    assert.deepEqual(refusedSets(reading('NeverVerifyAllowlistedImages', exact, 'repository'), { sets: [oneOnly] }), ['sibling'], 'a sibling repository no entry names stays verified');
  });
  test('AlwaysVerify names every selected set; NeverVerify and NeverVerifyPreloadedImages none', () => {
    assert.deepEqual(statusOf(reading('AlwaysVerify'), plan).refuses, ['kep', 'mixed', 'other (static)']);
    assert.equal(statusOf(reading('NeverVerify'), plan).refuses, undefined);
    assert.equal(statusOf(reading('NeverVerifyPreloadedImages'), plan).refuses, undefined);
  });
  test('Unknown carries its reason and no verdict; many sets are named up to a bound and counted, and every one of them is kept for the metric', () => {
    assert.deepEqual(statusOf({ ...reading('Unknown'), source: 'why' }, plan), { policy: 'Unknown', source: 'why' });
    const many = { sets: Array.from({ length: REFUSES_NAMED + 3 }, (_, i) => planned(`s${String(i).padStart(2, '0')}`, [`quay.io/org/app${D}`])) };
    const refused = refusedSets(reading('AlwaysVerify'), many);
    assert.equal(refused.length, REFUSES_NAMED + 3);
    const s = verificationStatus(reading('AlwaysVerify'), refused);
    assert.equal(s.refuses?.length, REFUSES_NAMED);
    assert.equal(s.refusesMore, 3);
  });
});
