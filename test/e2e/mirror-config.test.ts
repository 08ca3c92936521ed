// containerd 1.7.24 and 2.1.9 pull through the hosts.toml that `pinset
// mirror-config` (the bundle) prints: the registry behind a counting link,
// a real distribution cache (deploy/cache/'s configuration) in front of it.
// While the cache is up, every byte that crosses the link is the cache's;
// once it is down, containerd goes to the registry itself (`server`), and
// the pull still succeeds. (The CRI-O drop-in is read back as
// containers/image reads it in test/unit/mirror-config.test.ts, and a real
// CRI-O pulls through it in test/crio/mirror-config.crio.ts.)
import assert from 'node:assert/strict';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, test } from 'node:test';
import { bundledCli, runPinset } from '../support/agent-process.ts';
import { requireComponents } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient, PINNING_CONTAINERD_VERSIONS } from '../support/containerd.ts';
import { CACHE_CONFIG, FLEET_REGISTRY } from '../support/fleet-bed.ts';
import { pushRandom } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { ThinLink } from '../support/thin-link.ts';

describe('containerd pulls through the hosts.toml `pinset mirror-config` prints', () => {
  for (const version of PINNING_CONTAINERD_VERSIONS) {
    test(`containerd ${version}: the cache first; with the cache down, the registry itself`, async (t) => {
      if (!requireComponents(t, [containerdComponent(version), 'runc', 'docker-registry'])) return;
      const cli = await bundledCli();
      const upstream = await Registry.start();
      const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: 80e6 });
      const cache = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } });
      const containerd = await Containerd.start({ version });
      const cri = new CriClient(containerd.endpoint);
      try {
        const printed = await runPinset(['mirror-config', '--server', link.url, `${FLEET_REGISTRY}=${cache.url}`], { cli });
        assert.equal(printed.code, 0, printed.stderr);
        const folder = path.join(containerd.certsDir, FLEET_REGISTRY);
        await mkdir(folder, { recursive: true });
        await writeFile(path.join(folder, 'hosts.toml'), printed.stdout);

        const a = await pushRandom(upstream, 'mirror/a', 300_000, { host: FLEET_REGISTRY });
        await cri.pullImage(a.ref);
        assert.equal((await cri.imageStatus(a.ref))?.id, a.id);
        assert.ok(link.egressBytes() >= a.size, 'the image crossed the link');
        assert.deepEqual(
          link.transfers.filter((x) => !x.userAgent.startsWith('Go-http-client/')).map((x) => `${x.method} ${x.path} ${x.userAgent}`),
          [],
          'through the cache only: containerd itself never reached the registry',
        );

        await cache.pause();
        link.reset();
        const b = await pushRandom(upstream, 'mirror/b', 300_000, { host: FLEET_REGISTRY });
        await cri.pullImage(b.ref);
        assert.equal((await cri.imageStatus(b.ref))?.id, b.id, 'pulled with the cache down');
        const direct = link.transfers.filter((x) => x.method === 'GET' && x.path.includes('/blobs/'));
        assert.ok(direct.length > 0);
        for (const x of direct) assert.match(x.userAgent, /^containerd\//, `${x.path}: containerd went to the server itself`);
      } finally {
        cri.close();
        await containerd.stop();
        await cache.stop();
        await link.stop();
        await upstream.stop();
      }
    });
  }
});
