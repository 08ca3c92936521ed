// Where each distribution keeps its kubelet's configuration, found under a
// temporary host root laid out as the distribution lays the node out
// (src/kubelet/layouts.ts): the files with the names, places and formats
// each writes (../support/kubelet-nodes.ts, with their sources). The
// DaemonSet mounts the host's /etc, /var/lib and /run under /host; these
// roots hold the same folders.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { hostView } from '../../src/kubelet/host-files.ts';
import { describeKubeletConfig, findKubeletConfig } from '../../src/kubelet/layouts.ts';
import { aksNode, EKS_CONFIG, eksKubeletArgs, eksNode, gkeNode, K3S_DEFAULTS, KUBEADM_CONFIG, KUBEADM_FLAGS, kubeadmNode as kubeadmFiles, OPENSHIFT_UNIT, openshiftNode, writeNode, type NodeFiles } from '../support/kubelet-nodes.ts';

const run = promisify(execFile);
let tmp: string;
let n = 0;
before(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-kubelet-layouts-'));
});
after(async () => {
  await fsp.rm(tmp, { recursive: true, force: true });
});

/** A host root holding `files` (path on the host → content; a path ending in "/" is a folder). */
const hostRoot = (files: NodeFiles) => writeNode(path.join(tmp, `host${++n}`), files);

const DROPIN = 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: ["registry.example/org/*"]\n';

const kubeadmNode = (defaultKubelet: string, more: NodeFiles = {}) => hostRoot(kubeadmFiles(defaultKubelet, more));

