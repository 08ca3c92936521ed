// Where the node's kubelet keeps its configuration, found on the node under
// --host-root as the runtime is (DESIGN, "The node, found rather than
// configured"): its --config file, its --config-dir folder, and the
// --feature-gates of its command line. The DaemonSet mounts the host's /etc,
// /var/lib and /run under /host (deploy/agent/daemonset.yaml), where every
// layout below keeps them, GKE's aside.
//
// The layouts, each recognised by files only it has, first match wins
// (another one's files too are reported as a problem):
//   openshift  /etc/machine-config-daemon or /etc/openshift/kubelet.conf.d.
//              The machine-config operator writes kubelet.service to
//              /etc/systemd/system: ExecStart --config=/etc/kubernetes/kubelet.conf
//              --config-dir=/etc/openshift/kubelet.conf.d (machine-config-operator
//              templates/*/01-*-kubelet/_base/units/kubelet.service.yaml; the
//              folder made by its ExecStartPre).
//   eks        /etc/eks/kubelet/environment: nodeadm writes NODEADM_KUBELET_ARGS
//              there (--config=/etc/kubernetes/kubelet/config.json, and
//              --config-dir=/etc/kubernetes/kubelet/config.json.d when the
//              NodeConfig has spec.kubelet.config, written as 40-nodeadm.conf);
//              kubelet.service reads it (amazon-eks-ami nodeadm/internal/kubelet
//              config.go, environment.go; templates/al2023/runtime/rootfs/etc/
//              systemd/system/kubelet.service).
//   aks        /etc/default/kubeletconfig.json or /etc/kubernetes/azure.json:
//              AgentBaker's kubelet.service (EnvironmentFile=/etc/default/kubelet,
//              ExecStart ... $KUBELET_CONFIG_FILE_FLAGS ... $KUBELET_FLAGS) and
//              its drop-in 10-componentconfig.conf
//              (KUBELET_CONFIG_FILE_FLAGS=--config /etc/default/kubeletconfig.json),
//              both under /etc/systemd/system (AgentBaker parts/linux/cloud-init/
//              artifacts/kubelet.service, cse_config.sh).
//   rke2, k3s  their own configuration (./rancher.ts).
//   gke        /etc/default/kubelet with KUBELET_OPTS: the kube-up node
//              configuration GKE's node images come from
//              (cluster/gce/gci/configure-helper.sh start-kubelet: KUBELET_OPTS
//              with --config /home/kubernetes/kubelet-config.yaml, and
//              /etc/systemd/system/kubelet.service running $KUBELET_OPTS).
//              /home is not mounted: the agent says so.
//   kubeadm    /var/lib/kubelet/kubeadm-flags.env or /var/lib/kubelet/config.yaml.
//              Its packages install kubelet.service and the drop-in
//              10-kubeadm.conf under /usr/lib/systemd/system (not mounted; their
//              text is below, as kubernetes/release's packages ship it):
//              --config=/var/lib/kubelet/config.yaml, then $KUBELET_KUBEADM_ARGS
//              from /var/lib/kubelet/kubeadm-flags.env and $KUBELET_EXTRA_ARGS
//              from /etc/default/kubelet (.deb) or /etc/sysconfig/kubelet (.rpm),
//              where a --config-dir is given (kubernetes.io, "Configuring each
//              kubelet in your cluster using kubeadm" and "Set Kubelet Parameters
//              Via A Configuration File").
//   systemd    any other node with a kubelet.service under /etc/systemd/system
//              or /run/systemd/system: its command line as systemd builds it.
//
// For every layout but k3s and RKE2 the command line is built as systemd
// builds it (./systemd.ts): the unit under /etc or /run (or the text a
// layout ships under /usr), its drop-ins from kubelet.service.d in /etc and
// /run, their environment files. Flags given explicitly (--kubelet-config,
// --kubelet-config-dir) win over what is found, field by field; both
// given, nothing is looked for.
import type { HostView } from './host-files.ts';
import { hostView } from './host-files.ts';
import { kubeletFlags } from './kubelet-flags.ts';
import { K3S, rancherKubelet, RKE2 } from './rancher.ts';
import { expandArguments, parseEnvironmentFile, serviceDirectives, type Argument } from './systemd.ts';

export type KubeletLayout = 'openshift' | 'eks' | 'aks' | 'rke2' | 'k3s' | 'gke' | 'kubeadm' | 'systemd';

