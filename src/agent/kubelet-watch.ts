// The kubelet's configuration on this node, kept current for the node
// status: where its files are is found under --host-root
// (../kubelet/layouts.ts, as the runtime is found: DESIGN, "The node, found
// rather than configured"), at start and again whenever what that finding
// read may have changed, and what they hold is read as the kubelet reads it
// (./kubelet-config.ts).
//
// What is watched: the folder of every file the finding read (units,
// environment files, the --config file) and every folder it read (unit
// drop-in folders, the --config-dir and its sub-folders), each with a
// watch of its own, not recursively. Node's recursive fs.watch on Linux
// watches each file by its inode and loses a file replaced by rename(2),
// the way a drop-in is written whole; a folder's own watch sees every name
// in it come, go and change. A change is read after a short settle (a
// writer's create and write come as two events), and everything is read
// again every minute besides, for what no watch sees (a folder that did not
// exist yet, a file mounted alone).
import { readdirSync, statSync, watch, type FSWatcher } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { KubeletVerificationStatus } from '../api/types.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import { describeKubeletConfig, findKubeletConfig, type GivenKubeletPaths, type KubeletConfigLocation } from '../kubelet/layouts.ts';
import { hostView } from '../kubelet/host-files.ts';
import { readKubeletVerification, refusedSets, verificationStatus, type KubeletVerificationReading } from './kubelet-config.ts';
import type { Plan } from './plan.ts';

/** How often everything is read again, whatever the watches saw. */
export const KUBELET_CONFIG_REREAD_MS = 60_000;
/** How long after a change is seen the files are read: a writer's create and its write arrive as two events. */
export const KUBELET_CONFIG_SETTLE_MS = 100;
/** Folders watched at most (a --config-dir with many sub-folders). */
const MAX_WATCHED_FOLDERS = 64;

export interface KubeletWatchOptions {
  /** Where the host's /etc, /var/lib and /run are seen. */
  hostRoot: string;
  /** --kubelet-config and --kubelet-config-dir: undefined not given (found), "" none. */
  given: GivenKubeletPaths;
  /** The kubelet's version as its Node reports it (the gate's default and the allowlist's matching depend on it). */
  kubeletVersion: () => string | undefined;
  logger?: Logger | null;
  metrics?: AgentMetrics | null;
  rereadMs?: number;
  settleMs?: number;
}

/** What one finding and reading came to; compared to tell a change. */
interface Current {
  location: KubeletConfigLocation;
  version: string | undefined;
  reading: KubeletVerificationReading;
}

export class KubeletConfigWatch {
  readonly #o: KubeletWatchOptions;
  readonly #onHost: (p: string) => string;
  #location: KubeletConfigLocation | undefined;
  #current: Current | undefined;
  #watchers = new Map<string, FSWatcher>();
  #timer: NodeJS.Timeout | undefined;
  #settle: NodeJS.Timeout | undefined;
  #refreshing: Promise<boolean> | undefined;
  #again = false;
  #onChange: ((why: string) => void) | undefined;
  #stopped = false;

  constructor(o: KubeletWatchOptions) {
    this.#o = o;
    this.#onHost = hostView(o.hostRoot).onHost;
  }

  /** A watch whose layout has been found once (what the agent is handed). */
  static async found(o: KubeletWatchOptions): Promise<KubeletConfigWatch> {
    const w = new KubeletConfigWatch(o);
    await w.refresh();
    return w;
  }

  /** Where the kubelet's files were last found; undefined before the first refresh. */
  get location(): KubeletConfigLocation | undefined {
    return this.#location;
  }

