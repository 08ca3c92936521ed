// `pinset status` as a user runs it: a subprocess with --kubeconfig, against
// the in-process API server holding Nodes with status annotations.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { parse as parseYaml } from 'yaml';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { runAgentOnce } from '../support/agent-process.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';
import { METADATA_LIST_ACCEPT } from '../../src/api/list-pages.ts';
import { STATUS_ANNOTATION, type NodeRuntime, type NodeSetStatus, type PinnedImageSet } from '../../src/api/types.ts';
import { formatAge, jsonPieces, renderTable, runtimeLabel, statusRows, tableLines, writePieces, type JsonItem } from '../../src/cli/status.ts';
import { encodeNodeStatus } from '../../src/api/node-status.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const LONG_ERROR = `pulling quay.io/org/app@sha256:${'c'.repeat(64)}: rpc error: code = NotFound desc = manifest unknown: ${'the registry does not know it; '.repeat(8)}`;

let api: ApiServer;
let dir: string;
let kubeconfig: string;
let setUid: string;

function entry(over: Partial<NodeSetStatus>): NodeSetStatus {
  return {
    name: 'upgrade',
    uid: setUid,
    source: 'api',
    desiredGeneration: 2,
    currentGeneration: 2,
    images: { wanted: 3, present: 3, pinned: 3, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
    ...over,
  };
}

function node(name: string, annotation?: string, labels: Record<string, string> = { role: 'worker' }): void {
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels, ...(annotation !== undefined ? { annotations: { [STATUS_ANNOTATION]: annotation } } : {}) } });
}

/** A report as an agent of version 1 wrote it. */
function report(name: string, ageMs: number, sets: NodeSetStatus[]): string {
  return JSON.stringify({ version: 1, node: name, pinFile: '99-pinset-x.conf', updatedAt: new Date(Date.now() - ageMs).toISOString(), sets });
}

/** A report as agents write it now (version 2): nodes of both kinds are read side by side during an upgrade. */
function reportV2(ageMs: number, sets: NodeSetStatus[], runtime?: NodeRuntime): string {
  return encodeNodeStatus({ version: 2, pinFile: '99-pinset-x.conf', updatedAt: new Date(Date.now() - ageMs).toISOString(), sets, ...(runtime ? { runtime } : {}) });
}

const K3S_RUNTIME: NodeRuntime = {
  name: 'containerd',
  version: 'v2.1.5-k3s1',
  layout: 'k3s',
  source: 'detected',
  pinBackend: 'containerd',
  socket: '/run/k3s/containerd/containerd.sock',
  hostsDir: '/var/lib/rancher/k3s/agent/etc/containerd/certs.d',
  lock: '/var/lib/pinset/agent.lock',
};

