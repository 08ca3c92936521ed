// Registry credentials as the node has them, end to end: `pinset agent` (the
// bundle as shipped) on containerd 1.7.24 and 2.1.9, which has NO credentials of its
// own (its hosts.toml maps the made-up host registry.test to a loopback
// distribution registry behind htpasswd), pinning by image labels. The
// credentials come from the kubelet's credential provider plugins (the test
// plugin, test/support/test-credential-provider.mjs, with the same
// CredentialProviderConfig a kubelet would get), from the auth file, and
// from pull secrets that sets name, read from the in-process API server.
// Every scenario checks that no secret reaches a log line, the node's
// status or an Event.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus, type PinnedImageSet, type PinnedImageSetSpec } from '../../src/api/types.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient, PINNING_CONTAINERD_VERSIONS } from '../support/containerd.ts';
import { alive, controlPlugin, groupMembers, installTestPlugin, readPluginLog, writeProviderConfig, type ProviderEntry } from '../support/credential-plugin.ts';
import { pushSingleLayer, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { AgentProcess, bundledCli, eventually, runAgentOnce } from '../support/agent-process.ts';
import { staticNode } from '../support/static-node.ts';

const USER = 'robot';
// Distinctive, so a search for them cannot match anything else.
const PASSWORD = 'Pl4gin-Secret-pw-3f9a1c';
const WRONG_PASSWORD = 'St4le-Secret-pw-7e21d0';
const b64 = (s: string) => Buffer.from(s).toString('base64');
const SECRETS = [PASSWORD, WRONG_PASSWORD, b64(`${USER}:${PASSWORD}`), b64(`${USER}:${WRONG_PASSWORD}`)];

function set(name: string, spec: Partial<PinnedImageSetSpec> & { images: PushedImage[] }): PinnedImageSet {
  const { images, ...rest } = spec;
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { ...rest, pinnedImages: images.map((i) => ({ name: i.ref })) } };
}

function assertNoSecret(where: string, text: string): void {
  for (const s of SECRETS) assert.ok(!text.includes(s), `a credential appears in ${where}`);
}

function loggedStatus(agent: AgentProcess, name: string): NodeSetStatus | undefined {
  const statuses = agent.logs().filter((l) => l.msg === 'node status' && l.status) as { status: NodeStatus }[];
  return statuses.at(-1)?.status.sets.find((s) => s.name === name);
}

