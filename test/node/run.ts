// `npm run test:node`: the optional suite on a real node (test/node/*.node.ts).
// Needs PINSET_KUBELET_BIN, PINSET_KUBE_APISERVER_BIN and PINSET_CRIO_BIN
// (v1.32 binaries, e.g. built by hand: Debian 12 packages none of them),
// root, and from Debian etcd-server, conmon, runc, docker-registry, skopeo,
// dbus, openssl, plus kubectl and the image's OCI layout from
// scripts/build-image.sh. Without them it says what is missing and exits 0:
// `npm test` and CI do not need it. It takes about 11 minutes (the kubelet's
// image GC runs every 5).
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { realNodeMissing } from '../support/real-node.ts';

const found = realNodeMissing();
if ('why' in found) {
  process.stdout.write(`test:node skipped: ${found.why}\n`);
  process.exit(0);
}
const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith('.node.ts')).sort().map((f) => join(here, f));
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], { stdio: 'inherit' });
process.exit(r.status ?? 1);
