// The granter's own writes against its watch (./granter.ts): which of the
// two is newer, when both show the same Lease.
//
// A grant's write is answered on one connection, and the watch reports the
// same write (and what follows it) on another, so either can come first:
// - the answer first: the granter plans on the object it wrote at once,
//   and an event the watch still sends of the version the write replaced is
//   older than it (and ignored) until the watch catches up;
// - the watch first: while the write was in flight, the watch may already
//   have shown the object written and what came after it (the node took the
//   slot, renewed it, freed it, or it was deleted). The answer is then
//   older than the picture, and placing it would bring back a slot held by
//   the node for the accept window: a slot freed meanwhile would look held,
//   and the grant planned over it when that window ends would be refused
//   (409, or 404 if deleted) with no event to follow, the slot then left to
//   the nodes' polls.
// The API server's resourceVersions are opaque strings to be compared only
// for equality (Kubernetes API concepts, "Resource versions"), so nothing
// here orders them: the watch delivers one object's versions in order, so
// an event that shows the written version itself (same uid and
// resourceVersion), or the deletion of that object (same uid), while the
// write was in flight means the watch has reached or passed the write, and
// whatever it showed since stands.
import type { LeaseObject } from './lease-slots.ts';

/** What to do with a write's answer. */
export type Answer = 'place' | 'seen' | 'gone';

interface Flight {
  /** Writes of this name in flight. */
  writes: number;
  /** What the watch showed of this name meanwhile: versions, by uid, and deleted uids. */
  shown: Set<string>;
  deleted: Set<string>;
}

const key = (uid: string | undefined, version: string | undefined) => `${uid ?? ''}\u0000${version ?? ''}`;

export class OwnWrites {
  /** By Lease name: the writes in flight. */
  readonly #flights = new Map<string, Flight>();
  /** By Lease name: a write placed in the picture before the watch showed it, and the version it replaced ('' for a create). */
  readonly #ahead = new Map<string, { uid: string; version: string; base: string }>();

  /** A write of `name` is about to be sent. */
  begin(name: string): void {
    const f = this.#flights.get(name);
    if (f) f.writes++;
    else this.#flights.set(name, { writes: 1, shown: new Set(), deleted: new Set() });
  }

  /** The watch shows `l` (added or changed): true when the picture takes it, false when a write of this replica's is newer. */
  seen(l: LeaseObject): boolean {
    const { name, uid, resourceVersion } = l.metadata;
    this.#flights.get(name)?.shown.add(key(uid, resourceVersion));
    const a = this.#ahead.get(name);
    if (a && (resourceVersion ?? '') === a.base) return false;
    this.#ahead.delete(name);
    return true;
  }

  /** The watch shows `l` deleted. */
  gone(l: LeaseObject): void {
    const { name, uid } = l.metadata;
    this.#flights.get(name)?.deleted.add(uid ?? '');
    this.#ahead.delete(name);
  }

  /**
   * A write of `name` was answered with `written` (undefined: it failed,
   * or was undone). `base`: the version it replaced, '' for a create.
   * 'place': the watch has not shown it yet, the picture takes it; 'seen':
   * the watch showed it, and anything after it, already; 'gone': the watch
   * showed it deleted.
   */
  answered(name: string, written: LeaseObject | undefined, base: string): Answer {
    const f = this.#flights.get(name);
    if (f && --f.writes <= 0) this.#flights.delete(name);
    if (!written) return 'seen';
    const { uid, resourceVersion } = written.metadata;
    if (f?.deleted.has(uid ?? '')) return 'gone';
    if (f?.shown.has(key(uid, resourceVersion))) return 'seen';
    this.#ahead.set(name, { uid: uid ?? '', version: resourceVersion ?? '', base });
    return 'place';
  }

  /** Forget every write (this replica stopped leading). */
  clear(): void {
    this.#ahead.clear();
  }
}