function pinset(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(NODE, ['src/cli/main.ts', 'status', ...args], { cwd: ROOT, env: { ...process.env, COLUMNS: '100', ...env }, timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

before(async () => {
  api = await ApiServer.start();
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-status-'));
  kubeconfig = await api.writeKubeconfig(dir);
  setUid = api.create({
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name: 'upgrade' },
    spec: { nodeSelector: { matchLabels: { role: 'worker' } }, pinnedImages: [{ name: `quay.io/org/app@sha256:${'a'.repeat(64)}` }] },
  }).metadata.uid!;
  node(
    'worker-a',
    report('worker-a', 3 * 3600_000 + 10_000, [
      entry({}),
      { ...entry({ name: 'local-tools', source: 'static', desiredGeneration: 1, currentGeneration: 1 }), uid: undefined },
    ]),
  );
  node(
    'worker-b',
    reportV2(20 * 60_000, [
      entry({ phase: 'Degraded', reason: 'ImageNotFound', currentGeneration: 1, lastFailedGeneration: 2, lastFailedGenerationError: LONG_ERROR, images: { wanted: 3, present: 2, pinned: 3, failed: 1, invalid: 0 }, estimatedBytes: 5 * 1024 ** 3 }),
    ], K3S_RUNTIME),
  );
  node('worker-c');
  node('worker-d', '{"version":1,"sets":[');
  node('control-1', report('control-1', 15 * 60_000, []), { role: 'control-plane' });
});

after(async () => {
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('pinset status', () => {
  test('prints a node-by-set table (worker-a reports in version 1, worker-b in version 2)', async () => {
    const { code, stdout, stderr } = await pinset(['--kubeconfig', kubeconfig], { COLUMNS: '140' });
    assert.equal(code, 0, stderr);
    const all = stdout.trimEnd().split('\n');
    const lines = all.slice(0, all.indexOf(''));
    assert.match(lines[0]!, /^NODE\s+SET\s+PHASE\s+IMAGES\s+BYTES\s+ETA\s+GENERATION\s+AGE\s+ERROR$/);
    const row = (node: string, set: string) => {
      const found = lines.find((l) => l.split(/\s{2,}/)[0] === node && l.split(/\s{2,}/)[1] === set);
      assert.ok(found, `a row for ${node} ${set} in\n${stdout}`);
      return found.split(/\s{2,}/);
    };
    // Agents from before `bytes` report none: BYTES and ETA say "-".
    assert.deepEqual(row('worker-a', 'upgrade'), ['worker-a', 'upgrade', 'Ready', '3/3', '-', '-', '2/2', '3h']);
    assert.deepEqual(row('worker-a', 'local-tools (static)').slice(2), ['Ready', '3/3', '-', '-', '1/1', '3h']);
    const b = row('worker-b', 'upgrade');
    assert.deepEqual(b.slice(0, 8), ['worker-b', 'upgrade', 'Degraded', '2/3', '-', '-', '1/2', '20m']);
    assert.match(b[8]!, /^ImageNotFound: pulling quay\.io\/org\/app@sha256:c+…$/, 'the error is cut to fit');
    assert.deepEqual(row('worker-c', '<none>').slice(2), ['NotReported', '-', '-', '-', '-', '-']);
    const d = row('worker-d', '<none>');
    assert.equal(d[2], 'Unreadable');
    assert.match(d[8]!, /not JSON/);
    assert.deepEqual(row('control-1', '<none>').slice(2), ['-', '-', '-', '-', '-', '15m']);
    for (const l of lines) assert.ok([...l].length <= 140, `line fits 140 columns: ${l}`);
    assert.equal([...lines.find((l) => l.startsWith('worker-b'))!].length, 140);
    // Nodes in name order.
    const nodes = lines.slice(1).map((l) => l.split(/\s+/)[0]);
    assert.deepEqual(nodes, [...nodes].sort());
    // After the table, the set's progress across the 4 nodes it selects: in
    // images, as no node reports bytes (1 image each on the unreported
    // worker-c and worker-d, from the set's spec); no ETA without the controller.
    assert.deepEqual(all.slice(lines.length + 1, lines.length + 3), [
      'Progress:',
      "  upgrade: 62% of 8 images (2 waiting, 1 degraded); no ETA: the set's status has no progress from `pinset controller` (is it running?)",
    ]);
  });

  test('-o wide adds each set\'s disk estimate for what it still has to download, and the node\'s runtime as its agent found it', async () => {
    const { code, stdout, stderr } = await pinset(['--kubeconfig', kubeconfig, '-o', 'wide'], { COLUMNS: '200' });
    assert.equal(code, 0, stderr);
    const lines = stdout.trimEnd().split('\n');
    assert.match(lines[0]!, /^NODE\s+SET\s+PHASE\s+IMAGES\s+BYTES\s+RATE\s+ETA\s+GENERATION\s+AGE\s+ESTIMATE\s+RUNTIME\s+ERROR$/);
    const cells = (node: string) => lines.find((l) => l.startsWith(`${node} `))!.split(/\s{2,}/);
    assert.deepEqual(cells('worker-b').slice(0, 11), ['worker-b', 'upgrade', 'Degraded', '2/3', '-', '-', '-', '1/2', '20m', '5.0 GiB', 'containerd v2.1.5-k3s1 on k3s (containerd)']);
    assert.deepEqual(cells('worker-a').slice(9, 11), ['-', '-'], 'an agent from before the runtime report');
  });

  test('the RUNTIME of a node whose agent settled on no runtime, and why, in its ERROR', () => {
    const problem = '2 container runtimes answer on this node: cri-o 1.32.13 at /run/crio/crio.sock, containerd 2.1.9 at /run/containerd/containerd.sock';
    const status = { version: 2 as const, pinFile: '', updatedAt: new Date().toISOString(), sets: [], runtime: { source: 'detected', pinBackend: 'none', socket: '/run/crio/crio.sock', lock: '/var/lib/pinset/agent.lock', problem } };
    const [row] = statusRows([{ name: 'mixed', labels: {}, reading: { status } }], new Date());
    assert.equal(row!.runtime, 'none settled');
    assert.equal(row!.error, problem);
    assert.equal(runtimeLabel({ ...K3S_RUNTIME, name: 'cri-o', version: '1.32.13', layout: 'crio', pinBackend: 'crio' }), 'cri-o 1.32.13 (crio)');
  });

  test('--set shows that set only, and the selected nodes that have not reported on it', async () => {
    const { code, stdout } = await pinset(['--kubeconfig', kubeconfig, '--set', 'upgrade']);
    assert.equal(code, 0);
    const all = stdout.trimEnd().split('\n');
    const lines = all.slice(1, all.indexOf(''));
    assert.deepEqual(
      lines.map((l) => l.split(/\s{2,}/).slice(0, 3)),
      [
        ['worker-a', 'upgrade', 'Ready'],
        ['worker-b', 'upgrade', 'Degraded'],
        ['worker-c', 'upgrade', 'NotReported'],
        ['worker-d', 'upgrade', 'Unreadable'],
      ],
    );
  });

  test('-o json prints the parsed reports', async () => {
    const { code, stdout } = await pinset(['--kubeconfig', kubeconfig, '-o', 'json']);
    assert.equal(code, 0);
    const doc = JSON.parse(stdout) as { nodes: Array<{ node: string; status: { sets: NodeSetStatus[]; updatedAt: string } | null; error?: string }> };
    assert.deepEqual(doc.nodes.map((n) => n.node), ['control-1', 'worker-a', 'worker-b', 'worker-c', 'worker-d']);
    const a = doc.nodes.find((n) => n.node === 'worker-a')!;
    assert.deepEqual(a.status?.sets.map((s) => s.name), ['upgrade', 'local-tools']);
    const b = doc.nodes.find((n) => n.node === 'worker-b')!;
    assert.equal(b.status?.sets[0]?.lastFailedGenerationError, LONG_ERROR, 'JSON is not cut');
    assert.equal(doc.nodes.find((n) => n.node === 'worker-c')!.status, null);
    const d = doc.nodes.find((n) => n.node === 'worker-d')!;
    assert.equal(d.status, null);
    assert.match(d.error!, /not JSON/);

    const only = await pinset(['--kubeconfig', kubeconfig, '-ojson', '--set', 'local-tools']);
    const doc2 = JSON.parse(only.stdout) as typeof doc;
    assert.deepEqual(doc2.nodes.find((n) => n.node === 'worker-a')!.status?.sets.map((s) => s.name), ['local-tools']);
  });

  test('lists Nodes as metadata only, in pages of --chunk-size', async () => {
    api.requests.length = 0;
    const paged = await pinset(['--kubeconfig', kubeconfig, '--chunk-size', '2']);
    const whole = await pinset(['--kubeconfig', kubeconfig]);
    assert.equal(paged.code, 0, paged.stderr);
    assert.equal(paged.stdout, whole.stdout, 'the same table however it was paged');
    const lists = api.requests.filter((r) => r.path === '/api/v1/nodes' && r.userAgent === 'pinset-status');
    assert.deepEqual(lists.map((r) => r.query.limit), ['2', '2', '2', '500'], 'five nodes in three pages of two, then one of 500');
    assert.ok(lists.every((r) => r.accept === METADATA_LIST_ACCEPT && r.status === 200));
    assert.ok(lists[1]!.query.continue && lists[2]!.query.continue);
  });

  test('a list refused by the API server exits 1 with the server\'s message', async () => {
    const strict = await ApiServer.start({ token: 'sesame' });
    const strictDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-401-'));
    try {
      const file = await strict.writeKubeconfig(strictDir);
      await writeFile(file, (await readFile(file, 'utf8')).replace('sesame', 'wrong'));
      const { code, stderr } = await pinset(['--kubeconfig', file]);
      assert.equal(code, 1);
      assert.match(stderr, /^pinset status: cannot list nodes from the API server at .+: HTTP 401: Unauthorized\n$/);
    } finally {
      await strict.stop();
      await rm(strictDir, { recursive: true, force: true });
    }
  });

  test('exits 1 with a clear message when the API server cannot be reached', async () => {
    const gone = await ApiServer.start();
    const goneDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-gone-'));
    try {
      const file = await gone.writeKubeconfig(goneDir);
      await gone.stop();
      const { code, stdout, stderr } = await pinset(['--kubeconfig', file]);
      assert.equal(code, 1);
      assert.equal(stdout, '');
      assert.match(stderr, new RegExp(`^pinset status: cannot list nodes from the API server at ${gone.url.replace(/\./g, '\\.')}: .+`));
    } finally {
      await gone.stop();
      await rm(goneDir, { recursive: true, force: true });
    }
  });

  test('with no kubeconfig anywhere it says so and where it looked', async () => {
    const home = await mkdtemp(path.join(tmpdir(), 'pinset-home-'));
    try {
      const env: NodeJS.ProcessEnv = { ...process.env, HOME: home };
      delete env.KUBECONFIG;
      delete env.KUBERNETES_SERVICE_HOST;
      delete env.KUBERNETES_SERVICE_PORT;
      const r = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
        execFile(NODE, ['src/cli/main.ts', 'status'], { cwd: ROOT, env, timeout: 30_000 }, (err, _out, stderr) =>
          resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stderr }),
        );
      });
      assert.equal(r.code, 1);
      assert.match(r.stderr, /no kubeconfig found/);
      assert.match(r.stderr, /KUBECONFIG is not set/);
      assert.ok(r.stderr.includes(path.join(home, '.kube', 'config')), r.stderr);
      assert.match(r.stderr, /not a pod in a cluster \(KUBERNETES_SERVICE_HOST is not set\)/);
      assert.match(r.stderr, /pass --kubeconfig FILE or set KUBECONFIG/);
      assert.doesNotMatch(r.stderr, /HTTP protocol/);

      // KUBECONFIG naming only files that do not exist.
      const missing = await pinset([], { KUBECONFIG: path.join(home, 'nope') });
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, new RegExp(`KUBECONFIG names ${path.join(home, 'nope')}, and none of them exists`));
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  });

  test('a reader that stops early (`| head`): the output stops, exit 0, nothing on stderr; a slow reader gets all of it', async () => {
    // Enough nodes that the output is many times a pipe's 64 KiB.
    const big = await ApiServer.start();
    const bigDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-big-'));
    try {
      const file = await big.writeKubeconfig(bigDir);
      const sets = Array.from({ length: 8 }, (_, k) => entry({ name: `set-${k}`, uid: `uid-${k}` }));
      for (let i = 0; i < 400; i++) big.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: `node-${String(i).padStart(3, '0')}`, annotations: { [STATUS_ANNOTATION]: reportV2(60_000, sets) } } });
      const run = (reader: (out: Readable) => Promise<string>) =>
        new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
          const child = spawn(NODE, ['src/cli/main.ts', 'status', '--kubeconfig', file, '-o', 'json'], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
          let stderr = '';
          child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
          const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
          const out = reader(child.stdout);
          child.once('error', reject).once('close', (code) => {
            clearTimeout(timer);
            void out.then((stdout) => resolve({ code, stdout, stderr }));
          });
        });

      const head = await run(
        (out) =>
          new Promise((resolve) => {
            out.once('data', (c: Buffer) => {
              out.destroy();
              resolve(c.toString());
            });
          }),
      );
      assert.equal(head.code, 0, head.stderr);
      assert.equal(head.stderr, '');
      assert.match(head.stdout, /^\{\n {2}"nodes": \[/);

      const slow = await run(async (out) => {
        let text = '';
        for await (const c of out) {
          text += String(c);
          await new Promise((r) => setTimeout(r, 2));
        }
        return text;
      });
      assert.equal(slow.code, 0, slow.stderr);
      const doc = JSON.parse(slow.stdout) as { nodes: { node: string }[] };
      assert.equal(doc.nodes.length, 400);
      assert.ok(slow.stdout.length > 10 * 65536, `${slow.stdout.length} bytes`);
    } finally {
      await big.stop();
      await rm(bigDir, { recursive: true, force: true });
    }
  });

  test('a bad -o value is a usage error', async () => {
    const { code, stderr } = await pinset(['--kubeconfig', kubeconfig, '-o', 'yaml']);
    assert.equal(code, 2);
    assert.match(stderr, /table, wide, json/);
  });
});