// Every version that honours the label: 1.7.24 and 2.1.9.
for (const version of PINNING_CONTAINERD_VERSIONS)
describe(`pinset agent on containerd ${version}: registry credentials from credential provider plugins, the auth file and pull secrets`, () => {
  const NEEDS: ComponentName[] = [containerdComponent(version), 'runc', 'docker-registry', 'htpasswd'];
  let priv: Registry;
  let containerd: Containerd;
  let cri: CriClient;
  let cli: string;
  let work: string;
  let binDir: string;
  let n = 0;
  const agents: AgentProcess[] = [];

  before(async () => {
    if (missingComponents(NEEDS).length > 0) return;
    cli = await bundledCli();
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-creds-'));
    priv = await Registry.start({ auth: { username: USER, password: PASSWORD } });
    containerd = await Containerd.start({ version, mirrors: { 'registry.test': priv.url } });
    cri = new CriClient(containerd.endpoint);
    binDir = path.join(work, 'plugins');
    await installTestPlugin(binDir);
  });
  afterEach(async () => {
    for (const a of agents.splice(0)) await a.stop();
  });
  after(async () => {
    cri?.close();
    await containerd?.stop();
    await priv?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  /** A node of its own (static folder, state, auth file), and the test plugin configured as a kubelet would have it. */
  async function node(opts: { provider?: Partial<ProviderEntry> & { env?: Record<string, string> }; auths?: Record<string, { auth: string }>; extra?: string[] } = {}) {
    const dir = path.join(work, `node-${++n}`);
    await mkdir(dir, { recursive: true });
    const authFile = path.join(dir, 'config.json');
    await writeFile(authFile, JSON.stringify({ auths: opts.auths ?? {} }), { mode: 0o600 });
    const pluginLog = path.join(dir, 'plugin-execs.log');
    const control = path.join(dir, 'plugin-control.json');
    const { flags, writeSets } = await staticNode(dir, `creds-${n}`, containerd.endpoint, {
      authFile,
      // The disk estimate reaches registry.test as containerd does, through its hosts.toml, with the same credentials.
      extra: ['--pin-backend', 'containerd', '--containerd-hosts-dir', containerd.certsDir, ...(opts.extra ?? [])],
    });
    if (opts.provider) {
      const config = path.join(dir, 'credential-provider-config.yaml');
      const { env, ...entry } = opts.provider;
      await writeProviderConfig(config, [
        {
          matchImages: ['registry.test'],
          ...entry,
          env: { TEST_PLUGIN_USERNAME: USER, TEST_PLUGIN_PASSWORD: PASSWORD, TEST_PLUGIN_LOG: pluginLog, TEST_PLUGIN_CONTROL: control, ...env },
        },
      ]);
      flags.push('--image-credential-provider-config', config, '--image-credential-provider-bin-dir', binDir);
    }
    return {
      flags,
      writeSets,
      writeAuths: (auths: Record<string, { auth: string }>) => writeFile(authFile, JSON.stringify({ auths }), { mode: 0o600 }),
      execs: () => readPluginLog(pluginLog),
      control: (s: Record<string, string>) => controlPlugin(control, s),
      once: (extra: string[] = []) => runAgentOnce([...flags, ...extra], { cli }),
      start: (extra: string[] = []) => {
        const a = AgentProcess.start([...flags, ...extra], { cli });
        agents.push(a);
        return a;
      },
    };
  }

  async function pinned(img: PushedImage): Promise<boolean> {
    return (await cri.imageStatus(img.ref))?.pinned === true;
  }

  test('a credential provider plugin: the set Ready and pinned, containerd holding no credential; one exec for a registry-keyed answer; args and env as configured', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const imgs = await Promise.all(['a', 'b', 'c'].map((r) => pushSingleLayer(priv, `creds-plugin/${r}`, { host: 'registry.test' })));
    const nd = await node({ provider: { args: ['--from-config', 'yes'], env: { TEST_PLUGIN_CACHE_KEY_TYPE: 'Registry' } } });
    await nd.writeSets(set('private', { images: imgs }));
    const r = await nd.once(['--max-parallel-pulls', '1']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.sets[0]!.phase, 'Ready');
    assert.deepEqual(r.sets[0]!.images, { wanted: 3, present: 3, pinned: 3, failed: 0, invalid: 0 });
    for (const img of imgs) assert.equal(await pinned(img), true, `${img.ref} pinned`);
    const execs = await nd.execs();
    assert.equal(execs.length, 1, 'one exec: its Registry-keyed answer serves the other images from the cache');
    assert.deepEqual(execs[0]!.request, { apiVersion: 'credentialprovider.kubelet.k8s.io/v1', kind: 'CredentialProviderRequest', image: imgs[0]!.ref.split('@')[0] });
    assert.deepEqual(execs[0]!.args, ['--from-config', 'yes']);
    assert.equal(execs[0]!.env.TEST_PLUGIN_USERNAME, USER);
    assert.ok(execs[0]!.env.PATH, 'the agent\'s own environment is passed on too');
    assertNoSecret('the agent\'s output', r.stdout + r.stderr);
    // The disk estimate read every image's size from the private registry, with the plugin's credential, through containerd's hosts.toml.
    const estimate = r.stderr.split('\n').filter((l) => l.includes('disk estimate for the images to pull')).map((l) => JSON.parse(l) as { neededBytes: number; unknown: number; images: number })[0];
    assert.ok(estimate, `the estimate ran\n${r.stderr.slice(-2000)}`);
    assert.deepEqual([estimate.images, estimate.unknown], [3, 0], 'every size known');
    assert.ok(estimate.neededBytes > 0);
    // Without the plugin the same pull is refused: the credential did come from it.
    const bare = await node();
    const other = await pushSingleLayer(priv, 'creds-plugin/bare', { host: 'registry.test' });
    await bare.writeSets(set('private', { images: [other] }));
    const refused = await bare.once();
    assert.equal(refused.code, 1);
    assert.equal(refused.sets[0]!.reason, 'Unauthorized');
  });

  test('a wrong password in the auth file and the right one from a plugin: both tried, in the kubelet\'s order, and the image pulls', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(priv, 'creds-both/app', { host: 'registry.test' });
    const nd = await node({ provider: {}, auths: { 'registry.test': { auth: b64(`${USER}:${WRONG_PASSWORD}`) } } });
    await nd.writeSets(set('both', { images: [img] }));
    const r = await nd.once();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.sets[0]!.phase, 'Ready');
    assert.equal(await pinned(img), true);
    const lines = r.stderr.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
    const refused = lines.find((l) => l.msg === 'pull with this credential failed; trying the next one');
    assert.match(String(refused?.with), /the auth file .*config\.json \(entry registry\.test\)/, 'the auth file first, under the same key');
    assert.equal(lines.find((l) => l.msg === 'pulling image')?.credentials, 2);
    assertNoSecret('the agent\'s output', r.stdout + r.stderr);
  });

  test('a plugin that hangs is killed with its process group at the bound; the set says which provider failed; nothing is left running', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(priv, 'creds-hang/app', { host: 'registry.test' });
    const nd = await node({ provider: {} });
    await nd.control({ TEST_PLUGIN_MODE: 'hang' });
    await nd.writeSets(set('hung', { images: [img] }));
    const started = Date.now();
    const r = await nd.once(['--image-credential-provider-timeout', '2s']);
    assert.ok(Date.now() - started < 30_000, 'the reconcile was not stuck');
    assert.equal(r.code, 1);
    const s = r.sets[0]!;
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'CredentialProviderFailed');
    assert.match(s.message!, /credential provider test-credential-provider failed for registry\.test\/creds-hang\/app: did not finish within 2s and was killed; pulling .* without its credentials failed: PullImage: UNKNOWN: failed to pull/);
    const [exec] = await nd.execs();
    assert.ok(exec?.childPid);
    for (let i = 0; i < 50 && (alive(exec!.pid) || alive(exec!.childPid!)); i++) await sleep(20);
    assert.equal(alive(exec!.pid), false, 'the plugin is gone');
    assert.equal(alive(exec!.childPid!), false, 'the child it started is gone');
    assert.deepEqual(groupMembers(exec!.pgid!), [], 'its process group is empty');
  });

  test('a plugin printing garbage, or another apiVersion: a clear reason, and nothing it printed repeated', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    for (const [mode, why] of [
      ['garbage', /what it printed on stdout is not JSON/],
      ['wrong-api-version', /did not match expected apiVersion:credentialprovider\.kubelet\.k8s\.io\/v1, actual apiVersion:credentialprovider\.kubelet\.k8s\.io\/v0/],
    ] as const) {
      const img = await pushSingleLayer(priv, `creds-${mode}/app`, { host: 'registry.test' });
      const nd = await node({ provider: {} });
      await nd.control({ TEST_PLUGIN_MODE: mode });
      await nd.writeSets(set(mode, { images: [img] }));
      const r = await nd.once();
      assert.equal(r.code, 1);
      assert.equal(r.sets[0]!.reason, 'CredentialProviderFailed', mode);
      assert.match(r.sets[0]!.message!, why);
      assertNoSecret(`the agent's output (${mode})`, r.stdout + r.stderr);
    }
  });

  test('a plugin that starts failing: the new image Degraded CredentialProviderFailed, retried at the slow pace, the pinned image untouched; fixed, it converges without a restart', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const a = await pushSingleLayer(priv, 'creds-fail/a', { host: 'registry.test' });
    const b = await pushSingleLayer(priv, 'creds-fail/b', { host: 'registry.test' });
    // No cache: every pull asks the plugin, so its execs count the attempts.
    const nd = await node({ provider: { defaultCacheDuration: '0s' } });
    await nd.writeSets(set('apps', { images: [a] }));
    const agent = nd.start();
    await eventually(() => loggedStatus(agent, 'apps')?.phase === 'Ready', 30_000, () => `Ready first; ${JSON.stringify(loggedStatus(agent, 'apps'))}`);

    await nd.control({ TEST_PLUGIN_MODE: 'fail', TEST_PLUGIN_STDERR: `sts: access denied for ${PASSWORD}` });
    await nd.writeSets(set('apps', { images: [a, b] }));
    const degraded = await eventually(
      () => {
        const s = loggedStatus(agent, 'apps');
        return s?.reason === 'CredentialProviderFailed' ? s : undefined;
      },
      30_000,
      () => `CredentialProviderFailed; ${JSON.stringify(loggedStatus(agent, 'apps'))}`,
    );
    assert.match(degraded.message!, /credential provider test-credential-provider failed for registry\.test\/creds-fail\/b: exit status 1: sts: access denied for \[redacted\]/);
    assert.equal(degraded.images.present, 1);
    assert.equal(await pinned(a), true, 'the image already pinned stays pinned');
    const failingSince = (await nd.execs()).length;
    await sleep(8_000);
    const pulls = agent.logs().filter((l) => l.msg === 'pulling image' && String(l.image) === b.ref).length;
    assert.equal(pulls, 1, 'one attempt in 8 s: an Unauthorized pull waits 15-30 s before the next');
    assert.equal((await nd.execs()).length, failingSince, 'and no exec of the plugin meanwhile');
    assert.equal(await pinned(a), true);

    await nd.control({});
    await eventually(() => loggedStatus(agent, 'apps')?.phase === 'Ready', 60_000, () => `Ready once the plugin answers again; ${JSON.stringify(loggedStatus(agent, 'apps'))}`);
    assert.equal(await pinned(b), true);
    assert.ok(agent.running);
    assertNoSecret('the agent\'s output', agent.output());
  });

  test('pull secrets on a set, from the agents\' namespace: used, a bad one named per set, a changed one used at once, a deleted one keeps the pins; only that namespace read', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const api = await ApiServer.start();
    t.after(() => api.stop());
    const nodeName = `creds-${n + 1}`;
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: nodeName, labels: { tier: 'private' } } });
    const dockerconfig = (password: string) => JSON.stringify({ auths: { 'registry.test': { auth: b64(`${USER}:${password}`) } } });
    const secret = (name: string, type: string, data: Record<string, string>): KubeObject => ({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name, namespace: 'pinset-system' },
      type,
      data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, b64(v)])),
    });
    api.create(secret('regcred', 'kubernetes.io/dockerconfigjson', { '.dockerconfigjson': dockerconfig(WRONG_PASSWORD) }));
    api.create(secret('opaque', 'Opaque', { token: 'x' }));
    api.create(secret('broken', 'kubernetes.io/dockerconfigjson', { '.dockerconfigjson': JSON.stringify({ auths: { 'registry.test': { auth: b64('no-colon-here') } } }) }));
    api.create(secret('legacy', 'kubernetes.io/dockercfg', { '.dockercfg': JSON.stringify({ 'registry.test': { auth: b64(`${USER}:${PASSWORD}`) } }) }));
    // The same name in another namespace, with the right password: never read.
    api.create({ ...secret('regcred', 'kubernetes.io/dockerconfigjson', { '.dockerconfigjson': dockerconfig(PASSWORD) }), metadata: { name: 'regcred', namespace: 'default' } });
    const [s1, s2, s3] = await Promise.all(['one', 'two', 'three'].map((r) => pushSingleLayer(priv, `creds-secrets/${r}`, { host: 'registry.test' })));
    const sel = { nodeSelector: { matchLabels: { tier: 'private' } } };
    for (const s of [
      set('with-regcred', { ...sel, pullSecrets: [{ name: 'regcred' }], images: [s1!] }),
      set('with-legacy', { ...sel, pullSecrets: [{ name: 'legacy' }], images: [s2!] }),
      set('missing', { ...sel, pullSecrets: [{ name: 'nope' }], images: [s3!] }),
      set('wrong-type', { ...sel, pullSecrets: [{ name: 'opaque' }], images: [s3!] }),
      set('malformed', { ...sel, pullSecrets: [{ name: 'broken' }], images: [s3!] }),
    ]) {
      api.create(s as unknown as KubeObject);
    }
    const nd = await node();
    const kubeconfig = await api.writeKubeconfig(work);
    const agent = nd.start(['--kubeconfig', kubeconfig]);
    const statusOf = (name: string) => parseNodeStatus(api.get('nodes', nodeName)?.metadata.annotations?.[STATUS_ANNOTATION]).status?.sets.find((s) => s.name === name);
    const wait = (name: string, ok: (s: NodeSetStatus) => boolean, what: string, ms = 30_000) =>
      eventually(
        () => {
          const s = statusOf(name);
          return s && ok(s) ? s : undefined;
        },
        ms,
        () => `${name} ${what}; now ${JSON.stringify(statusOf(name))}\n${agent.output().slice(-2000)}`,
      );

    await wait('with-legacy', (s) => s.phase === 'Ready', 'Ready through the legacy dockercfg secret');
    const refused = await wait('with-regcred', (s) => s.reason === 'Unauthorized', 'Unauthorized with the stale password');
    assert.match(refused.message!, /pull secret pinset-system\/regcred/, 'the refused credential is named by where it came from');
    const problems: [string, RegExp][] = [
      // The pull that failed without it is named beside it (src/api/reasons.ts).
      ['missing', /^pull secret pinset-system\/nope does not exist; 0 of 1 images present, pins kept; also Unauthorized: registry registry\.test refused/],
      ['wrong-type', /^pull secret pinset-system\/opaque is of type Opaque, not kubernetes\.io\/dockerconfigjson/],
      ['malformed', /^pull secret pinset-system\/broken is malformed: \.dockerconfigjson: the entry "registry\.test" has an "auth" that is not base64 of "user:password"/],
    ];
    for (const [name, message] of problems) {
      const s = await wait(name, (x) => x.reason === 'PullSecretInvalid', 'PullSecretInvalid');
      assert.equal(s.phase, 'Degraded');
      assert.match(s.message!, message);
    }

    // The secret rotated: used at once, not at the 15-30 s pace of a refused pull, and without a restart.
    const pid = agent.child.pid;
    const rotatedAt = Date.now();
    api.patch('secrets', 'regcred', { data: { '.dockerconfigjson': b64(dockerconfig(PASSWORD)) } }, 'pinset-system');
    await wait('with-regcred', (s) => s.phase === 'Ready', 'Ready after the secret changed', 12_000);
    assert.ok(Date.now() - rotatedAt < 12_000);
    assert.equal(await pinned(s1!), true);
    assert.equal(agent.child.pid, pid);
    assert.ok(agent.running);

    // Deleted: the set says so; its image stays pinned.
    api.remove('secrets', 'regcred', 'pinset-system');
    await wait('with-regcred', (s) => s.reason === 'PullSecretInvalid', 'PullSecretInvalid once the secret is gone');
    assert.equal(await pinned(s1!), true, 'a bad secret never unpins');

    // Only the agents' namespace was read, and only read.
    const secretRequests = api.requests.filter((r) => r.path.includes('/secrets'));
    assert.ok(secretRequests.length > 0);
    for (const r of secretRequests) {
      assert.ok(r.path.startsWith('/api/v1/namespaces/pinset-system/secrets'), r.path);
      assert.equal(r.method, 'GET');
    }
    await api.waitFor(() => api.list('events').length > 0, 10_000, 'an Event');
    assertNoSecret('the agent\'s output', agent.output());
    assertNoSecret('the node annotation', JSON.stringify(api.get('nodes', nodeName)));
    assertNoSecret('Events', JSON.stringify(api.list('events')));
  });
});