export interface KubeletConfigLocation {
  /** "detected": found on the node (flags given may still win for one field); "flags": both given; "none": nothing found. */
  source: 'detected' | 'flags' | 'none';
  layout?: KubeletLayout;
  /** The kubelet's --config and --config-dir as this process sees them (under --host-root); undefined: none. */
  configFile?: string;
  configDir?: string;
  /**
   * The kubelet is started with configDir, so a folder that is not there
   * stops it (its WalkDir fails). False where the layout makes the folder
   * before the kubelet starts, and for a folder given by flag (missing =
   * no drop-ins).
   */
  configDirRequired: boolean;
  /** The --feature-gates of the kubelet's command line: they win over the files' featureGates, gate by gate. */
  featureGates: Record<string, boolean>;
  /** How each was found, for the status and the log. */
  evidence: string[];
  /** What keeps the agent from telling the policy, or the kubelet from starting with what it was given. */
  problems: string[];
  /** Files and folders (as seen here) whose change may change this finding. */
  inputs: string[];
}

/** The explicit flags: undefined not given; "" given as none. */
export interface GivenKubeletPaths {
  configFile?: string;
  configDir?: string;
}

const MAX_UNIT_BYTES = 64 * 1024;
const MAX_ENV_FILE_BYTES = 64 * 1024;
const MAX_DROPINS = 256;
const UNIT_DIRS = ['/etc/systemd/system', '/run/systemd/system'];
const UNIT = 'kubelet.service';
/** Where the DaemonSet mounts the host (deploy/agent/daemonset.yaml). */
const MOUNTED = ['/etc/', '/var/lib/', '/run/'];

// kubernetes/release cmd/krel/templates/latest/kubelet/kubelet.service and
// kubeadm/10-kubeadm.conf (the .rpm's with /etc/sysconfig/kubelet).
const KUBEADM_UNIT = '[Service]\nExecStart=/usr/bin/kubelet\n';
const kubeadmDropin = (extraArgsFile: string) => `[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-${extraArgsFile}
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
`;

interface SystemdLayout {
  layout: Exclude<KubeletLayout, 'k3s' | 'rke2'>;
  /** Any of these on the host says the node is of this layout. */
  markers: (host: HostView) => Promise<boolean>;
  /** The unit (and drop-ins) as the distribution installs them where this process cannot see, used unless /etc or /run has a file of that name. */
  shipped?: (host: HostView) => Promise<{ unit?: string; dropins?: Record<string, string> }>;
  /** The layout makes its --config-dir before the kubelet starts (a missing one is not the kubelet's refusal then). */
  makesConfigDir?: boolean;
}

const anyOf = (...paths: string[]) => async (host: HostView) => {
  for (const p of paths) if ((await host.kind(p)) !== 'missing') return true;
  return false;
};

/** An environment file's variable, set (even empty). */
const assigns = (file: string, variable: string) => async (host: HostView) => {
  const got = await host.read(file, MAX_ENV_FILE_BYTES);
  return 'text' in got && parseEnvironmentFile(got.text).has(variable);
};

const SYSTEMD_LAYOUTS: Record<Exclude<KubeletLayout, 'k3s' | 'rke2'>, SystemdLayout> = {
  openshift: { layout: 'openshift', markers: anyOf('/etc/machine-config-daemon', '/etc/openshift/kubelet.conf.d'), makesConfigDir: true },
  eks: {
    layout: 'eks',
    markers: anyOf('/etc/eks/kubelet/environment'),
    shipped: async () => ({ unit: '[Service]\nEnvironmentFile=/etc/eks/kubelet/environment\nExecStart=/usr/bin/kubelet $NODEADM_KUBELET_ARGS\n' }),
  },
  aks: { layout: 'aks', markers: anyOf('/etc/default/kubeletconfig.json', '/etc/kubernetes/azure.json') },
  gke: { layout: 'gke', markers: assigns('/etc/default/kubelet', 'KUBELET_OPTS') },
  kubeadm: {
    layout: 'kubeadm',
    markers: anyOf('/var/lib/kubelet/kubeadm-flags.env', '/var/lib/kubelet/config.yaml'),
    shipped: async (host) => {
      const rpm = (await host.kind('/etc/default/kubelet')) === 'missing' && (await host.kind('/etc/sysconfig/kubelet')) !== 'missing';
      return { unit: KUBEADM_UNIT, dropins: { '10-kubeadm.conf': kubeadmDropin(rpm ? '/etc/sysconfig/kubelet' : '/etc/default/kubelet') } };
    },
  },
  systemd: { layout: 'systemd', markers: anyOf(...UNIT_DIRS.map((d) => `${d}/${UNIT}`)) },
};

const RANCHER = { rke2: RKE2, k3s: K3S };
const rancherMarkers = (f: typeof K3S) => anyOf(f.configFile, `${f.dataDir}/agent/etc/kubelet.conf.d`, ...f.units);

