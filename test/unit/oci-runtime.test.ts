// The OCI runtime the image tests run the image with, by the host's cgroup
// layout (test/support/oci-runtime.ts). The mountinfo samples are the three
// layouts as the kernel prints them: a unified host (Debian 12's default), a
// hybrid one (systemd's /sys/fs/cgroup/unified beside v1 hierarchies, as on
// some CI machines), and a legacy one.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { cgroupLayoutOf, chooseOciRuntime, crunRefuses, hostCgroups, hostOciRuntime, type CgroupFacts } from '../support/oci-runtime.ts';

const UNIFIED = `22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
28 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
`;

const HYBRID = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
36 31 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;

const LEGACY = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
`;

const RUNC = '/usr/sbin/runc';
const CRUN = '/usr/bin/crun';

describe('the cgroup layout, read from mountinfo', () => {
  test('cgroup2 at /sys/fs/cgroup is unified', () => {
    assert.deepEqual(cgroupLayoutOf(UNIFIED), { layout: 'unified', v2Mount: '/sys/fs/cgroup' });
  });
  test('v1 hierarchies with a cgroup2 mount beside them is hybrid', () => {
    assert.deepEqual(cgroupLayoutOf(HYBRID), { layout: 'hybrid', v2Mount: '/sys/fs/cgroup/unified' });
  });
  test('v1 hierarchies only is legacy', () => {
    assert.deepEqual(cgroupLayoutOf(LEGACY), { layout: 'legacy' });
  });
  test("a mount point with an escaped space or optional fields does not shift the fields read", () => {
    const text = '41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 master:2 - cgroup2 cgroup2 rw\n32 31 0:29 / /mnt/with\\040space rw - cgroup cgroup rw,cpu\n';
    assert.deepEqual(cgroupLayoutOf(text), { layout: 'hybrid', v2Mount: '/sys/fs/cgroup/unified' });
  });
  test('this host reads as one of the layouts, its cgroup2 controllers listed', () => {
    const c = hostCgroups();
    assert.ok(['unified', 'hybrid', 'legacy', 'none'].includes(c.layout), c.layout);
    if (c.layout === 'unified') assert.equal(c.v2Mount, '/sys/fs/cgroup');
    assert.ok(Array.isArray(c.v2Controllers));
  });
});

describe('the OCI runtime chosen for the layout', () => {
  const hybridHolding: CgroupFacts = { layout: 'hybrid', v2Mount: '/sys/fs/cgroup/unified', v2Controllers: ['hugetlb'] };
  const hybridEmpty: CgroupFacts = { layout: 'hybrid', v2Mount: '/sys/fs/cgroup/unified', v2Controllers: [] };
  const unified: CgroupFacts = { layout: 'unified', v2Mount: '/sys/fs/cgroup', v2Controllers: ['cpu', 'memory', 'pids'] };
  const legacy: CgroupFacts = { layout: 'legacy', v2Controllers: [] };

  test('crun refuses a hybrid layout whose cgroup2 holds a controller, and no other', () => {
    assert.equal(crunRefuses(hybridHolding), true);
    assert.equal(crunRefuses(hybridEmpty), false);
    assert.equal(crunRefuses(unified), false);
    assert.equal(crunRefuses(legacy), false);
  });

  test('runc whenever it is installed, on every layout, and the choice says the layout', () => {
    for (const c of [hybridHolding, hybridEmpty, unified, legacy]) {
      const got = chooseOciRuntime(c, { runc: RUNC, crun: CRUN });
      assert.equal(got.runtime, 'runc', c.layout);
      assert.ok(got.runtime && got.path === RUNC);
      assert.match(got.runtime ? got.why : '', new RegExp(`cgroups ${c.layout}`));
    }
    const h = chooseOciRuntime(hybridHolding, { runc: RUNC, crun: null });
    assert.ok(h.runtime && /cgroup2 at \/sys\/fs\/cgroup\/unified holding hugetlb/.test(h.why), JSON.stringify(h));
  });

  test('without runc: crun where it runs, and a problem naming runc where crun refuses', () => {
    const ok = chooseOciRuntime(unified, { runc: null, crun: CRUN });
    assert.deepEqual([ok.runtime, ok.runtime && ok.path], ['crun', CRUN]);
    const refused = chooseOciRuntime(hybridHolding, { runc: null, crun: CRUN });
    assert.equal(refused.runtime, null);
    assert.match(refused.runtime === null ? refused.problem : '', /crun refuses every container there.*apt-get install -y --no-install-recommends runc/);
    const none = chooseOciRuntime(legacy, { runc: null, crun: null });
    assert.equal(none.runtime, null);
  });

  test("this host's choice is never crun on a layout crun refuses", () => {
    const got = hostOciRuntime();
    if (got.runtime === 'crun') assert.equal(crunRefuses(hostCgroups()), false);
  });
});