describe('pinset status: nodes keeping pins no set asks for', () => {
  test('named after the table with their agent\'s words and how to remove the pins; not with --set', async () => {
    const own = await ApiServer.start();
    const ownDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-kept-'));
    try {
      const file = await own.writeKubeconfig(ownDir);
      const kept = (n: number) => `${n} pin(s) kept that no set asks for now: the CustomResourceDefinition pinnedimagesets.pinset.dev is not installed, so the sets cannot be listed; the pins stay (to remove them: \`pinset uninstall\`, or \`pinset agent --drop-pins\` on this node)`;
      const at = (name: string, pins: number, pinsKept?: string) =>
        own.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, annotations: { [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: '/etc/crio/crio.conf.d/99-pinset.conf', updatedAt: new Date().toISOString(), sets: [], pins, ...(pinsKept ? { pinsKept } : {}) }) } } });
      for (let i = 0; i < 6; i++) at(`node-${i}`, 3 + i, kept(3 + i));
      at('clean', 0);
      const { code, stdout, stderr } = await pinset(['--kubeconfig', file], { COLUMNS: '400' });
      assert.equal(code, 0, stderr);
      const lines = stdout.trimEnd().split('\n');
      const after = lines.slice(lines.indexOf('') + 1);
      assert.deepEqual(after, [
        'Pins kept that no set asks for now (they go when the agent can read its sets again; to remove them: `pinset uninstall`, or `pinset agent --drop-pins` on the node):',
        ...[0, 1, 2, 3, 4].map((i) => `  node-${i}: ${kept(3 + i)}`),
        '  and 1 more node',
      ]);
      assert.ok(!after.some((l) => l.includes('clean')), 'a node keeping nothing is not named');
      const one = await pinset(['--kubeconfig', file, '--set', 'apps']);
      assert.ok(!one.stdout.includes('Pins kept'), one.stdout);
    } finally {
      await own.stop();
      await rm(ownDir, { recursive: true, force: true });
    }
  });
});