/** The order layouts are tried in: the generic systemd one last. */
const ORDER: KubeletLayout[] = ['openshift', 'eks', 'aks', 'rke2', 'k3s', 'gke', 'kubeadm', 'systemd'];

async function matches(host: HostView, layout: KubeletLayout): Promise<boolean> {
  return layout === 'k3s' || layout === 'rke2' ? rancherMarkers(RANCHER[layout])(host) : SYSTEMD_LAYOUTS[layout].markers(host);
}

/** What a layout's files say, paths on the host. */
type Found = Omit<KubeletConfigLocation, 'source' | 'layout' | 'configDirRequired'>;

/** The kubelet's command line from its systemd unit, and where each flag of it came from. */
async function fromSystemd(host: HostView, l: SystemdLayout): Promise<Found> {
  const problems: string[] = [];
  const inputs: string[] = [];
  const shipped = (await l.shipped?.(host)) ?? {};
  // The unit: the first of /etc, /run that has it, else the shipped text.
  let unit: { name: string; text: string } | undefined;
  for (const dir of UNIT_DIRS) {
    inputs.push(`${dir}/${UNIT}`, `${dir}/${UNIT}.d`);
    if (unit) continue;
    const got = await host.read(`${dir}/${UNIT}`, MAX_UNIT_BYTES);
    if ('text' in got) unit = { name: `${dir}/${UNIT}`, text: got.text };
    else if ('error' in got) problems.push(got.error);
  }
  unit ??= shipped.unit === undefined ? undefined : { name: `${UNIT} as ${l.layout} installs it`, text: shipped.unit };
  // Drop-ins by name: /etc masks /run masks what the layout ships; read in name order.
  const dropins = new Map<string, { name: string; text: string }>();
  for (const [name, text] of Object.entries(shipped.dropins ?? {})) dropins.set(name, { name: `${UNIT}.d/${name} as ${l.layout} installs it`, text });
  for (const dir of [...UNIT_DIRS].reverse()) {
    const listed = await host.names(`${dir}/${UNIT}.d`, MAX_DROPINS);
    if ('error' in listed) {
      problems.push(listed.error);
      continue;
    }
    for (const name of listed.names.filter((n) => n.endsWith('.conf'))) {
      const got = await host.read(`${dir}/${UNIT}.d/${name}`, MAX_UNIT_BYTES);
      if ('text' in got) dropins.set(name, { name: `${dir}/${UNIT}.d/${name}`, text: got.text });
      else if ('error' in got) problems.push(got.error);
    }
  }
  const files = [...(unit ? [unit] : []), ...[...dropins.keys()].sort().map((n) => dropins.get(n)!)];
  const service = serviceDirectives(files.map((f) => f.text));
  if (!service.execStart) {
    return { featureGates: {}, evidence: [], problems: [...problems, `no ExecStart for the kubelet in ${files.map((f) => f.name).join(', ') || `${UNIT} (not found)`}`], inputs };
  }
  // Environment=, then the environment files, which win; each variable with where it was set.
  const env = new Map<string, string>(service.environment);
  const origin = new Map<string, string>([...service.environment.keys()].map((k) => [k, 'Environment= of its unit']));
  for (const f of service.environmentFiles) {
    inputs.push(f.path);
    const got = await host.read(f.path, MAX_ENV_FILE_BYTES);
    if ('missing' in got) {
      if (!f.optional) problems.push(`the kubelet's unit needs the environment file ${f.path}, which does not exist: systemd does not start the kubelet`);
      continue;
    }
    if ('error' in got) {
      problems.push(got.error);
      continue;
    }
    for (const [k, v] of parseEnvironmentFile(got.text)) {
      env.set(k, v);
      origin.set(k, f.path);
    }
  }
  const args: Argument[] = service.execStart.expand ? expandArguments(service.execStart.args, env) : service.execStart.args.map((word) => ({ word }));
  const flags = kubeletFlags(args.map((a) => a.word));
  const whence = (at: number | undefined) => {
    const v = at === undefined ? undefined : args[at]?.variable;
    return v ? `${v} of ${origin.get(v) ?? 'its unit'}` : `ExecStart of ${unit?.name ?? UNIT}`;
  };
  const evidence: string[] = [];
  if (flags.config) evidence.push(`--config ${flags.config} (${whence(flags.at.config)})`);
  if (flags.configDir) evidence.push(`--config-dir ${flags.configDir} (${whence(flags.at.configDir)})`);
  if (Object.keys(flags.featureGates).length > 0) evidence.push(`--feature-gates ${Object.entries(flags.featureGates).map(([g, on]) => `${g}=${on}`).join(',')}`);
  return {
    ...(flags.config ? { configFile: flags.config } : {}),
    ...(flags.configDir ? { configDir: flags.configDir } : {}),
    featureGates: flags.featureGates,
    evidence,
    problems: [...problems, ...flags.problems.map((p) => `${p}: the kubelet does not start`)],
    inputs,
  };
}

