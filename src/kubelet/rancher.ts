// k3s and RKE2 run the kubelet inside their own process, with
// --config-dir=<data-dir>/agent/etc/kubelet.conf.d and no --config: they
// write their defaults there as 00-k3s-defaults.conf (00-rke2-defaults.conf)
// at each start, and copy a file or folder a `kubelet-arg` names with
// config=... or config-dir=... into it as 10-cli-config.conf and
// 20-cli-config-dir (k3s pkg/daemons/agent/agent.go startKubelet,
// extractConfigArgs, writeKubeletConfig; pkg/agent/config/config.go get:
// kubeletConfigDir; docs.k3s.io "Kubelet configuration files", v1.32 and
// later). So the folder is the kubelet's whole configuration; the other
// kubelet-args (--feature-gates among them) reach its command line.
//
// Their own configuration (pkg/configfilearg/parser.go readConfigFile):
// /etc/rancher/<k3s|rke2>/config.yaml, then every *.yaml or *.yml (any case)
// of config.yaml.d in name order; a key ending in "+" appends to a list,
// any other replaces. Flags on the command line come after the file's
// (a k3s install puts them in /etc/systemd/system/k3s.service's ExecStart;
// its environment file, which holds the join token, is never read here).
import { parseYamlDocuments } from '../api/yaml.ts';
import type { HostView } from './host-files.ts';
import { kubeletFlags } from './kubelet-flags.ts';
import { expandArguments, serviceDirectives } from './systemd.ts';

export interface RancherFlavour {
  name: 'k3s' | 'rke2';
  /** Its configuration file on the host; config.yaml.d beside it. */
  configFile: string;
  dataDir: string;
  /** Its units where the install writes them under /etc (RKE2's live under /usr: not seen). */
  units: string[];
}

export const K3S: RancherFlavour = {
  name: 'k3s',
  configFile: '/etc/rancher/k3s/config.yaml',
  dataDir: '/var/lib/rancher/k3s',
  units: ['/etc/systemd/system/k3s.service', '/etc/systemd/system/k3s-agent.service'],
};
export const RKE2: RancherFlavour = { name: 'rke2', configFile: '/etc/rancher/rke2/config.yaml', dataDir: '/var/lib/rancher/rke2', units: [] };

/** Bounds: no configuration file of these comes near. */
const MAX_CONFIG_BYTES = 256 * 1024;
const MAX_DROPINS = 256;

export interface RancherKubelet {
  configDir: string;
  featureGates: Record<string, boolean>;
  /** How each was found, for people. */
  evidence: string[];
  problems: string[];
  /** Host paths whose change may change this. */
  inputs: string[];
}

type Values = Map<string, unknown[]>;

/** config.yaml and config.yaml.d as k3s merges them: key → its values (a list, or one value). */
async function configValues(host: HostView, f: RancherFlavour, problems: string[]): Promise<{ values: Values; read: string[] }> {
  const values: Values = new Map();
  const files = [f.configFile];
  const dropins = await host.names(`${f.configFile}.d`, MAX_DROPINS);
  if ('error' in dropins) problems.push(dropins.error);
  else files.push(...dropins.names.filter((n) => /\.ya?ml$/i.test(n)).map((n) => `${f.configFile}.d/${n}`));
  const read: string[] = [];
  for (const file of files) {
    const got = await host.read(file, MAX_CONFIG_BYTES);
    if ('missing' in got) continue;
    if ('error' in got) {
      problems.push(got.error);
      continue;
    }
    read.push(file);
    const doc = parseYamlDocuments(got.text)[0];
    if (!doc) continue;
    if ('error' in doc || typeof doc.value !== 'object' || doc.value === null || Array.isArray(doc.value)) {
      problems.push(`${file}: ${'error' in doc ? doc.error : 'not a mapping of flags'}; ${f.name} does not start with it`);
      continue;
    }
    for (const [rawKey, v] of Object.entries(doc.value)) {
      const append = rawKey.endsWith('+');
      const key = append ? rawKey.slice(0, -1) : rawKey;
      const list = Array.isArray(v) ? v : v === null || v === undefined || String(v).trim() === '' ? [] : [v];
      values.set(key, append && values.has(key) ? [...values.get(key)!, ...list] : list);
    }
  }
  return { values, read };
}

/** The flags on the k3s unit's command line, after its subcommand. */
async function unitFlags(host: HostView, f: RancherFlavour): Promise<{ unit?: string; kubeletArgs: string[]; dataDir?: string }> {
  for (const unit of f.units) {
    const got = await host.read(unit, MAX_CONFIG_BYTES);
    if (!('text' in got)) continue;
    const start = serviceDirectives([got.text]).execStart;
    if (!start) continue;
    // Without the environment: the unit's environment file holds the join token, and no flag of interest comes from it.
    const args = start.expand ? expandArguments(start.args, new Map()).map((a) => a.word) : start.args;
    const kubeletArgs: string[] = [];
    let dataDir: string | undefined;
    for (let i = 0; i < args.length; i++) {
      const a = args[i]!;
      const m = /^--?(kubelet-arg|data-dir|d)(?:=(.*))?$/.exec(a);
      if (!m) continue;
      const value = m[2] ?? args[++i];
      if (value === undefined) break;
      if (m[1] === 'kubelet-arg') kubeletArgs.push(value);
      else dataDir = value;
    }
    return { unit, kubeletArgs, dataDir };
  }
  return { kubeletArgs: [] };
}

/** The kubelet's drop-in folder and command-line gates on a k3s or RKE2 node. */
export async function rancherKubelet(host: HostView, f: RancherFlavour): Promise<RancherKubelet> {
  const problems: string[] = [];
  const evidence: string[] = [];
  const { values, read } = await configValues(host, f, problems);
  const fromUnit = await unitFlags(host, f);
  const lastOf = (key: string) => values.get(key)?.at(-1);
  const dataDir = fromUnit.dataDir ?? String(lastOf('data-dir') ?? lastOf('d') ?? f.dataDir);
  if (dataDir !== f.dataDir) evidence.push(`data-dir ${dataDir} (${fromUnit.dataDir ? fromUnit.unit : read.join(', ')})`);
  const kubeletArgs = [...(values.get('kubelet-arg') ?? []).map(String), ...fromUnit.kubeletArgs];
  const flags = kubeletFlags(kubeletArgs.map((a) => (a.startsWith('--') ? a : `--${a}`)));
  problems.push(...flags.problems.map((p) => `kubelet-arg ${p}: the kubelet does not start`));
  const configDir = `${dataDir}/agent/etc/kubelet.conf.d`;
  evidence.push(`--config-dir ${configDir} (${f.name}'s own)`);
  if (flags.config) evidence.push(`kubelet-arg config=${flags.config}, copied into the folder as 10-cli-config.conf when ${f.name} starts`);
  if (flags.configDir) evidence.push(`kubelet-arg config-dir=${flags.configDir}, copied into the folder as 20-cli-config-dir when ${f.name} starts`);
  if (Object.keys(flags.featureGates).length > 0) evidence.push(`kubelet-arg feature-gates (${Object.entries(flags.featureGates).map(([g, on]) => `${g}=${on}`).join(',')})`);
  return {
    configDir,
    featureGates: flags.featureGates,
    evidence,
    problems,
    inputs: [f.configFile, `${f.configFile}.d`, ...(fromUnit.unit ? [fromUnit.unit] : []), configDir],
  };
}