describe('pinset status: nodes that only pre-load', () => {
  const WHY_16 = 'containerd 1.6.20~ds1 does not honour io.cri-containerd.pinned set after the pull; pins need 1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x';
  const WHY_17 = 'containerd 1.7.2 does not honour io.cri-containerd.pinned set after the pull; pins need 1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x';

  test('each such node is marked in the table, and said once after it with why and the versions that pin; -o json carries cannotPin', async () => {
    const own = await ApiServer.start();
    const ownDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-preload-'));
    try {
      const file = await own.writeKubeconfig(ownDir);
      const at = (name: string, sets: NodeSetStatus[], cannotPin?: string) =>
        own.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, annotations: { [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: 'none (pre-load only)', updatedAt: new Date().toISOString(), sets, ...(cannotPin ? { cannotPin } : {}) }) } } });
      const cannot = (present: number) => ({ name: 'apps', source: 'api' as const, desiredGeneration: 1, currentGeneration: 0, images: { wanted: 2, present, pinned: 0, failed: 0, invalid: 0 }, phase: 'Degraded' as const, reason: 'RuntimeCannotPin', message: `2 of 2 images present (pre-loaded) but not pinned: ${WHY_16}` });
      for (let i = 0; i < 7; i++) at(`edge-${i}`, [cannot(2)], WHY_16);
      at('edge-old', [cannot(2)], WHY_17);
      at('worker', [{ ...cannot(2), phase: 'Ready', reason: 'AllImagesPinned', message: undefined, images: { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 } }]);
      const { code, stdout, stderr } = await pinset(['--kubeconfig', file], { COLUMNS: '400' });
      assert.equal(code, 0, stderr);
      const lines = stdout.trimEnd().split('\n');
      assert.match(lines.find((l) => l.startsWith('edge-0'))!, /^edge-0 \(pre-load only\)\s+apps\s+Degraded\s+2\/2/);
      assert.match(lines.find((l) => l.startsWith('worker'))!, /^worker\s+apps\s+Ready/, 'a node that pins is not marked');
      const after = lines.slice(lines.indexOf('') + 1);
      assert.deepEqual(after, [
        "Pre-load only: these nodes' runtimes cannot pin, so nothing keeps the kubelet's image garbage collection from removing their images.",
        `  edge-0, edge-1, edge-2, edge-3, edge-4 and 2 more: ${WHY_16}`,
        `  edge-old: ${WHY_17}`,
      ]);
      const json = JSON.parse((await pinset(['--kubeconfig', file, '-o', 'json'])).stdout) as { nodes: { node: string; status: { cannotPin?: string } }[] };
      assert.equal(json.nodes.find((n) => n.node === 'edge-old')?.status.cannotPin, WHY_17);
      assert.equal(json.nodes.find((n) => n.node === 'worker')?.status.cannotPin, undefined);
      // --set: only the nodes in its rows are said.
      const one = await pinset(['--kubeconfig', file, '--set', 'other']);
      assert.equal(one.stdout, 'No node reports on set other.\n');
    } finally {
      await own.stop();
      await rm(ownDir, { recursive: true, force: true });
    }
  });
});

