// Pull secrets named by sets (spec.pullSecrets): Secrets of type
// kubernetes.io/dockerconfigjson (key .dockerconfigjson) or the legacy
// kubernetes.io/dockercfg (key .dockercfg) in the agents' own namespace,
// read through one list+watch of that namespace's Secrets (./kube.ts,
// started only once a set names one), so a changed secret is used from the
// next pull on, without a restart. Decoded as the kubelet decodes a pod's
// pull secrets (pkg/credentialprovider/secrets/secrets.go): all the named
// secrets of an image make one keyring, tried before the node's own
// credentials. Unlike the kubelet, which skips a missing or mistyped
// secret and fails every pull on a malformed one, a secret that cannot be
// used is a problem of its own, named with why, which makes its sets
// Degraded (PullSecretInvalid) while their images are still pulled with
// whatever credentials remain, and no pin is touched. No message quotes a
// secret's content.
import type { PullAuth } from '../cri/runtime.ts';
import { decodeDockerAuths, DockerConfigError, scrubSecrets } from '../registry/auth.ts';
import { Keyring, type Credential } from '../registry/keyring.ts';

export const DOCKER_CONFIG_JSON = 'kubernetes.io/dockerconfigjson';
export const DOCKER_CFG = 'kubernetes.io/dockercfg';
/** The data key each pull-secret type keeps its credentials under. */
export const PULL_SECRET_KEYS: Readonly<Record<string, string>> = { [DOCKER_CONFIG_JSON]: '.dockerconfigjson', [DOCKER_CFG]: '.dockercfg' };

/** What the agent keeps of a Secret: its name, type and, for the two pull-secret types, their one key. */
export interface SecretLike {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string; uid?: string };
  type?: string;
  /** base64, as the API serves it. */
  data?: Record<string, string>;
}

/** The Secrets of the agents' namespace, as a list+watch holds them. */
export interface SecretStore {
  readonly namespace: string;
  /** Start the list+watch (once; later calls do nothing). */
  watch(): void;
  readonly synced: boolean;
  get(name: string): SecretLike | undefined;
  /** Resolves true once the Secrets are listed, false if that takes longer than `ms`. */
  whenSynced(ms: number): Promise<boolean>;
}

/** Keeps of a Secret only what a pull secret needs; other types keep no data at all. */
export function pullSecretView(o: SecretLike): SecretLike {
  const key = o.type ? PULL_SECRET_KEYS[o.type] : undefined;
  const md = o.metadata ?? {};
  const value = key ? o.data?.[key] : undefined;
  return {
    metadata: { name: md.name, namespace: md.namespace, resourceVersion: md.resourceVersion, uid: md.uid },
    type: o.type,
    ...(key && value !== undefined ? { data: { [key]: value } } : {}),
  };
}

type Decoded = { entries: [string, PullAuth][]; secrets: string[] } | { problem: string };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A pull secret's credentials, or why it cannot be used (never quoting its content). */
export function decodePullSecret(s: SecretLike): Decoded {
  const type = s.type || 'Opaque';
  const key = PULL_SECRET_KEYS[type];
  if (!key) return { problem: `is of type ${type}, not ${DOCKER_CONFIG_JSON} (or the legacy ${DOCKER_CFG})` };
  const raw = s.data?.[key];
  if (!raw) return { problem: `is malformed: it has no ${key}` };
  let doc: unknown;
  try {
    doc = JSON.parse(Buffer.from(raw, 'base64').toString('utf8'));
  } catch {
    return { problem: `is malformed: ${key} is not JSON` };
  }
  if (!isObject(doc)) return { problem: `is malformed: ${key} is not a JSON object` };
  try {
    const { entries, secrets } = decodeDockerAuths(type === DOCKER_CONFIG_JSON ? doc.auths : doc, true);
    if (entries.length === 0) return { problem: `holds no registry credentials: ${key} has no entry with a username and password${type === DOCKER_CONFIG_JSON ? ' under "auths"' : ''}` };
    return { entries, secrets };
  } catch (e) {
    if (e instanceof DockerConfigError) return { problem: `is malformed: ${key}: ${e.message}` };
    throw e;
  }
}

export class PullSecrets {
  readonly store: SecretStore | null;
  /** Decoded secrets by name, with the resourceVersion they were decoded at. */
  private readonly decoded = new Map<string, { rv: string | undefined; d: Decoded }>();
  private readonly secrets = new Set<string>();
  private firstList: Promise<boolean> | undefined;

  constructor(store: SecretStore | null) {
    this.store = store;
  }

  get namespace(): string | undefined {
    return this.store?.namespace;
  }

  private decode(name: string): Decoded {
    const s = this.store?.get(name);
    if (!s) return { problem: 'does not exist' };
    const rv = s.metadata?.resourceVersion;
    const hit = this.decoded.get(name);
    if (hit && hit.rv === rv && rv !== undefined) return hit.d;
    const d = decodePullSecret(s);
    if ('secrets' in d) for (const x of d.secrets) this.secrets.add(x);
    this.decoded.set(name, { rv, d });
    return d;
  }

  /** Why the named secret cannot be used now, or undefined when it can. */
  problem(name: string): string | undefined {
    const what = `pull secret ${this.store ? `${this.store.namespace}/` : ''}${name}`;
    if (!this.store) return `${what} cannot be read: the agent runs without an API server (no kubeconfig), and pull secrets are read from it`;
    if (!this.store.synced) return `${what} cannot be read yet: the Secrets of ${this.store.namespace} have not been listed (the agent needs get, list and watch on Secrets there: deploy/agent/rbac.yaml)`;
    const d = this.decode(name);
    return 'problem' in d ? `${what} ${d.problem}` : undefined;
  }

  /**
   * Waits (up to `ms`, once: every caller shares that wait) for the first
   * list, so the first pulls of a set that names a secret use it. A list
   * that keeps failing costs that wait once, then the set says why.
   */
  async ready(ms: number): Promise<void> {
    if (!this.store || this.store.synced) return;
    this.store.watch();
    this.firstList ??= this.store.whenSynced(ms);
    await this.firstList;
  }

  /** The usable ones of the named secrets, as one keyring, looked up for an image (host/path). */
  lookup(names: readonly string[], image: string): Credential[] {
    if (!this.store?.synced) return [];
    const keyring = new Keyring();
    for (const name of names) {
      const d = this.decode(name);
      if ('entries' in d) keyring.add(d.entries, (key) => `pull secret ${this.store!.namespace}/${name} (entry ${key})`);
    }
    return keyring.lookup(image);
  }

  scrub(text: string): string {
    return scrubSecrets(text, [...this.secrets]);
  }
}
