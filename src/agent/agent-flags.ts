// `pinset agent`'s flags: each with its environment-variable twin, a
// default and one line of help (src/util/flags.ts reads them, and
// ./boot/config.ts makes them the agent's typed configuration;
// docs/reference.md's table says the same, and a test holds the two together).
import { minWatchTimeoutFlag } from '../api/watch-timeout.ts';
import { DEFAULT_SLOT_NAMESPACE } from '../rollout/slots.ts';
import { PIN_BACKEND_FLAGS } from '../pins/choice.ts';
import type { FlagSpec } from '../util/flags.ts';
import { DEFAULT_DISK_ESTIMATE_FACTOR } from './estimate.ts';

/**
 * Default pull parallelism. Measured on containerd with a loopback
 * registry (BENCHMARKS.md): 4 parallel pulls reach nearly all of the
 * throughput of 8 while keeping the runtime's and the registry's load low;
 * the kubelet itself pulls serially by default.
 */
export const DEFAULT_MAX_PARALLEL_PULLS = 4;

export const AGENT_FLAGS: readonly FlagSpec[] = [
  { name: 'node-name', env: 'NODE_NAME', type: 'string', required: true, help: 'name of this node (the DaemonSet sets it from spec.nodeName)' },
  {
    name: 'kubeconfig',
    env: 'KUBECONFIG',
    type: 'string',
    help: 'kubeconfig file (on a host: the kubelet\'s, e.g. /var/lib/kubelet/kubeconfig; until it exists only static sets apply, then the agent exits with 75 to be restarted); in a pod the in-cluster config is used; with neither, only static sets apply',
  },
  { name: 'static-dir', env: 'PINSET_STATIC_DIR', type: 'string', default: '/etc/pinset/sets.d', help: 'folder of YAML files of PinnedImageSet documents (missing = none)' },
  { name: 'node-labels', env: 'PINSET_NODE_LABELS', type: 'string', help: 'k=v,... labels for selector matching when the Node cannot be read' },
  {
    name: 'cri-endpoint',
    env: 'PINSET_CRI_ENDPOINT',
    type: 'string',
    help: 'CRI socket of the container runtime; default: found on the node (the one of /var/run/crio/crio.sock, /run/containerd/containerd.sock, /run/k3s/containerd/containerd.sock under --host-root that answers CRI Version)',
  },
  {
    name: 'host-root',
    env: 'PINSET_HOST_ROOT',
    type: 'string',
    default: '/',
    help: 'where the host\'s /run, /etc and /var/lib are seen (the DaemonSet mounts them under /host): the runtime\'s socket, CRI-O\'s drop-in folder, containerd\'s registry hosts and image filesystem are looked for there',
  },
  {
    name: 'pin-backend',
    env: 'PINSET_PIN_BACKEND',
    type: 'string',
    default: 'auto',
    choices: [...PIN_BACKEND_FLAGS],
    help: 'how images are pinned: auto (from the runtime CRI Version names: CRI-O drop-in, containerd image labels, else pre-load only), crio, containerd, or none (pre-load only)',
  },
  { name: 'state-dir', env: 'PINSET_STATE_DIR', type: 'string', default: '/var/lib/pinset', help: 'pinset\'s own folder on the node: the node lock lives there, whatever the runtime' },
  { name: 'crio-dropin-dir', env: 'PINSET_CRIO_DROPIN_DIR', type: 'string', help: 'CRI-O drop-in folder the pin file is written to (default /etc/crio/crio.conf.d under --host-root)' },
  { name: 'reload', env: 'PINSET_RELOAD', type: 'string', default: 'dbus', choices: ['dbus', 'systemctl', 'none'], help: 'how CRI-O is reloaded after the pin file changes' },
  { name: 'crio-unit', env: 'PINSET_CRIO_UNIT', type: 'string', default: 'crio.service', help: 'systemd unit of CRI-O' },
  { name: 'auth-file', env: 'PINSET_AUTH_FILE', type: 'string', default: '/var/lib/kubelet/config.json', help: 'registry credentials, docker config.json format (missing = anonymous pulls)' },
  {
    name: 'image-credential-provider-config',
    env: 'PINSET_IMAGE_CREDENTIAL_PROVIDER_CONFIG',
    type: 'string',
    help: 'the kubelet\'s CredentialProviderConfig (YAML or JSON): credential provider plugins asked for registry credentials, as the kubelet asks them (needs --image-credential-provider-bin-dir)',
  },
  { name: 'image-credential-provider-bin-dir', env: 'PINSET_IMAGE_CREDENTIAL_PROVIDER_BIN_DIR', type: 'string', help: 'the folder of the credential provider plugins\' executables (the kubelet\'s flag of the same name)' },
  { name: 'image-credential-provider-timeout', env: 'PINSET_IMAGE_CREDENTIAL_PROVIDER_TIMEOUT', type: 'duration', default: '1m', help: 'a plugin still running after this long is killed with its process group, and counts as failed (the kubelet\'s fixed bound is 1m)' },
  {
    name: 'kubelet-config',
    env: 'PINSET_KUBELET_CONFIG',
    type: 'string',
    allowEmpty: true,
    help: 'the kubelet\'s --config file, read-only, for its image credential verification policy; default: found on the node under --host-root (kubeadm, k3s, RKE2, EKS, OpenShift, AKS, GKE, any kubelet.service); "" none ("" with an empty --kubelet-config-dir: not reported)',
  },
  {
    name: 'kubelet-config-dir',
    env: 'PINSET_KUBELET_CONFIG_DIR',
    type: 'string',
    allowEmpty: true,
    help: 'the kubelet\'s --config-dir folder of *.conf drop-ins, read-only; default: found on the node as --kubelet-config is; "" none; a folder given that is missing means none',
  },
  { name: 'max-parallel-pulls', env: 'PINSET_MAX_PARALLEL_PULLS', type: 'int', default: DEFAULT_MAX_PARALLEL_PULLS, help: 'images pulled at the same time' },
  { name: 'image-fs-high-watermark', env: 'PINSET_IMAGE_FS_HIGH_WATERMARK', type: 'int', default: 85, help: 'pulls wait while the image filesystem is at least this % full (the kubelet\'s image GC threshold); 0 disables' },
  { name: 'disk-estimate-factor', env: 'PINSET_DISK_ESTIMATE_FACTOR', type: 'number', default: DEFAULT_DISK_ESTIMATE_FACTOR, help: 'before pulling, estimated disk = compressed size of the images to download (from the registry) x this; a batch that would not fit below the watermark waits; 0 disables the estimate' },
  { name: 'registries-conf', env: 'CONTAINERS_REGISTRIES_CONF', type: 'string', help: 'registries.conf with the node\'s mirrors, for the size estimate (default /etc/containers/registries.conf)' },
  { name: 'registries-conf-dir', env: 'PINSET_REGISTRIES_CONF_DIR', type: 'string', default: '/etc/containers/registries.conf.d', help: 'drop-in folder of registries.conf' },
  { name: 'containerd-hosts-dir', env: 'PINSET_CONTAINERD_HOSTS_DIR', type: 'string', help: 'containerd\'s registry hosts folder (its config_path; several joined with ":"), for the size estimate; default: the config_path of the runtime\'s containerd config (/etc/containerd/config.toml; k3s and RKE2: /var/lib/rancher/{k3s,rke2}/agent/etc/containerd/config.toml), else that layout\'s certs.d, where it replaces registries.conf' },
  { name: 'lease-namespace', env: 'POD_NAMESPACE', type: 'string', default: DEFAULT_SLOT_NAMESPACE, help: 'the agents\' namespace: rollout slot Leases (spec.rollout.maxConcurrentNodes) and the pull secrets sets name (spec.pullSecrets); the DaemonSet sets it to its own' },
  { name: 'rollout-lease-duration', env: 'PINSET_ROLLOUT_LEASE_DURATION', type: 'duration', default: '60s', help: 'a rollout slot not renewed for this long is free again (a node that died); renewed every third of it' },
  { name: 'status-progress-interval', env: 'PINSET_STATUS_PROGRESS_INTERVAL', type: 'duration', default: '1m', help: 'progress alone (image counts, bytes) is written to the Node this long after the last write, then twice as long each time up to 5 times this (5m); a change of phase, or a set starting to download, is written at once' },
  { name: 'resync-interval', env: 'PINSET_RESYNC_INTERVAL', type: 'duration', default: '5m', help: 'full reconcile at least this often' },
  { name: 'presence-check-interval', env: 'PINSET_PRESENCE_CHECK_INTERVAL', type: 'duration', default: '30s', help: 'between reconciles, ask the runtime this often (one ListImages) whether pinned images are still there' },
  { name: 'reload-confirm-timeout', env: 'PINSET_RELOAD_CONFIRM_TIMEOUT', type: 'duration', default: '5s', help: 'how long CRI-O may take to apply a reload before it counts as not applied (and is retried)' },
  minWatchTimeoutFlag(' (2 watches: about 8 requests an hour)'),
  { name: 'metrics-addr', env: 'PINSET_METRICS_ADDR', type: 'string', default: '0.0.0.0:9402', allowEmpty: true, help: 'host:port for /healthz, /readyz and /metrics ("" disables)' },
  { name: 'log-level', env: 'PINSET_LOG_LEVEL', type: 'string', default: 'info', choices: ['trace', 'debug', 'info', 'warn', 'error', 'fatal'], help: 'log level' },
  { name: 'once', env: 'PINSET_ONCE', type: 'bool', default: false, help: 'one full reconcile, then exit 0 if every selected set is Ready, 1 if not (or a static file cannot be read); one JSON line per set on stdout' },
  { name: 'lock-timeout', env: 'PINSET_LOCK_TIMEOUT', type: 'duration', default: '1m', help: 'with --once or --drop-pins: how long to wait while another agent on this node holds the node lock (then exit 3)' },
  {
    name: 'drop-pins',
    env: 'PINSET_DROP_PINS',
    type: 'bool',
    default: false,
    help: "remove pinset's pins from this node (its CRI-O drop-in, or its labels on containerd), confirm through CRI, and exit; for a node whose agent is gone",
  },
];