describe('pinset status: the kubelet\'s credential verification', () => {
  test('nodes whose kubelet policy will refuse pinned images offline are said once per verdict after the table; --set narrows it; -o json carries it', async () => {
    const own = await ApiServer.start();
    const ownDir = await mkdtemp(path.join(tmpdir(), 'pinset-status-kubelet-'));
    try {
      const file = await own.writeKubeconfig(ownDir);
      const ready = (name: string): NodeSetStatus => ({ name, source: 'api', desiredGeneration: 1, currentGeneration: 1, images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 }, phase: 'Ready', reason: 'AllImagesPinned' });
      const at = (name: string, kubeletVerification?: Record<string, unknown>) =>
        own.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, annotations: { [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: 'x', updatedAt: new Date().toISOString(), sets: [ready('apps'), ready('db')], ...(kubeletVerification ? { kubeletVerification: kubeletVerification as never } : {}) }) } } });
      const allow = { policy: 'NeverVerifyAllowlistedImages', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf', refuses: ['db'] };
      at('edge-1', allow);
      at('edge-2', allow);
      at('edge-3', { policy: 'NeverVerifyPreloadedImages', source: "the kubelet's default" });
      at('edge-4', { policy: 'AlwaysVerify', source: '/var/lib/kubelet/config.yaml', refuses: ['apps', 'db'] });
      at('edge-5', { policy: 'Invalid', source: 'preloadedImagesVerificationAllowlist: "nginx": not a normalized name: the kubelet does not start' });
      at('fine-1', { policy: 'NeverVerifyAllowlistedImages', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf' });
      at('fine-2', { policy: 'NeverVerify', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf' });
      at('fine-3', { policy: 'Unknown', source: 'no kubelet configuration at /var/lib/kubelet/config.yaml' });
      at('old-agent');
      const { code, stdout, stderr } = await pinset(['--kubeconfig', file], { COLUMNS: '400' });
      assert.equal(code, 0, stderr);
      const lines = stdout.trimEnd().split('\n');
      const after = lines.slice(lines.indexOf('') + 1);
      assert.match(after[0]!, /^Kubelet credential verification: pinned images may not start offline on these nodes .*pinset kubelet-allowlist --node NAME/);
      assert.deepEqual(after.slice(1).sort(), [
        "  edge-1, edge-2: policy NeverVerifyAllowlistedImages (/etc/kubernetes/kubelet.conf.d/50-pinset.conf): pods of db need the registry unless their credentials match the kubelet's own record of a pull",
        "  edge-3: policy NeverVerifyPreloadedImages (the kubelet's default): holds only for images the kubelet never pulled itself",
        "  edge-4: policy AlwaysVerify (/var/lib/kubelet/config.yaml): pods of apps, db need the registry unless their credentials match the kubelet's own record of a pull",
        '  edge-5: the kubelet refuses its configuration and does not start with it: preloadedImagesVerificationAllowlist: "nginx": not a normalized name: the kubelet does not start',
      ]);
      const one = await pinset(['--kubeconfig', file, '--set', 'apps'], { COLUMNS: '400' });
      assert.ok(!one.stdout.includes('edge-1, edge-2'), one.stdout);
      assert.match(one.stdout, /edge-4: policy AlwaysVerify \(\/var\/lib\/kubelet\/config\.yaml\): pods of apps need/);
      const json = JSON.parse((await pinset(['--kubeconfig', file, '-o', 'json'])).stdout) as { nodes: { node: string; status: { kubeletVerification?: unknown } }[] };
      assert.deepEqual(json.nodes.find((n) => n.node === 'edge-1')?.status.kubeletVerification, allow);
      assert.equal(json.nodes.find((n) => n.node === 'old-agent')?.status.kubeletVerification, undefined);
    } finally {
      await own.stop();
      await rm(ownDir, { recursive: true, force: true });
    }
  });
});

