// The agent's credential source (src/registry/credentials.ts), in the
// kubelet's order: for an image, the pull secrets of the sets that want it
// first (./pull-secrets.ts; all of them as one keyring, as a pod's
// imagePullSecrets are), then the node's own credentials (the auth file and
// the credential provider plugins, src/registry/node-credentials.ts). The
// puller, the disk estimate and the registry client all ask here, so each
// tries the same list.
//
// Which sets want an image comes from the last plan: an image named by
// digest is matched to the sets naming that reference; a lookup for
// anything else of a repository (a platform's manifest under an index, a
// blob) to the sets wanting any image of that repository.
import type { Logger } from 'pino';
import type { CredentialSource, ImageCredentials, ImageRef } from '../registry/credentials.ts';
import { ProblemLog } from '../util/problem-log.ts';
import type { Plan } from './plan.ts';
import type { PullSecrets } from './pull-secrets.ts';

/** How long a pull waits for the first list of Secrets once a set names one. */
export const SECRETS_LIST_WAIT_MS = 10_000;

export class AgentCredentials implements CredentialSource {
  private readonly node: CredentialSource;
  private readonly pullSecrets: PullSecrets | null;
  private readonly problems: ProblemLog | null;
  private byReference = new Map<string, string[]>();
  private byRepository = new Map<string, string[]>();
  private secretsOf = new Map<string, string[]>();
  /** Wanted image keys per set key. */
  private imagesOf = new Map<string, string[]>();

  constructor(o: { node: CredentialSource; pullSecrets?: PullSecrets | null; logger?: Logger }) {
    this.node = o.node;
    this.pullSecrets = o.pullSecrets ?? null;
    this.problems = o.logger ? new ProblemLog(o.logger) : null;
  }

  /** Learn which sets want which images, and which secrets they name; the Secrets' watch starts once a set names one. */
  notePlan(plan: Plan): void {
    const byReference = new Map<string, string[]>();
    const byRepository = new Map<string, string[]>();
    const imagesOf = new Map<string, string[]>();
    for (const w of plan.wanted) {
      const add = (m: Map<string, string[]>, k: string) => m.set(k, [...new Set([...(m.get(k) ?? []), ...w.sets])]);
      add(byReference, w.reference.reference);
      add(byRepository, `${w.reference.host}/${w.reference.path}`);
      for (const s of w.sets) imagesOf.set(s, [...(imagesOf.get(s) ?? []), w.key]);
    }
    const secretsOf = new Map<string, string[]>();
    for (const s of plan.sets) if (s.pullSecrets.length > 0 && s.selection !== 'not-selected' && s.specErrors.length === 0) secretsOf.set(s.key, s.pullSecrets);
    this.byReference = byReference;
    this.byRepository = byRepository;
    this.imagesOf = imagesOf;
    this.secretsOf = secretsOf;
    if (secretsOf.size > 0) this.pullSecrets?.store?.watch();
  }

  /** Once a set names a pull secret: wait (once, bounded) for the first list of the Secrets, so the first report and pulls use them. */
  async secretsReady(): Promise<void> {
    if (this.secretsOf.size > 0) await this.pullSecrets?.ready(SECRETS_LIST_WAIT_MS);
  }

  /** Per set key, why one of its pull secrets cannot be used; logged once while it lasts when `log`. */
  setProblems(plan: Plan, log = false): Map<string, string> {
    const out = new Map<string, string>();
    if (log) this.problems?.begin();
    for (const s of plan.sets) {
      const names = this.secretsOf.get(s.key);
      if (!names || !this.pullSecrets) continue;
      const problems = names.map((n) => this.pullSecrets!.problem(n)).filter((p): p is string => p !== undefined);
      if (problems.length === 0) continue;
      out.set(s.key, `${problems[0]}${problems.length > 1 ? ` (and ${problems.length - 1} more of its pull secrets)` : ''}`);
      if (log) this.problems?.warn({ set: s.name, err: problems[0] }, 'pull secret unusable: the set is Degraded; its images are pulled with the other credentials and its pins stay');
    }
    return out;
  }

  /** The wanted images of the sets that name a secret (to retry them at once when it changes). */
  imagesUsingSecret(name: string): string[] {
    const out = new Set<string>();
    for (const [set, names] of this.secretsOf) if (names.includes(name)) for (const k of this.imagesOf.get(set) ?? []) out.add(k);
    return [...out];
  }

  private setsFor(image: ImageRef): string[] {
    const o = image.origin;
    if (!o) return [];
    return (o.digest ? this.byReference.get(`${o.repository}@${o.digest}`) : undefined) ?? this.byRepository.get(o.repository) ?? [];
  }

  async credentialsFor(image: ImageRef, signal?: AbortSignal): Promise<ImageCredentials> {
    const names = [...new Set(this.setsFor(image).flatMap((k) => this.secretsOf.get(k) ?? []))];
    const repo = `${image.host}/${image.path}`;
    let fromSecrets: ImageCredentials['candidates'] = [];
    if (names.length > 0 && this.pullSecrets) {
      await this.pullSecrets.ready(SECRETS_LIST_WAIT_MS);
      fromSecrets = this.pullSecrets.lookup(names, repo);
    }
    const node = await this.node.credentialsFor(image, signal);
    return { candidates: [...fromSecrets, ...node.candidates], failures: node.failures };
  }

  scrub(text: string): string {
    return this.node.scrub(this.pullSecrets ? this.pullSecrets.scrub(text) : text);
  }
}
