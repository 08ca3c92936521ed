// Reloaders against real processes: DbusReloader against a private
// dbus-daemon with a systemd stand-in whose reload signals the CRI-O
// stand-in as CRI-O's unit does (the job ends when the signal is sent); SystemctlReloader against this machine's systemctl
// and against a recording fake on PATH.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { stringify as toToml } from 'smol-toml';
import { createReloader, DbusReloader, NoReloader, normalizeUnitName, ReloadError, SystemctlReloader } from '../../src/crio/reload.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { startPrivateBus, startSystemdStandIn } from '../support/dbus.ts';

const APP = `quay.io/org/app@sha256:${'a'.repeat(64)}`;

function pinFile(patterns: string[]): string {
  return toToml({ crio: { image: { pinned_images: patterns } } });
}

async function rejectsWith(p: Promise<unknown>, ...patterns: RegExp[]): Promise<ReloadError> {
  let caught: unknown;
  await p.then(
    () => assert.fail('expected the reload to fail'),
    (err) => (caught = err),
  );
  assert.ok(caught instanceof ReloadError, `expected a ReloadError, got ${String(caught)}`);
  for (const re of patterns) assert.match(caught.message, re);
  return caught;
}

describe('DbusReloader against a private bus and a systemd stand-in', () => {
  let node: CrioNode;
  const savedAddress = process.env.DBUS_SYSTEM_BUS_ADDRESS;
  const reloaders: Array<{ close(): void }> = [];
  const track = <T extends { close(): void }>(r: T): T => {
    reloaders.push(r);
    return r;
  };

  before(async () => {
    node = await startCrioNode({ catalogue: { [APP]: { size: 1000 } } });
    node.crio.preload(APP);
    // The production path: the library's systemBus() reads this variable.
    process.env.DBUS_SYSTEM_BUS_ADDRESS = node.env.DBUS_SYSTEM_BUS_ADDRESS;
  });
  after(async () => {
    for (const r of reloaders) r.close();
    if (savedAddress === undefined) delete process.env.DBUS_SYSTEM_BUS_ADDRESS;
    else process.env.DBUS_SYSTEM_BUS_ADDRESS = savedAddress;
    await node?.stop();
  });

  test('a reload makes CRI-O pick up a new pin', async () => {
    await writeFile(join(node.dropInDir, '90-pins'), pinFile([APP]));
    assert.equal(node.crio.image(APP)?.pinned, false, 'not pinned before the reload');
    const before = node.systemd.reloadCount('crio.service');

    const reloader = track(createReloader('dbus', { unit: 'crio.service', timeoutMs: 10_000 }));
    assert.equal(reloader.mode, 'dbus');
    await reloader.reload();

    assert.equal(node.systemd.reloadCount('crio.service'), before + 1);
    assert.equal(node.systemd.reloads.at(-1)?.mode, 'replace');
    // The job ends when the signal is sent (ExecReload=kill -HUP); CRI-O re-reads 10-40 ms later.
    await node.crio.settled();
    assert.equal(node.crio.image(APP)?.pinned, true);
    // A second reload on the same connection works too.
    await reloader.reload();
    assert.equal(node.systemd.reloadCount('crio.service'), before + 2);
  });

  test('a job that ends before the method reply arrives still resolves', async () => {
    node.systemd.signalBeforeReply = true;
    try {
      const reloader = track(new DbusReloader({ timeoutMs: 10_000 }));
      const before = node.systemd.reloadCount();
      await reloader.reload();
      assert.equal(node.systemd.reloadCount(), before + 1);
    } finally {
      node.systemd.signalBeforeReply = false;
    }
  });

  test('a failed job rejects, naming the unit and the result', async () => {
    const reloader = track(new DbusReloader({ timeoutMs: 10_000 }));
    node.systemd.failNextReloads(1);
    await rejectsWith(reloader.reload(), /crio\.service/, /"failed"/);
    // The next reload is not affected.
    await reloader.reload();
  });

  test('CRI-O refusing a bad drop-in: systemd still reports the job done; CRI-O keeps the old pins', async () => {
    const reloader = track(new DbusReloader({ timeoutMs: 10_000 }));
    await writeFile(join(node.dropInDir, '90-pins'), pinFile([APP]));
    await reloader.reload();
    await node.crio.settled();
    const pinsBefore = node.crio.pinnedPatterns();

    await writeFile(join(node.dropInDir, '95-broken'), '[crio.image\npinned_images = [');
    try {
      await reloader.reload();
      assert.equal(node.systemd.reloads.at(-1)?.result, 'done');
      await node.crio.settled();
      assert.match(node.crio.reloads.at(-1)?.error ?? '', /Unable to reload configuration: .*95-broken/);
      assert.deepEqual(node.crio.pinnedPatterns(), pinsBefore);
      assert.equal(node.crio.image(APP)?.pinned, true);
    } finally {
      await rm(join(node.dropInDir, '95-broken'));
    }
  });

  test('an unknown unit is a clear error', async () => {
    const reloader = track(new DbusReloader({ unit: 'crio-typo.service', timeoutMs: 10_000 }));
    await rejectsWith(reloader.reload(), /crio-typo\.service/, /NoSuchUnit/);
  });

  test('a unit name without a suffix is completed with .service, as systemctl does', async () => {
    const reloader = track(new DbusReloader({ unit: 'crio', timeoutMs: 10_000 }));
    assert.equal(reloader.unit, 'crio.service');
    await reloader.reload();
  });

  test('access denied by systemd is a clear error', async () => {
    node.systemd.denyReloads('Interactive authentication required.');
    try {
      const reloader = track(new DbusReloader({ timeoutMs: 10_000 }));
      await rejectsWith(reloader.reload(), /refused/, /AccessDenied/, /crio\.service/);
    } finally {
      node.systemd.allowReloads();
    }
  });

  test('a job that never ends times out within the bound', async () => {
    let release!: () => void;
    const saved = node.systemd.onReload;
    node.systemd.onReload = () => new Promise<void>((r) => (release = r));
    try {
      const reloader = track(new DbusReloader({ timeoutMs: 300 }));
      const started = Date.now();
      await rejectsWith(reloader.reload(), /timed out after 300 ms/, /job \/org\/freedesktop\/systemd1\/job\/\d+/);
      // Loose bound: the point is "bounded", not the exact figure.
      assert.ok(Date.now() - started < 5_000, `took ${Date.now() - started} ms`);
    } finally {
      node.systemd.onReload = saved;
      release?.();
    }
  });

  test('an abort signal stops the wait', async () => {
    let release!: () => void;
    const saved = node.systemd.onReload;
    node.systemd.onReload = () => new Promise<void>((r) => (release = r));
    try {
      const reloader = track(new DbusReloader({ timeoutMs: 30_000 }));
      const ac = new AbortController();
      const p = reloader.reload(ac.signal);
      setTimeout(() => ac.abort(new Error('desired state changed')), 50);
      const err = await rejectsWith(p, /aborted/);
      assert.equal((err.cause as Error).message, 'desired state changed');
    } finally {
      node.systemd.onReload = saved;
      release?.();
    }
  });

  test('a closed reloader refuses to reload', async () => {
    const reloader = new DbusReloader({ timeoutMs: 10_000 });
    await reloader.reload();
    reloader.close();
    await rejectsWith(reloader.reload(), /closed/);
  });
});

