// Between a change of the sets and its reconcile lies the settle time
// (DEBOUNCE_MS), where the agent would otherwise wait idle. The look ahead
// uses it: it reads the sets as they are now (nothing logged or
// remembered), plans them (pure), and has the pull admission ask for what
// the reconcile will wait on before its first pull: the disk check and the
// sizes of the images the sets may download. The reconcile still decides
// everything from its own observation; it finds those answers made or in
// flight (the size estimator joins a request already made and keeps what a
// reference by digest holds).
import type { Logger } from 'pino';
import { errMessage } from '../util/problem-log.ts';
import type { AgentCredentials } from './image-credentials.ts';
import type { SetSources } from './observe.ts';
import { planReconcile } from './plan.ts';
import type { Presence } from './presence.ts';
import type { PullAdmission } from './pull-admission.ts';

export class Lookahead {
  private readonly sets: SetSources;
  private readonly admission: PullAdmission;
  private readonly presence: Presence;
  private readonly log: Logger;
  private readonly credentials: AgentCredentials | null | undefined;
  private running = false;
  private again = false;

  constructor(p: { sets: SetSources; admission: PullAdmission; presence: Presence; log: Logger; credentials?: AgentCredentials | null }) {
    this.credentials = p.credentials;
    this.sets = p.sets;
    this.admission = p.admission;
    this.presence = p.presence;
    this.log = p.log;
  }

  /** The sets changed: look ahead now; a change seen while a look ahead runs is looked at once it is done. */
  request(): void {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    void this.run();
  }

  private async run(): Promise<void> {
    try {
      do {
        this.again = false;
        const observed = await this.sets.peek();
        const plan = planReconcile({ ...observed, currentPins: [], carriedPins: [] });
        // The sizes are asked for with the credentials of the sets as they are now (their pull secrets).
        this.credentials?.notePlan(plan);
        this.admission.lookahead(plan, this.presence.knownPresent);
      } while (this.again);
    } catch (e) {
      // Nothing depends on it: the reconcile observes and asks for itself.
      this.log.debug({ err: errMessage(e) }, 'look ahead failed');
    } finally {
      this.running = false;
    }
  }
}
