// The containerd behaviour assertions (test/support/containerd-behaviour.ts)
// against the twin, as each version it copies: the same assertions run on
// the real containerd 1.7.24 and 1.6.20 in test/e2e/containerd-behaviour.test.ts.
import { randomBytes } from 'node:crypto';
import { containerdBehaviour } from '../support/containerd-behaviour.ts';
import { startFakeContainerd } from '../support/fake-containerd.ts';

const hex = () => randomBytes(32).toString('hex');

for (const version of ['1.7.24', '1.6.20', '1.7.9', '2.1.5']) {
  containerdBehaviour(`containerd behaviour: the twin as ${version}`, async () => {
    const c = await startFakeContainerd({ version });
    let n = 0;
    return {
      endpoint: c.endpoint,
      version,
      async taggedImage(repo) {
        const r = `registry.test/t${n++}/${repo}`;
        const digest = `sha256:${hex()}`;
        const id = `sha256:${hex()}`;
        c.catalogue.set(`${r}:v1`, { size: 765, digest, id });
        c.catalogue.set(`${r}@${digest}`, { size: 765, id });
        return { tag: `${r}:v1`, digestRef: `${r}@${digest}`, id };
      },
      restart: () => c.restart(),
      running: () => c.serving,
      close: () => c.stop(),
    };
  });
}
