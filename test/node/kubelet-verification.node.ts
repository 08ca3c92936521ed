// pinset's promise under the kubelet's credential verification of images
// already on the node (KEP-2535, beta and on by default since Kubernetes
// 1.35), measured on the real kubelet (run by test/node/run.ts, once per
// runtime; on a kubelet older than 1.35 it says why it does not apply and
// skips). The kubelet's files are laid out as kubeadm lays them out, and
// the kubelet is started from them as kubeadm's 10-kubeadm.conf starts it:
// its --config-dir comes from KUBELET_EXTRA_ARGS in /etc/default/kubelet,
// the step docs/kubelet-credential-verification.md gives kubeadm nodes. The
// agent is deployed from deploy/ alone, no component and no
// PINSET_KUBELET_* variable: it finds them.
//
// One private registry behind htpasswd holds the images of one set, which
// pinset pins with the set's pull secret; a second one, whose credential
// only the kubelet's credential provider plugin gives (./real-node-
// credentials.ts), holds two more, which pinset pins with the same plugin.
// Of each pair, one image is pulled by pinset alone, the other by the
// kubelet first, for a pod, before any set names it. A fifth image, in a
// sibling repository of the secret-* ones (same registry and path), is in
// no set: another CRI client puts it on the node, as pinset would. Then both
// registries stop, a namespace's Secret is rotated, and under each
// configuration of the kubelet (its policy, in a --config-dir drop-in, read
// at its restart) one pod per image and per case is made:
//  - none: no pull secret;
//  - secret: the Secret that pulled first (user "puller");
//  - other: another namespace, another valid Secret (user "other");
//  - rotated: a namespace whose Secret pulled first and was then rotated
//    (a new password in the same Secret object);
//  - recreated: the same, but the Secret deleted and made again with a
//    newly issued credential (a new object, as some secret operators
//    replace them).
// What each pod came to (Running, or the kubelet's reason) is the table of
// the kubelet's version in docs/kubelet-credential-verification.md, and the
// test fails when the kubelet disagrees with it. The drop-in `pinset
// kubelet-allowlist --node` prints for the node makes every pod of a pinned
// image run: on 1.35 "/*" entries, which exempt the sibling too; from 1.36
// the pinned repositories by name, and the sibling stays verified.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Agent, fetch } from 'undici';
import { parse } from 'yaml';
import { KUBELET_CONFIG_DIR, KUBELET_EXTRA_ARGS_FILE, minorOf, realNodeMissing, startRealNode, type RealNode } from '../support/real-node.ts';
import { PULL_SECRET_NAME } from '../support/real-node-credentials.ts';
import { AGENT_NAMESPACE } from '../support/real-node-deploy.ts';
import { imageLayout, pushPinsetImage, pushWorkloadImage, type NodeImage } from '../support/real-node-images.ts';
import { runtimeMissing, type RuntimeName } from '../support/real-node-runtime.ts';
import { sec, SuiteNode, until, workloadPod } from '../support/real-node-suite.ts';
import { CASES, CONFIGS, documentedOutcomes, IMAGES, NAMESPACES, PINNED, TABLE_DOC, type Case, type ConfigName, type ImageKey, type Outcomes } from '../support/kubelet-verification-table.ts';

const run = promisify(execFile);
/** The Secret of each case's namespace (none has no secret). */
const SECRET = 'kep-pull';
const runtimeName = (process.env.PINSET_NODE_RUNTIME ?? 'crio') as RuntimeName;
const found = realNodeMissing();
const skip = 'why' in found ? found.why : (runtimeMissing(runtimeName) ?? undefined);
const SETS_API = '/apis/pinset.dev/v1alpha1/pinnedimagesets';
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