  /** The folders watched now. */
  get watching(): string[] {
    return [...this.#watchers.keys()].sort();
  }

  /**
   * Finds the layout again and reads the files; true when what the status
   * says of them changed. One at a time: a call while one runs waits for
   * it, then runs once more.
   */
  async refresh(): Promise<boolean> {
    if (this.#refreshing) {
      this.#again = true;
      return this.#refreshing;
    }
    this.#refreshing = (async () => {
      let changed = false;
      do {
        this.#again = false;
        changed = (await this.#findAndRead()) || changed;
      } while (this.#again && !this.#stopped);
      return changed;
    })();
    try {
      return await this.#refreshing;
    } finally {
      this.#refreshing = undefined;
    }
  }

  async #findAndRead(): Promise<boolean> {
    const before = this.#current;
    let location: KubeletConfigLocation;
    try {
      location = await findKubeletConfig(this.#o.hostRoot, this.#o.given);
    } catch (e) {
      // Not expected (every read is caught where it is made): the last finding stands until the next look.
      this.#o.logger?.warn({ err: (e as Error).message }, "the kubelet's configuration could not be looked for; the last finding stands");
      return false;
    }
    this.#location = location;
    this.#current = undefined;
    const now = this.#read();
    if (this.#onChange) this.#rewatch();
    const said = (c: Current) => ({ kubelet: describeKubeletConfig(c.location), policy: c.reading.policy, source: c.reading.source, ...(c.location.problems.length ? { problems: c.location.problems } : {}) });
    if (!before) {
      // The Node (and the kubelet's version on it) may not be read yet: the policy is then judged as a 1.35 kubelet's, and again once it is.
      const version = now.version ?? 'not known yet (read as 1.35)';
      this.#o.logger?.info({ ...said(now), kubeletVersion: version }, location.source === 'none' ? "the kubelet's configuration was not found on this node" : "the kubelet's configuration found");
      return false;
    }
    // The allowlist too: the same file may exempt other repositories.
    const key = (c: Current) => JSON.stringify({ ...said(c), allowlist: c.reading.allowlist, matching: c.reading.matching });
    const changed = key(before) !== key(now);
    if (changed) this.#o.logger?.info({ was: said(before), now: said(now) }, "the kubelet's configuration changed");
    return changed;
  }

  /** The files read for the kubelet's current version: again when it changes or after a refresh. */
  #read(): Current {
    const version = this.#o.kubeletVersion();
    if (this.#current && this.#current.version === version) return this.#current;
    const location = this.#location!;
    const reading = readKubeletVerification({ ...location, onHost: this.#onHost }, version);
    this.#current = { location, version, reading };
    return this.#current;
  }

  /** The policy a kubelet started now would use. */
  reading(): KubeletVerificationReading {
    return this.#read().reading;
  }

  /** The node status's kubeletVerification for the sets that select this node; the metric carries every refused set. */
  status(plan: Pick<Plan, 'sets'>): KubeletVerificationStatus {
    const { reading, location } = this.#read();
    const refused = refusedSets(reading, plan);
    this.#o.metrics?.reportKubeletRefused(reading.policy, refused);
    return verificationStatus(reading, refused, statusSource(reading, location));
  }

  /** Watches what the finding read; `onChange` is called when what the status says of it changed. */
  start(onChange: (why: string) => void): void {
    this.#onChange = onChange;
    this.#stopped = false;
    this.#rewatch();
    this.#timer = setInterval(() => this.#look(), this.#o.rereadMs ?? KUBELET_CONFIG_REREAD_MS);
    this.#timer.unref();
  }

  stop(): void {
    this.#stopped = true;
    this.#onChange = undefined;
    clearInterval(this.#timer);
    clearTimeout(this.#settle);
    this.#settle = undefined;
    for (const w of this.#watchers.values()) w.close();
    this.#watchers.clear();
  }

  /** Reads everything again (after the settle time, when a watch saw a change) and says so when the status would change. */
  #look(): void {
    if (this.#stopped) return;
    void this.refresh().then((changed) => {
      if (changed && !this.#stopped) this.#onChange?.("the kubelet's configuration changed");
    });
  }

  #seen(): void {
    if (this.#settle || this.#stopped) return;
    this.#settle = setTimeout(() => {
      this.#settle = undefined;
      this.#look();
    }, this.#o.settleMs ?? KUBELET_CONFIG_SETTLE_MS);
    this.#settle.unref();
  }

  /** The watches for the current finding: new folders watched, folders no longer read let go. */
  #rewatch(): void {
    const wanted = this.#location ? watchedFolders(this.#location) : [];
    for (const [dir, w] of this.#watchers) {
      if (wanted.includes(dir)) continue;
      w.close();
      this.#watchers.delete(dir);
    }
    for (const dir of wanted) {
      if (this.#watchers.has(dir)) continue;
      try {
        const w = watch(dir, { persistent: false }, () => this.#seen());
        w.on('error', () => {
          w.close();
          if (this.#watchers.get(dir) === w) this.#watchers.delete(dir);
          this.#seen();
        });
        this.#watchers.set(dir, w);
      } catch {
        // Gone meanwhile: the next reading finds what is there.
      }
    }
  }
}

/** The status's source: where the policy comes from (or why it cannot be told), then where the kubelet's files were found. */
function statusSource(reading: KubeletVerificationReading, location: KubeletConfigLocation): string {
  const why = reading.policy === 'Unknown' && location.problems.length > 0 ? location.problems.join('; ') : reading.source;
  return location.source === 'none' ? why : `${why}; ${describeKubeletConfig(location)}`;
}

const isFolder = (p: string) => {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
};

/** The existing folders to watch for a finding: each input's folder, each input that is a folder, and the --config-dir's sub-folders. */
export function watchedFolders(location: KubeletConfigLocation): string[] {
  const out = new Set<string>();
  const add = (dir: string) => {
    if (out.size < MAX_WATCHED_FOLDERS && isFolder(dir)) out.add(dir);
  };
  for (const p of location.inputs) {
    add(path.dirname(p));
    add(p);
  }
  const sub = (dir: string) => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory() || out.size >= MAX_WATCHED_FOLDERS) continue;
      out.add(path.join(dir, e.name));
      sub(path.join(dir, e.name));
    }
  };
  if (location.configDir && isFolder(location.configDir)) sub(location.configDir);
  return [...out].sort();
}
