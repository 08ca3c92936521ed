// Observe the desired state: sets from the API (the list+watch in ./kube.ts)
// and from the static folder (./static.ts), the node's labels, and the
// registry auth file. Faults keep the last observation: a source that
// cannot be read is null (API not listed yet, labels unknown) or held
// (static files), and the plan keeps current pins for it.
import type { Logger } from 'pino';
import type { Labels } from '../api/selector.ts';
import type { PinnedImageSet } from '../api/types.ts';
import type { AuthFile } from '../registry/auth.ts';
import { errMessage, ProblemLog } from '../util/problem-log.ts';
import type { KubeObserver } from './kube.ts';
import type { ObservedSet, Plan, PlanInput } from './plan.ts';
import { StaticSource } from './static.ts';

export interface SetSourcesOptions {
  kube?: KubeObserver | null;
  staticDir: string;
  /** --node-labels: used when the Node cannot be read. */
  flagLabels?: Labels | null;
  authFile?: AuthFile | null;
  logger: Logger;
}

/** Everything the plan needs but the pins. */
export type ObservedSets = Omit<PlanInput, 'currentPins' | 'carriedPins'>;

export class SetSources {
  private readonly o: SetSourcesOptions;
  private readonly staticSource: StaticSource;
  /** Problems that persist are logged when they appear, not on every resync. */
  readonly problems: ProblemLog;

  constructor(o: SetSourcesOptions) {
    this.o = o;
    this.staticSource = new StaticSource(o.staticDir, o.logger);
    this.problems = new ProblemLog(o.logger);
  }

  /** Labels to select sets with: the Node's, else --node-labels, else unknown (null) when an API is in use. */
  private labels(): Labels | null {
    const node = this.o.kube?.currentNode();
    if (node) return node.metadata?.labels ?? {};
    if (this.o.flagLabels) return this.o.flagLabels;
    return this.o.kube ? null : {};
  }

  /** The API's sets, or null while they are not listed. */
  private apiSets(): ObservedSet[] | null {
    const kubeSets = this.o.kube ? this.o.kube.currentSets() : [];
    return kubeSets === null ? null : kubeSets.map((o: PinnedImageSet) => ({ source: 'api', object: o, origin: 'api' }));
  }

  async observe(): Promise<ObservedSets> {
    this.problems.begin();
    // A list or a deletion just seen is taken only once the CRD is known to stand.
    await this.o.kube?.settled();
    const labels = this.labels();
    const apiSets = this.apiSets();
    const apiProblem = apiSets === null ? this.o.kube?.setsProblem() : undefined;
    // The static source logs its files' problems itself, once per change.
    const stat = await this.staticSource.read();
    const auth = this.o.authFile;
    await auth?.refresh().catch((e) => this.problems.warn({ err: errMessage(e) }, 'auth file unreadable; pulling anonymously'));
    if (auth?.problem) this.problems.warn({ file: auth.path }, auth.problem);
    return { labels, apiSets, ...(apiProblem ? { apiProblem } : {}), staticSets: stat.sets, staticProblems: stat.unknown };
  }

  /**
   * The sets as they are now, for a look ahead (./lookahead.ts): nothing
   * logged, refreshed or remembered; the static folder's unreadable files
   * left out.
   */
  async peek(): Promise<ObservedSets> {
    return { labels: this.labels(), apiSets: this.apiSets(), staticSets: await this.staticSource.peek(), staticProblems: [] };
  }

  /** What the plan found wrong with the sets, logged once while it lasts. */
  notePlan(plan: Plan): void {
    if (plan.retained.length > 0) this.problems.warn({ retained: plan.retained.length, why: plan.retainReasons }, 'observation incomplete: keeping current pins');
    for (const s of plan.sets) {
      for (const p of s.invalidImages) this.problems.warn({ set: s.name, source: s.source, field: p.field, err: p.error }, 'invalid image reference: not pinned, not pulled');
      if (s.specErrors.length) this.problems.warn({ set: s.name, source: s.source, errs: s.specErrors }, 'invalid set: not applied');
    }
  }
}