describe('kubeadm: /var/lib/kubelet/config.yaml, and a --config-dir from the environment files of 10-kubeadm.conf', () => {
  test('--config-dir in /etc/default/kubelet\'s KUBELET_EXTRA_ARGS, quoted, with a --feature-gates', async () => {
    const root = await kubeadmNode(`KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d --feature-gates='KubeletEnsureSecretPulledImages=true'"\n`, {
      '/etc/kubernetes/kubelet.conf.d/50-pinset.conf': DROPIN,
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.source, 'detected');
    assert.equal(loc.layout, 'kubeadm');
    assert.equal(loc.configFile, path.join(root, '/var/lib/kubelet/config.yaml'));
    assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
    assert.deepEqual(loc.featureGates, { KubeletEnsureSecretPulledImages: true });
    assert.deepEqual(loc.problems, []);
    assert.deepEqual(loc.evidence, [
      '--config /var/lib/kubelet/config.yaml (KUBELET_CONFIG_ARGS of Environment= of its unit)',
      '--config-dir /etc/kubernetes/kubelet.conf.d (KUBELET_EXTRA_ARGS of /etc/default/kubelet)',
      '--feature-gates KubeletEnsureSecretPulledImages=true',
    ]);
    assert.equal(describeKubeletConfig(loc), `kubeadm layout: ${loc.evidence.join('; ')}`);
    for (const watched of ['/etc/default/kubelet', '/var/lib/kubelet/kubeadm-flags.env', '/etc/systemd/system/kubelet.service.d', '/etc/kubernetes/kubelet.conf.d']) {
      assert.ok(loc.inputs.includes(path.join(root, watched)), `${watched} among ${loc.inputs.join(', ')}`);
    }
  });

  test('"--config-dir DIR" as two words, in single quotes, in the .rpm\'s /etc/sysconfig/kubelet', async () => {
    const root = await hostRoot({
      '/var/lib/kubelet/config.yaml': KUBEADM_CONFIG,
      '/var/lib/kubelet/kubeadm-flags.env': KUBEADM_FLAGS,
      '/etc/sysconfig/kubelet': "KUBELET_EXTRA_ARGS='--config-dir /etc/kubernetes/kubelet.conf.d'\n",
      '/etc/kubernetes/kubelet.conf.d/': '',
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
    assert.match(loc.evidence[1]!, /KUBELET_EXTRA_ARGS of \/etc\/sysconfig\/kubelet/);
  });

  test('the package\'s empty KUBELET_EXTRA_ARGS: no --config-dir; kubeadm\'s own flags (kubeletExtraArgs) are read too, the later file winning', async () => {
    const plain = await kubeadmNode('KUBELET_EXTRA_ARGS=\n');
    const loc = await findKubeletConfig(plain);
    assert.equal(loc.configFile, path.join(plain, '/var/lib/kubelet/config.yaml'));
    assert.equal(loc.configDir, undefined);
    assert.deepEqual(loc.problems, []);
    const both = await hostRoot({
      '/var/lib/kubelet/config.yaml': KUBEADM_CONFIG,
      '/var/lib/kubelet/kubeadm-flags.env': 'KUBELET_KUBEADM_ARGS="--config-dir=/etc/kubeadm.conf.d"\n',
      '/etc/default/kubelet': 'KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n',
      '/etc/kubeadm.conf.d/': '',
      '/etc/kubernetes/kubelet.conf.d/': '',
    });
    assert.equal((await findKubeletConfig(both)).configDir, path.join(both, '/etc/kubernetes/kubelet.conf.d'));
  });

  test('a systemd drop-in under /etc: its ExecStart wins; its Environment= loses to the environment files (systemd.exec(5))', async () => {
    const root = await kubeadmNode('KUBELET_EXTRA_ARGS=\n', {
      '/etc/systemd/system/kubelet.service.d/20-extra.conf': '[Service]\nEnvironment="KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d"\n',
      '/etc/kubernetes/kubelet.conf.d/': '',
    });
    assert.equal((await findKubeletConfig(root)).configDir, undefined, 'the empty KUBELET_EXTRA_ARGS of /etc/default/kubelet wins');
    await fsp.writeFile(
      path.join(root, '/etc/systemd/system/kubelet.service.d/30-exec.conf'),
      '[Service]\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS \\\n  --config-dir=/etc/kubernetes/kubelet.conf.d\n',
    );
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
    assert.match(loc.evidence[1]!, /ExecStart of kubelet\.service as kubeadm installs it/);
  });

  test('a --config-dir that does not exist: the kubelet does not start, said; a --config-dir outside the mounted folders: said so', async () => {
    const root = await kubeadmNode('KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n');
    const loc = await findKubeletConfig(root);
    assert.deepEqual(loc.problems, [`the kubelet's --config-dir /etc/kubernetes/kubelet.conf.d does not exist under ${root}: the kubelet does not start with a --config-dir that does not exist (cmd/kubelet/app/server.go walks it)`]);
    const elsewhere = await kubeadmNode('KUBELET_EXTRA_ARGS="--config-dir /opt/kubelet.d"\n');
    assert.match((await findKubeletConfig(elsewhere)).problems[0]!, /--config-dir \/opt\/kubelet\.d is outside the host folders the agent's pod mounts \(\/etc, \/var\/lib, \/run\)/);
  });
});

describe('k3s and RKE2: their kubelet.conf.d, kubelet-arg in config.yaml and config.yaml.d', () => {
  test('k3s: the folder under the default data-dir; gates from kubelet-arg in config.yaml and config.yaml.d (appended); a config= named, and where k3s copies it', async () => {
    const root = await hostRoot({
      '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf': K3S_DEFAULTS,
      '/etc/rancher/k3s/config.yaml': 'write-kubeconfig-mode: "0644"\nkubelet-arg:\n  - "feature-gates=KubeletEnsureSecretPulledImages=true"\n',
      '/etc/rancher/k3s/config.yaml.d/50-pinset.YML': 'kubelet-arg+:\n  - config=/etc/rancher/k3s/kubelet.conf\n',
      '/etc/rancher/k3s/config.yaml.d/60-notes.txt': 'kubelet-arg: [feature-gates=KubeletEnsureSecretPulledImages=false]\n',
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'k3s');
    assert.equal(loc.configFile, undefined, 'k3s gives the kubelet no --config');
    assert.equal(loc.configDir, path.join(root, '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d'));
    assert.deepEqual(loc.featureGates, { KubeletEnsureSecretPulledImages: true });
    assert.deepEqual(loc.problems, []);
    assert.ok(loc.evidence.includes('kubelet-arg config=/etc/rancher/k3s/kubelet.conf, copied into the folder as 10-cli-config.conf when k3s starts'), loc.evidence.join('\n'));
  });

  test('k3s: a data-dir of its own, and the install\'s unit with --kubelet-arg on its command line (after the file\'s); its environment file, which holds the token, is not read', async () => {
    const root = await hostRoot({
      '/etc/rancher/k3s/config.yaml': 'data-dir: /var/lib/k3s-data\nkubelet-arg: feature-gates=KubeletEnsureSecretPulledImages=true\n',
      '/var/lib/k3s-data/agent/etc/kubelet.conf.d/00-k3s-defaults.conf': K3S_DEFAULTS,
      // get.k3s.io's create_systemd_service_file: ExecStart over continuation lines, each arg quoted.
      '/etc/systemd/system/k3s-agent.service':
        "[Unit]\nDescription=Lightweight Kubernetes\n[Service]\nType=notify\nEnvironmentFile=-/etc/default/%N\nEnvironmentFile=-/etc/systemd/system/k3s-agent.service.env\nExecStart=/usr/local/bin/k3s \\\n    agent \\\n\t'--kubelet-arg' \\\n\t'feature-gates=KubeletEnsureSecretPulledImages=false' \\\n",
      '/etc/systemd/system/k3s-agent.service.env': 'K3S_TOKEN=K10abc::server:secret\nK3S_URL=https://10.0.0.1:6443\n',
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configDir, path.join(root, '/var/lib/k3s-data/agent/etc/kubelet.conf.d'));
    assert.deepEqual(loc.featureGates, { KubeletEnsureSecretPulledImages: false }, 'the command line comes after the file');
    assert.ok(!loc.inputs.some((p) => p.endsWith('.service.env')), loc.inputs.join(', '));
    assert.doesNotMatch(JSON.stringify(loc), /K10abc/);
  });

  test('RKE2: /var/lib/rancher/rke2/agent/etc/kubelet.conf.d and /etc/rancher/rke2/config.yaml', async () => {
    const root = await hostRoot({
      '/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/00-rke2-defaults.conf': K3S_DEFAULTS,
      '/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/50-pinset.conf': DROPIN,
      '/etc/rancher/rke2/config.yaml': 'token: my-shared-secret\ncni: canal\n',
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'rke2');
    assert.equal(loc.configDir, path.join(root, '/var/lib/rancher/rke2/agent/etc/kubelet.conf.d'));
    assert.deepEqual(loc.featureGates, {});
    assert.doesNotMatch(JSON.stringify(loc), /my-shared-secret/);
  });

  test('a config.yaml that is not a mapping: said, the folder still found', async () => {
    const root = await hostRoot({ '/etc/rancher/k3s/config.yaml': '- not\n- flags\n', '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/': '' });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configDir, path.join(root, '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d'));
    assert.match(loc.problems[0]!, /config\.yaml: not a mapping of flags; k3s does not start with it/);
  });
});

describe('EKS (nodeadm, Amazon Linux 2023): /etc/eks/kubelet/environment\'s NODEADM_KUBELET_ARGS', () => {
  test('with a NodeConfig\'s spec.kubelet.config: --config-dir config.json.d, written as 40-nodeadm.conf', async () => {
    const root = await hostRoot(eksNode({ imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages', preloadedImagesVerificationAllowlist: ['123456789012.dkr.ecr.us-west-2.amazonaws.com/team/*'] }));
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'eks');
    assert.equal(loc.configFile, path.join(root, '/etc/kubernetes/kubelet/config.json'));
    assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet/config.json.d'));
    assert.deepEqual(loc.problems, []);
    assert.deepEqual(loc.evidence, ['--config /etc/kubernetes/kubelet/config.json (NODEADM_KUBELET_ARGS of /etc/eks/kubelet/environment)', '--config-dir /etc/kubernetes/kubelet/config.json.d (NODEADM_KUBELET_ARGS of /etc/eks/kubelet/environment)']);
  });

  test('without one: no --config-dir (nodeadm gives the flag only with a user configuration); the unit as nodeadm writes it when /etc lacks it', async () => {
    const root = await hostRoot({ '/etc/eks/kubelet/environment': `${eksKubeletArgs('')}\n`, '/etc/kubernetes/kubelet/config.json': EKS_CONFIG });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configFile, path.join(root, '/etc/kubernetes/kubelet/config.json'));
    assert.equal(loc.configDir, undefined);
  });
});

describe('OpenShift: the machine-config operator\'s kubelet.service', () => {
  test('--config /etc/kubernetes/kubelet.conf, --config-dir /etc/openshift/kubelet.conf.d (made by its ExecStartPre: not there yet is no problem)', async () => {
    const root = await hostRoot(openshiftNode());
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'openshift');
    assert.equal(loc.configFile, path.join(root, '/etc/kubernetes/kubelet.conf'));
    assert.equal(loc.configDir, path.join(root, '/etc/openshift/kubelet.conf.d'));
    assert.deepEqual(loc.problems, []);
    assert.deepEqual(loc.evidence, ['--config /etc/kubernetes/kubelet.conf (ExecStart of /etc/systemd/system/kubelet.service)', '--config-dir /etc/openshift/kubelet.conf.d (ExecStart of /etc/systemd/system/kubelet.service)']);
  });

  test('a unit that needs an environment file that is missing: said (systemd would not start the kubelet)', async () => {
    const root = await hostRoot({ '/etc/systemd/system/kubelet.service': OPENSHIFT_UNIT, '/etc/kubernetes/kubelet.conf': 'kind: KubeletConfiguration\n', '/etc/openshift/kubelet.conf.d/': '' });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'openshift');
    assert.deepEqual(loc.problems, ["the kubelet's unit needs the environment file /etc/os-release, which does not exist: systemd does not start the kubelet"]);
  });
});

describe('AKS and GKE (not checked on a real node: their node images\' public sources)', () => {
  test('AKS: AgentBaker\'s kubelet.service, its 10-componentconfig.conf drop-in and /etc/default/kubelet', async () => {
    const root = await hostRoot(aksNode());
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'aks');
    assert.equal(loc.configFile, path.join(root, '/etc/default/kubeletconfig.json'));
    assert.equal(loc.configDir, undefined);
    assert.deepEqual(loc.featureGates, { RotateKubeletServerCertificate: true, KubeletEnsureSecretPulledImages: true });
    assert.deepEqual(loc.evidence[0], '--config /etc/default/kubeletconfig.json (KUBELET_CONFIG_FILE_FLAGS of Environment= of its unit)');
  });

  test('GKE: kube-up\'s /etc/default/kubelet KUBELET_OPTS names /home/kubernetes/kubelet-config.yaml, which the DaemonSet does not mount: said', async () => {
    const root = await hostRoot(gkeNode());
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'gke');
    assert.equal(loc.configFile, path.join(root, '/home/kubernetes/kubelet-config.yaml'));
    assert.deepEqual(loc.problems, [`the kubelet's --config /home/kubernetes/kubelet-config.yaml is outside the host folders the agent's pod mounts (/etc, /var/lib, /run): mount it read-only under ${root}/home/kubernetes/kubelet-config.yaml, or give --kubelet-config`]);
  });
});

describe('any other node, flags, and nothing', () => {
  test('a kubelet.service of its own under /etc (a Kubespray node): its command line as systemd builds it', async () => {
    const root = await hostRoot({
      '/etc/systemd/system/kubelet.service': '[Service]\nEnvironmentFile=-/etc/kubernetes/kubelet.env\nExecStart=/usr/local/bin/kubelet \\\n\t\t$KUBE_LOGTOSTDERR \\\n\t\t$KUBE_LOG_LEVEL \\\n\t\t$KUBELET_API_SERVER \\\n\t\t$KUBELET_ADDRESS \\\n\t\t$KUBELET_ARGS\n',
      '/etc/kubernetes/kubelet.env': 'KUBE_LOG_LEVEL="--v=2"\nKUBELET_ARGS="--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \\\n--config=/etc/kubernetes/kubelet-config.yaml \\\n--kubeconfig=/etc/kubernetes/kubelet.conf \\\n--config-dir=/etc/kubernetes/kubelet.conf.d"\n',
      '/etc/kubernetes/kubelet-config.yaml': 'kind: KubeletConfiguration\n',
      '/etc/kubernetes/kubelet.conf.d/': '',
    });
    const loc = await findKubeletConfig(root);
    assert.equal(loc.layout, 'systemd');
    assert.equal(loc.configFile, path.join(root, '/etc/kubernetes/kubelet-config.yaml'));
    assert.equal(loc.configDir, path.join(root, '/etc/kubernetes/kubelet.conf.d'));
    assert.deepEqual(loc.problems, []);
  });

  test('both flags given: nothing looked for ("" is none); one given: it wins over what is found', async () => {
    const root = await kubeadmNode('KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n', { '/etc/kubernetes/kubelet.conf.d/': '' });
    assert.deepEqual(await findKubeletConfig(root, { configFile: '/somewhere/config.yaml', configDir: '' }), {
      source: 'flags',
      configFile: '/somewhere/config.yaml',
      configDirRequired: false,
      featureGates: {},
      evidence: ['--kubelet-config /somewhere/config.yaml', '--kubelet-config-dir ""'],
      problems: [],
      inputs: ['/somewhere/config.yaml'],
    });
    const one = await findKubeletConfig(root, { configDir: '/mine/conf.d' });
    assert.equal(one.source, 'detected');
    assert.equal(one.configFile, path.join(root, '/var/lib/kubelet/config.yaml'));
    assert.equal(one.configDir, '/mine/conf.d');
    assert.equal(one.evidence.at(-1), '--kubelet-config-dir /mine/conf.d given');
  });

  test('no kubelet files at all: none, said where it looked; two layouts\' files: the first taken, said', async () => {
    const empty = await hostRoot({ '/etc/hostname': 'node\n' });
    const none = await findKubeletConfig(empty);
    assert.equal(none.source, 'none');
    assert.deepEqual(none.problems, [`under ${empty}: no kubelet configuration of kubeadm, k3s, RKE2, EKS (nodeadm), OpenShift, AKS or GKE, and no kubelet.service under /etc or /run`]);
    const mixed = await kubeadmNode('KUBELET_EXTRA_ARGS=\n', { '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf': K3S_DEFAULTS });
    const loc = await findKubeletConfig(mixed);
    assert.equal(loc.layout, 'k3s');
    assert.match(loc.problems.at(-1)!, /files of k3s and kubeadm on this node: read as k3s; give --kubelet-config and --kubelet-config-dir/);
  });

  test('an environment file that is a FIFO or too large is refused with the reason, and the rest still read', async () => {
    const root = await kubeadmNode('KUBELET_EXTRA_ARGS=\n');
    await fsp.rm(path.join(root, '/etc/default/kubelet'));
    await run('mkfifo', [path.join(root, '/etc/default/kubelet')]);
    await fsp.writeFile(path.join(root, '/var/lib/kubelet/kubeadm-flags.env'), `KUBELET_KUBEADM_ARGS="${'x'.repeat(70_000)}"`);
    const loc = await findKubeletConfig(root);
    assert.equal(loc.configFile, path.join(root, '/var/lib/kubelet/config.yaml'));
    assert.deepEqual(loc.problems, [
      '/var/lib/kubelet/kubeadm-flags.env is 70023 bytes, more than the 65536-byte limit for it: not read',
      '/etc/default/kubelet is a FIFO (named pipe), not a regular file (EFTYPE): not read',
    ]);
  });
});

describe('the host\'s files through the shared bounded reader, named by their host paths', () => {
  test('a regular file is read; a folder, a device, a link to nothing and an oversized file are refused, saying what they are', async () => {
    const dir = await hostRoot({ '/f': 'text', '/d/': '' });
    const host = hostView(dir);
    assert.deepEqual(await host.read('/f', 10), { text: 'text' });
    assert.deepEqual(await host.read('/nope', 10), { missing: true });
    assert.deepEqual(await host.read('/d', 10), { error: '/d is a folder, not a regular file (EISDIR): not read' });
    assert.deepEqual(await hostView('/').read('/dev/zero', 10), { error: '/dev/zero is a character device, not a regular file (EFTYPE): not read' });
    assert.deepEqual(await host.read('/f', 3), { error: '/f is 4 bytes, more than the 3-byte limit for it: not read' });
    await fsp.symlink('/etc/nowhere-at-all', path.join(dir, 'link'));
    assert.deepEqual(await host.read('/link', 10), { error: '/link is a symbolic link to /etc/nowhere-at-all, which does not exist here' });
    assert.equal(host.onHost(path.join(dir, 'etc/default/kubelet')), '/etc/default/kubelet');
    assert.equal(host.onHost('/elsewhere/x'), '/elsewhere/x');
  });
  test('a FIFO with no writer is refused at once, not waited on', async () => {
    const dir = await hostRoot({});
    await run('mkfifo', [path.join(dir, 'fifo')]);
    const t0 = Date.now();
    assert.deepEqual(await hostView(dir).read('/fifo', 10), { error: '/fifo is a FIFO (named pipe), not a regular file (EFTYPE): not read' });
    assert.ok(Date.now() - t0 < 5000);
  });
});