describe('DbusReloader when the bus goes away', () => {
  test('no bus at the address: an error at once, not a hang', { timeout: 20_000 }, async () => {
    const dir = await mkdtemp(join(tmpdir(), 'pinset-nobus-'));
    try {
      const reloader = new DbusReloader({ busAddress: `unix:path=${join(dir, 'missing.sock')}`, timeoutMs: 30_000 });
      await rejectsWith(reloader.reload(), /missing\.sock/, /ENOENT/);
      reloader.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('a bus without systemd on it: a clear error', { timeout: 20_000 }, async () => {
    const bus = await startPrivateBus();
    try {
      const reloader = new DbusReloader({ busAddress: bus.address, timeoutMs: 30_000 });
      await rejectsWith(reloader.reload(), /systemd is not on the system bus/, /ServiceUnknown/);
      reloader.close();
    } finally {
      await bus.dispose();
    }
  });

  test('the bus dying during a reload fails it at once; after a restart the reloader reconnects', { timeout: 30_000 }, async () => {
    const bus = await startPrivateBus();
    const reloader = new DbusReloader({ busAddress: bus.address, timeoutMs: 30_000 });
    try {
      let systemd = await startSystemdStandIn({ address: bus.address, onReload: () => new Promise(() => {}) });
      // Fails on the dropped connection, long before the 30 s timeout (the test's own timeout is 30 s).
      const failed = rejectsWith(reloader.reload(), /connection/i, /crio\.service/);
      while (systemd.reloads.length === 0) await new Promise((r) => setTimeout(r, 10));
      await bus.stop();
      await failed;
      systemd.close();

      await bus.start();
      systemd = await startSystemdStandIn({ address: bus.address });
      await reloader.reload();
      assert.equal(systemd.reloadCount('crio.service'), 1);
      systemd.close();
    } finally {
      reloader.close();
      await bus.dispose();
    }
  });

  test('without Subscribe systemd sends no JobRemoved: the reloader subscribes', { timeout: 20_000 }, async () => {
    const bus = await startPrivateBus();
    const systemd = await startSystemdStandIn({ address: bus.address });
    const reloader = new DbusReloader({ busAddress: bus.address, timeoutMs: 10_000 });
    try {
      await reloader.reload();
      assert.equal(systemd.subscribers.size, 1);
      assert.deepEqual(systemd.unsignalledJobs, []);
    } finally {
      reloader.close();
      systemd.close();
      await bus.dispose();
    }
  });
});

describe('SystemctlReloader', () => {
  test("this machine's systemctl fails: a ReloadError with its exit code and message", async (t) => {
    try {
      execFileSync('sh', ['-c', 'command -v systemctl'], { stdio: 'ignore' });
    } catch {
      t.skip('systemctl is not installed here');
      return;
    }
    // A unit that exists nowhere, so this fails on any machine, booted with systemd or not.
    const reloader = new SystemctlReloader({ unit: 'pinset-test-no-such-unit.service', timeoutMs: 30_000 });
    const err = await rejectsWith(reloader.reload(), /systemctl reload pinset-test-no-such-unit\.service failed with exit code [1-9]\d*/);
    // systemctl's own words follow the exit code.
    assert.match(err.message, /exit code \d+: \S/);
  });

  describe('with a fake systemctl first on PATH', () => {
    let dir: string;
    const savedPath = process.env.PATH;
    before(async () => {
      dir = await mkdtemp(join(tmpdir(), 'pinset-systemctl-'));
      const script = [
        '#!/bin/sh',
        // Records its arguments, one a line, then behaves as FAKE_SYSTEMCTL_MODE says.
        'printf "%s\\n" "$@" > "$(dirname "$0")/args"',
        'case "$(cat "$(dirname "$0")/mode" 2>/dev/null)" in',
        '  fail) echo "Job for crio.service failed because the control process exited with error code." >&2; exit 3;;',
        '  noisy) i=0; while [ $i -lt 400 ]; do printf "0123456789" >&2; i=$((i+1)); done; exit 1;;',
        '  hang) exec sleep 30;;',
        '  *) exit 0;;',
        'esac',
        '',
      ].join('\n');
      await writeFile(join(dir, 'systemctl'), script);
      await chmod(join(dir, 'systemctl'), 0o755);
      process.env.PATH = `${dir}:${savedPath}`;
    });
    after(async () => {
      process.env.PATH = savedPath;
      await rm(dir, { recursive: true, force: true });
    });
    const mode = (m: string) => writeFile(join(dir, 'mode'), m);

    test('runs `systemctl reload <unit>` and resolves on exit 0', async () => {
      await mode('ok');
      const reloader = createReloader('systemctl', { unit: 'crio.service', timeoutMs: 10_000 });
      assert.equal(reloader.mode, 'systemctl');
      await reloader.reload();
      assert.deepEqual((await readFile(join(dir, 'args'), 'utf8')).split('\n').filter(Boolean), ['reload', 'crio.service']);
    });

    test('a failing systemctl: exit code and stderr in the error', async () => {
      await mode('fail');
      const reloader = new SystemctlReloader({ timeoutMs: 10_000 });
      await rejectsWith(reloader.reload(), /exit code 3/, /Job for crio\.service failed because the control process exited/);
    });

    test('a flood on stderr is cut short in the error', async () => {
      await mode('noisy');
      const reloader = new SystemctlReloader({ timeoutMs: 10_000 });
      const err = await rejectsWith(reloader.reload(), /exit code 1/, /more characters/);
      assert.ok(err.message.length < 1500, `message is ${err.message.length} characters`);
    });

    test('a systemctl that hangs is killed at the timeout', async () => {
      await mode('hang');
      const reloader = new SystemctlReloader({ timeoutMs: 300 });
      await rejectsWith(reloader.reload(), /timed out after 300 ms/);
    });

    test('an abort kills systemctl', async () => {
      await mode('hang');
      const reloader = new SystemctlReloader({ timeoutMs: 30_000 });
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 50);
      await rejectsWith(reloader.reload(ac.signal), /aborted/);
    });
  });

  test('no systemctl on PATH: says so', async () => {
    const reloader = new SystemctlReloader({ systemctl: 'pinset-no-such-systemctl' });
    await rejectsWith(reloader.reload(), /not found on PATH/);
  });
});

describe('NoReloader and the factory', () => {
  test("mode 'none' resolves without doing anything", async () => {
    const reloader = createReloader('none', { unit: 'crio.service' });
    assert.ok(reloader instanceof NoReloader);
    assert.equal(reloader.mode, 'none');
    await reloader.reload();
  });

  test('unit names are checked and completed', () => {
    assert.equal(normalizeUnitName('crio'), 'crio.service');
    assert.equal(normalizeUnitName('crio.service'), 'crio.service');
    assert.equal(normalizeUnitName('crio@x.service'), 'crio@x.service');
    assert.throws(() => normalizeUnitName('--now'), /invalid systemd unit name/);
    assert.throws(() => normalizeUnitName('crio service'), /invalid systemd unit name/);
    assert.throws(() => createReloader('systemctl', { unit: '-H evil' }), /invalid systemd unit name/);
  });
});
