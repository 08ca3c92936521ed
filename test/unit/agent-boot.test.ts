// The agent's composition root (src/agent/boot/): the flags parsed once
// into the typed configuration, what a node runs decided in one place (the
// pin kit), and where the node lock lives. The builders running together
// are in test/integration (agent, node-lock, node-lock-upgrade, drop-pins).
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { AGENT_FLAGS } from '../../src/agent/agent-flags.ts';
import { agentConfig } from '../../src/agent/boot/config.ts';
import { nodeLockFiles, nodeLockPath } from '../../src/agent/boot/node-lock-place.ts';
import { decidePinBackend, pinKit, pinPlan } from '../../src/agent/boot/pin-kit.ts';
import { NodeLock, type LockHolder } from '../../src/agent/node-lock.ts';
import { currentRuntime } from '../../src/agent/set-report.ts';
import type { ImageRuntime, RuntimeInfo } from '../../src/cri/runtime.ts';
import { parseFlags, UsageError } from '../../src/util/flags.ts';
import { silentLogger } from '../../src/util/log.ts';

const CRIO: RuntimeInfo = { runtimeName: 'cri-o', runtimeVersion: '1.32.13', runtimeApiVersion: 'v1' };
const CTRD: RuntimeInfo = { runtimeName: 'containerd', runtimeVersion: '2.1.9', runtimeApiVersion: 'v1' };
const OLD_CTRD: RuntimeInfo = { runtimeName: 'containerd', runtimeVersion: '1.6.20', runtimeApiVersion: 'v1' };