/** Where a host path is, said for a person: outside the DaemonSet's mounts, or not there. */
function absence(host: HostView, what: string, p: string): string {
  const mounted = host.root === '/' || MOUNTED.some((m) => p.startsWith(m));
  return mounted
    ? `the kubelet's ${what} ${p} does not exist${host.root === '/' ? '' : ` under ${host.root}`}`
    : `the kubelet's ${what} ${p} is outside the host folders the agent's pod mounts (/etc, /var/lib, /run): mount it read-only under ${host.root}${p}, or give --kubelet-${what === '--config' ? 'config' : 'config-dir'}`;
}

/** The kubelet's configuration on this node, as far as its files tell. */
export async function findKubeletConfig(hostRoot: string, given: GivenKubeletPaths = {}): Promise<KubeletConfigLocation> {
  const flagged = (p: string | undefined) => (p === undefined ? undefined : p === '' ? undefined : p);
  if (given.configFile !== undefined && given.configDir !== undefined) {
    return {
      source: 'flags',
      ...(flagged(given.configFile) ? { configFile: given.configFile } : {}),
      ...(flagged(given.configDir) ? { configDir: given.configDir } : {}),
      configDirRequired: false,
      featureGates: {},
      evidence: [`--kubelet-config ${given.configFile || '""'}`, `--kubelet-config-dir ${given.configDir || '""'}`],
      problems: [],
      inputs: [given.configFile, given.configDir].filter((p) => p !== ''),
    };
  }
  const host = hostView(hostRoot);
  const matched: KubeletLayout[] = [];
  for (const l of ORDER) if (await matches(host, l)) matched.push(l);
  const named = matched.filter((l) => l !== 'systemd');
  const layout = matched[0];
  if (!layout) {
    const searched = `${host.root === '/' ? '' : `under ${host.root}: `}no kubelet configuration of kubeadm, k3s, RKE2, EKS (nodeadm), OpenShift, AKS or GKE, and no kubelet.service under /etc or /run`;
    return { source: 'none', configDirRequired: false, featureGates: {}, evidence: [], problems: [searched], inputs: [] };
  }
  const found: Found = layout === 'k3s' || layout === 'rke2' ? await rancherKubelet(host, RANCHER[layout]) : await fromSystemd(host, SYSTEMD_LAYOUTS[layout]);
  if (named.length > 1) found.problems.push(`files of ${named.join(' and ')} on this node: read as ${layout}; give --kubelet-config and --kubelet-config-dir to say where its kubelet's are`);
  const out: KubeletConfigLocation = {
    source: 'detected',
    layout,
    configDirRequired: false,
    featureGates: found.featureGates,
    evidence: [...found.evidence],
    problems: [...found.problems],
    inputs: found.inputs.map((p) => host.seen(p)),
  };
  if (given.configFile !== undefined) {
    if (flagged(given.configFile)) out.configFile = given.configFile;
    out.evidence.push(`--kubelet-config ${given.configFile === '' ? '""' : given.configFile} given`);
  } else if (found.configFile) {
    out.configFile = host.seen(found.configFile);
    if ((await host.kind(found.configFile)) === 'missing') out.problems.push(absence(host, '--config', found.configFile));
  }
  if (given.configDir !== undefined) {
    if (flagged(given.configDir)) out.configDir = given.configDir;
    out.evidence.push(`--kubelet-config-dir ${given.configDir === '' ? '""' : given.configDir} given`);
  } else if (found.configDir) {
    out.configDir = host.seen(found.configDir);
    const makes = layout === 'k3s' || layout === 'rke2' || SYSTEMD_LAYOUTS[layout].makesConfigDir === true;
    out.configDirRequired = !makes;
    if (!makes && (await host.kind(found.configDir)) === 'missing') {
      out.problems.push(`${absence(host, '--config-dir', found.configDir)}: the kubelet does not start with a --config-dir that does not exist (cmd/kubelet/app/server.go walks it)`);
    }
  }
  for (const p of [out.configFile, out.configDir]) if (p && !out.inputs.includes(p)) out.inputs.push(p);
  return out;
}

/** One line for the status's source and the log: the layout and where its files are. */
export function describeKubeletConfig(loc: KubeletConfigLocation): string {
  const what = loc.source === 'flags' ? 'flags' : loc.source === 'none' ? 'no kubelet layout found' : `${loc.layout!} layout`;
  return loc.evidence.length > 0 ? `${what}: ${loc.evidence.join('; ')}` : what;
}
