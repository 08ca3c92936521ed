// Leader election on a coordination.k8s.io/v1 Lease against the in-process
// API server: replicas racing, a holder dying, a clean release, a leader cut
// off from the API, and `pinset controller` releasing on SIGTERM.
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiServer } from '../support/apiserver.ts';
import { LeaderElector } from '../../src/controller/leader.ts';
import { silentLogger } from '../../src/util/log.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const NS = 'pinset-system';
const LEASE = 'pinset-controller';
const MICRO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;

interface LeaseSpec {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  acquireTime?: string;
  renewTime?: string;
  leaseTransitions?: number;
}

let api: ApiServer;
const cleanups: Array<() => Promise<void> | void> = [];

before(async () => {
  api = await ApiServer.start();
});
after(async () => {
  await api.stop();
});
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
  for (const l of api.list('leases')) api.remove('leases', l.metadata.name!, l.metadata.namespace);
  api.setAvailable(true);
  api.requests.length = 0;
});

function lease(): LeaseSpec | undefined {
  return api.get('leases', LEASE, NS)?.spec as LeaseSpec | undefined;
}

function candidate(identity: string, timing = { leaseDurationMs: 2000, renewDeadlineMs: 1000, retryPeriodMs: 250 }) {
  const events: string[] = [];
  const elector = new LeaderElector({
    kubeConfig: api.kubeConfig(),
    namespace: NS,
    name: LEASE,
    identity,
    ...timing,
    log: silentLogger(),
    onStartedLeading: () => events.push('started'),
    onStoppedLeading: () => events.push('stopped'),
  });
  cleanups.push(() => elector.stop({ release: false }));
  return { identity, elector, events };
}

describe('leader election', () => {
  test('of replicas racing for the Lease exactly one leads, and the Lease names it', async () => {
    const replicas = ['a', 'b', 'c'].map((id) => candidate(`replica-${id}`));
    for (const r of replicas) r.elector.start();
    await api.waitFor(() => replicas.some((r) => r.elector.isLeader()), 5000, 'a leader');
    // Watch for three lease durations: never two leaders, never a change of leader.
    const first = replicas.find((r) => r.elector.isLeader())!;
    const deadline = Date.now() + 3 * 2000;
    while (Date.now() < deadline) {
      const leaders = replicas.filter((r) => r.elector.isLeader());
      assert.equal(leaders.length, 1, `leaders: ${leaders.map((l) => l.identity).join(', ')}`);
      assert.equal(leaders[0], first);
      await sleep(25);
    }
    const spec = lease()!;
    assert.equal(spec.holderIdentity, first.identity);
    assert.equal(spec.leaseDurationSeconds, 2);
    assert.match(spec.renewTime!, MICRO_TIME, 'renewTime is an RFC 3339 MicroTime');
    assert.match(spec.acquireTime!, MICRO_TIME);
    assert.ok(Date.now() - Date.parse(spec.renewTime!) < 1000, 'the leader keeps renewing');
    for (const r of replicas) assert.deepEqual(r.events, r === first ? ['started'] : []);
    // Writes were optimistic: every lease PUT carried the resourceVersion it read.
    const puts = api.requests.filter((r) => r.method === 'PUT' && r.path.endsWith(`/leases/${LEASE}`));
    assert.ok(puts.length > 0);
    for (const p of puts) assert.ok((p.body as { metadata?: { resourceVersion?: string } }).metadata?.resourceVersion);
  });

  test('when the holder stops renewing without releasing, another replica takes over after the lease expires', async () => {
    const a = candidate('replica-a');
    a.elector.start();
    await api.waitFor(() => a.elector.isLeader(), 5000, 'replica-a to lead');
    const b = candidate('replica-b');
    b.elector.start();
    await sleep(600);
    assert.equal(b.elector.isLeader(), false, 'a live holder keeps the lease');

    await a.elector.stop({ release: false });
    const abandoned = lease()!;
    assert.equal(abandoned.holderIdentity, 'replica-a');
    await api.waitFor(() => b.elector.isLeader(), 5000, 'replica-b to take over');
    const taken = lease()!;
    assert.equal(taken.holderIdentity, 'replica-b');
    assert.equal(taken.leaseTransitions, (abandoned.leaseTransitions ?? 0) + 1);
    assert.ok(
      Date.parse(taken.acquireTime!) >= Date.parse(abandoned.renewTime!) + abandoned.leaseDurationSeconds! * 1000,
      `taken over at ${taken.acquireTime}, before the lease renewed at ${abandoned.renewTime} expired`,
    );
  });

  test('a clean stop clears the holder so another replica takes over at once', async () => {
    // A long lease: a takeover within a few retries can only come from the release.
    const timing = { leaseDurationMs: 10_000, renewDeadlineMs: 5000, retryPeriodMs: 200 };
    const a = candidate('replica-a', timing);
    a.elector.start();
    await api.waitFor(() => a.elector.isLeader(), 5000, 'replica-a to lead');
    const b = candidate('replica-b', timing);
    b.elector.start();
    await sleep(500);
    assert.equal(b.elector.isLeader(), false);

    await a.elector.stop();
    assert.equal(a.elector.isLeader(), false);
    assert.deepEqual(a.events, ['started', 'stopped']);
    assert.equal(lease()?.holderIdentity, undefined, 'the holder is cleared when stop() returns');
    const released = Date.now();
    await api.waitFor(() => b.elector.isLeader(), 5000, 'replica-b to take over');
    assert.ok(Date.now() - released < 3000, `took ${Date.now() - released} ms, the lease lasts 10 s`);
    assert.equal(lease()?.holderIdentity, 'replica-b');
  });

  test('a leader that cannot renew steps down within the renew deadline, and leads again when the API returns', async () => {
    const a = candidate('replica-a');
    a.elector.start();
    await api.waitFor(() => a.elector.isLeader(), 5000, 'replica-a to lead');
    api.setAvailable(false);
    const cut = Date.now();
    await api.waitFor(() => !a.elector.isLeader(), 5000, 'replica-a to step down');
    const after = Date.now() - cut;
    // It must stop before the lease (2 s) could expire for the others.
    assert.ok(after < 2000, `stepped down after ${after} ms`);
    assert.deepEqual(a.events, ['started', 'stopped']);
    api.setAvailable(true);
    await api.waitFor(() => a.elector.isLeader(), 5000, 'replica-a to lead again');
    assert.deepEqual(a.events, ['started', 'stopped', 'started']);
  });

  test('refuses durations that could give two leaders', () => {
    assert.throws(
      () => new LeaderElector({ kubeConfig: api.kubeConfig(), namespace: NS, name: LEASE, identity: 'x', leaseDurationMs: 2000, renewDeadlineMs: 3000, retryPeriodMs: 250, log: silentLogger() }),
      /renew deadline must be shorter than the lease duration/,
    );
  });
});

