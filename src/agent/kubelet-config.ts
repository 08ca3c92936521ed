// The kubelet's credential verification policy on this node, read the way
// the kubelet reads its configuration (cmd/kubelet/app/server.go, 1.35 and
// 1.36):
// - the --config file, defaulted: with the gate KubeletEnsureSecretPulledImages
//   on (its default from 1.35, off in 1.33 and 1.34, absent before),
//   imagePullCredentialsVerificationPolicy defaults to
//   NeverVerifyPreloadedImages (pkg/kubelet/apis/config/v1beta1/defaults.go,
//   whose gates are the file's featureGates over the command line's);
// - with a --config-dir, every file whose name ends in ".conf" under it,
//   walked as Go's filepath.WalkDir walks (lexical order, sub-folders
//   entered where they sort, a link never followed into a folder: a
//   --config-dir that is itself a link is one entry, not walked), each
//   applied as a JSON merge patch (RFC 7386: a later file wins,
//   featureGates merge key by key, a list replaces the whole list); each
//   must be apiVersion kubelet.config.k8s.io/v1beta1, kind
//   KubeletConfiguration, and the folder must exist, or the kubelet does not
//   start; then defaulted again;
// - then the command line's --feature-gates over the files' featureGates,
//   gate by gate (kubeletConfigFlagPrecedence), and validated with those
//   gates (validation.go: a policy or an allowlist with the gate off, an
//   allowlist under another policy, or an entry the allowlist's rules for
//   the kubelet's version refuse, and the kubelet does not start).
// Read-only, and only these files, each through the bounded reader
// (../util/regular-file.ts: a FIFO or a device named *.conf is refused at
// once, never waited on). Where the files are is found on the node
// (../kubelet/layouts.ts; ./kubelet-watch.ts keeps it current). A missing
// --config file is "cannot tell", never an error of the agent. The kubelet
// reads its files when it starts: this says what they hold now, which is
// what a kubelet started now uses.
import { lstatSync, readdirSync } from 'node:fs';
import * as path from 'node:path';
import { allowlistMatching, allowlistProblems, DEFAULT_VERIFICATION_POLICY, GATE, gateDefault, isVerificationPolicy, offlineVerdict, type AllowlistMatching, type VerificationPolicy } from '../api/kubelet-verification.ts';
import type { KubeletVerificationStatus } from '../api/types.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { mergePatch } from '../util/json.ts';
import { readRegularFileSync, ReadRefusedError } from '../util/regular-file.ts';
import type { Plan } from './plan.ts';

export const KUBELET_CONFIG_API_VERSION = 'kubelet.config.k8s.io/v1beta1';
export const KUBELET_CONFIG_KIND = 'KubeletConfiguration';
/** The kubelet's drop-in suffix (server.go dropinFileExtension). */
const DROPIN_EXTENSION = '.conf';
/** A kubelet configuration file larger than this is not read (no real one comes near). */
const MAX_FILE_BYTES = 1024 * 1024;
/** A --config-dir holding more drop-ins than this is not read. */
const MAX_DROPINS = 1024;

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
  /** How the kubelet's version matches the allowlist with an image. */
  matching: AllowlistMatching;
  /** Where the policy comes from (a file, or the kubelet's default), or why it is Invalid or Unknown. */
  source: string;
}

/** The kubelet's files, as this process sees them, and its command line's gates. */
export interface KubeletFiles {
  /** The kubelet's --config file; undefined: none. */
  configFile?: string;
  /** The kubelet's --config-dir; undefined: none. */
  configDir?: string;
  /** The kubelet is started with configDir: a folder that is not there stops it. False: missing means no drop-ins. */
  configDirRequired?: boolean;
  /** The --feature-gates of the kubelet's command line. */
  featureGates?: Record<string, boolean>;
  /** A path as a person on the node names it (the host's path of one seen under --host-root). */
  onHost?: (p: string) => string;
}

type Doc = Record<string, unknown>;
const isDoc = (v: unknown): v is Doc => typeof v === 'object' && v !== null && !Array.isArray(v);

function gateIn(doc: Doc): boolean | undefined {
  const gates = doc.featureGates;
  const v = isDoc(gates) ? gates[GATE] : undefined;
  return typeof v === 'boolean' ? v : undefined;
}

class Unreadable extends Error {}

/** The kubelet does not start with these files. */
class Refused extends Error {}

const codeOf = (e: unknown) => (e as NodeJS.ErrnoException).code;

