// `npm run test:node`: the optional suite on a real node (test/node/*.node.ts),
// once per container runtime. Needs PINSET_KUBELET_BIN and
// PINSET_KUBE_APISERVER_BIN (v1.32 or v1.35 binaries, e.g. built by hand: Debian 12
// packages none of them), root, and from Debian etcd-server, runc,
// docker-registry, skopeo, dbus, openssl, plus kubectl and the image's OCI
// layout from scripts/build-image.sh. The runtimes:
//  - CRI-O: PINSET_CRIO_BIN (with pinns beside it), and Debian's conmon;
//  - containerd: PINSET_CONTAINERD_BIN, else the 1.7.24 .ci/containerd-1.7
//    unpacks into .cache/containerd-1.7, and Debian's
//    containernetworking-plugins.
// PINSET_NODE_RUNTIMES (e.g. `crio,containerd-2.1`) names the runtimes to
// run: crio, containerd-1.7 and containerd-2.1 (unpacked by .ci/ into
// .cache/), containerd (PINSET_CONTAINERD_BIN's); unset, every one this
// machine has. PINSET_KUBE_CONTROLLER_MANAGER_BIN and
// PINSET_KUBE_SCHEDULER_BIN, when both are given, let Kubernetes' own
// controllers create and place pinset's pods; without them the suite makes
// the agent's pod as the daemonset controller would, and says so.
// PINSET_MORE_KUBELET_BINS (":"-separated) names more kubelets, of other
// versions, for test/node/kubelet-dropin.node.ts only.
// Without a kubelet and an API server it says what is missing and exits 0:
// `npm test` and CI do not need it. It takes about 11 minutes per runtime
// (the kubelet's image GC runs every 5).
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { nodeRuntimes, realNodeMissing } from '../support/real-node.ts';

const found = realNodeMissing();
if ('why' in found) {
  process.stdout.write(`test:node skipped: ${found.why}\n`);
  process.exit(0);
}
const runtimes = nodeRuntimes();
if (runtimes.errors.length) {
  process.stderr.write(`test:node: ${runtimes.errors.join('; ')}\n`);
  process.exit(1);
}
for (const s of runtimes.skipped) process.stdout.write(`test:node: not on ${s.runtime}: ${s.why}\n`);
if (runtimes.run.length === 0) {
  process.stdout.write('test:node skipped: no container runtime to run on\n');
  process.exit(0);
}
const controllers = 'why' in found.bins.controllers ? `the daemonset controller imitated (${found.bins.controllers.why})` : 'kube-controller-manager and kube-scheduler';
process.stdout.write(`test:node on ${runtimes.run.map((r) => r.label).join(', ')}, with ${controllers}\n`);

const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith('.node.ts')).sort().map((f) => join(here, f));
const results: Array<{ runtime: string; status: number; seconds: number }> = [];
for (const choice of runtimes.run) {
  const t0 = Date.now();
  process.stdout.write(`\n=== ${choice.label} ===\n`);
  const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], { stdio: 'inherit', env: { ...process.env, ...choice.env, PINSET_NODE_RUNTIME: choice.runtime } });
  results.push({ runtime: choice.label, status: r.status ?? 1, seconds: Math.round((Date.now() - t0) / 1000) });
}
process.stdout.write(`\ntest:node: ${results.map((r) => `${r.runtime} ${r.status === 0 ? 'passed' : 'FAILED'} (${r.seconds} s)`).join(', ')}\n`);
process.exit(results.every((r) => r.status === 0) ? 0 : 1);
