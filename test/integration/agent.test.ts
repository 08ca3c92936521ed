// The agent end to end against stand-ins, with the production code
// unchanged: the in-process API server (real HTTP and watch protocol), a
// CRI server that pins like CRI-O, and a private D-Bus with a systemd
// stand-in whose ReloadUnit makes that CRI-O re-read its drop-ins. The
// agent runs as its own process, started as a user starts it.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFile, mkdtemp, readdir, readFile, rm, stat, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { CustomObjectsApi, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus } from '../../src/api/types.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { ApiServer } from '../support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { AgentProcess, readPinFile, runAgentOnce } from '../support/agent-process.ts';

const NODE = 'node-1';
const hex = (c: string) => c.repeat(64);
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${hex(c)}`;

const A1 = img('team-a/web', 'a');
const A2 = img('team-a/db', 'b');
const SHARED = img('base/runtime', 'c');
const B1 = img('team-b/api', 'd');
const C1 = img('team-c/job', 'e');
const CATALOGUE = Object.fromEntries([A1, A2, SHARED, B1, C1].map((r) => [r, { size: 1000 }]));

function set(name: string, images: string[], selector?: object, extra: object = {}) {
  return {
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name },
    spec: { ...(selector ? { nodeSelector: selector } : {}), pinnedImages: images.map((n) => ({ name: n })), ...extra },
  };
}

interface Bed {
  api: ApiServer;
  node: CrioNode;
  dir: string;
  staticDir: string;
  kubeconfig: string;
  agent?: AgentProcess;
  args(extra?: string[]): string[];
  start(extra?: string[]): AgentProcess;
  status(): NodeStatus | null;
  setStatus(name: string): NodeSetStatus | undefined;
  waitForSet(name: string, pred: (s: NodeSetStatus) => boolean, what: string, timeoutMs?: number): Promise<NodeSetStatus>;
  pinFileList(): Promise<string[]>;
}

let bed: Bed;

async function makeBed(labels: Record<string, string> = { 'node-role.kubernetes.io/worker': '' }): Promise<Bed> {
  const api = await ApiServer.start({ bookmarkIntervalMs: 1000 });
  const node = await startCrioNode({ catalogue: CATALOGUE });
  const dir = await mkdtemp(join(tmpdir(), 'pinset-agent-it-'));
  const staticDir = join(dir, 'sets.d');
  await mkdir(staticDir);
  const kubeconfig = await api.writeKubeconfig(dir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels } });
  const b: Bed = {
    api,
    node,
    dir,
    staticDir,
    kubeconfig,
    args: (extra = []) => [
      '--node-name', NODE,
      '--kubeconfig', kubeconfig,
      '--static-dir', staticDir,
      '--cri-endpoint', node.endpoint,
      '--crio-dropin-dir', node.dropInDir,
      '--state-dir', node.stateDir,
      '--reload', 'dbus',
      '--auth-file', join(dir, 'no-auth.json'),
      '--metrics-addr', '',
      '--resync-interval', '2s',
      ...extra,
    ],
    start(extra = []) {
      b.agent = AgentProcess.start(b.args(extra), { env: node.env });
      return b.agent;
    },
    status() {
      const n = api.get('nodes', NODE);
      const raw = (n?.metadata as { annotations?: Record<string, string> } | undefined)?.annotations?.[STATUS_ANNOTATION];
      if (!raw) return null;
      const r = parseNodeStatus(raw);
      assert.ok(r.status, `the annotation reads: ${r.error}`);
      assert.equal(r.status.version, 2, 'the agent writes version 2');
      return r.status;
    },
    setStatus(name) {
      return b.status()?.sets.find((s) => s.name === name);
    },
    async waitForSet(name, pred, what, timeoutMs = 20_000) {
      return await api.waitFor((): NodeSetStatus | undefined => {
        const s = b.setStatus(name);
        return s && pred(s) ? s : undefined;
      }, timeoutMs, `${name}: ${what} (now ${JSON.stringify(b.setStatus(name))})`) as NodeSetStatus;
    },
    async pinFileList() {
      const f = await readPinFile(node.dropInDir);
      assert.ok(f, 'the pin file exists');
      return f.pins;
    },
  };
  return b;
}

beforeEach(async () => {
  bed = await makeBed();
});

afterEach(async () => {
  const code = await bed.agent?.stop();
  // SIGTERM stops the agent cleanly.
  if (bed.agent) assert.equal(code, 0, 'agent exits 0 on SIGTERM');
  await bed.node.stop();
  await bed.api.stop();
  await rm(bed.dir, { recursive: true, force: true });
});

const ready = (s: NodeSetStatus) => s.phase === 'Ready';

describe('pinset agent against the API server, CRI-O and systemd stand-ins', () => {
  test('two sets on one node: both pinned in one file, the shared image pulled once', async () => {
    bed.api.create(set('workers', [A1, SHARED], { matchLabels: { 'node-role.kubernetes.io/worker': '' } }));
    bed.api.create(set('everyone', [B1, SHARED]));
    bed.start();
    const w = await bed.waitForSet('workers', ready, 'Ready');
    const e = await bed.waitForSet('everyone', ready, 'Ready');
    assert.deepEqual(w.images, { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 });
    assert.equal(e.source, 'api');
    assert.equal(w.currentGeneration, 1);
    assert.deepEqual(await bed.pinFileList(), [A1, B1, SHARED].sort());
    // CRI-O (the stand-in) pins them after the D-Bus reload.
    for (const r of [A1, B1, SHARED]) assert.ok(bed.node.crio.image(r)?.pinned, `${r} pinned by the runtime`);
    assert.equal(bed.node.crio.pullCount(SHARED), 1);
    assert.ok(bed.node.systemd.reloadCount('crio.service') >= 1);
    // The annotation was written by a JSON merge patch of that one annotation.
    const patches = bed.api.requests.filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${NODE}`);
    assert.ok(patches.length >= 1);
    for (const p of patches) {
      assert.equal(p.contentType, 'application/merge-patch+json');
      assert.deepEqual(Object.keys((p.body as { metadata: { annotations: object } }).metadata.annotations), [STATUS_ANNOTATION]);
      assert.deepEqual(Object.keys(p.body as object), ['metadata']);
    }
  });

  test('a set deleted: its images unpinned but still present; the other set untouched', async () => {
    bed.api.create(set('keep', [A1]));
    bed.api.create(set('drop', [B1]));
    bed.start();
    await bed.waitForSet('drop', ready, 'Ready');
    await bed.waitForSet('keep', ready, 'Ready');
    bed.api.remove('pinnedimagesets', 'drop');
    await bed.api.waitFor(() => !bed.node.crio.pinnedPatterns().includes(B1), 20_000, 'B1 unpinned by CRI-O');
    assert.deepEqual(await bed.pinFileList(), [A1]);
    assert.ok(bed.node.crio.image(B1), 'the image stays on the node');
    assert.equal(bed.node.crio.image(B1)!.pinned, false);
    assert.equal(bed.node.crio.image(A1)!.pinned, true);
    await bed.api.waitFor(() => bed.status() && !bed.setStatus('drop'), 20_000, 'the deleted set leaves the status');
  });

  test('node labels change so a set no longer selects the node: unpinned', async () => {
    bed.api.create(set('workers', [A1], { matchExpressions: [{ key: 'node-role.kubernetes.io/worker', operator: 'Exists' }] }));
    bed.api.create(set('not-gpu', [B1], { matchExpressions: [{ key: 'gpu', operator: 'DoesNotExist' }] }));
    bed.start();
    await bed.waitForSet('workers', ready, 'Ready');
    await bed.waitForSet('not-gpu', ready, 'Ready');
    bed.api.patch('nodes', NODE, { metadata: { labels: { 'node-role.kubernetes.io/worker': null, gpu: 'a100' } } });
    // Nothing of its own left to pin: the agent's file goes, rather than stay with an empty list.
    await bed.api.waitFor(async () => (await readPinFile(bed.node.dropInDir)) === null, 20_000, 'both sets unpinned, the pin file removed');
    await bed.api.waitFor(() => bed.node.crio.pinnedPatterns().length === 0, 20_000, 'CRI-O reloaded with no pins');
    assert.ok(bed.node.crio.image(A1) && bed.node.crio.image(B1), 'images stay');
  });

  test("an administrator's pin in an earlier drop-in is carried over and stays pinned", async () => {
    await writeFile(join(bed.node.dropInDir, '10-admin.conf'), '[crio.image]\npinned_images = ["quay.io/admin/*", "registry.test/team-c/job*"]\n');
    bed.node.crio.preload(C1);
    await bed.node.crio.reload();
    assert.ok(bed.node.crio.image(C1)!.pinned, 'pinned by the admin file before the agent runs');
    bed.api.create(set('a', [A1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    assert.deepEqual(await bed.pinFileList(), [A1, 'quay.io/admin/*', 'registry.test/team-c/job*'].sort());
    // The agent's file sorts last, and CRI-O keeps only the last list: the admin's pins must be in it.
    assert.ok(bed.node.crio.image(C1)!.pinned, 'still pinned after the agent reloaded CRI-O');
    assert.ok(bed.node.crio.pinnedPatterns().includes('quay.io/admin/*'));
    assert.equal(await readFile(join(bed.node.dropInDir, '10-admin.conf'), 'utf8'), '[crio.image]\npinned_images = ["quay.io/admin/*", "registry.test/team-c/job*"]\n', 'the admin file is untouched');
  });

  test('a later drop-in that sets pinned_images: Degraded PinsOverridden naming the file', async () => {
    await writeFile(join(bed.node.dropInDir, 'zz-local.conf'), '[crio.image]\npinned_images = []\n');
    bed.api.create(set('a', [A1]));
    bed.start();
    const s = await bed.waitForSet('a', (x) => x.reason === 'PinsOverridden', 'PinsOverridden');
    assert.equal(s.phase, 'Degraded');
    assert.match(s.message ?? '', /zz-local\.conf/);
    assert.equal(bed.node.crio.image(A1)?.pinned, false, 'CRI-O really does not pin it');
    await bed.api.waitFor(() => bed.api.list('events', { namespace: 'default' }).some((e) => (e as { reason?: string }).reason === 'PinsOverridden'), 10_000, 'a PinsOverridden Event');
    await rm(join(bed.node.dropInDir, 'zz-local.conf'));
    await bed.waitForSet('a', ready, 'Ready once the file is gone');
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
  });

  test('bad references: that set Degraded with a clear message, the other Ready, the file holds only valid references', async () => {
    const injection = 'registry.test/x"]\n[crio.runtime]\ndefault_runtime = "evil"\n#@sha256:' + hex('f');
    const bad = [
      'registry.test/team-a/web:v1',
      'registry.test/team-a/web@sha256:abc123',
      `registry.test/team-a/web@sha256:${hex('A')}`,
      `team-a/web@sha256:${hex('a')}`,
      injection,
    ];
    bed.api.create(set('bad', [A2, ...bad]));
    bed.api.create(set('good', [B1]));
    bed.start();
    const s = await bed.waitForSet('bad', (x) => x.reason === 'InvalidReference' && x.images.present === 1, 'Degraded InvalidReference, valid image pulled');
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.images.invalid, 5);
    assert.match(s.message ?? '', /5 reference\(s\) rejected/);
    assert.match(s.message ?? '', /spec\.pinnedImages\[1\]\.name: .*names a tag/);
    assert.match(s.lastFailedGenerationError ?? '', /InvalidReference/);
    await bed.waitForSet('good', ready, 'Ready');
    const files = (await readdir(bed.node.dropInDir)).filter((f) => f.startsWith('99-pinset-'));
    const text = await readFile(join(bed.node.dropInDir, files[0]!), 'utf8');
    const doc = parseToml(text) as Record<string, any>;
    assert.deepEqual(Object.keys(doc), ['crio']);
    assert.deepEqual(Object.keys(doc.crio), ['image']);
    assert.deepEqual(doc.crio.image.pinned_images, [A2, B1].sort());
    assert.doesNotMatch(text, /crio\.runtime|evil/);
  });

  test('API down mid-run: nothing unpinned; back up: changes apply again', async () => {
    bed.api.create(set('a', [A1]));
    bed.api.create(set('b', [B1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    await bed.waitForSet('b', ready, 'Ready');
    const before = await bed.pinFileList();
    bed.api.setAvailable(false);
    const mark = bed.agent!.mark();
    // Several resyncs (2 s) while the API is unreachable.
    await bed.agent!.waitForLog((l) => l.msg === 'watch failed; keeping the last observation and retrying', 20_000, 'watch failure');
    await bed.agent!.waitForReconcile(mark, 10_000);
    const m2 = bed.agent!.mark();
    await bed.agent!.waitForReconcile(m2, 10_000);
    assert.deepEqual(await bed.pinFileList(), before);
    assert.ok(bed.node.crio.image(A1)!.pinned && bed.node.crio.image(B1)!.pinned);
    // Its two watches retry with a growing delay (1 s doubling, jittered down
    // to half): over 10 s at most 5 attempts each, where a backoff reset on
    // every attempt (the old behaviour) made one a second each.
    const connections = bed.api.connections;
    await new Promise((r) => setTimeout(r, 10_000));
    const attempts = bed.api.connections - connections;
    assert.ok(attempts <= 12, `${attempts} connection attempts in 10 s`);
    bed.api.setAvailable(true);
    bed.api.remove('pinnedimagesets', 'b');
    await bed.api.waitFor(async () => !(await bed.pinFileList()).includes(B1), 40_000, 'the deletion applied after the API came back');
    assert.deepEqual(await bed.pinFileList(), [A1]);
  });

  test('CRI down then up: pins go in first, pulls converge when the runtime is back; /readyz follows', async () => {
    const agent = bed.start(['--metrics-addr', '127.0.0.1:0']);
    await agent.waitForReconcile(0);
    const url = String((await agent.waitForLog((l) => l.msg === 'health and metrics listening')).url);
    assert.equal((await fetch(`${url}/readyz`)).status, 200);
    bed.node.crio.stopServing();
    bed.api.create(set('a', [A1, A2]));
    const s = await bed.waitForSet('a', (x) => x.reason === 'RuntimeUnavailable', 'RuntimeUnavailable');
    assert.equal(s.phase, 'Degraded');
    assert.deepEqual(await bed.pinFileList(), [A1, A2].sort(), 'pinned before anything is pulled');
    const notReady = await fetch(`${url}/readyz`);
    assert.equal(notReady.status, 503);
    assert.match(await notReady.text(), /runtime is not reachable/);
    assert.equal((await fetch(`${url}/healthz`)).status, 200, 'alive all the same: no restart for a runtime outage');
    await bed.node.crio.resume();
    const r = await bed.waitForSet('a', ready, 'Ready after the runtime is back', 30_000);
    assert.equal(r.images.present, 2);
    assert.equal(r.currentGeneration, 1);
    await bed.api.waitFor(async () => (await fetch(`${url}/readyz`)).status === 200, 10_000, 'ready again');
  });

  test('reload failing then succeeding: ReloadFailed, the pin file stays, then converges', async () => {
    bed.node.systemd.failNextReloads(2);
    bed.api.create(set('a', [A1]));
    bed.start();
    const s = await bed.waitForSet('a', (x) => x.reason === 'ReloadFailed', 'ReloadFailed');
    assert.equal(s.phase, 'Degraded');
    assert.deepEqual(await bed.pinFileList(), [A1], 'the file is kept while the reload fails');
    await bed.waitForSet('a', ready, 'Ready after a reload succeeds', 30_000);
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
    assert.ok(bed.node.systemd.reloads.filter((r) => r.result === 'failed').length >= 2);
    await bed.api.waitFor(() => bed.api.list('events', { namespace: 'default' }).some((e) => (e as { reason?: string }).reason === 'ReloadFailed'), 10_000, 'a ReloadFailed Event');
  });

  test('agent restarted: no re-pull, no rewrite, no reload', async () => {
    bed.api.create(set('a', [A1, SHARED]));
    const first = bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    assert.equal(await first.stop(), 0);
    bed.agent = undefined;
    const [file] = (await readdir(bed.node.dropInDir)).filter((f) => f.startsWith('99-pinset-'));
    const st = await stat(join(bed.node.dropInDir, file!));
    const pulls = bed.node.crio.pullCount();
    const reloads = bed.node.systemd.reloads.length;
    const patches = bed.api.requests.filter((r) => r.method === 'PATCH').length;

    const second = bed.start();
    const line = await second.waitForReconcile(0);
    assert.equal(line.wrote, false);
    assert.equal(line.reloaded, false);
    assert.equal(line.pulls, 0);
    const [file2] = (await readdir(bed.node.dropInDir)).filter((f) => f.startsWith('99-pinset-'));
    assert.equal(file2, file, 'the same file name across restarts');
    const st2 = await stat(join(bed.node.dropInDir, file2!));
    assert.equal(st2.ino, st.ino);
    assert.equal(st2.mtimeMs, st.mtimeMs);
    assert.equal(bed.node.crio.pullCount(), pulls);
    assert.equal(bed.node.systemd.reloads.length, reloads);
    // One more (resync) reconcile: still nothing written anywhere.
    const again = await second.waitForReconcile(second.mark());
    assert.equal(again.wrote, false);
    assert.equal(again.pulls, 0);
    assert.equal(bed.api.requests.filter((r) => r.method === 'PATCH').length, patches, 'status unchanged, not rewritten');
  });

  test('the agent restores its file when someone deletes or edits it', async () => {
    bed.api.create(set('a', [A1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    const [file] = (await readdir(bed.node.dropInDir)).filter((f) => f.startsWith('99-pinset-'));
    const path = join(bed.node.dropInDir, file!);
    const original = await readFile(path, 'utf8');
    await writeFile(path, original.replace(A1, 'quay.io/someone/else@sha256:' + hex('9')));
    await bed.api.waitFor(async () => (await readFile(path, 'utf8')) === original, 20_000, 'edited file restored');
    await rm(path);
    await bed.api.waitFor(async () => (await readFile(path, 'utf8').catch(() => '')) === original, 20_000, 'deleted file restored');
    await bed.api.waitFor(() => bed.node.crio.image(A1)?.pinned === true, 10_000, 'CRI-O reloaded with the restored file');
  });

  test('a pull the new desired state no longer wants is cancelled', async () => {
    bed.api.create(set('a', [A1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    bed.node.crio.holdPulls();
    bed.api.create(set('big', [C1]));
    await bed.node.crio.waitForHeldPulls(1);
    bed.api.remove('pinnedimagesets', 'big');
    await bed.api.waitFor(() => bed.node.crio.cancelled.some((c) => c.method === 'PullImage' && c.image === C1), 20_000, 'the held pull cancelled by the agent');
    bed.node.crio.releasePulls();
    await bed.api.waitFor(async () => !(await bed.pinFileList()).includes(C1), 20_000, 'C1 unpinned');
    assert.equal(bed.node.crio.image(C1), null, 'the cancelled pull never landed');
    assert.equal(bed.setStatus('a')?.phase, 'Ready');
  });

  test('image filesystem above the high watermark: pulls wait, NoSpace, pins stay', async () => {
    // The fake runtime reports its image filesystem in a temp folder on this machine's disk,
    // which is more than 1% full: a 1% watermark must stop every pull.
    bed.api.create(set('a', [A1]));
    bed.start(['--image-fs-high-watermark', '1']);
    const s = await bed.waitForSet('a', (x) => x.reason === 'NoSpace', 'NoSpace');
    assert.equal(s.phase, 'Degraded');
    assert.match(s.message ?? '', /high watermark/);
    assert.equal(bed.node.crio.pullCount(), 0, 'no pull was started');
    assert.deepEqual(await bed.pinFileList(), [A1], 'pinned even though not pulled');
  });

  test('watches: bookmarks asked for, a dropped watch resumes, a compacted history relists', async () => {
    bed.api.create(set('a', [A1]));
    bed.api.create(set('gone-while-away', [B1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    await bed.waitForSet('gone-while-away', ready, 'Ready');
    const watches = (await bed.api.waitFor(() => (bed.api.openWatches().length >= 2 ? bed.api.openWatches() : undefined), 10_000, 'two open watches'))!;
    const setsWatch = watches.find((w) => w.resource === 'pinnedimagesets')!;
    const nodeWatch = watches.find((w) => w.resource === 'nodes')!;
    assert.equal(setsWatch.query.allowWatchBookmarks, 'true');
    assert.equal(nodeWatch.query.fieldSelector, `metadata.name=${NODE}`);
    assert.ok(Number(setsWatch.query.resourceVersion) > 0, 'the watch starts from the listed resourceVersion');

    // A dropped watch reconnects from its resourceVersion (no relist).
    const listsBefore = bed.api.requests.filter((r) => r.method === 'GET' && r.path.endsWith('/pinnedimagesets') && !r.query.watch).length;
    bed.api.dropWatches();
    bed.api.create(set('c', [C1]));
    await bed.waitForSet('c', ready, 'Ready after the watch was dropped', 30_000);
    assert.equal(bed.api.requests.filter((r) => r.method === 'GET' && r.path.endsWith('/pinnedimagesets') && !r.query.watch).length, listsBefore, 'resumed without a relist');

    // Watches down, a deletion happens, history compacted: 410 Gone, relist, the deletion is seen.
    bed.api.setAvailable(false);
    bed.api.setAvailable(true);
    bed.api.remove('pinnedimagesets', 'gone-while-away');
    bed.api.compact();
    bed.api.dropWatches();
    await bed.api.waitFor(async () => !(await bed.pinFileList()).includes(B1), 40_000, 'the deletion seen through a relist');
    assert.ok(bed.api.requests.filter((r) => r.method === 'GET' && r.path.endsWith('/pinnedimagesets') && !r.query.watch).length > listsBefore, 'relisted after 410 Gone');
    assert.deepEqual(await bed.pinFileList(), [A1, C1].sort());
  });

  test('health, readiness and metrics; PullFailed Events de-duplicated across retries', async () => {
    bed.node.crio.failPulls(A2, { times: 4, code: 2, message: 'failed to resolve reference: dial tcp 127.0.0.1:1: connect: connection refused' });
    bed.api.create(set('a', [A1, A2]));
    const agent = bed.start(['--metrics-addr', '127.0.0.1:0']);
    const listening = await agent.waitForLog((l) => l.msg === 'health and metrics listening', 10_000, 'the metrics listener');
    const url = String(listening.url);
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const failing = await bed.waitForSet('a', (x) => x.reason === 'RegistryUnavailable', 'RegistryUnavailable');
    assert.match(failing.message ?? '', /registry registry\.test could not be reached/);
    await bed.waitForSet('a', ready, 'Ready after the registry answers again', 40_000);
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    assert.equal((await fetch(`${url}/readyz`)).status, 200);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const value = (re: RegExp) => Number(re.exec(metrics)?.[1]);
    assert.equal(value(/^pinset_pulls_total\{result="success",kind="download"\} (\d+)$/m), 2);
    assert.ok(value(/^pinset_pulls_total\{result="Unavailable",kind="download"\} (\d+)$/m) >= 2, 'the failed attempts are counted');
    assert.equal(value(/^pinset_sets\{phase="Ready"\} (\d+)$/m), 1);
    assert.equal(value(/^pinset_images_pinned (\d+)$/m), 2);
    assert.ok(value(/^pinset_reloads_total\{result="success"\} (\d+)$/m) >= 1);
    assert.ok(value(/^pinset_last_successful_reconcile_timestamp_seconds (\d+(?:\.\d+)?)/m) > 1_700_000_000);
    assert.match(metrics, /^pinset_pull_duration_seconds_count 2$/m);
    const events = bed.api.list('events', { namespace: 'default' }) as { reason?: string; count?: number; involvedObject?: { name?: string } }[];
    const pullFailed = events.filter((e) => e.reason === 'PullFailed');
    assert.equal(pullFailed.length, 1, 'one Event for the retries, not one per retry');
    assert.equal(pullFailed[0]!.involvedObject?.name, NODE);
    assert.equal(events.filter((e) => e.reason === 'SetReady').length, 1);

    // Every write the agent made (annotation patches, Event creates and patches) names its field manager.
    const writes = bed.api.requests.filter((r) => r.method !== 'GET');
    assert.ok(writes.some((r) => r.path.endsWith(`/nodes/${NODE}`)) && writes.some((r) => r.path.includes('/events')));
    for (const w of writes) assert.equal(w.query.fieldManager, 'pinset-agent', `${w.method} ${w.path}`);
    const managed = (bed.api.get('nodes', NODE)!.metadata.managedFields ?? []) as { manager: string; fieldsV1: Record<string, unknown> }[];
    assert.deepEqual(
      managed.find((m) => m.manager === 'pinset-agent')?.fieldsV1,
      { 'f:metadata': { 'f:annotations': { [`f:${STATUS_ANNOTATION}`]: {} } } },
      'the agent owns its annotation and nothing else on the Node',
    );
    const pf = bed.api.get('events', (pullFailed[0] as { metadata?: { name?: string } }).metadata!.name!, 'default')!;
    assert.ok((pf.metadata.managedFields as { manager: string }[]).every((m) => m.manager === 'pinset-agent'));
  });

  test('a set rollout writes the annotation at most 3 times: Progressing as the pulls start, Ready when done', async () => {
    const agent = bed.start();
    await agent.waitForReconcile(0);
    await bed.api.waitFor(() => bed.status(), 10_000, 'the first report (no sets)');
    const writes = () => bed.api.requests.filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${NODE}` && r.status === 200).length;
    const before = writes();
    bed.node.crio.holdPulls();
    bed.api.create(set('rollout', [A1, A2, B1]));
    await bed.node.crio.waitForHeldPulls(1, 20_000);
    // Written while every pull is still held: the new phase does not wait for progress.
    const started = await bed.waitForSet('rollout', (x) => x.phase === 'Progressing', 'Progressing while the pulls are held');
    assert.equal(started.reason, 'Pulling');
    assert.equal(started.images.present, 0);
    bed.node.crio.releasePulls();
    await bed.waitForSet('rollout', ready, 'Ready');
    await new Promise((r) => setTimeout(r, 1_000));
    const n = writes() - before;
    assert.ok(n >= 2 && n <= 3, `${n} annotation writes for one set rollout`);
  });

  test('a slow run reports progress while it pulls: Progressing with counts, then Ready', async () => {
    bed.node.crio.delayPulls(2_500);
    bed.api.create(set('slow', [A1, A2, B1, C1]));
    // Progress alone is written once a minute by default; a test cannot wait that long.
    bed.start(['--max-parallel-pulls', '1', '--status-progress-interval', '2s']);
    const mid = await bed.waitForSet('slow', (x) => x.phase === 'Progressing' && x.images.present > 0 && x.images.present < 4, 'Progressing part-way', 30_000);
    assert.equal(mid.reason, 'Pulling');
    assert.match(mid.message ?? '', /of 4 images present/);
    await bed.waitForSet('slow', ready, 'Ready', 30_000);
  });

  test("its own status writes, the kubelet's heartbeats and the controller's set status trigger no reconcile", async () => {
    bed.api.create(set('a', [A1]));
    const agent = bed.start(['--resync-interval', '10m', '--log-level', 'debug']);
    await bed.waitForSet('a', ready, 'Ready');
    // Let the reconcile that wrote Ready (and anything it triggered) finish.
    await new Promise((r) => setTimeout(r, 1500));
    const mark = agent.mark();
    bed.api.patch('nodes', NODE, { metadata: { annotations: { 'node.alpha.kubernetes.io/ttl': '0' } }, status: { conditions: [{ type: 'Ready', status: 'True' }] } });
    // The controller writes set status through the status subresource, as here.
    await bed.api
      .kubeConfig()
      .makeApiClient(CustomObjectsApi)
      .patchClusterCustomObjectStatus(
        { group: 'pinset.dev', version: 'v1alpha1', plural: 'pinnedimagesets', name: 'a', body: { status: { observedGeneration: 1, nodes: { matched: 1, ready: 1, progressing: 0, degraded: 0 } } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
    assert.equal(bed.api.get('pinnedimagesets', 'a')?.metadata.generation, 1);
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(agent.logs().slice(mark).filter((l) => l.msg === 'reconcile finished' || l.msg === 'reconcile requested'), [], 'no reconcile for changes that change nothing');
    // A label change does.
    bed.api.patch('nodes', NODE, { metadata: { labels: { zone: 'b' } } });
    await agent.waitForReconcile(mark, 10_000);
  });

  test('a kubeconfig that does not exist yet (a node that has not joined): static sets apply; when it appears the agent exits 75 to be restarted with the API', async () => {
    await writeFile(join(bed.staticDir, 'boot.yaml'), JSON.stringify(set('boot', [A1])));
    bed.api.create(set('from-api', [B1]));
    const later = join(bed.dir, 'kubelet', 'kubeconfig');
    const args = bed.args().map((a, i, all) => (all[i - 1] === '--kubeconfig' ? later : a));
    const agent = AgentProcess.start([...args, '--node-labels', 'zone=x'], { env: bed.node.env });
    bed.agent = agent;
    await agent.waitForLog((l) => l.msg?.startsWith('the kubeconfig does not exist yet') === true && l.kubeconfig === later, 10_000, 'the warning');
    await bed.api.waitFor(async () => (await readPinFile(bed.node.dropInDir))?.pins.includes(A1), 20_000, 'the static set pinned');
    assert.ok(!(await bed.pinFileList()).includes(B1), 'no API yet');
    assert.equal(bed.api.requests.length, 0, 'the API was not contacted');
    await mkdir(join(bed.dir, 'kubelet'));
    await copyFile(bed.kubeconfig, later);
    assert.equal(await Promise.race([agent.exited, new Promise((r) => setTimeout(() => r('still running'), 30_000))]), 75);
    assert.ok(agent.logs().some((l) => l.msg === 'the kubeconfig appeared; exiting to be restarted with the API'));
    // Restarted (as systemd does), it reads the API with that kubeconfig.
    bed.start(['--node-labels', 'zone=x', '--kubeconfig', later]);
    await bed.waitForSet('from-api', ready, 'Ready through the API', 30_000);
  });

  test('--once with static sets and no API: exit 0 when Ready, one JSON line per set', async () => {
    await writeFile(join(bed.staticDir, 'boot.yaml'), [set('boot-a', [A1]), set('boot-b', [B1], { matchLabels: { zone: 'x' } })].map((o) => JSON.stringify(o)).join('\n---\n'));
    const args = bed.args().filter((a, i, all) => a !== '--kubeconfig' && all[i - 1] !== '--kubeconfig');
    const r = await runAgentOnce([...args, '--node-labels', 'zone=x'], { env: bed.node.env });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.sets.map((s) => [s.name, s.source, s.phase]), [['boot-a', 'static', 'Ready'], ['boot-b', 'static', 'Ready']]);
    const bad = await runAgentOnce([...args, '--node-labels', 'zone=x', '--reload', 'sometimes'], { env: bed.node.env });
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--reload/);
  });
});
