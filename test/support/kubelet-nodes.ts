// Nodes laid out as each distribution lays out its kubelet's files: the
// files with the names, places and formats each writes, as cited beside
// each (src/kubelet/layouts.ts has the sources). A node is a map of host
// paths to contents (a path ending in "/" is a folder), put under a
// temporary host root by writeNode. The unit tests of the finding
// (test/unit/kubelet-layouts.test.ts) and the shipped agent's run on each
// layout (test/e2e/deploy-kubelet-layouts.test.ts) share them.
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';

export type NodeFiles = Record<string, string>;

/** Puts `files` (host path → content; a path ending in "/" is a folder) under `root`. */
export async function writeNode(root: string, files: NodeFiles): Promise<string> {
  await fsp.mkdir(root, { recursive: true });
  for (const [p, content] of Object.entries(files)) {
    const at = path.join(root, p);
    if (p.endsWith('/')) await fsp.mkdir(at, { recursive: true });
    else {
      await fsp.mkdir(path.dirname(at), { recursive: true });
      await fsp.writeFile(at, content);
    }
  }
  return root;
}

const HEAD = 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n';

/** A drop-in of the kubelet's configuration with these fields (YAML, as `pinset kubelet-allowlist` prints it). */
export function kubeletDropIn(policy: string, allowlist?: string[]): string {
  return `${HEAD}imagePullCredentialsVerificationPolicy: ${policy}\n${allowlist ? `preloadedImagesVerificationAllowlist:\n${allowlist.map((e) => `  - ${e}\n`).join('')}` : ''}`;
}

// kubeadm writes its KubeletConfiguration to /var/lib/kubelet/config.yaml and
// the flags of its phase kubelet-start to /var/lib/kubelet/kubeadm-flags.env
// (cmd/kubeadm/app/phases/kubelet/flags.go: KUBELET_KUBEADM_ARGS="...");
// the .deb ships /etc/default/kubelet with an empty KUBELET_EXTRA_ARGS=.
export const KUBEADM_CONFIG = `apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
kind: KubeletConfiguration
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
`;
export const KUBEADM_FLAGS = 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10"\n';

/** A kubeadm node: /etc/default/kubelet as given (the package's is `KUBELET_EXTRA_ARGS=`), and more files. */
export function kubeadmNode(defaultKubelet: string, more: NodeFiles = {}): NodeFiles {
  return { '/var/lib/kubelet/config.yaml': KUBEADM_CONFIG, '/var/lib/kubelet/kubeadm-flags.env': KUBEADM_FLAGS, '/etc/default/kubelet': defaultKubelet, ...more };
}

// k3s writes 00-k3s-defaults.conf (a KubeletConfiguration in YAML) into
// <data-dir>/agent/etc/kubelet.conf.d at each start and runs the kubelet with
// --config-dir on it (pkg/daemons/agent/agent.go); its config.yaml takes
// kubelet-arg as a list, config.yaml.d appends with "kubelet-arg+".
export const K3S_DEFAULTS = `${HEAD}cgroupDriver: cgroupfs\nclusterDNS:\n- 10.43.0.10\nclusterDomain: cluster.local\nfailSwapOn: false\n`;

// EKS, Amazon Linux 2023: nodeadm's kubelet.service
// (templates/al2023/runtime/rootfs/etc/systemd/system/kubelet.service) and
// its environment file: KEY=value lines, the flags unquoted in one value
// (nodeadm/internal/kubelet/environment.go).
export const EKS_UNIT = '[Unit]\nDescription=Kubernetes Kubelet\n[Service]\nSlice=runtime.slice\nEnvironmentFile=/etc/eks/kubelet/environment\nExecStartPre=/sbin/iptables -P FORWARD ACCEPT -w 5\nExecStart=/usr/bin/kubelet $NODEADM_KUBELET_ARGS\n';
export const eksKubeletArgs = (more: string) =>
  `NODEADM_KUBELET_ARGS=--node-ip=10.0.1.23 --cloud-provider=external --hostname-override=ip-10-0-1-23.ec2.internal --config=/etc/kubernetes/kubelet/config.json${more} --node-labels=eks.amazonaws.com/nodegroup=ng-1`;
export const EKS_CONFIG = JSON.stringify({ kind: 'KubeletConfiguration', apiVersion: 'kubelet.config.k8s.io/v1beta1', address: '0.0.0.0', cgroupDriver: 'systemd', clusterDomain: 'cluster.local' }, null, 4);

/** An EKS node whose NodeConfig has spec.kubelet.config `fields`: nodeadm writes them as 40-nodeadm.conf (JSON) and adds --config-dir. */
export function eksNode(fields?: Record<string, unknown>): NodeFiles {
  if (!fields) return { '/etc/systemd/system/kubelet.service': EKS_UNIT, '/etc/eks/kubelet/environment': `${eksKubeletArgs('')}\n`, '/etc/kubernetes/kubelet/config.json': EKS_CONFIG };
  return {
    '/etc/systemd/system/kubelet.service': EKS_UNIT,
    '/etc/eks/kubelet/environment': `${eksKubeletArgs(' --config-dir=/etc/kubernetes/kubelet/config.json.d')}\n`,
    '/etc/kubernetes/kubelet/config.json': EKS_CONFIG,
    '/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf': JSON.stringify({ apiVersion: 'kubelet.config.k8s.io/v1beta1', kind: 'KubeletConfiguration', ...fields }, null, 4),
  };
}