const config = (argv: string[], env: NodeJS.ProcessEnv = {}) => agentConfig(parseFlags(AGENT_FLAGS, ['--node-name', 'n1', ...argv], env).values, env);

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-boot-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('the agent configuration, parsed once', () => {
  test('each builder its section; --host-root read once, every host path under it', () => {
    const c = config(['--host-root', '/host', '--once', '--kubelet-config', '', '--kubelet-config-dir', '', '--image-credential-provider-config', '/p.yaml', '--image-credential-provider-bin-dir', '/bin'], {});
    assert.equal(c.profile.hostRoot, '/host');
    assert.equal(c.profile.dropInDir, '/host/etc/crio/crio.conf.d');
    assert.equal(c.lock.dropInDir, c.profile.dropInDir);
    assert.equal(c.pins.busAddress, 'unix:path=/host/run/dbus/system_bus_socket');
    assert.equal(c.metricsAddr, '', 'nothing serves metrics with --once');
    assert.equal(c.kubelet, null, 'both kubelet flags "": nothing reported of the kubelet');
    assert.deepEqual(c.registry.providers, { config: '/p.yaml', binDir: '/bin', timeoutMs: 60_000 });
    assert.equal(c.lock.stateDir, '/var/lib/pinset');
    assert.equal(c.loop.maxParallelPulls, 4);
  });

  test('the kubelet\'s files: unset is found under the host root, "" is none, a path given wins for its field', () => {
    assert.deepEqual(config(['--host-root', '/host']).kubelet, { hostRoot: '/host', given: { configFile: undefined, configDir: undefined } });
    assert.deepEqual(config([], { PINSET_KUBELET_CONFIG_DIR: '' }).kubelet, { hostRoot: '/', given: { configFile: undefined, configDir: '' } });
    assert.deepEqual(config(['--kubelet-config', '/host/etc/kubernetes/kubelet.conf'], { PINSET_HOST_ROOT: '/host' }).kubelet, { hostRoot: '/host', given: { configFile: '/host/etc/kubernetes/kubelet.conf', configDir: undefined } });
    assert.equal(config([], { PINSET_KUBELET_CONFIG: '', PINSET_KUBELET_CONFIG_DIR: '' }).kubelet, null);
  });

  test('the environment is read once too: a system bus given wins, a pod is a pod', () => {
    const c = config(['--host-root', '/host'], { DBUS_SYSTEM_BUS_ADDRESS: 'unix:path=/x', KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' });
    assert.equal(c.pins.busAddress, undefined);
    assert.equal(c.api.runsInPod, true);
    assert.equal(c.lock.runsInPod, true);
    assert.equal(config([]).pins.busAddress, undefined, 'on the host, the default bus');
  });

  test('a value no builder could use stops the agent with a usage error, before anything starts', () => {
    const refused = (argv: string[], env: NodeJS.ProcessEnv = {}) => assert.throws(() => config(argv, env), UsageError, argv.join(' '));
    refused(['--max-parallel-pulls', '0']);
    refused(['--disk-estimate-factor', '0.5']);
    refused(['--rollout-lease-duration', '2s']);
    refused(['--status-progress-interval', '500ms']);
    refused(['--metrics-addr', 'nonsense:port:x']);
    refused(['--crio-unit', 'bad name!']);
    refused(['--image-credential-provider-config', '/p.yaml']);
    refused([], { PINSET_TEST_SIGKILL_AT: 'never' });
    // Only a reloader that asks systemd needs a unit name systemd accepts.
    assert.equal(config(['--reload', 'none', '--crio-unit', 'bad name!']).pins.crioUnit, 'bad name!');
    assert.equal(config(['--crio-unit', 'crio']).pins.crioUnit, 'crio.service');
  });
});

describe('what a node runs, decided in one place', () => {
  const found = (o: Partial<Parameters<typeof pinPlan>[0]>) => ({ source: 'detected' as const, dropInDir: path.join(dir, 'etc/crio/crio.conf.d'), ...o });

  test('pinPlan: --pin-backend auto narrows to what was found; no runtime settled on pins nothing', async () => {
    assert.deepEqual(pinPlan(found({ layout: 'crio', runtime: CRIO }), 'auto'), { pinBackend: 'crio', usesDropIn: true });
    assert.deepEqual(pinPlan(found({ layout: 'containerd', runtime: CTRD }), 'auto'), { pinBackend: 'containerd', usesDropIn: false });
    assert.deepEqual(pinPlan(found({ layout: 'k3s', runtime: { ...CTRD, runtimeName: 'other' } }), 'auto'), { pinBackend: 'auto', usesDropIn: false });
    assert.deepEqual(pinPlan(found({ layout: 'containerd', runtime: CTRD }), 'crio'), { pinBackend: 'crio', usesDropIn: true }, 'an explicit flag wins');
    assert.deepEqual(pinPlan(found({ problem: 'none answers' }), 'crio'), { pinBackend: 'none', usesDropIn: false });
    // With --cri-endpoint and auto: CRI-O's drop-in where its configuration folder is there.
    assert.deepEqual(pinPlan(found({ source: 'flags' }), 'auto'), { pinBackend: 'auto', usesDropIn: false });
    await mkdir(path.join(dir, 'etc/crio'), { recursive: true });
    assert.deepEqual(pinPlan(found({ source: 'flags' }), 'auto'), { pinBackend: 'auto', usesDropIn: true });
    assert.deepEqual(pinPlan(found({ source: 'flags' }), 'containerd'), { pinBackend: 'containerd', usesDropIn: false });
  });

  test('decidePinBackend: at each CRI Version answer, the backend, or pre-load only naming what would pin', () => {
    const both = { crio: () => null as never, containerd: { canPin: (v: string) => (v.startsWith('1.6.20') ? { ok: false as const, why: 'too old' } : { ok: true as const }) } };
    assert.deepEqual(decidePinBackend('auto', undefined, both), { backend: 'crio' }, 'before an answer, the drop-in is kept');
    assert.deepEqual(decidePinBackend('auto', undefined, { containerd: both.containerd }), { backend: 'none', quiet: true });
    assert.deepEqual(decidePinBackend('auto', CRIO, both), { backend: 'crio' });
    assert.deepEqual(decidePinBackend('auto', CTRD, both), { backend: 'containerd' });
    assert.deepEqual(decidePinBackend('auto', OLD_CTRD, both), { backend: 'none', why: 'too old' });
    assert.match(String((decidePinBackend('auto', { ...CRIO, runtimeName: 'other' }, both) as { why?: string }).why), /has no pin backend in pinset/);
    assert.match(String((decidePinBackend('crio', CTRD, {}) as { why?: string }).why), /drop-in folder cannot be used/);
    assert.deepEqual(decidePinBackend('none', CRIO, both), { backend: 'none' });
  });

  test('the kit: CRI-O\'s pin file and reloader only where the drop-in is used; --drop-pins removes with the runtime\'s own backend, or says why not', async () => {
    const logger = silentLogger();
    const runtime = { close: () => {} } as unknown as ImageRuntime;
    const pins = { reload: 'none' as const, crioUnit: 'crio.service', confirmTimeoutMs: 5_000 };
    const dropInDir = path.join(dir, 'crio.conf.d');
    const crioKit = await pinKit({ pinBackend: 'crio', usesDropIn: true, hostRoot: '/', criEndpoint: 'unix:///x.sock', dropInDir }, pins, { runtime, logger });
    assert.equal(crioKit.pinFile?.dir, dropInDir);
    assert.equal(crioKit.choice.for(CRIO).name, 'crio');
    const removal = crioKit.removal(CRIO);
    assert.equal(typeof removal === 'string' ? removal : removal.name, 'crio');
    crioKit.close();
    const ctrdKit = await pinKit({ pinBackend: 'containerd', usesDropIn: false, hostRoot: '/', criEndpoint: 'unix:///x.sock', dropInDir: path.join(dir, 'none') }, pins, { runtime, logger });
    assert.equal(ctrdKit.pinFile, undefined, 'no drop-in opened on a containerd node');
    assert.equal(ctrdKit.choice.for(OLD_CTRD).name, 'none', 'a containerd that does not honour the label: pre-load only');
    const old = ctrdKit.removal(OLD_CTRD);
    assert.equal(typeof old === 'string' ? old : old.name, 'containerd', 'labels it set are removed whatever its version');
    if (typeof old !== 'string') old.close();
    ctrdKit.close();
    const autoKit = await pinKit({ pinBackend: 'auto', usesDropIn: false, hostRoot: '/', criEndpoint: 'unix:///x.sock', dropInDir: path.join(dir, 'none') }, pins, { runtime, logger });
    assert.equal(autoKit.removal(CRIO), `CRI-O's drop-in folder ${path.join(dir, 'none')} is not there: no pinset drop-in to remove`);
    assert.equal(autoKit.removal({ ...CRIO, runtimeName: 'other' }), "the runtime other 1.32.13 holds no pins of pinset's (no pin backend for it): nothing to remove");
    autoKit.close();
  });

  test('the node status: the profile as described, with the backend in use and the last answer in their places', () => {
    const described = { layout: 'crio', source: 'detected', pinBackend: 'auto', socket: '/run/crio/crio.sock', lock: '/var/lib/pinset/agent.lock' };
    const now = currentRuntime(described, 'crio', CRIO);
    assert.deepEqual(Object.keys(now), ['name', 'version', 'layout', 'source', 'pinBackend', 'socket', 'lock'], 'the keys in the order the document has them');
    assert.deepEqual([now.name, now.version, now.pinBackend], ['cri-o', '1.32.13', 'crio']);
    assert.deepEqual(currentRuntime({ ...described, name: 'cri-o', version: '1.32.12' }, 'none', undefined), { name: 'cri-o', version: '1.32.12', ...described, pinBackend: 'none' });
  });
});

describe('where the node lock lives', () => {
  const identity = (pid: number): Omit<LockHolder, 'lockedAt'> => ({ pid, host: 'h', node: 'n', runsIn: 'host', startedAt: '2026-01-01T00:00:00Z' });

  test('one path per node, whatever was found; the place earlier versions used on CRI-O is taken second, where CRI-O\'s folder exists', async () => {
    const stateDir = path.join(dir, 'state');
    const dropInDir = path.join(dir, 'etc/crio/crio.conf.d');
    assert.equal(nodeLockPath({ stateDir }), path.join(stateDir, 'agent.lock'));
    assert.deepEqual(nodeLockFiles({ stateDir, dropInDir }), [{ path: path.join(stateDir, 'agent.lock'), folderFlag: '--state-dir' }], 'no CRI-O folder: the one lock');
    await mkdir(path.join(dir, 'etc/crio'), { recursive: true });
    assert.deepEqual(nodeLockFiles({ stateDir, dropInDir }), [{ path: path.join(stateDir, 'agent.lock'), folderFlag: '--state-dir' }, { path: path.join(dir, 'etc/crio/.pinset/agent.lock'), bestEffort: true }]);
    assert.equal(nodeLockFiles({ stateDir: path.join(dir, 'etc/crio/.pinset'), dropInDir }).length, 1, 'the same file is not locked twice');
  });

  test('the files in order, all held or none: a second lock waits on the first file and gives up holding nothing', async () => {
    const files = [path.join(dir, 'state', 'agent.lock'), path.join(dir, 'crio', '.pinset', 'agent.lock')];
    const a = new NodeLock(files, identity(1));
    assert.equal(await a.acquire(), true);
    assert.equal(a.isHeld, true);
    assert.deepEqual(JSON.parse(await readFile(files[1]!, 'utf8')).pid, 1, 'each file says who holds it');
    const waits: string[] = [];
    const b = new NodeLock(files, identity(2));
    assert.equal(await b.acquire({ timeoutMs: 300, onWait: (h, file) => waits.push(`${h?.pid} ${file}`) }), false);
    assert.deepEqual(waits, [`1 ${files[0]}`], 'it waits on the first file, never holding the second');
    // The first file held by a third party, the second by an earlier agent: the lock is the first file's, then the second's.
    a.release();
    const earlier = new NodeLock([files[1]!], identity(3));
    assert.equal(await earlier.acquire(), true);
    const c = new NodeLock(files, identity(4));
    const cWaits: string[] = [];
    assert.equal(await c.acquire({ timeoutMs: 300, onWait: (h, file) => cWaits.push(`${h?.pid} ${file}`) }), false);
    assert.deepEqual(cWaits, [`3 ${files[1]}`]);
    assert.equal(c.isHeld, false, 'the first file it had is released too');
    assert.equal(await new NodeLock([files[0]!], identity(5)).acquire({ timeoutMs: 0 }), true, 'so another agent can take it');
    earlier.release();
  });

  test('a best-effort file this process cannot make is left out; one it can only read is still locked (flock needs no write access)', async (t) => {
    const ro = path.join(dir, 'ro');
    await mkdir(ro);
    await writeFile(path.join(ro, 'agent.lock'), '');
    // A folder read-only to this process: a read-only mount as root (root writes through modes), modes otherwise.
    const { execFileSync } = await import('node:child_process');
    const { chmod } = await import('node:fs/promises');
    if (process.getuid?.() === 0) {
      try {
        execFileSync('mount', ['--bind', ro, ro], { stdio: 'pipe' });
        execFileSync('mount', ['-o', 'remount,bind,ro', ro], { stdio: 'pipe' });
      } catch (e) {
        return t.skip(`cannot make a read-only bind mount here: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}`);
      }
    } else {
      await chmod(path.join(ro, 'agent.lock'), 0o444);
      await chmod(ro, 0o555);
    }
    try {
      await lockedReadOnly(ro);
    } finally {
      if (process.getuid?.() === 0) execFileSync('umount', [ro]);
    }
  });

  async function lockedReadOnly(ro: string): Promise<void> {
    const held = new NodeLock([{ path: path.join(ro, 'agent.lock'), bestEffort: true }], identity(1));
    assert.equal(await held.acquire(), true, 'the read-only file is locked');
    const lock = new NodeLock([path.join(dir, 'state', 'agent.lock'), { path: path.join(ro, 'agent.lock'), bestEffort: true }, { path: path.join(ro, 'none', 'agent.lock'), bestEffort: true }], identity(2));
    assert.equal(await lock.acquire({ timeoutMs: 300 }), false, 'and excludes another agent');
    held.release();
    assert.equal(await lock.acquire({ timeoutMs: 300 }), true, 'the file that cannot be made is left out');
    lock.release();
    await assert.rejects(new NodeLock([path.join(ro, 'agent.lock')], identity(3)).acquire(), 'a file that must be locked read-write is not taken read-only');
  }
});
