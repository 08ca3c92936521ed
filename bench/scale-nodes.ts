// Nodes as a kubelet registers and updates them on a real cluster, for the
// scale benchmark (bench/scale.ts): 17.7 KB of JSON each, 2.2 KB of it
// metadata (labels, the annotations kubelets, CNI and CSI agents write, and
// the managedFields the API server keeps), the rest status: ~50 images
// (names by digest and by tag, sizes), conditions, addresses, capacity and
// allocatable, nodeInfo. Deterministic: node i is the same on every run.
import type { KubeObject } from '../test/support/apiserver.ts';

const hex = (seed: number, n = 64) => {
  let out = '';
  let x = seed >>> 0 || 1;
  while (out.length < n) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    out += x.toString(16).padStart(8, '0');
  }
  return out.slice(0, n);
};

const COMPONENTS = [
  'kube-proxy', 'coredns', 'calico-node', 'calico-cni', 'csi-node-driver-registrar', 'ebs-csi-driver', 'livenessprobe', 'node-exporter',
  'fluent-bit', 'pause', 'istio-proxyv2', 'istio-pilot', 'cert-manager-controller', 'cert-manager-webhook', 'metrics-server', 'cluster-autoscaler',
  'nginx-ingress-controller', 'external-dns', 'prometheus-config-reloader', 'kube-state-metrics', 'grafana-agent', 'otel-collector', 'vault-agent',
  'aws-load-balancer-controller', 'argocd-application-controller', 'argocd-repo-server', 'redis', 'postgres-exporter', 'jaeger-agent', 'datadog-agent',
  'falco', 'trivy-operator', 'velero-plugin-for-aws', 'node-problem-detector', 'kured', 'descheduler', 'keda-operator', 'gatekeeper', 'kyverno',
  'linkerd-proxy', 'envoy', 'haproxy', 'memcached', 'zookeeper', 'kafka', 'elasticsearch', 'kibana', 'logstash', 'app-frontend', 'app-backend',
];

export const NODE_POOLS = 10;

export function nodeName(i: number): string {
  return `ip-10-${20 + (i % NODE_POOLS)}-${Math.floor(i / 250)}-${i % 250}.eu-west-1.compute.internal`;
}

/** A Node (without the pinset.dev/status annotation): about 17.7 KB of JSON once the API server adds managedFields. */
export function realisticNode(i: number): KubeObject {
  const name = nodeName(i);
  const pool = `pool-${i % NODE_POOLS}`;
  const zone = `eu-west-1${'abc'[i % 3]}`;
  const ip = `10.${20 + (i % NODE_POOLS)}.${Math.floor(i / 250)}.${i % 250}`;
  const t = '2026-11-20T08:14:03Z';
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      labels: {
        'beta.kubernetes.io/arch': 'amd64',
        'beta.kubernetes.io/os': 'linux',
        'kubernetes.io/arch': 'amd64',
        'kubernetes.io/hostname': name,
        'kubernetes.io/os': 'linux',
        'node-role.kubernetes.io/worker': '',
        'node.kubernetes.io/instance-type': 'm6i.2xlarge',
        'topology.kubernetes.io/region': 'eu-west-1',
        'topology.kubernetes.io/zone': zone,
        'pinset.bench/pool': pool,
      },
      annotations: {
        'alpha.kubernetes.io/provided-node-ip': ip,
        'csi.volume.kubernetes.io/nodeid': `{"ebs.csi.aws.com":"i-0${hex(i, 16)}"}`,
        'node.alpha.kubernetes.io/ttl': '0',
        'projectcalico.org/IPv4Address': `${ip}/20`,
        'volumes.kubernetes.io/controller-managed-attach-detach': 'true',
      },
    },
    spec: {
      podCIDR: `172.16.${i % 250}.0/24`,
      podCIDRs: [`172.16.${i % 250}.0/24`],
      providerID: `aws:///${zone}/i-0${hex(i, 16)}`,
    },
    status: {
      addresses: [
        { type: 'InternalIP', address: ip },
        { type: 'InternalDNS', address: name },
        { type: 'Hostname', address: name },
      ],
      allocatable: { cpu: '7910m', 'ephemeral-storage': '95491281146', 'hugepages-1Gi': '0', 'hugepages-2Mi': '0', memory: '31482412Ki', pods: '110' },
      capacity: { cpu: '8', 'ephemeral-storage': '104845292Ki', 'hugepages-1Gi': '0', 'hugepages-2Mi': '0', memory: '32472620Ki', pods: '110' },
      conditions: [
        ['MemoryPressure', 'False', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'],
        ['DiskPressure', 'False', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'],
        ['PIDPressure', 'False', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available'],
        ['KernelDeadlock', 'False', 'KernelHasNoDeadlock', 'kernel has no deadlock'],
        ['ReadonlyFilesystem', 'False', 'FilesystemIsNotReadOnly', 'Filesystem is not read-only'],
        ['Ready', 'True', 'KubeletReady', 'kubelet is posting ready status'],
      ].map(([type, status, reason, message]) => ({ type, status, reason, message, lastHeartbeatTime: t, lastTransitionTime: t })),
      daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
      images: COMPONENTS.map((c, k) => ({
        names: [`123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/${c}@sha256:${hex(k * 7919 + 1)}`, `123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/${c}:v1.${k % 30}.${k % 7}-eksbuild`],
        sizeBytes: 10_000_000 + ((k * 7_654_321) % 400_000_000),
      })),
      nodeInfo: {
        architecture: 'amd64',
        bootID: `${hex(i + 1, 8)}-${hex(i + 2, 4)}-${hex(i + 3, 4)}-${hex(i + 4, 4)}-${hex(i + 5, 12)}`,
        containerRuntimeVersion: 'cri-o://1.32.13',
        kernelVersion: '6.1.0-28-cloud-amd64',
        kubeProxyVersion: 'v1.33.4',
        kubeletVersion: 'v1.33.4',
        machineID: hex(i + 6, 32),
        operatingSystem: 'linux',
        osImage: 'Debian GNU/Linux 12 (bookworm)',
        systemUUID: `ec2${hex(i + 7, 5)}-${hex(i + 8, 4)}-${hex(i + 9, 4)}-${hex(i + 10, 4)}-${hex(i + 11, 12)}`,
      },
    },
  };
}