let node: RealNode | undefined;
let suite: SuiteNode | undefined;
const n = () => node!;
const sn = () => suite!;
const images = {} as Record<ImageKey | 'pinset', NodeImage>;
const users = {} as Record<'puller' | 'other' | 'pullerRotated' | 'reissued', { username: string; password: string }>;
const outcomes: Outcomes = {};
const figures: Record<string, unknown> = { runtime: runtimeName };
let kubeletSkip: string | undefined;

const b64 = (s: string) => Buffer.from(s).toString('base64');
function dockerConfigSecret(host: string, user: { username: string; password: string }) {
  const auth = b64(`${user.username}:${user.password}`);
  return { apiVersion: 'v1', kind: 'Secret', metadata: { name: SECRET }, type: 'kubernetes.io/dockerconfigjson', data: { '.dockerconfigjson': b64(JSON.stringify({ auths: { [host]: { auth } } })) } };
}

/** The kubelet's effective configuration, from its own /configz (the suite's check that a drop-in was taken; pinset never asks it). */
async function configz(): Promise<any> {
  const cfg = JSON.parse(readFileSync(n().kubeletConfigFile, 'utf8'));
  const dispatcher = new Agent({ connect: { rejectUnauthorized: false } });
  try {
    const res = await fetch(`https://127.0.0.1:${cfg.port}/configz`, { dispatcher, signal: AbortSignal.timeout(5000) });
    return ((await res.json()) as any).kubeletconfig;
  } finally {
    await dispatcher.close();
  }
}

/** The drop-in for a configuration; null for the kubelet's defaults. */
async function dropInFor(config: ConfigName): Promise<string | null> {
  const doc = (o: Record<string, unknown>) => JSON.stringify({ apiVersion: 'kubelet.config.k8s.io/v1beta1', kind: 'KubeletConfiguration', ...o }, null, 2);
  switch (config) {
    case 'default':
      return null;
    case 'NeverVerify':
    case 'AlwaysVerify':
      return doc({ imagePullCredentialsVerificationPolicy: config });
    case 'allowlist-names':
      // Each repository by its exact name, as a reader of the field's documentation would write it.
      return doc({ imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: PINNED.map((k) => images[k].ref.split('@')[0]) });
    case 'pinset':
      return pinsetDropIn();
  }
}

/** What `pinset kubelet-allowlist` prints for the node, with the admin's kubeconfig. */
async function pinsetDropIn(): Promise<string> {
  const { stdout } = await run(process.execPath, [join(ROOT, 'src/cli/main.ts'), 'kubelet-allowlist', '--node', n().nodeName], { env: { ...process.env, KUBECONFIG: n().kubeconfig } });
  return stdout;
}

/** Restarts the kubelet with `dropIn` in its --config-dir (or none), and waits until it reports the node again. */
async function restartKubelet(dropIn: string | null): Promise<void> {
  const file = join(n().kubeletConfigDir, '50-credential-verification.conf');
  if (dropIn === null) await rm(file, { force: true });
  else {
    // Whole or not at all, as an administrator's tool writes it: the agent reads the folder when it changes, and a half-written file is one the kubelet would refuse.
    await writeFile(`${file}.tmp`, dropIn);
    await rename(`${file}.tmp`, file);
  }
  await n().stopKubelet();
  const since = Date.now();
  await n().startKubelet();
  await until('the kubelet reporting the node after its restart', 60_000, async () => {
    const obj = await n().api.get(`/api/v1/nodes/${n().nodeName}`);
    const ready = (obj.status.conditions as any[]).find((c) => c.type === 'Ready');
    return Date.parse(ready?.lastHeartbeatTime ?? 0) >= since - 1000;
  }, () => sn().context());
}

/** The policy the agent's status should name for a configuration. */
const expectedPolicy = (config: ConfigName) => (config === 'default' ? 'NeverVerifyPreloadedImages' : config === 'pinset' || config === 'allowlist-names' ? 'NeverVerifyAllowlistedImages' : config);