// OpenShift: the machine-config operator's
// templates/worker/01-worker-kubelet/_base/units/kubelet.service.yaml as rendered.
export const OPENSHIFT_UNIT = `[Unit]
Description=Kubernetes Kubelet
Requires=crio.service kubelet-dependencies.target

[Service]
Type=notify
ExecStartPre=/bin/mkdir --parents /etc/kubernetes/manifests
ExecStartPre=/bin/mkdir --parents /etc/openshift/kubelet.conf.d
Environment="KUBELET_NODE_IP=0.0.0.0"
EnvironmentFile=/etc/os-release
EnvironmentFile=-/etc/kubernetes/kubelet-workaround
EnvironmentFile=-/etc/kubernetes/kubelet-env

ExecStart=/usr/local/bin/kubenswrapper \\
    /usr/bin/kubelet \\
      --config=/etc/kubernetes/kubelet.conf \\
      --config-dir=/etc/openshift/kubelet.conf.d \\
      --bootstrap-kubeconfig=/etc/kubernetes/kubeconfig \\
      --kubeconfig=/var/lib/kubelet/kubeconfig \\
      --container-runtime-endpoint=/var/run/crio/crio.sock \\
      --node-labels=node-role.kubernetes.io/worker,node.openshift.io/os_id=\${ID},\${CUSTOM_KUBELET_LABELS} \\
      --node-ip=\${KUBELET_NODE_IP} \\
      --v=\${KUBELET_LOG_LEVEL}

Restart=always
`;

/** An OpenShift worker; `kubeletConf` is /etc/kubernetes/kubelet.conf (where a KubeletConfig's fields are merged). */
export function openshiftNode(kubeletConf = `${HEAD}cgroupDriver: systemd\nmaxPods: 250\n`, more: NodeFiles = {}): NodeFiles {
  return {
    '/etc/systemd/system/kubelet.service': OPENSHIFT_UNIT,
    '/etc/os-release': 'NAME="Red Hat Enterprise Linux CoreOS"\nID="rhcos"\n',
    '/etc/kubernetes/kubelet.conf': kubeletConf,
    '/etc/machine-config-daemon/currentconfig': '{}',
    // kubeadm's kubelet kubeconfig has this name too: on OpenShift it is the configuration.
    '/var/lib/kubelet/kubeconfig': 'apiVersion: v1\nkind: Config\n',
    ...more,
  };
}

/** An AKS node (AgentBaker's kubelet.service, its 10-componentconfig.conf, /etc/default/kubelet), the kubelet's KUBELET_FLAGS given. */
export function aksNode(kubeletFlags = '--address=0.0.0.0 --anonymous-auth=false --feature-gates=RotateKubeletServerCertificate=true,KubeletEnsureSecretPulledImages=true --max-pods=110'): NodeFiles {
  return {
    '/etc/systemd/system/kubelet.service':
      '[Service]\nRestart=always\nEnvironmentFile=/etc/default/kubelet\nExecStart=/usr/local/bin/kubelet \\\n        --enable-server \\\n        --node-labels="${KUBELET_NODE_LABELS}" \\\n        --v=2 \\\n        $KUBELET_TLS_BOOTSTRAP_FLAGS \\\n        $KUBELET_CONFIG_FILE_FLAGS \\\n        $KUBELET_CONTAINERD_FLAGS \\\n        $KUBELET_FLAGS\n',
    '/etc/systemd/system/kubelet.service.d/10-componentconfig.conf': '[Service]\nEnvironment="KUBELET_CONFIG_FILE_FLAGS=--config /etc/default/kubeletconfig.json"\n',
    '/etc/default/kubelet': `KUBELET_FLAGS=${kubeletFlags}\nKUBELET_REGISTER_SCHEDULABLE=true\nKUBELET_NODE_LABELS=kubernetes.azure.com/role=agent\n`,
    '/etc/default/kubeletconfig.json': '{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1"}',
    '/etc/kubernetes/azure.json': '{}',
  };
}

/**
 * A GKE node's /etc and /var/lib as kube-up's cluster/gce/gci/configure-helper.sh
 * start-kubelet leaves them: its --config is under /home/kubernetes, which
 * the DaemonSet does not mount (so it is not here).
 */
export function gkeNode(): NodeFiles {
  return {
    '/etc/default/kubelet': 'KUBELET_OPTS="--v=2 --cloud-provider=external --experimental-mounter-path=/home/kubernetes/containerized_mounter/mounter --cert-dir=/var/lib/kubelet/pki/ --kubeconfig=/var/lib/kubelet/kubeconfig --config /home/kubernetes/kubelet-config.yaml --cgroup-driver=systemd"\nKUBE_COVERAGE_FILE="/var/log/kubelet.cov"\n',
    '/etc/systemd/system/kubelet.service': '[Unit]\nDescription=Kubernetes kubelet\n[Service]\nRestart=always\nEnvironmentFile=/etc/default/kubelet\nExecStart=/home/kubernetes/bin/kubelet $KUBELET_OPTS\n',
  };
}
