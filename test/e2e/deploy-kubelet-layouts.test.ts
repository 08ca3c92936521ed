// The kubelet's configuration found by the shipped agent on each
// distribution's node: the agent run with exactly the args and env of the
// DaemonSet that `kubectl kustomize deploy/` renders (its host paths under
// a temporary host root, ../support/shipped-agent.ts), no PINSET_KUBELET_*
// and no component, on a node whose kubelet files are laid out as the
// distribution lays them out (../support/kubelet-nodes.ts): kubeadm with and
// without a --config-dir (given in /etc/default/kubelet's KUBELET_EXTRA_ARGS,
// or in kubeadm-flags.env by a JoinConfiguration's kubeletExtraArgs), k3s,
// RKE2, EKS (nodeadm), OpenShift, and AKS and GKE as far as their public
// sources show their files. Each node status says the policy of that
// layout's files, and its source names the layout. The runtime is the
// containerd twin at the layout's socket (the runtime layouts are tested on
// the real one in ./deploy-args.test.ts); the agent is the bundle as shipped.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import type { KubeletVerificationStatus, NodeStatus } from '../../src/api/types.ts';
import { AgentProcess, bundledCli, runPinset } from '../support/agent-process.ts';
import { isCI } from '../support/components.ts';
import { FakeContainerd } from '../support/fake-containerd.ts';
import { aksNode, eksNode, gkeNode, K3S_DEFAULTS, kubeadmNode, KUBEADM_CONFIG, KUBEADM_FLAGS, kubeletDropIn, openshiftNode, writeNode, type NodeFiles } from '../support/kubelet-nodes.ts';
import { kubectlPath, shippedAgent, shippedEnv, type ShippedAgent } from '../support/shipped-agent.ts';

const NODE = 'node-kubelet';
const D = (n: number) => `@sha256:${String(n).repeat(64)}`;
/** The static set every node holds: two repositories under registry.test/kep/. */
const REFS = [`registry.test/kep/p1${D(1)}`, `registry.test/kep/p2${D(2)}`];
const SETS_DIR = '/etc/pinset/sets.d';
const CONF_D = '/etc/kubernetes/kubelet.conf.d';

const noKubectl = !kubectlPath() ? 'kubectl not found: the DaemonSet cannot be rendered' : false;
if (noKubectl && isCI()) throw new Error(`CI=true and ${noKubectl}`);

interface Layout {
  name: string;
  /** The node's files; the set and the runtime are added. */
  files: (dropIn: string) => NodeFiles;
  /** Where the runtime's socket is. */
  containerdDir: string;
  want: { policy: string; refuses?: string[]; source: RegExp };
}

/** The drop-in `pinset kubelet-allowlist` prints for the set ("/*" entries: no kubelet version known). */
const PINSET = 'the drop-in pinset kubelet-allowlist prints';