/** Seconds from `since` until the agent's status names `policy`. */
function agentNaming(policy: string, since: number): Promise<{ seconds: number }> {
  return until(`the agent's status naming ${policy}`, 150_000, async () => {
    const kv = (await sn().nodeStatus()).status?.kubeletVerification;
    return kv?.policy === policy ? { seconds: sec(Date.now() - since) } : undefined;
  }, () => sn().context());
}

/** What a pod came to: Running, or the reason the kubelet gives for not running it. */
async function outcome(namespace: string, name: string): Promise<string | undefined> {
  const st = await sn().podState(namespace, name);
  if (st.running) return 'Running';
  if (st.waiting && /ErrImagePull|ImagePullBackOff|ErrImageNeverPull/.test(st.waiting)) return st.waiting === 'ImagePullBackOff' ? 'ErrImagePull' : st.waiting;
  return undefined;
}

const podName = (config: ConfigName, image: ImageKey, c: Case) => `kep-${config.toLowerCase()}-${image}-${c}`.slice(0, 63);

/** One pod per image and case; resolves to what each came to. */
async function podsUnder(config: ConfigName): Promise<Record<ImageKey, Record<Case, string>>> {
  const made: Array<{ image: ImageKey; c: Case; ns: string; name: string }> = [];
  for (const image of IMAGES) {
    for (const c of CASES) {
      const ns = NAMESPACES[c];
      const name = podName(config, image, c);
      await n().api.create(`/api/v1/namespaces/${ns}/pods`, workloadPod(n().nodeName, name, images[image].ref, { namespace: ns, pullSecrets: c === 'none' ? [] : [SECRET] }));
      made.push({ image, c, ns, name });
    }
  }
  const result = {} as Record<ImageKey, Record<Case, string>>;
  for (const m of made) {
    const got = await until(`pod ${m.ns}/${m.name} Running or refused`, 120_000, () => outcome(m.ns, m.name), () => sn().context());
    (result[m.image] ??= {} as Record<Case, string>)[m.c] = got;
  }
  for (const m of made) await n().api.delete(`/api/v1/namespaces/${m.ns}/pods/${m.name}`, { gracePeriodSeconds: 0 });
  await until('the pods gone', 60_000, async () => {
    for (const m of made) if (await n().api.find(`/api/v1/namespaces/${m.ns}/pods/${m.name}`)) return false;
    return true;
  });
  return result;
}

