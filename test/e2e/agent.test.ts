// `pinset agent` end to end: its own process, started with flags as a user
// would, against a real containerd (CRI) and real registries on loopback,
// with sets from a static folder and from the in-process API server.
// The pin backend is CRI-O's drop-in (--pin-backend crio) with containerd
// 1.6 serving the CRI: there is no reload (--reload none) and no pin
// report, so "pinned" here means "in the pin file" (containerd's own pins,
// its image labels, are test/e2e/containerd-pins.test.ts). The agent is the bundle
// as shipped (dist/, `npm run build`), checked to be built from these sources.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, beforeEach, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus, type PinnedImageSet, type PinnedImageSetSpec } from '../../src/api/types.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, CriClient } from '../support/containerd.ts';
import { CriProxy } from '../support/cri-proxy.ts';
import { nodePlatform, pushMultiArch, pushMultiLayer, pushRandom, pushSingleLayer, unknownRef, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { AgentProcess, bundledCli, eventually, readPinFile, runAgentOnce } from '../support/agent-process.ts';

const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry', 'htpasswd'];
const NODE = 'e2e-node';
const USER = 'puller';
// Distinctive, so a grep for it cannot match anything else.
const PASSWORD = 'Sup3r-Secret-pw-91c4e7';
const WRONG_PASSWORD = 'Wr0ng-Secret-pw-5d02ab';

function basicAuth(user: string, password: string): string {
  return Buffer.from(`${user}:${password}`).toString('base64');
}

function set(name: string, spec: PinnedImageSetSpec): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec };
}

function images(...pushed: (PushedImage | string)[]): { name: string }[] {
  return pushed.map((p) => ({ name: typeof p === 'string' ? p : p.ref }));
}

/** The last per-set status the agent logged (long-running mode without an API). */
function loggedStatus(agent: AgentProcess, name: string): NodeSetStatus | undefined {
  const statuses = agent.logs().filter((l) => l.msg === 'node status' && l.status) as { status: NodeStatus }[];
  return statuses.at(-1)?.status.sets.find((s) => s.name === name);
}

