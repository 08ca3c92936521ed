// The kubelet's credential verification policy on this node, read the way
// the 1.35 kubelet reads its configuration (cmd/kubelet/app/server.go):
// - the --config file, defaulted: with the gate KubeletEnsureSecretPulledImages
//   on (its default from 1.35, off in 1.33 and 1.34, absent before),
//   imagePullCredentialsVerificationPolicy defaults to
//   NeverVerifyPreloadedImages (pkg/kubelet/apis/config/v1beta1/defaults.go;
//   the gate as the file's own featureGates leave it);
// - then every file whose name ends in ".conf" under --config-dir, walked
//   as Go's filepath.WalkDir walks (lexical order, sub-folders entered where
//   they sort), each applied as a JSON merge patch (RFC 7386: a later file
//   wins, featureGates merge key by key, a list replaces the whole list);
//   each must be apiVersion kubelet.config.k8s.io/v1beta1, kind
//   KubeletConfiguration, or the kubelet does not start;
// - then defaulted again, and validated (validation.go: a policy or an
//   allowlist with the gate off, an allowlist under another policy, or an
//   entry the allowlist's rules refuse, and the kubelet does not start).
// Read-only, and only these files: what the agent cannot see (the kubelet's
// --feature-gates flag, files at other paths) is said in
// docs/kubelet-credential-verification.md. A missing file is "cannot tell",
// never an error of the agent. The kubelet reads its files when it starts:
// this says what they hold now, which is what a kubelet started now uses.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';
import { allowlistProblems, DEFAULT_VERIFICATION_POLICY, GATE, gateDefault, isVerificationPolicy, offlineVerdict, type VerificationPolicy } from '../api/kubelet-verification.ts';
import type { KubeletVerificationStatus } from '../api/types.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { mergePatch } from '../util/json.ts';
import type { Plan } from './plan.ts';

export const KUBELET_CONFIG_API_VERSION = 'kubelet.config.k8s.io/v1beta1';
export const KUBELET_CONFIG_KIND = 'KubeletConfiguration';
/** The kubelet's drop-in suffix (server.go dropinFileExtension). */
const DROPIN_EXTENSION = '.conf';
/** A kubelet configuration file larger than this is not read (no real one comes near). */
const MAX_FILE_BYTES = 1024 * 1024;

/** What the node's kubelet configuration says, as far as the agent can tell. */
export interface KubeletVerificationReading {
  /**
   * The policy a kubelet started now uses. "Off": the kubelet does not
   * verify (gate off, or a version without the feature). "Invalid": the
   * kubelet refuses these files and does not start. "Unknown": not readable.
   */
  policy: VerificationPolicy | 'Off' | 'Invalid' | 'Unknown';
  /** preloadedImagesVerificationAllowlist as merged (only under NeverVerifyAllowlistedImages). */
  allowlist: string[];
  /** Where the policy comes from (a file, or the kubelet's default), or why it is Invalid or Unknown. */
  source: string;
}

export interface KubeletConfigPaths {
  /** The kubelet's --config file; undefined: not read. */
  configFile?: string;
  /** The kubelet's --config-dir; undefined: not read. */
  configDir?: string;
}

type Doc = Record<string, unknown>;
const isDoc = (v: unknown): v is Doc => typeof v === 'object' && v !== null && !Array.isArray(v);

function gateIn(doc: Doc, fallback: boolean): boolean {
  const gates = doc.featureGates;
  const v = isDoc(gates) ? gates[GATE] : undefined;
  return typeof v === 'boolean' ? v : fallback;
}

class Unreadable extends Error {}

/** One file's single document as plain data; undefined when the file does not exist. */
function readDoc(file: string): Doc | undefined {
  let text: string;
  try {
    if (statSync(file).size > MAX_FILE_BYTES) throw new Unreadable(`${file} is larger than ${MAX_FILE_BYTES} bytes`);
    text = readFileSync(file, 'utf8');
  } catch (e) {
    if (e instanceof Unreadable) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    throw new Unreadable(`cannot read ${file}: ${code ?? (e as Error).message}`);
  }
  const docs = parseYamlDocuments(text);
  const first = docs[0];
  if (!first) return {};
  if ('error' in first) throw new Unreadable(`${file}: ${first.error}`);
  if (!isDoc(first.value)) throw new Unreadable(`${file}: not a KubeletConfiguration object`);
  return first.value;
}