describe(`the kubelet's credential verification (KEP-2535) and pinned images, on a real kubelet and ${runtimeName}`, { skip }, () => {
  before(async () => {
    if (skip || !('bins' in found)) return;
    const t0 = Date.now();
    node = await startRealNode(found.bins, runtimeName);
    figures.kubelet = n().kubeletVersion;
    if (minorOf(n().kubeletVersion) < 35) {
      kubeletSkip = `kubelet ${n().kubeletVersion}: its credential verification of present images (KEP-2535) is beta and on by default from 1.35`;
      return;
    }
    suite = await SuiteNode.on(n());
    const layout = imageLayout();
    images.pinset = await pushPinsetImage(found.bins.skopeo, n().registry, layout);
    const c = n().credentials;
    for (const key of IMAGES) {
      const [registry, host] = key.startsWith('secret') ? [c.secretRegistry, c.secretHost] : [c.pluginRegistry, c.pluginHost];
      const kind = key.split('-')[0]!;
      images[key] = await pushWorkloadImage(registry, layout, `kep-${key}`, { host, ...(key !== `${kind}-pinset` ? { layersFrom: `node-suite/kep-${kind}-pinset` } : {}) });
    }
    figures.kubeletMinor = minorOf(n().kubeletVersion);
    // A second user of the set's registry, and the namespaces' Secrets.
    users.puller = c.secretRegistry.auth!;
    users.other = { username: 'other', password: `Other-pw-${Date.now()}` };
    users.pullerRotated = { username: users.puller.username, password: `${users.puller.password}-rotated` };
    users.reissued = { username: 'reissued', password: `Reissued-pw-${Date.now()}` };
    await c.secretRegistry.setUser(users.other);
    for (const ns of ['kep-other', 'kep-rotated', 'kep-recreated']) await n().api.create('/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } });
    await n().api.create('/api/v1/namespaces/default/secrets', dockerConfigSecret(c.secretHost, users.puller));
    await n().api.create('/api/v1/namespaces/kep-other/secrets', dockerConfigSecret(c.secretHost, users.other));
    await n().api.create('/api/v1/namespaces/kep-rotated/secrets', dockerConfigSecret(c.secretHost, users.puller));
    await n().api.create('/api/v1/namespaces/kep-recreated/secrets', dockerConfigSecret(c.secretHost, users.puller));
    figures.bedSeconds = sec(Date.now() - t0);
  });

  after(async () => {
    if (!node) return;
    process.stdout.write(`\nkubelet verification figures (${runtimeName}): ${JSON.stringify(figures)}\n`);
    for (const [config, rows] of Object.entries(outcomes)) for (const [image, cases] of Object.entries(rows)) process.stdout.write(`| ${config} | ${image} | ${CASES.map((c) => cases[c as Case]).join(' | ')} |\n`);
    const notes = await node.stop();
    if (notes.length) process.stdout.write(`kubelet verification cleanup: ${notes.join('; ')}\n`);
    node = undefined;
  });

  test('the kubelet pulls two images for pods first; pinset pins all four with the set\'s pull secret and the credential provider; the registries stop', async (t) => {
    if (kubeletSkip) return t.skip(kubeletSkip);
    // deploy/ alone: the agent finds the kubelet's files as kubeadm keeps them (the bed's).
    const live = await sn().deployAgent(images.pinset);
    t.diagnostic(`agent pod ${live.metadata.name} Ready`);
    // The kubelet's own pulls: with the Secret of two namespaces, and with its plugin.
    const seeds = [
      { ns: 'default', image: 'secret-kubelet' as const, secrets: [SECRET] },
      { ns: 'kep-rotated', image: 'secret-kubelet' as const, secrets: [SECRET] },
      { ns: 'kep-recreated', image: 'secret-kubelet' as const, secrets: [SECRET] },
      { ns: 'default', image: 'provider-kubelet' as const, secrets: [] },
    ];
    for (const [i, s] of seeds.entries()) await n().api.create(`/api/v1/namespaces/${s.ns}/pods`, workloadPod(n().nodeName, `kep-seed-${i}`, images[s.image].ref, { namespace: s.ns, pullSecrets: s.secrets }));
    for (const [i, s] of seeds.entries()) await until(`seed pod ${s.ns}/kep-seed-${i} Running`, 120_000, async () => (await sn().podState(s.ns, `kep-seed-${i}`)).running, () => sn().context());
    for (const [i, s] of seeds.entries()) await n().api.delete(`/api/v1/namespaces/${s.ns}/pods/kep-seed-${i}`, { gracePeriodSeconds: 0 });
    // The kubelet's records of its pulls: one per image it pulled, none of pinset's.
    const records = join(n().hostPath('var/lib/kubelet'), 'image_manager', 'pulled');
    assert.ok(existsSync(records), `the kubelet keeps pull records in ${records}`);

    // The sibling: on the node through CRI with the registry's credential, as another client than the kubelet puts it there.
    await n().cri.pullImage(images['secret-sibling'].ref, { auth: { ...users.puller } });
    assert.ok(await n().cri.imageStatus(images['secret-sibling'].ref), 'the sibling on the node');

    // The kubeadm step the docs give (--config-dir through KUBELET_EXTRA_ARGS): the kubelet runs with the folder it names.
    assert.match(readFileSync(n().hostPath(KUBELET_EXTRA_ARGS_FILE), 'utf8'), new RegExp(`^KUBELET_EXTRA_ARGS="--config-dir=/${KUBELET_CONFIG_DIR}"`, 'm'));
    const cmdline = readFileSync(`/proc/${n().kubelet.pid}/cmdline`, 'utf8').split('\0');
    assert.ok(cmdline.includes(`--config-dir=${n().hostPath(KUBELET_CONFIG_DIR)}`), `the kubelet's command line: ${cmdline.join(' ')}`);

    await n().api.create(`/api/v1/namespaces/${AGENT_NAMESPACE}/secrets`, n().credentials.pullSecret);
    const refs = PINNED.map((k) => images[k].ref);
    await n().api.create(SETS_API, { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'offline' }, spec: { pullSecrets: [{ name: PULL_SECRET_NAME }], pinnedImages: refs.map((r) => ({ name: r })) } });
    await until('every image of the set pinned', 180_000, async () => {
      for (const r of refs) if ((await n().cri.imageStatus(r))?.pinned !== true) return false;
      return true;
    }, () => sn().context());
    await n().credentials.secretRegistry.pause();
    await n().credentials.pluginRegistry.pause();
    // The rotation: a new password for the same user, in the registry (stopped) and in the one namespace's Secret.
    await n().credentials.secretRegistry.setUser(users.pullerRotated);
    const rotated = dockerConfigSecret(n().credentials.secretHost, users.pullerRotated);
    const put = await n().api.request('PUT', `/api/v1/namespaces/kep-rotated/secrets/${SECRET}`, rotated);
    assert.equal(put.status, 200, `the Secret rotated: ${JSON.stringify(put.body).slice(0, 300)}`);
    await n().api.delete(`/api/v1/namespaces/kep-recreated/secrets/${SECRET}`);
    await until('the Secret gone', 30_000, async () => (await n().api.find(`/api/v1/namespaces/kep-recreated/secrets/${SECRET}`)) === null);
    await n().credentials.secretRegistry.setUser(users.reissued);
    await n().api.create('/api/v1/namespaces/kep-recreated/secrets', dockerConfigSecret(n().credentials.secretHost, users.reissued));
  });

  for (const config of CONFIGS) {
    test(`registries stopped, kubelet configuration ${config}: what each pod of a pinned image comes to`, async (t) => {
      if (kubeletSkip) return t.skip(kubeletSkip);
      const dropIn = await dropInFor(config);
      if (dropIn) t.diagnostic(`drop-in:\n${dropIn}`);
      if (config === 'pinset') {
        // What --node prints for this kubelet: from 1.36 the set's repositories by name, before it "/*" entries.
        const allowlist = parse(dropIn!).preloadedImagesVerificationAllowlist as string[];
        const exact = minorOf(n().kubeletVersion) >= 36;
        assert.deepEqual(allowlist, exact ? PINNED.map((k) => images[k].ref.split('@')[0]).sort() : [...new Set(PINNED.map((k) => `${images[k].ref.slice(0, images[k].ref.lastIndexOf('/'))}/*`))].sort());
        figures.pinsetAllowlist = allowlist;
      }
      // The agent sees the folder change (it watches what it found), whatever the kubelet's restart: how long it takes, where the policy changes.
      const expected = expectedPolicy(config);
      const previous = (await sn().nodeStatus()).status?.kubeletVerification?.policy;
      const agentSaw = previous !== expected ? agentNaming(expected, Date.now()) : undefined;
      agentSaw?.catch(() => {}); // awaited below; a failure before that is not an unhandled one
      await restartKubelet(dropIn);
      const effective = await configz();
      figures[`policy:${config}`] = effective.imagePullCredentialsVerificationPolicy;
      t.diagnostic(`the kubelet runs with ${effective.imagePullCredentialsVerificationPolicy} ${JSON.stringify(effective.preloadedImagesVerificationAllowlist ?? [])}`);
      assert.equal(effective.imagePullCredentialsVerificationPolicy, expected, 'the kubelet took the drop-in from the folder KUBELET_EXTRA_ARGS names');
      if (agentSaw) figures[`agentSeconds:${config}`] = (await agentSaw).seconds;
      outcomes[config] = await podsUnder(config);
      t.diagnostic(JSON.stringify(outcomes[config]));
      // What the agent tells from the kubelet's files, and `pinset status`'s note: the set is refused exactly when a pod of an image pinset alone pulled needed the registry.
      const pinsetOnlyRefused = (['secret-pinset', 'provider-pinset'] as const).some((i) => CASES.some((c) => outcomes[config]![i][c] !== 'Running'));
      const told = await until(`the agent's status naming ${expected}, ${pinsetOnlyRefused ? '' : 'not '}refusing the set offline (against ${JSON.stringify(outcomes[config])})`, 150_000, async () => {
        const kv = (await sn().nodeStatus()).status?.kubeletVerification;
        return kv?.policy === expected && (kv.refuses ?? []).includes('offline') === pinsetOnlyRefused ? kv : undefined;
      }, () => sn().context());
      figures[`agent:${config}`] = told;
      t.diagnostic(`the agent's status: ${JSON.stringify(told)}${agentSaw ? ` (its policy ${figures[`agentSeconds:${config}`]} s after the drop-in was written)` : ''}`);
      assert.match(told.source, /kubeadm layout: .*--config-dir \/etc\/kubernetes\/kubelet\.conf\.d \(KUBELET_EXTRA_ARGS of \/etc\/default\/kubelet\)/, 'the status says the kubelet\'s files were found as kubeadm keeps them');
      const { stdout: statusText } = await run(process.execPath, [join(ROOT, 'src/cli/main.ts'), 'status'], { env: { ...process.env, KUBECONFIG: n().kubeconfig } });
      t.diagnostic(`pinset status:\n${statusText}`);
      if (pinsetOnlyRefused) assert.match(statusText, new RegExp(`${n().nodeName}[\\s\\S]*offline|offline[\\s\\S]*${n().nodeName}`), 'pinset status names the node and the refused set');
      if (config === 'pinset' || config === 'NeverVerify') {
        for (const image of PINNED) for (const c of CASES) assert.equal(outcomes[config][image][c], 'Running', `${config}: ${image} ${c}`);
      }
      if (config === 'pinset' && minorOf(n().kubeletVersion) >= 36) {
        // A sibling repository the drop-in does not name stays verified: offline, no pod of it starts.
        for (const c of CASES) assert.notEqual(outcomes[config]['secret-sibling'][c], 'Running', `pinset's 1.36 drop-in exempted the sibling (${c})`);
      }
    });
  }

  test("the table of the kubelet's version in docs/kubelet-credential-verification.md is what the kubelet did", (t) => {
    if (kubeletSkip) return t.skip(kubeletSkip);
    assert.deepEqual(outcomes, documentedOutcomes(readFileSync(TABLE_DOC, 'utf8'), minorOf(n().kubeletVersion)));
  });

  test("no credential of this file's users (the other user, the rotated and the re-created Secret's) nor of the bed in any container log, the Node, the Events or the sets", async (t) => {
    if (kubeletSkip) return t.skip(kubeletSkip);
    const host = n().credentials.secretHost;
    const more = (['other', 'pullerRotated', 'reissued'] as const).flatMap((k) => [
      { what: `${k}'s password`, value: users[k].password },
      { what: `${k}'s credential, base64`, value: b64(`${users[k].username}:${users[k].password}`) },
      { what: `${k}'s Secret, .dockerconfigjson`, value: dockerConfigSecret(host, users[k]).data['.dockerconfigjson'] },
    ]);
    const found = await sn().credentialFindings(more);
    assert.deepEqual(found.findings, []);
    t.diagnostic(`searched ${found.logFiles} container log file(s), the Node, the Events and the sets for ${n().credentials.secrets.length + more.length} credential strings`);
  });
});
