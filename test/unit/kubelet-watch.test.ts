// The kubelet's configuration kept current (src/agent/kubelet-watch.ts) on
// a temporary host root laid out as kubeadm lays a node out: found at
// start, read as the kubelet's version reads it, said in the status with
// the layout, and found and read again when a file it read changes. Drop-ins
// are written as tools write them: whole, by rename(2) over the old file (a
// recursive fs.watch loses such a file after its first replacement), and in
// place.
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify } from 'yaml';
import { KubeletConfigWatch, watchedFolders } from '../../src/agent/kubelet-watch.ts';
import type { PlannedSet } from '../../src/agent/plan.ts';
import { parseReference, type ParsedReference } from '../../src/api/reference.ts';
import { AgentMetrics } from '../../src/metrics/agent-metrics.ts';

const HEAD = { apiVersion: 'kubelet.config.k8s.io/v1beta1', kind: 'KubeletConfiguration' };
const D = '@sha256:' + 'a'.repeat(64);
let tmp: string;
let n = 0;
const watches: KubeletConfigWatch[] = [];
before(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-kubelet-watch-'));
});
afterEach(() => {
  for (const w of watches.splice(0)) w.stop();
});
after(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

/** A kubeadm node: config.yaml, kubeadm-flags.env, and /etc/default/kubelet with `extraArgs`. */
async function kubeadmNode(extraArgs: string, files: Record<string, unknown> = {}): Promise<string> {
  const root = path.join(tmp, `node${++n}`);
  const put = async (p: string, content: unknown) => {
    await fsp.mkdir(path.dirname(path.join(root, p)), { recursive: true });
    await fsp.writeFile(path.join(root, p), typeof content === 'string' ? content : stringify(content));
  };
  await put('/var/lib/kubelet/config.yaml', { ...HEAD, cgroupDriver: 'systemd' });
  await put('/var/lib/kubelet/kubeadm-flags.env', 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock"\n');
  await put('/etc/default/kubelet', `KUBELET_EXTRA_ARGS=${extraArgs}\n`);
  for (const [p, c] of Object.entries(files)) await put(p, c);
  return root;
}

/** Written whole, as an administrator's tool writes it: a temporary file renamed over the old one. */
async function replace(file: string, content: unknown): Promise<void> {
  await fsp.mkdir(path.dirname(file), { recursive: true });
  await fsp.writeFile(`${file}.tmp`, typeof content === 'string' ? content : stringify(content));
  await fsp.rename(`${file}.tmp`, file);
}

function planned(name: string, refs: string[]): PlannedSet {
  const references = refs.map((r) => (parseReference(r) as { ok: true; value: ParsedReference }).value);
  return { key: `api/${name}`, name, source: 'api', origin: 'api', generation: 1, runtimeHandler: '', selection: 'selected', specErrors: [], invalidImages: [], references, pullSecrets: [] };
}

/** Each watch's listener for its next change. */
const listeners = new Map<KubeletConfigWatch, (why: string) => void>();

/** A watch found on `root` and started: its changes go to nextChange(). The minute's re-read is put off: only the watches can see a change. */
async function watchOn(root: string, o: { version?: () => string | undefined; metrics?: AgentMetrics } = {}): Promise<KubeletConfigWatch> {
  const w = await KubeletConfigWatch.found({ hostRoot: root, given: {}, kubeletVersion: o.version ?? (() => 'v1.35.6'), metrics: o.metrics, rereadMs: 3_600_000, settleMs: 20 });
  watches.push(w);
  w.start((why) => listeners.get(w)?.(why));
  return w;
}

/** The reason of the next change the watch reports, or "(no change seen)" after `ms`. */
function nextChange(w: KubeletConfigWatch, ms = 5_000): { seen: Promise<string> } {
  let resolve!: (why: string) => void;
  const seen = new Promise<string>((r) => (resolve = r));
  listeners.set(w, resolve);
  const timer = setTimeout(() => resolve('(no change seen)'), ms);
  return { seen: seen.finally(() => clearTimeout(timer)) };
}

const DROPIN = '/etc/kubernetes/kubelet.conf.d/50-pinset.conf';
const allowlisted = (entries: string[]) => ({ ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: entries });

describe('KubeletConfigWatch on a kubeadm node', () => {
  test('found at start: the policy of the drop-in in the --config-dir that /etc/default/kubelet gives, said with host paths and the layout', async () => {
    const root = await kubeadmNode('--config-dir=/etc/kubernetes/kubelet.conf.d', { [DROPIN]: allowlisted(['registry.test/kep/*']) });
    const w = await watchOn(root);
    const st = w.status({ sets: [planned('kep', [`registry.test/kep/p1${D}`]), planned('tools', [`quay.io/org/app${D}`])] });
    assert.equal(st.policy, 'NeverVerifyAllowlistedImages');
    assert.deepEqual(st.refuses, ['tools']);
    assert.equal(st.source, `${DROPIN}; kubeadm layout: --config /var/lib/kubelet/config.yaml (KUBELET_CONFIG_ARGS of Environment= of its unit); --config-dir /etc/kubernetes/kubelet.conf.d (KUBELET_EXTRA_ARGS of /etc/default/kubelet)`);
    assert.ok(!st.source.includes(root), 'the host\'s paths, not where the agent sees them');
  });

  test('a --config-dir named but missing: the kubelet does not start, said as Invalid', async () => {
    const w = await watchOn(await kubeadmNode('--config-dir=/etc/kubernetes/kubelet.conf.d'));
    const st = w.status({ sets: [] });
    assert.equal(st.policy, 'Invalid');
    assert.match(st.source, /^the kubelet's --config-dir \/etc\/kubernetes\/kubelet\.conf\.d does not exist: the kubelet does not start; kubeadm layout/);
  });

  test('the kubelet\'s version decides the matching: exact entries exempt a 1.36 kubelet\'s images, none of a 1.35 one\'s', async () => {
    const root = await kubeadmNode('--config-dir=/etc/kubernetes/kubelet.conf.d', { [DROPIN]: allowlisted(['registry.test/kep/p1']) });
    let version = 'v1.35.6';
    const w = await watchOn(root, { version: () => version });
    const plan = { sets: [planned('offline', [`registry.test/kep/p1${D}`]), planned('sibling', [`registry.test/kep/p2${D}`])] };
    assert.deepEqual(w.status(plan).refuses, ['offline', 'sibling']);
    version = 'v1.36.2';
    assert.deepEqual(w.status(plan).refuses, ['sibling'], 'the named repository exempted, its sibling verified');
  });

  test('every refused set goes to the metric; the status names the first 10', async () => {
    const root = await kubeadmNode('', {});
    await fsp.writeFile(path.join(root, '/var/lib/kubelet/config.yaml'), stringify({ ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' }));
    const metrics = new AgentMetrics();
    const w = await watchOn(root, { metrics });
    const sets = Array.from({ length: 13 }, (_, i) => planned(`s${String(i).padStart(2, '0')}`, [`quay.io/org/app${D}`]));
    const st = w.status({ sets });
    assert.deepEqual([st.refuses?.length, st.refusesMore], [10, 3]);
    const series = (await metrics.kubeletRefusedSets.get()).values.map((v) => `${v.labels.set}|${v.labels.policy}`).sort();
    assert.deepEqual(series, sets.map((s) => `${s.name}|AlwaysVerify`));
  });

  test('drop-ins written whole by rename, again and again, and in place: each change seen within moments, without the minute\'s re-read', async () => {
    const root = await kubeadmNode('--config-dir=/etc/kubernetes/kubelet.conf.d', { [DROPIN]: allowlisted(['registry.test/kep/*']) });
    const w = await watchOn(root);
    const file = path.join(root, DROPIN);
    const steps: [string, unknown, string][] = [
      ['replaced', { ...HEAD, imagePullCredentialsVerificationPolicy: 'AlwaysVerify' }, 'AlwaysVerify'],
      ['replaced again', { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' }, 'NeverVerify'],
      ['replaced a third time', allowlisted(['registry.test/kep/*']), 'NeverVerifyAllowlistedImages'],
      ['half-written in place', 'apiVersion: kubelet.config.k8s.io/v1beta1\n', 'Invalid'],
      ['completed in place', stringify(allowlisted(['registry.test/kep/*'])), 'NeverVerifyAllowlistedImages'],
    ];
    for (const [what, content, policy] of steps) {
      const change = nextChange(w);
      const t0 = Date.now();
      if (what.includes('in place')) await fsp.writeFile(file, content as string);
      else await replace(file, content);
      assert.equal(await change.seen, "the kubelet's configuration changed", what);
      assert.equal(w.reading().policy, policy, what);
      assert.ok(Date.now() - t0 < 5_000, `${what}: seen in ${Date.now() - t0} ms`);
    }
  });

  test('--config-dir added to /etc/default/kubelet while running: the layout found again, its new folder read and watched', async () => {
    const root = await kubeadmNode('', { [DROPIN]: allowlisted(['registry.test/kep/*']) });
    const w = await watchOn(root);
    assert.equal(w.reading().policy, 'NeverVerifyPreloadedImages', 'no --config-dir yet: the drop-in is not the kubelet\'s');
    const change = nextChange(w);
    await replace(path.join(root, '/etc/default/kubelet'), 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d"\n');
    await change.seen;
    assert.equal(w.reading().policy, 'NeverVerifyAllowlistedImages');
    assert.equal(w.location?.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
    assert.ok(watchedFolders(w.location!).includes(path.join(root, '/etc/kubernetes/kubelet.conf.d')));
    assert.ok(w.watching.includes(path.join(root, '/etc/kubernetes/kubelet.conf.d')));
    const sub = path.join(root, '/etc/kubernetes/kubelet.conf.d/sub');
    await fsp.mkdir(sub);
    for (let i = 0; i < 100 && !w.watching.includes(sub); i++) await new Promise((r) => setTimeout(r, 20));
    assert.ok(w.watching.includes(sub), `the new sub-folder watched: ${w.watching.join(', ')}`);
    const next = nextChange(w);
    await replace(path.join(root, '/etc/kubernetes/kubelet.conf.d/sub/99-last.conf'), allowlisted(['registry.test/kep/p1']));
    assert.equal(await next.seen, "the kubelet's configuration changed", 'the allowlist alone changed');
    assert.deepEqual(w.reading().allowlist, ['registry.test/kep/p1'], 'a sub-folder made later is walked (and watched)');
  });

  test('a FIFO named *.conf put in the folder never hangs the watch: cannot tell, naming it', async () => {
    const root = await kubeadmNode('--config-dir=/etc/kubernetes/kubelet.conf.d', { [DROPIN]: allowlisted(['registry.test/kep/*']) });
    const w = await watchOn(root);
    const change = nextChange(w);
    execFileSync('mkfifo', [path.join(root, '/etc/kubernetes/kubelet.conf.d/60-pipe.conf')]);
    await change.seen;
    const st = w.status({ sets: [] });
    assert.equal(st.policy, 'Unknown');
    assert.match(st.source, /^\/etc\/kubernetes\/kubelet\.conf\.d\/60-pipe\.conf is a FIFO \(named pipe\), not a regular file \(EFTYPE\): not read; kubeadm layout/);
  });

  test('nothing of a kubelet under the host root: Unknown, saying where it looked; both flags given: those paths, no looking', async () => {
    const empty = path.join(tmp, `empty${++n}`);
    await fsp.mkdir(path.join(empty, 'etc'), { recursive: true });
    const w = await watchOn(empty);
    const st = w.status({ sets: [] });
    assert.equal(st.policy, 'Unknown');
    assert.equal(st.source, `under ${empty}: no kubelet configuration of kubeadm, k3s, RKE2, EKS (nodeadm), OpenShift, AKS or GKE, and no kubelet.service under /etc or /run`);
    const mine = path.join(tmp, `mine${n}`);
    await replace(path.join(mine, 'config.yaml'), { ...HEAD, imagePullCredentialsVerificationPolicy: 'NeverVerify' });
    const given = await KubeletConfigWatch.found({ hostRoot: empty, given: { configFile: path.join(mine, 'config.yaml'), configDir: path.join(mine, 'absent.d') }, kubeletVersion: () => 'v1.35.6' });
    assert.deepEqual(given.status({ sets: [] }), { policy: 'NeverVerify', source: `${path.join(mine, 'config.yaml')}; flags: --kubelet-config ${path.join(mine, 'config.yaml')}; --kubelet-config-dir ${path.join(mine, 'absent.d')}` });
  });
});