describe('pinset agent on containerd and a real registry', () => {
  let registry: Registry;
  let privateRegistry: Registry;
  let containerd: Containerd;
  let proxy: CriProxy;
  let cri: CriClient;
  let work: string;
  let staticDir: string;
  let dropinDir: string;
  let authFile: string;
  let agents: AgentProcess[] = [];
  let ready = false;
  let cli: string;

  before(async () => {
    cli = await bundledCli();
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // each test reports it
    registry = await Registry.start();
    privateRegistry = await Registry.start({ auth: { username: USER, password: PASSWORD } });
    containerd = await Containerd.start({
      mirrors: { 'registry.test': registry.url, 'private.registry.test': privateRegistry.url },
    });
    proxy = await CriProxy.start(containerd.endpoint);
    cri = new CriClient(containerd.endpoint);
    ready = true;
  });

  after(async () => {
    cri?.close();
    await proxy?.stop();
    await containerd?.stop();
    await registry?.stop();
    await privateRegistry?.stop();
  });

  beforeEach(async () => {
    if (!ready) return;
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-agent-'));
    staticDir = path.join(work, 'sets.d');
    dropinDir = path.join(work, 'crio.conf.d');
    authFile = path.join(work, 'config.json');
    await mkdir(staticDir);
    await mkdir(dropinDir);
    proxy.clear();
  });

  afterEach(async () => {
    for (const a of agents) await a.stop();
    agents = [];
    if (work) await rm(work, { recursive: true, force: true });
  });

  /** Flags every run shares; `endpoint` defaults to containerd through the recording proxy. */
  function flags(extra: string[] = [], endpoint = proxy.endpoint): string[] {
    return [
      '--node-name', NODE,
      '--static-dir', staticDir,
      '--cri-endpoint', endpoint,
      '--crio-dropin-dir', dropinDir,
      '--state-dir', path.join(path.dirname(dropinDir), 'state'),
      '--reload', 'none',
      '--pin-backend', 'crio',
      '--auth-file', authFile,
      '--metrics-addr', '',
      '--log-level', 'debug',
      ...extra,
    ];
  }

  async function writeStatic(...sets: PinnedImageSet[]): Promise<void> {
    await writeFile(path.join(staticDir, 'sets.yaml'), sets.map((s) => dumpYaml(s)).join('---\n'));
  }

  async function writeAuthFile(auths: Record<string, { auth: string }>): Promise<void> {
    await writeFile(authFile, JSON.stringify({ auths }), { mode: 0o600 });
  }

  function startAgent(extra: string[] = [], endpoint?: string): AgentProcess {
    const agent = AgentProcess.start(flags(extra, endpoint), { cli });
    agents.push(agent);
    return agent;
  }

  async function assertPresent(img: PushedImage): Promise<void> {
    const listed = (await cri.listImages()).find((i) => i.repoDigests.includes(img.ref));
    assert.ok(listed, `containerd lists ${img.ref}`);
    assert.equal(listed.id, img.id, `${img.ref} is the image that was pushed`);
  }

  test('pulls by digest into containerd and writes the pin file (--once, static set)', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const single = await pushSingleLayer(registry, 'e2e/single');
    const layered = await pushMultiLayer(registry, 'e2e/layered', 4);
    const big = await pushRandom(registry, 'e2e/big', 50 * 1000 * 1000);
    await writeStatic(set('base', { pinnedImages: images(single, layered, big) }));

    const r = await runAgentOnce(flags(), { cli });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.sets.length, 1);
    const s = r.sets[0];
    assert.equal(s.name, 'base');
    assert.equal(s.source, 'static');
    assert.equal(s.phase, 'Ready');
    assert.equal(s.reason, 'AllImagesPinned');
    assert.deepEqual(s.images, { wanted: 3, present: 3, pinned: 3, failed: 0, invalid: 0 });

    for (const img of [single, layered, big]) await assertPresent(img);
    const pinFile = await readPinFile(dropinDir);
    assert.deepEqual(pinFile?.pins, [big.ref, layered.ref, single.ref].sort());
    assert.deepEqual(proxy.callsOf('PullImage').map((c) => c.image).sort(), [big.ref, layered.ref, single.ref].sort());
  });

  test('images already present: no PullImage call at all', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const a = await pushSingleLayer(registry, 'e2e/present-a');
    const b = await pushMultiLayer(registry, 'e2e/present-b', 2);
    await cri.pullImage(a.ref);
    await cri.pullImage(b.ref);
    await writeStatic(set('present', { pinnedImages: images(a, b) }));
    proxy.clear();

    const r = await runAgentOnce(flags(), { cli });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.sets[0].phase, 'Ready');
    assert.deepEqual(r.sets[0].images, { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 });
    assert.deepEqual(proxy.callsOf('PullImage'), [], 'no pull for images the runtime has');
    assert.ok(proxy.calls.length > 0, 'the agent did talk to the runtime through the proxy');
    assert.deepEqual((await readPinFile(dropinDir))?.pins, [a.ref, b.ref].sort());
  });

  test("a digest naming a multi-arch index lands the node's platform", async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const index = await pushMultiArch(registry, 'e2e/multiarch');
    await writeStatic(set('multiarch', { pinnedImages: images(index) }));

    const r = await runAgentOnce(flags(), { cli });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.sets[0].phase, 'Ready');

    const mine = index.platforms[`linux/${nodePlatform().architecture}`];
    const listed = await cri.listImages();
    const landed = listed.find((i) => i.repoDigests.includes(index.ref));
    assert.equal(landed?.id, mine.id, `the linux/${nodePlatform().architecture} image landed`);
    for (const [platform, other] of Object.entries(index.platforms)) {
      if (other.id !== mine.id) assert.ok(!listed.some((i) => i.id === other.id), `${platform} did not land`);
    }
    assert.deepEqual((await readPinFile(dropinDir))?.pins, [index.ref]);
  });

  test('the authenticated registry through --auth-file: credentials for that registry only', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const secret = await pushSingleLayer(privateRegistry, 'e2e/secret', { host: 'private.registry.test' });
    const open = await pushSingleLayer(registry, 'e2e/open');
    await writeAuthFile({ 'private.registry.test': { auth: basicAuth(USER, PASSWORD) } });
    await writeStatic(set('mixed', { pinnedImages: images(secret, open) }));

    const r = await runAgentOnce(flags(), { cli });
    assert.equal(r.code, 0, `${JSON.stringify(r.sets)}\n${r.stderr}`);
    assert.equal(r.sets[0].phase, 'Ready');
    await assertPresent(secret);
    await assertPresent(open);

    const pulls = proxy.callsOf('PullImage');
    assert.deepEqual(pulls.find((c) => c.image === secret.ref)?.hasAuth, true, 'AuthConfig sent for private.registry.test');
    assert.deepEqual(pulls.find((c) => c.image === open.ref)?.hasAuth, false, 'no AuthConfig for registry.test');
    assert.ok(!r.stdout.includes(PASSWORD) && !r.stderr.includes(PASSWORD), 'the password is in no output');
    assert.ok(!r.stderr.includes(basicAuth(USER, PASSWORD)), 'the encoded credential is in no output');
  });

  test('a wrong password: Degraded naming the registry, no secret anywhere, retries continue (API set)', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const api = await ApiServer.start();
    t.after(() => api.stop());
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: { 'kubernetes.io/hostname': NODE, tier: 'private' } } });
    const secret = await pushSingleLayer(privateRegistry, 'e2e/wrong-password', { host: 'private.registry.test' });
    api.create(set('private-apps', { nodeSelector: { matchLabels: { tier: 'private' } }, pinnedImages: images(secret) }) as unknown as KubeObject);
    await writeAuthFile({ 'private.registry.test': { auth: basicAuth(USER, WRONG_PASSWORD) } });
    const kubeconfig = await api.writeKubeconfig(work);
    const agent = startAgent(['--kubeconfig', kubeconfig]);

    const nodeSet = () => {
      const raw = api.get('nodes', NODE)?.metadata.annotations?.[STATUS_ANNOTATION];
      return parseNodeStatus(raw).status?.sets.find((s) => s.name === 'private-apps');
    };
    const degraded = await eventually(
      () => {
        const s = nodeSet();
        return s?.phase === 'Degraded' ? s : undefined;
      },
      30_000,
      () => `Degraded in ${STATUS_ANNOTATION}; now ${JSON.stringify(nodeSet())}\n${agent.output().slice(-3000)}`,
    );
    assert.equal(degraded.reason, 'Unauthorized');
    assert.match(degraded.message ?? '', /private\.registry\.test/, 'the message names the registry');
    assert.equal(degraded.images.failed, 1);
    assert.deepEqual((await readPinFile(dropinDir))?.pins, [secret.ref], 'pinned even while the pull fails');

    // The secret (either password, plain or encoded) is in no log line, status or Event.
    await api.waitFor(() => api.list('events').some((e) => JSON.stringify(e).includes('private-apps')), 10_000, 'a PullFailed Event');
    const secrets = [PASSWORD, WRONG_PASSWORD, basicAuth(USER, WRONG_PASSWORD), basicAuth(USER, PASSWORD)];
    const places: [string, string][] = [
      ['agent output', agent.output()],
      ['node annotation', JSON.stringify(api.get('nodes', NODE))],
      ['events', JSON.stringify(api.list('events'))],
      ['requests to the API', JSON.stringify(api.requests)],
    ];
    for (const [where, text] of places) for (const s of secrets) assert.ok(!text.includes(s), `a credential appears in ${where}`);
    assert.match(agent.output(), /Unauthorized|401/, 'the failure itself is logged');

    // Fix the secret on disk only: the agent keeps retrying and converges.
    await writeAuthFile({ 'private.registry.test': { auth: basicAuth(USER, PASSWORD) } });
    await eventually(
      () => nodeSet()?.phase === 'Ready',
      // Unauthorized is retried after 15-30 s at first (src/util/backoff.ts).
      60_000,
      () => `Ready after fixing the password; now ${JSON.stringify(nodeSet())}`,
    );
    await assertPresent(secret);
    assert.ok(agent.running, 'converged without a restart');
    for (const s of secrets) assert.ok(!agent.output().includes(s), 'no credential in the output after the retry either');
    assert.equal(await agent.stop(), 0);
  });

  test('registry down, then up again: converges without restarting anything', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const flaky = await Registry.start();
    t.after(() => flaky.stop());
    await containerd.mapHost('flaky.registry.test', flaky.url);
    const img = await pushMultiLayer(flaky, 'e2e/outage', 2, { host: 'flaky.registry.test' });
    await flaky.pause();
    await writeStatic(set('outage', { pinnedImages: images(img) }));
    const agent = startAgent();

    const down = await eventually(
      () => {
        const s = loggedStatus(agent, 'outage');
        return s?.phase === 'Degraded' ? s : undefined;
      },
      30_000,
      () => `Degraded while the registry is down; logs:\n${agent.output().slice(-3000)}`,
    );
    assert.equal(down.reason, 'RegistryUnavailable');
    assert.match(down.message ?? '', /flaky\.registry\.test/);
    const pid = agent.child.pid;
    const containerdPid = containerd.pid;

    await flaky.resume();
    await eventually(
      () => loggedStatus(agent, 'outage')?.phase === 'Ready',
      60_000,
      () => `Ready after the registry came back; now ${JSON.stringify(loggedStatus(agent, 'outage'))}`,
    );
    await assertPresent(img);
    assert.ok(agent.running);
    assert.equal(agent.child.pid, pid);
    assert.equal(containerd.pid, containerdPid, 'containerd was not restarted either');
    assert.equal(await agent.stop(), 0);
  });

  test('containerd killed and restarted in the middle of pulls: converges', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const imgs: PushedImage[] = [];
    for (let i = 0; i < 6; i++) imgs.push(await pushRandom(registry, `e2e/crash-${i}`, 25 * 1000 * 1000));
    await writeStatic(set('crash', { pinnedImages: images(...imgs) }));
    // Straight to containerd: the agent itself must see the socket go away.
    const agent = startAgent(['--max-parallel-pulls', '2'], containerd.endpoint);

    await eventually(
      () => agent.logs().some((l) => l.msg === 'pulling image'),
      30_000,
      () => `a pull started; logs:\n${agent.output().slice(-3000)}`,
    );
    await containerd.kill();
    const pulledBeforeKill = agent.logs().filter((l) => l.msg === 'pulled image').length;
    assert.ok(pulledBeforeKill < imgs.length, `containerd died with pulls still to do (${pulledBeforeKill} of ${imgs.length} done)`);
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal((await readPinFile(dropinDir))?.pins.length, imgs.length, 'the pin file was written before the pulls');
    await containerd.start();

    await eventually(
      () => loggedStatus(agent, 'crash')?.phase === 'Ready',
      120_000,
      () => `Ready after containerd came back; now ${JSON.stringify(loggedStatus(agent, 'crash'))}\n${agent.output().slice(-3000)}`,
    );
    for (const img of imgs) await assertPresent(img);
    const failures = agent.logs().filter((l) => l.level === 'warn');
    assert.ok(failures.length > 0, 'the crash was noticed (a warning was logged)');
    assert.ok(agent.running);
    assert.equal(await agent.stop(), 0);
  });

  test('an unknown digest: ImageNotFound, named in the status, retried slowly', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const known = await pushSingleLayer(registry, 'e2e/known');
    const missing = unknownRef('e2e/known');
    await writeStatic(set('typo', { pinnedImages: images(known, missing) }));

    const r = await runAgentOnce(flags(), { cli });
    assert.equal(r.code, 1, 'not every set is Ready');
    const s = r.sets[0];
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'ImageNotFound');
    assert.ok(s.message?.includes(missing), `the message names ${missing}: ${s.message}`);
    assert.equal(s.lastFailedGeneration, s.desiredGeneration);
    assert.deepEqual(s.images, { wanted: 2, present: 1, pinned: 2, failed: 1, invalid: 0 });
    await assertPresent(known);

    // Long-running with a resync every second: the missing image is not
    // asked for again at that pace.
    proxy.clear();
    const agent = startAgent(['--resync-interval', '1s']);
    await eventually(
      () => agent.logs().filter((l) => l.msg === 'reconcile finished').length >= 4,
      30_000,
      () => `four reconciles; logs:\n${agent.output().slice(-3000)}`,
    );
    const attempts = proxy.callsOf('PullImage').filter((c) => c.image === missing);
    assert.equal(attempts.length, 1, 'one attempt across four reconciles');
    const retry = agent.logs().find((l) => l.image === missing && typeof l.retryInMs === 'number');
    assert.ok(retry && (retry.retryInMs as number) >= 30_000, `the next attempt is at least 30 s away: ${JSON.stringify(retry)}`);
    assert.equal(loggedStatus(agent, 'typo')?.reason, 'ImageNotFound');
    assert.equal(await agent.stop(), 0);
  });

  test('runtimeHandler reaches the runtime; a runtime that rejects it is named plainly', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const a = await pushSingleLayer(registry, 'e2e/handler-a');
    const b = await pushSingleLayer(registry, 'e2e/handler-b');
    await writeStatic(set('runc-class', { runtimeHandler: 'runc', pinnedImages: images(a) }));

    const ok = await runAgentOnce(flags(), { cli });
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(ok.sets[0].phase, 'Ready');
    const pulls = proxy.callsOf('PullImage').filter((c) => c.image === a.ref);
    assert.equal(pulls.length, 1);
    assert.equal(pulls[0].runtimeHandler, 'runc', 'ImageSpec.runtime_handler carried the set runtimeHandler');
    await assertPresent(a);

    proxy.rejectHandler('kata', { code: 3, details: 'runtime handler kata not supported' });
    t.after(() => proxy.allowHandler('kata'));
    await writeStatic(set('kata-class', { runtimeHandler: 'kata', pinnedImages: images(b) }));
    const rejected = await runAgentOnce(flags(), { cli });
    assert.equal(rejected.code, 1);
    const s = rejected.sets.find((x) => x.name === 'kata-class');
    assert.equal(s?.phase, 'Degraded');
    assert.equal(s?.reason, 'RuntimeHandlerRejected');
    assert.match(s?.message ?? '', /kata/);
    assert.match(s?.message ?? '', /runtime handler kata not supported/);
    assert.equal(await cri.imageStatus(b.ref), null, 'nothing landed');
  });
});