/** Go's filepath.Ext: from the last dot of the base name (".conf" itself included). */
function extension(name: string): string {
  const dot = name.lastIndexOf('.');
  return dot < 0 ? '' : name.slice(dot);
}

/** The drop-in files under `dir` in the kubelet's order; [] when the folder does not exist. */
export function dropinFiles(dir: string): string[] {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return [];
    throw new Unreadable(`cannot read the folder ${dir}: ${code ?? (e as Error).message}`);
  }
  // WalkDir sorts by name (byte order), and descends into a folder where it sorts.
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const out: string[] = [];
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...dropinFiles(p));
    else if (extension(e.name) === DROPIN_EXTENSION) out.push(p);
  }
  return out;
}

/** What validation.go refuses, or undefined. */
function invalidity(doc: Doc, gateOn: boolean): string | undefined {
  const policy = doc.imagePullCredentialsVerificationPolicy;
  const list = doc.preloadedImagesVerificationAllowlist;
  const hasList = Array.isArray(list) && list.length > 0;
  if (!gateOn) {
    if (policy !== undefined && policy !== '') return `imagePullCredentialsVerificationPolicy is set while the gate ${GATE} is off`;
    if (hasList) return `preloadedImagesVerificationAllowlist is set while the gate ${GATE} is off`;
    return undefined;
  }
  if (!isVerificationPolicy(policy)) return `imagePullCredentialsVerificationPolicy ${JSON.stringify(policy)} is not one of the four policies`;
  if (list !== undefined && list !== null && !Array.isArray(list)) return 'preloadedImagesVerificationAllowlist is not a list';
  if (hasList && policy !== 'NeverVerifyAllowlistedImages') return 'preloadedImagesVerificationAllowlist is set under another policy than NeverVerifyAllowlistedImages';
  if (hasList && list.some((e) => typeof e !== 'string')) return 'preloadedImagesVerificationAllowlist holds something other than strings';
  const problems = hasList ? allowlistProblems(list as string[]) : [];
  return problems.length > 0 ? `preloadedImagesVerificationAllowlist: ${problems[0]}` : undefined;
}

/**
 * The policy a kubelet of `kubeletVersion` started now would use, from its
 * --config file and --config-dir drop-ins. Never throws.
 */
export function readKubeletVerification(paths: KubeletConfigPaths, kubeletVersion?: string): KubeletVerificationReading {
  const unknown = (why: string): KubeletVerificationReading => ({ policy: 'Unknown', allowlist: [], source: why });
  const gate = gateDefault(kubeletVersion);
  try {
    const base = paths.configFile ? readDoc(paths.configFile) : undefined;
    const dropins = paths.configDir ? dropinFiles(paths.configDir) : [];
    const read = [paths.configFile, paths.configDir].filter(Boolean).join(' and ');
    if (base === undefined && dropins.length === 0) return unknown(read ? `no kubelet configuration at ${read}` : 'no kubelet configuration paths given');
    if (!gate.known) return { policy: 'Off', allowlist: [], source: `kubelet ${kubeletVersion}: no credential verification before 1.33` };

    let source = 'the kubelet\'s default';
    const decides = (doc: Doc, file: string) => {
      if ('imagePullCredentialsVerificationPolicy' in doc) source = file;
    };
    let doc: Doc = base ?? {};
    if (base && paths.configFile) decides(base, paths.configFile);
    if (gateIn(doc, gate.on) && !doc.imagePullCredentialsVerificationPolicy) doc = { ...doc, imagePullCredentialsVerificationPolicy: DEFAULT_VERIFICATION_POLICY };
    for (const file of dropins) {
      const patch = readDoc(file) ?? {};
      if (patch.apiVersion !== KUBELET_CONFIG_API_VERSION || patch.kind !== KUBELET_CONFIG_KIND) {
        return { policy: 'Invalid', allowlist: [], source: `${file} is not apiVersion ${KUBELET_CONFIG_API_VERSION}, kind ${KUBELET_CONFIG_KIND}: the kubelet does not start` };
      }
      decides(patch, file);
      doc = mergePatch(doc, patch) as Doc;
    }
    const on = gateIn(doc, gate.on);
    if (on && !doc.imagePullCredentialsVerificationPolicy) {
      doc = { ...doc, imagePullCredentialsVerificationPolicy: DEFAULT_VERIFICATION_POLICY };
      source = 'the kubelet\'s default';
    }
    const bad = invalidity(doc, on);
    if (bad) return { policy: 'Invalid', allowlist: [], source: `${bad}: the kubelet does not start` };
    if (!on) return { policy: 'Off', allowlist: [], source: `the gate ${GATE} is off` };
    const policy = doc.imagePullCredentialsVerificationPolicy as VerificationPolicy;
    const list = doc.preloadedImagesVerificationAllowlist;
    return { policy, allowlist: Array.isArray(list) ? (list as string[]) : [], source };
  } catch (e) {
    return unknown(e instanceof Unreadable ? e.message : String(e));
  }
}