describe('status table pieces', () => {
  test('ages read like kubectl\'s', () => {
    const s = 1000;
    const cases: Array<[number, string]> = [
      [0, '0s'],
      [-500, '0s'],
      [-5 * s, '<invalid>'],
      [45 * s, '45s'],
      [119 * s, '119s'],
      [3 * 60 * s, '3m'],
      [(3 * 60 + 20) * s, '3m20s'],
      [15 * 60 * s, '15m'],
      [179 * 60 * s, '179m'],
      [(5 * 60 + 30) * 60 * s, '5h30m'],
      [20 * 3600 * s, '20h'],
      [(3 * 24 + 4) * 3600 * s, '3d4h'],
      [30 * 24 * 3600 * s, '30d'],
      [(2 * 365 + 10) * 24 * 3600 * s, '2y10d'],
      [9 * 365 * 24 * 3600 * s, '9y'],
    ];
    for (const [ms, want] of cases) assert.equal(formatAge(ms), want, `${ms} ms`);
  });

  test('ERROR keeps a minimum width on a narrow terminal and multi-line errors stay on one line', () => {
    const now = new Date('2025-01-01T00:00:00Z');
    const rows = statusRows(
      [
        {
          name: 'n',
          labels: {},
          reading: {
            status: {
              version: 1,
              node: 'n',
              pinFile: 'x',
              updatedAt: '2024-12-31T23:59:00Z',
              sets: [{ name: 's', source: 'api', desiredGeneration: 1, currentGeneration: 0, phase: 'Degraded', reason: 'PullFailed', lastFailedGeneration: 1, lastFailedGenerationError: 'line one\nline two '.repeat(10), images: { wanted: 1, present: 0, pinned: 1, failed: 1, invalid: 0 } }],
            },
          },
        },
      ],
      now,
    );
    assert.equal(rows[0]!.age, '60s');
    const out = renderTable(rows, 10).trimEnd().split('\n');
    assert.equal(out.length, 2);
    const err = out[1]!.split(/\s{2,}/)[8]!;
    assert.equal([...err].length, 20);
    assert.equal(err, 'PullFailed: line on…');
  });

  test('-o json is written item by item, byte for byte as one JSON.stringify of the document', () => {
    const items: JsonItem[] = Array.from({ length: 300 }, (_, i) => ({
      node: `node-${i}`,
      status: i % 7 === 0 ? null : { version: 2, pinFile: 'x.conf', updatedAt: '2025-01-01T00:00:00Z', sets: [{ name: 's', source: 'api', desiredGeneration: 1, currentGeneration: 1, phase: 'Ready', reason: 'AllImagesPinned', images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 } }] },
      ...(i % 11 === 0 ? { error: 'not JSON' } : {}),
    }));
    for (const list of [items, items.slice(0, 1), []]) {
      const pieces = [...jsonPieces(list)];
      assert.equal(pieces.join(''), `${JSON.stringify({ nodes: list }, null, 2)}\n`);
      assert.equal(pieces.length, list.length === 0 ? 1 : list.length + 2, 'one piece per item, an opening and a closing');
    }
  });

  test('output waits for the reader: no write while the stream asks for a drain, and all of it arrives', async () => {
    const received: string[] = [];
    let writesWhileFull = 0;
    let writes = 0;
    // A reader slower than the writer: each chunk taken on a later turn of the event loop.
    const out = new Writable({
      highWaterMark: 1024,
      write(chunk: Buffer, _enc, done) {
        received.push(chunk.toString());
        setImmediate(done);
      },
    });
    const write = out.write.bind(out) as (chunk: string) => boolean;
    out.write = ((chunk: string) => {
      writes++;
      if (out.writableNeedDrain) writesWhileFull++;
      return write(chunk);
    }) as typeof out.write;
    const pieces = Array.from({ length: 5000 }, (_, i) => `line ${i} ${'x'.repeat(80)}\n`);
    assert.equal(await writePieces(pieces, out), undefined);
    assert.equal(received.join(''), pieces.join(''));
    assert.ok(writes > 2, `written in batches (${writes} writes)`);
    assert.equal(writesWhileFull, 0, 'never wrote to a stream waiting for a drain');
  });

  test('a write error stops the output: the error is returned and no further piece is read', async () => {
    let taken = 0;
    function* pieces() {
      for (let i = 0; i < 1000; i++) {
        taken++;
        yield 'y'.repeat(1000);
      }
    }
    const out = new Writable({
      write(_chunk, _enc, done) {
        done(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }));
      },
    });
    const err = await writePieces(pieces(), out);
    assert.equal((err as NodeJS.ErrnoException | undefined)?.code, 'EPIPE');
    assert.ok(taken < 1000, `stopped after ${taken} of 1000 pieces`);
  });

  test('a table of 250000 rows: a header and a line per row, columns as wide as the widest value', () => {
    const row = { node: 'n', set: 's', phase: 'Ready', images: '1/1', bytes: '-', rate: '-', eta: '-', generation: '1/1', age: '1m', estimate: '-', runtime: '-', error: '' };
    const rows = Array.from({ length: 250_000 }, (_, i) => ({ ...row, node: `node-${i}` }));
    const lines = [...tableLines(rows, 120)];
    assert.equal(lines.length, 250_001);
    assert.match(lines[250_000]!, /^node-249999 {3}s/);
    assert.match(lines[1]!, /^node-0 {8}s/, 'node-0 padded to the width of node-249999');
  });
});