const LAYOUTS: Layout[] = [
  {
    name: 'kubeadm, no --config-dir (the package\'s empty KUBELET_EXTRA_ARGS): config.yaml alone, a drop-in beside it not read',
    files: () => kubeadmNode('KUBELET_EXTRA_ARGS=\n', { '/var/lib/kubelet/config.yaml': `${KUBEADM_CONFIG}imagePullCredentialsVerificationPolicy: AlwaysVerify\n`, [`${CONF_D}/50-pinset.conf`]: kubeletDropIn('NeverVerify') }),
    containerdDir: '/run/containerd',
    want: { policy: 'AlwaysVerify', refuses: ['everywhere (static)'], source: /^\/var\/lib\/kubelet\/config\.yaml; kubeadm layout: --config \/var\/lib\/kubelet\/config\.yaml/ },
  },
  {
    name: 'kubeadm, --config-dir in /etc/default/kubelet\'s KUBELET_EXTRA_ARGS, holding ' + PINSET,
    files: (dropIn) => kubeadmNode(`KUBELET_EXTRA_ARGS="--config-dir=${CONF_D}"\n`, { [`${CONF_D}/50-pinset.conf`]: dropIn }),
    containerdDir: '/run/containerd',
    want: { policy: 'NeverVerifyAllowlistedImages', source: /^\/etc\/kubernetes\/kubelet\.conf\.d\/50-pinset\.conf; kubeadm layout: .*--config-dir \/etc\/kubernetes\/kubelet\.conf\.d \(KUBELET_EXTRA_ARGS of \/etc\/default\/kubelet\)/ },
  },
  {
    name: 'kubeadm, --config-dir in kubeadm-flags.env (a JoinConfiguration\'s kubeletExtraArgs)',
    files: () => kubeadmNode('KUBELET_EXTRA_ARGS=\n', { '/var/lib/kubelet/kubeadm-flags.env': KUBEADM_FLAGS.replace(/"\n$/, ` --config-dir=${CONF_D}"\n`), [`${CONF_D}/50-pinset.conf`]: kubeletDropIn('NeverVerify') }),
    containerdDir: '/run/containerd',
    want: { policy: 'NeverVerify', source: /^\/etc\/kubernetes\/kubelet\.conf\.d\/50-pinset\.conf; kubeadm layout: .*--config-dir \/etc\/kubernetes\/kubelet\.conf\.d \(KUBELET_KUBEADM_ARGS of \/var\/lib\/kubelet\/kubeadm-flags\.env\)/ },
  },
  {
    name: 'k3s: its kubelet.conf.d, after its own defaults, holding ' + PINSET,
    files: (dropIn) => ({
      '/etc/rancher/k3s/config.yaml': 'write-kubeconfig-mode: "0644"\n',
      '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf': K3S_DEFAULTS,
      '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-pinset.conf': dropIn,
    }),
    containerdDir: '/run/k3s/containerd',
    want: { policy: 'NeverVerifyAllowlistedImages', source: /^\/var\/lib\/rancher\/k3s\/agent\/etc\/kubelet\.conf\.d\/50-pinset\.conf; k3s layout: --config-dir \/var\/lib\/rancher\/k3s\/agent\/etc\/kubelet\.conf\.d \(k3s's own\)/ },
  },
  {
    name: 'RKE2: its kubelet.conf.d, a drop-in under AlwaysVerify',
    files: () => ({
      '/etc/rancher/rke2/config.yaml': 'cni: canal\n',
      '/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/00-rke2-defaults.conf': K3S_DEFAULTS,
      '/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/50-verify.conf': kubeletDropIn('AlwaysVerify'),
    }),
    containerdDir: '/run/k3s/containerd',
    want: { policy: 'AlwaysVerify', refuses: ['everywhere (static)'], source: /; rke2 layout: --config-dir \/var\/lib\/rancher\/rke2\/agent\/etc\/kubelet\.conf\.d/ },
  },
  {
    name: 'EKS (nodeadm): a NodeConfig\'s spec.kubelet.config, written as config.json.d/40-nodeadm.conf',
    files: () => eksNode({ imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['registry.test/kep/*'] }),
    containerdDir: '/run/containerd',
    want: { policy: 'NeverVerifyAllowlistedImages', source: /^\/etc\/kubernetes\/kubelet\/config\.json\.d\/40-nodeadm\.conf; eks layout: --config \/etc\/kubernetes\/kubelet\/config\.json \(NODEADM_KUBELET_ARGS of \/etc\/eks\/kubelet\/environment\)/ },
  },
  {
    name: 'OpenShift: a KubeletConfig\'s fields merged into /etc/kubernetes/kubelet.conf; the --config-dir its unit makes, not there yet',
    files: () => openshiftNode(`${kubeletDropIn('NeverVerifyAllowlistedImages', ['registry.test/kep/p1'])}cgroupDriver: systemd\n`),
    containerdDir: '/run/containerd',
    // No kubelet version known: taken as 1.35, where an exact entry matches no pod.
    want: { policy: 'NeverVerifyAllowlistedImages', refuses: ['everywhere (static)'], source: /^\/etc\/kubernetes\/kubelet\.conf; openshift layout: --config \/etc\/kubernetes\/kubelet\.conf \(ExecStart of \/etc\/systemd\/system\/kubelet\.service\)/ },
  },
  {
    name: 'AKS (its public sources): the gate turned off by --feature-gates in /etc/default/kubelet\'s KUBELET_FLAGS',
    files: () => aksNode('--address=0.0.0.0 --feature-gates=KubeletEnsureSecretPulledImages=false --max-pods=110'),
    containerdDir: '/run/containerd',
    want: { policy: 'Off', source: /^the gate KubeletEnsureSecretPulledImages is off; aks layout: --config \/etc\/default\/kubeletconfig\.json .*--feature-gates KubeletEnsureSecretPulledImages=false/ },
  },
  {
    name: 'GKE (its public sources): the --config under /home/kubernetes, which the DaemonSet does not mount',
    files: () => gkeNode(),
    containerdDir: '/run/containerd',
    want: { policy: 'Unknown', source: /^the kubelet's --config \/home\/kubernetes\/kubelet-config\.yaml is outside the host folders the agent's pod mounts \(\/etc, \/var\/lib, \/run\).*; gke layout/ },
  },
];

describe('the DaemonSet of kubectl kustomize deploy/ on each distribution\'s kubelet files: the policy found, no kubelet flag set', { skip: noKubectl }, () => {
  let shipped: ShippedAgent;
  let cli: string;
  let work: string;
  let setsFile: string;

  before(async () => {
    shipped = await shippedAgent();
    cli = await bundledCli();
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-kubelet-'));
    setsFile = path.join(work, 'everywhere.yaml');
    await writeFile(setsFile, dumpYaml({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'everywhere' }, spec: { pinnedImages: REFS.map((name) => ({ name })) } }));
  });
  after(async () => {
    await rm(work, { recursive: true, force: true });
  });

  /** The node's files, the set in its static folder and the containerd twin at the layout's socket, the images on it; the shipped agent started there. */
  async function nodeWith(name: string, l: Layout): Promise<{ root: string; agent: AgentProcess; runtime: FakeContainerd }> {
    const printed = await runPinset(['kubelet-allowlist', setsFile], { cli });
    assert.equal(printed.code, 0, printed.stderr);
    const root = await writeNode(path.join(work, name), { ...l.files(printed.stdout), [`${SETS_DIR}/sets.yaml`]: await readFile(setsFile, 'utf8') });
    await mkdir(path.join(root, l.containerdDir), { recursive: true });
    const runtime = new FakeContainerd(path.join(root, l.containerdDir), { version: '2.1.9', catalogue: Object.fromEntries(REFS.map((r) => [r, { size: 1024 }])) });
    await runtime.start();
    for (const r of REFS) runtime.preload(r);
    const env = { ...shippedEnv(shipped, root, { NODE_NAME: NODE, POD_NAMESPACE: 'pinset-system' }), PINSET_METRICS_ADDR: '' };
    assert.deepEqual(Object.keys(env).filter((k) => k.startsWith('PINSET_KUBELET_')), [], 'no kubelet path given');
    return { root, agent: AgentProcess.start(shipped.args.slice(1), { cli, env }), runtime };
  }

  /** The first node status whose kubeletVerification satisfies `ok`. */
  async function statusWhere(agent: AgentProcess, ok: (kv: KubeletVerificationStatus) => boolean, what: string, from = 0, timeoutMs = 20_000): Promise<KubeletVerificationStatus> {
    const line = await agent.waitForLog((l) => l.msg === 'node status' && Boolean((l.status as NodeStatus).kubeletVerification) && ok((l.status as NodeStatus).kubeletVerification!), timeoutMs, what, from);
    return (line.status as NodeStatus).kubeletVerification!;
  }

  test('rendered with no PINSET_KUBELET_* variable and no mount of the kubelet\'s own: /etc and /var/lib under /host are all it reads', () => {
    assert.deepEqual(Object.keys(shipped.env).filter((k) => k.startsWith('PINSET_KUBELET_')), []);
    assert.ok(!shipped.mounts.some((m) => /kubelet/.test(m.hostPath)), shipped.mounts.map((m) => m.hostPath).join(', '));
  });

  for (const [i, l] of LAYOUTS.entries()) {
    test(l.name, async () => {
      const { agent, runtime } = await nodeWith(`layout-${i}`, l);
      try {
        const kv = await statusWhere(agent, (k) => k.policy === l.want.policy, `kubeletVerification ${l.want.policy}`);
        assert.match(kv.source, l.want.source);
        assert.deepEqual(kv.refuses ?? [], l.want.refuses ?? []);
        const found = await agent.waitForLog((x) => /the kubelet's configuration (found|was not found)/.test(String(x.msg)), 5_000, 'the kubelet\'s configuration logged');
        assert.equal(found.policy, l.want.policy);
        assert.equal(await agent.stop(), 0);
      } finally {
        await agent.stop();
        await runtime.stop();
      }
    });
  }

  test('kubeadm with --config-dir: a drop-in replaced while the agent runs (written whole, twice) is in the node status within seconds, not at the minute\'s re-read', async () => {
    const l = LAYOUTS[1]!;
    const { root, agent, runtime } = await nodeWith('replaced', l);
    const file = path.join(root, CONF_D, '50-pinset.conf');
    const replace = async (text: string) => {
      await writeFile(`${file}.tmp`, text);
      await rename(`${file}.tmp`, file);
    };
    try {
      await statusWhere(agent, (k) => k.policy === 'NeverVerifyAllowlistedImages', 'the first drop-in');
      for (const [policy, refuses] of [['AlwaysVerify', ['everywhere (static)']], ['NeverVerify', []]] as const) {
        const from = agent.mark();
        const t0 = Date.now();
        await replace(kubeletDropIn(policy));
        const kv = await statusWhere(agent, (k) => k.policy === policy, `${policy} after the drop-in was replaced`, from, 10_000);
        assert.deepEqual(kv.refuses ?? [], refuses);
        assert.ok(Date.now() - t0 < 10_000, `seen in ${Date.now() - t0} ms`);
      }
      assert.equal(await agent.stop(), 0);
    } finally {
      await agent.stop();
      await runtime.stop();
    }
  });
});