/** Sets named in the status's `refuses`; the rest are counted. */
export const REFUSES_NAMED = 10;

/**
 * The node status's kubeletVerification for the sets that select this
 * node: which of them have pinned images the policy verifies. The image is
 * taken as the set spells it: a pod spelling it otherwise is matched
 * against the allowlist as it spells it.
 */
export function verificationStatus(reading: KubeletVerificationReading, plan: Pick<Plan, 'sets'>): KubeletVerificationStatus {
  const out: KubeletVerificationStatus = { policy: reading.policy, source: reading.source };
  if (!isVerificationPolicy(reading.policy)) return out;
  const policy = reading.policy;
  const refused = plan.sets
    .filter((s) => s.selection === 'selected' && s.references.some((r) => offlineVerdict(policy, reading.allowlist, r.reference) === 'verified'))
    .map((s) => (s.source === 'static' ? `${s.name} (static)` : s.name))
    .sort();
  if (refused.length > 0) out.refuses = refused.slice(0, REFUSES_NAMED);
  if (refused.length > REFUSES_NAMED) out.refusesMore = refused.length - REFUSES_NAMED;
  return out;
}

/** How long a reading of the files is used before they are read again. */
export const KUBELET_CONFIG_REREAD_MS = 60_000;

/** The kubelet's configuration files, read again at most once a KUBELET_CONFIG_REREAD_MS (and when the kubelet's version changes). */
export class KubeletConfigWatch {
  private last?: { at: number; version: string | undefined; reading: KubeletVerificationReading };
  private readonly paths: KubeletConfigPaths;
  private readonly kubeletVersion: () => string | undefined;
  private readonly now: () => number;

  constructor(paths: KubeletConfigPaths, kubeletVersion: () => string | undefined, now: () => number = Date.now) {
    this.paths = paths;
    this.kubeletVersion = kubeletVersion;
    this.now = now;
  }

  reading(): KubeletVerificationReading {
    const version = this.kubeletVersion();
    const t = this.now();
    if (!this.last || this.last.version !== version || t - this.last.at >= KUBELET_CONFIG_REREAD_MS) {
      this.last = { at: t, version, reading: readKubeletVerification(this.paths, version) };
    }
    return this.last.reading;
  }

  status(plan: Pick<Plan, 'sets'>): KubeletVerificationStatus {
    const reading = this.reading();
    this.reported = JSON.stringify(reading);
    return verificationStatus(reading, plan);
  }

  /** How often the files are read again at most (and, from the agent, at least). */
  readonly rereadMs = KUBELET_CONFIG_REREAD_MS;

  /** The folders whose changes may change the reading: the config file's and the drop-in folder. */
  folders(): string[] {
    return [this.paths.configFile && path.dirname(this.paths.configFile), this.paths.configDir].filter((d): d is string => Boolean(d));
  }

  /** Reads the files again now; true when the reading differs from the one last reported (a reconcile then reports the new one). */
  changed(): boolean {
    this.last = undefined;
    const now = JSON.stringify(this.reading());
    return this.reported !== undefined && now !== this.reported;
  }

  private reported?: string;
}
