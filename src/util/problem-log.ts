// Warnings logged once while they persist: a problem seen in the previous
// pass is not logged again, one that went away and came back is.
import type { Logger } from 'pino';

export class ProblemLog {
  private readonly log: Logger;
  private before: ReadonlySet<string> = new Set();
  private seen = new Set<string>();
  constructor(log: Logger) {
    this.log = log;
  }
  /** Start a pass: what is not warned of again in it is forgotten. */
  begin(): void {
    this.before = this.seen;
    this.seen = new Set();
  }
  warn(fields: Record<string, unknown>, msg: string): void {
    const key = `${msg}\n${JSON.stringify(fields)}`;
    this.seen.add(key);
    if (!this.before.has(key)) this.log.warn(fields, msg);
  }
}

export function errMessage(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).slice(0, 1000);
}