// ---------------------------------------------------------------------------
// As a kubectl plugin: kubectl runs `kubectl-pinset` from PATH with the
// arguments after "pinset" and its own environment.

const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => existsSync(p));
const kubectlMissing = process.env.CI !== 'true' && !kubectl ? 'kubectl not installed' : false;

describe('kubectl pinset', () => {
  let bin: string;
  const pluginEnv = () => {
    const env: NodeJS.ProcessEnv = { ...process.env, KUBECONFIG: kubeconfig, COLUMNS: '140', PATH: [bin, path.join(ROOT, 'node_modules/.bin'), process.env.PATH].join(path.delimiter) };
    return env;
  };
  const run = (cmd: string, args: string[]) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(cmd, args, { cwd: tmpdir(), env: pluginEnv(), timeout: 30_000 }, (err, stdout, stderr) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr }),
      );
    });

  before(async () => {
    // What `npm install -g` does with the bin entry, an executable link on
    // PATH, made here to the plugin's source (integration tests run the
    // sources). The installed package's own bin entry, the bundle, is
    // test/e2e/npm-install.test.ts's.
    bin = await mkdtemp(path.join(tmpdir(), 'pinset-bin-'));
    await symlink(path.join(ROOT, 'src/cli/kubectl-pinset.ts'), path.join(bin, 'kubectl-pinset'));
  });
  after(() => rm(bin, { recursive: true, force: true }));

  test('kubectl-pinset status: the same table as pinset status, with the kubeconfig from the environment', async () => {
    const plugin = await run('kubectl-pinset', ['status']);
    assert.equal(plugin.code, 0, plugin.stderr);
    const direct = await pinset(['--kubeconfig', kubeconfig], { COLUMNS: '140' });
    const rows = (t: string) => t.trimEnd().split('\n').map((l) => l.split(/\s{2,}/).slice(0, 5).join('|'));
    assert.deepEqual(rows(plugin.stdout), rows(direct.stdout));
    assert.match(plugin.stdout, /^worker-b\s+upgrade\s+Degraded/m);
  });

  test('kubectl-pinset validate, and only the people\'s commands', async () => {
    const good = await run('kubectl-pinset', ['validate', path.join(ROOT, 'test/fixtures/sets/good/minimal.yaml')]);
    assert.equal(good.code, 0, good.stderr);
    assert.match(good.stdout, /valid/);
    const help = await run('kubectl-pinset', ['--help']);
    assert.match(help.stdout, /^usage: kubectl pinset <command>/);
    assert.doesNotMatch(help.stdout, /^\s+(agent|controller)\s/m);
    const agent = await run('kubectl-pinset', ['agent']);
    assert.equal(agent.code, 2);
    assert.match(agent.stderr, /unknown command "agent"/);
  });

  test('through kubectl itself: kubectl finds the plugin and runs it', { skip: kubectlMissing }, async () => {
    if (!kubectl) assert.fail('kubectl not found; CI=true requires it');
    const list = await run(kubectl, ['plugin', 'list', '--name-only']);
    assert.match(list.stdout, /^kubectl-pinset$/m, list.stdout + list.stderr);
    const r = await run(kubectl, ['pinset', 'status', '--set', 'upgrade']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      r.stdout.split('\n\n')[0]!.split('\n').slice(1).map((l) => l.split(/\s{2,}/).slice(0, 3).join(' ')),
      ['worker-a upgrade Ready', 'worker-b upgrade Degraded', 'worker-c upgrade NotReported', 'worker-d upgrade Unreadable'],
    );
  });
});

