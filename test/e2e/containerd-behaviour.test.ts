// The containerd behaviour assertions (test/support/containerd-behaviour.ts)
// against the real containerd: 2.1.9 (Debian sid's, from
// .cache/containerd-2.1), 1.7.24 (Debian trixie's, from
// .cache/containerd-1.7) and 1.6.20 (Debian 12's). The twin
// (test/support/fake-containerd.ts) passes the very same assertions in
// test/integration/containerd-behaviour.test.ts: that is what shows it
// behaves like the real daemon. The last test of each suite kills 1.7 with
// an Update without target, on purpose: that daemon was started for this
// suite alone.
import { containerdBehaviour } from '../support/containerd-behaviour.ts';
import { missingComponents, missingMessage, isCI, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, type ContainerdVersion } from '../support/containerd.ts';
import { pushSingleLayer } from '../support/images.ts';
import { Registry } from '../support/registry.ts';

for (const version of ['2.1', '1.7', '1.6'] as ContainerdVersion[]) {
  containerdBehaviour(`containerd behaviour: the real containerd ${version}`, async () => {
    const needs: ComponentName[] = [containerdComponent(version), 'runc', 'docker-registry'];
    const missing = missingComponents(needs);
    const why = missing.length > 0 ? missingMessage(missing) : process.getuid?.() !== 0 ? 'containerd needs root: run the end-to-end tests as root' : undefined;
    if (why) {
      if (isCI()) throw new Error(`CI=true and ${why}`);
      process.stderr.write(`\n*** SKIPPED containerd ${version} behaviour: ${why} ***\n\n`);
      return `SKIPPED: ${why}`;
    }
    const registry = await Registry.start();
    let containerd: Containerd;
    try {
      containerd = await Containerd.start({ version, mirrors: { 'registry.test': registry.url } });
    } catch (err) {
      await registry.stop();
      throw err;
    }
    const reported = await containerd.version();
    return {
      endpoint: containerd.endpoint,
      version: reported,
      async taggedImage(repo) {
        const img = await pushSingleLayer(registry, `behaviour/${repo}`, { tag: 'v1' });
        return { tag: `registry.test/behaviour/${repo}:v1`, digestRef: img.ref, id: img.id };
      },
      restart: () => containerd.restart(),
      running: () => containerd.running,
      async close() {
        await containerd.stop();
        await registry.stop();
      },
    };
  });
}