/** One file's single document as plain data; undefined when the file does not exist. */
function readDoc(file: string, shown: string): Doc | undefined {
  let text: string;
  try {
    text = readRegularFileSync(file, { maxBytes: MAX_FILE_BYTES, shownAs: shown });
  } catch (e) {
    if (codeOf(e) === 'ENOENT') return undefined;
    if (e instanceof ReadRefusedError) throw new Unreadable(e.message);
    throw new Unreadable(`cannot read ${shown}: ${codeOf(e) ?? (e as Error).message}`);
  }
  const docs = parseYamlDocuments(text);
  const first = docs[0];
  if (!first) return {};
  if ('error' in first) throw new Unreadable(`${shown}: ${first.error}`);
  if (!isDoc(first.value)) throw new Unreadable(`${shown}: not a KubeletConfiguration object`);
  return first.value;
}

/** Go's filepath.Ext: from the last dot of the base name (".conf" itself included). */
function extension(name: string): string {
  const dot = name.lastIndexOf('.');
  return dot < 0 ? '' : name.slice(dot);
}

/**
 * The drop-in files under `dir` in the kubelet's order, as filepath.WalkDir
 * visits them: lstat(2) of the root (a link is not followed, so a linked
 * folder is one entry, not walked), entries sorted by name, a folder
 * entered where it sorts (a link to one is an entry of its own). A name
 * ending in ".conf" that is no folder is a drop-in. Throws "missing" when
 * the root does not exist.
 */
export function dropinFiles(dir: string): string[] {
  let root;
  try {
    root = lstatSync(dir);
  } catch (e) {
    if (codeOf(e) === 'ENOENT' || codeOf(e) === 'ENOTDIR') throw new MissingFolder(dir);
    throw new Unreadable(`cannot read the folder ${dir}: ${codeOf(e) ?? (e as Error).message}`);
  }
  if (!root.isDirectory()) return extension(path.basename(dir)) === DROPIN_EXTENSION ? [dir] : [];
  const out: string[] = [];
  walk(dir, out);
  return out;
}

class MissingFolder extends Error {
  readonly dir: string;
  constructor(dir: string) {
    super(`${dir} does not exist`);
    this.dir = dir;
  }
}

function walk(dir: string, out: string[]): void {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    throw new Unreadable(`cannot read the folder ${dir}: ${codeOf(e) ?? (e as Error).message}`);
  }
  // WalkDir sorts by name (byte order), and descends into a folder where it sorts.
  entries.sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)));
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (extension(e.name) === DROPIN_EXTENSION) out.push(p);
    if (out.length > MAX_DROPINS) throw new Unreadable(`more than ${MAX_DROPINS} drop-ins under ${dir}: not read`);
  }
}

/** What validation.go refuses, or undefined. */
function invalidity(doc: Doc, gateOn: boolean, matching: AllowlistMatching): string | undefined {
  const policy = doc.imagePullCredentialsVerificationPolicy;
  const list = doc.preloadedImagesVerificationAllowlist;
  const hasList = Array.isArray(list) && list.length > 0;
  if (!gateOn) {
    if (policy !== undefined && policy !== '') return `imagePullCredentialsVerificationPolicy is set while the gate ${GATE} is off`;
    if (hasList) return `preloadedImagesVerificationAllowlist is set while the gate ${GATE} is off`;
    return undefined;
  }
  if (!isVerificationPolicy(policy)) return `imagePullCredentialsVerificationPolicy ${JSON.stringify(policy ?? '')} is not one of the four policies`;
  if (list !== undefined && list !== null && !Array.isArray(list)) return 'preloadedImagesVerificationAllowlist is not a list';
  if (hasList && policy !== 'NeverVerifyAllowlistedImages') return 'preloadedImagesVerificationAllowlist is set under another policy than NeverVerifyAllowlistedImages';
  if (hasList && list.some((e) => typeof e !== 'string')) return 'preloadedImagesVerificationAllowlist holds something other than strings';
  const problems = hasList ? allowlistProblems(list as string[], matching) : [];
  return problems.length > 0 ? `preloadedImagesVerificationAllowlist: ${problems[0]}` : undefined;
}