describe("pinset status: the README's walk-through", () => {
  test('its sample is what pinset status prints once the first set is Ready on the three nodes it describes, run by real agents (containerd 2.1.4, the image there already as its sandbox image)', async (t) => {
    const readme = (await readFile(path.join(ROOT, 'README.md'), 'utf8')).split('\n');
    const start = readme.findIndex((l) => l.startsWith('$ pinset status --set first-set'));
    assert.ok(start > 0, 'the README runs `pinset status --set first-set`');
    const end = readme.findIndex((l, i) => i > start && l.trim() === '```');
    const sample = readme.slice(start + 1, end).join('\n');

    const own = await ApiServer.start();
    const work = await mkdtemp(path.join(tmpdir(), 'pinset-readme-status-'));
    const nodes: FakeContainerd[] = [];
    t.after(async () => {
      for (const c of nodes) await c.stop();
      await own.stop();
      await rm(work, { recursive: true, force: true });
    });
    const kc = await own.writeKubeconfig(work);
    const firstSet = parseYaml(await readFile(path.join(ROOT, 'examples/first-set.yaml'), 'utf8')) as PinnedImageSet;
    own.create(firstSet as unknown as KubeObject);
    const pause = firstSet.spec.pinnedImages[0]!.name;
    for (const name of ['cp-1', 'worker-1', 'worker-2']) {
      // containerd 2.1 pulls registry.k8s.io/pause:3.10, the first set's image, as its sandbox image: it is there before the set.
      const c = await startFakeContainerd({ version: '2.1.4', catalogue: { [pause]: { size: 320_368 } }, sandboxImage: pause });
      nodes.push(c);
      c.preload(pause);
      own.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { 'kubernetes.io/os': 'linux', 'kubernetes.io/hostname': name } } });
      const r = await runAgentOnce([
        '--node-name', name, '--kubeconfig', kc, '--cri-endpoint', c.endpoint, '--static-dir', path.join(work, name, 'sets.d'),
        '--crio-dropin-dir', path.join(work, name, 'no-crio', 'crio.conf.d'), '--state-dir', path.join(work, name, 'state'),
        '--auth-file', path.join(work, 'none.json'), '--kubelet-config', '', '--kubelet-config-dir', '', '--metrics-addr', '',
      ]);
      assert.equal(r.code, 0, r.stderr);
    }
    const { code, stdout, stderr } = await pinset(['--kubeconfig', kc, '--set', 'first-set'], { COLUMNS: '80' });
    assert.equal(code, 0, stderr);
    // The agents reported a moment ago; the README's reader looks 95 s after.
    assert.equal(stdout.trimEnd().replace(/ +\d+s$/gm, (age) => age.replace(/\d+s$/, '95s')), sample);
  });
});