describe('pinset controller process', () => {
  test('takes the Lease, serves health and metrics, and on SIGTERM releases the Lease and exits 0', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'pinset-leader-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const kubeconfig = await api.writeKubeconfig(dir);
    const args = [
      'src/cli/main.ts', 'controller', '--kubeconfig', kubeconfig, '--identity', 'proc-1',
      '--lease-duration', '10s', '--renew-deadline', '5s', '--retry-period', '250ms', '--metrics-addr', '127.0.0.1:0',
    ];
    const child: ChildProcess = spawn(NODE, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, POD_NAMESPACE: NS } });
    cleanups.push(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const logs: Array<Record<string, unknown>> = [];
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        logs.push(JSON.parse(line));
      } catch {
        // not a log line
      }
    });

    await api.waitFor(() => lease()?.holderIdentity === 'proc-1', 10_000, `proc-1 to hold the lease (stderr: ${stderr})`);
    const serving = (await api.waitFor(() => logs.find((l) => l.msg === 'serving /healthz, /readyz and /metrics'), 5000, 'the metrics listener'))!;
    const base = `http://${String(serving.addr)}`;
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
    await api.waitFor(async () => (await fetch(`${base}/readyz`)).status === 200, 5000, 'readyz');
    const metrics = await (await fetch(`${base}/metrics`)).text();
    assert.match(metrics, /^pinset_controller_leader 1$/m);

    const signalled = Date.now();
    child.kill('SIGTERM');
    const code = await exited;
    assert.equal(code, 0, `exit code (stderr: ${stderr})`);
    assert.ok(Date.now() - signalled < 5000, 'exits within a few seconds');
    const spec = lease()!;
    assert.equal(spec.holderIdentity, undefined, 'the lease is released, not left to expire');
    assert.ok(logs.some((l) => l.msg === 'released the lease'));
  });

  test('rejects a renew deadline that is not shorter than the lease duration', async () => {
    const child = spawn(NODE, ['src/cli/main.ts', 'controller', '--lease-duration', '5s', '--renew-deadline', '5s', '--metrics-addr', ''], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    assert.equal(code, 2);
    assert.match(stderr, /renew deadline must be shorter than the lease duration/);
  });
});