/** The configuration as the kubelet merges and defaults it, and the file that last named the policy. */
function merged(files: KubeletFiles, gate: { on: boolean }, shown: (p: string) => string): { doc: Doc; source: string } | undefined {
  const cli = files.featureGates?.[GATE];
  const base = files.configFile ? readDoc(files.configFile, shown(files.configFile)) : undefined;
  let dropins: string[] = [];
  let walked = false;
  if (files.configDir) {
    try {
      dropins = dropinFiles(files.configDir);
      walked = true;
    } catch (e) {
      if (!(e instanceof MissingFolder)) throw e;
      if (files.configDirRequired) throw new Refused(`the kubelet's --config-dir ${shown(files.configDir)} does not exist`);
    }
  }
  if (base === undefined && !walked) return undefined;
  let source = "the kubelet's default";
  // Without a --config file the kubelet starts from its built-in defaults, made before its flags are read.
  let doc: Doc = base ?? {};
  if (base && 'imagePullCredentialsVerificationPolicy' in base) source = shown(files.configFile!);
  const defaulted = (d: Doc, gateOn: boolean) => (gateOn && !d.imagePullCredentialsVerificationPolicy ? { ...d, imagePullCredentialsVerificationPolicy: DEFAULT_VERIFICATION_POLICY } : d);
  doc = defaulted(doc, base ? (gateIn(base) ?? cli ?? gate.on) : gate.on);
  if (!walked) return { doc, source };
  for (const file of dropins) {
    const patch = readDoc(file, shown(file)) ?? {};
    if (patch.apiVersion !== KUBELET_CONFIG_API_VERSION || patch.kind !== KUBELET_CONFIG_KIND) {
      throw new Refused(`${shown(file)} is not apiVersion ${KUBELET_CONFIG_API_VERSION}, kind ${KUBELET_CONFIG_KIND}`);
    }
    if ('imagePullCredentialsVerificationPolicy' in patch) source = shown(file);
    doc = mergePatch(doc, patch) as Doc;
  }
  const after = defaulted(doc, gateIn(doc) ?? cli ?? gate.on);
  if (after !== doc) source = "the kubelet's default";
  return { doc: after, source };
}

/**
 * The policy a kubelet of `kubeletVersion` started now would use, from its
 * --config file, --config-dir drop-ins and --feature-gates. Never throws.
 */
export function readKubeletVerification(files: KubeletFiles, kubeletVersion?: string): KubeletVerificationReading {
  const matching = allowlistMatching(kubeletVersion);
  const shown = files.onHost ?? ((p: string) => p);
  const reading = (policy: KubeletVerificationReading['policy'], source: string, allowlist: string[] = []): KubeletVerificationReading => ({ policy, allowlist, matching, source });
  const gate = gateDefault(kubeletVersion);
  try {
    const read = [files.configFile, files.configDir].filter((p): p is string => Boolean(p)).map(shown).join(' and ');
    const found = merged(files, gate, shown);
    if (!found) return reading('Unknown', read ? `no kubelet configuration at ${read}` : 'no kubelet configuration paths given');
    if (!gate.known) return reading('Off', `kubelet ${kubeletVersion}: no credential verification before 1.33`);
    const { doc, source } = found;
    const on = files.featureGates?.[GATE] ?? gateIn(doc) ?? gate.on;
    const bad = invalidity(doc, on, matching);
    if (bad) return reading('Invalid', `${bad}: the kubelet does not start`);
    if (!on) return reading('Off', `the gate ${GATE} is off`);
    const list = doc.preloadedImagesVerificationAllowlist;
    return reading(doc.imagePullCredentialsVerificationPolicy as VerificationPolicy, source, Array.isArray(list) ? (list as string[]) : []);
  } catch (e) {
    if (e instanceof Refused) return reading('Invalid', `${e.message}: the kubelet does not start`);
    return reading('Unknown', e instanceof Unreadable ? e.message : String(e));
  }
}

/** Sets named in the status's `refuses`; the rest are counted. */
export const REFUSES_NAMED = 10;

/**
 * The sets that select this node with a pinned image the policy verifies,
 * by name (a static one as "name (static)"), sorted. The image is taken as
 * the set spells it: a pod spelling it otherwise is matched against the
 * allowlist as it spells it.
 */
export function refusedSets(reading: KubeletVerificationReading, plan: Pick<Plan, 'sets'>): string[] {
  if (!isVerificationPolicy(reading.policy)) return [];
  const policy = reading.policy;
  return plan.sets
    .filter((s) => s.selection === 'selected' && s.references.some((r) => offlineVerdict(policy, reading.allowlist, r.reference, reading.matching) === 'verified'))
    .map((s) => (s.source === 'static' ? `${s.name} (static)` : s.name))
    .sort();
}

/** The node status's kubeletVerification: the policy, its source, and the first REFUSES_NAMED of `refused` (the rest counted). */
export function verificationStatus(reading: KubeletVerificationReading, refused: readonly string[], source = reading.source): KubeletVerificationStatus {
  const out: KubeletVerificationStatus = { policy: reading.policy, source };
  if (refused.length > 0) out.refuses = refused.slice(0, REFUSES_NAMED);
  if (refused.length > REFUSES_NAMED) out.refusesMore = refused.length - REFUSES_NAMED;
  return out;
}
