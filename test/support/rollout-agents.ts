// Simulated nodes that follow the rollout slot protocol (src/rollout/gate.ts)
// with no agent process around it: each wants one set's images, takes a
// slot through its own RolloutGate, "downloads" for a while, frees the slot.
// A node looks again when its next attempt is due or when its gate says a
// slot was handed over (onChange), as the agent's loop does. Lightweight
// enough to run thousands in one process, against the in-process API server
// (LeaseRolloutSlots) or the in-memory twin; used by
// test/integration/rollout-*.test.ts and bench/scale.ts.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { RolloutGate, type RolloutGateOptions } from '../../src/rollout/gate.ts';
import type { RolloutSet, RolloutSlots } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

export interface SimulatedRolloutOptions {
  /** The node names. */
  nodes: readonly string[];
  set: RolloutSet;
  /** A node's slots (its identity is the node name). */
  slotsFor: (node: string) => RolloutSlots;
  /** How long one node downloads, ms. */
  downloadMs: (node: string) => number;
  /** Gate options for every node (pacing, renewal). */
  gate?: Partial<Omit<RolloutGateOptions, 'slots' | 'logger'>>;
  logger?: Logger;
  /** Give up after this long (ms). */
  timeoutMs?: number;
  /** Called when a node starts and ends downloading (for extra checks). */
  onChange?: (node: string, downloading: boolean, concurrent: number) => void;
  /** Once aborted, nodes still waiting stop (a download under way ends first). */
  signal?: AbortSignal;
}

export interface SimulatedRollout {
  /** The most nodes downloading at the same moment. */
  maxConcurrent: number;
  /** Nodes in the order they finished. */
  finished: string[];
  durationMs: number;
  /** When each download started and ended (ms since epoch), in order. */
  starts: number[];
  ends: number[];
  /** Downloads whose node heard its slot was another's (a renewal found it lost) before the download ended: the node, and ms after its start. */
  lostWhileDownloading: { node: string; afterMs: number }[];
}

/**
 * How long each freed slot stayed free: with `max` slots, the i-th download
 * to end freed the slot the (max + i)-th download to start took (ms each).
 */
export function handoverLatencies(r: Pick<SimulatedRollout, 'starts' | 'ends'>, max: number): number[] {
  const starts = [...r.starts].sort((a, b) => a - b);
  const ends = [...r.ends].sort((a, b) => a - b);
  const out: number[] = [];
  for (let i = 0; i < ends.length && max + i < starts.length; i++) out.push(Math.max(0, starts[max + i]! - ends[i]!));
  return out;
}

/** Run every node until each has downloaded once. */
export async function simulateRollout(opts: SimulatedRolloutOptions): Promise<SimulatedRollout> {
  const logger = opts.logger ?? silentLogger();
  const key = `api/${opts.set.name}`;
  const limits = new Map([[key, opts.set]]);
  const deadline = Date.now() + (opts.timeoutMs ?? 120_000);
  let concurrent = 0;
  let maxConcurrent = 0;
  const finished: string[] = [];
  const starts: number[] = [];
  const ends: number[] = [];
  const started = Date.now();
  const lostWhileDownloading: { node: string; afterMs: number }[] = [];

  const node = async (name: string): Promise<void> => {
    let wake: (() => void) | undefined;
    let woken = false;
    let downloadingSince: number | undefined;
    const gate = new RolloutGate({
      slots: opts.slotsFor(name),
      logger,
      ...opts.gate,
      onLost: (key) => {
        opts.gate?.onLost?.(key);
        if (downloadingSince !== undefined) lostWhileDownloading.push({ node: name, afterMs: Date.now() - downloadingSince });
      },
      onChange: (why) => {
        opts.gate?.onChange?.(why);
        woken = true;
        wake?.();
      },
    });
    const image = { key: `image-of-${opts.set.name}`, sets: [key] };
    const stop = () => wake?.();
    opts.signal?.addEventListener('abort', stop);
    try {
      for (;;) {
        if (opts.signal?.aborted) return;
        if (Date.now() > deadline) throw new Error(`${name} got no slot of ${opts.set.name} in time`);
        woken = false;
        const { allowed } = await gate.admit([image], limits, () => true);
        if (allowed.length > 0) {
          concurrent++;
          maxConcurrent = Math.max(maxConcurrent, concurrent);
          starts.push(Date.now());
          downloadingSince = Date.now();
          opts.onChange?.(name, true, concurrent);
          await sleep(opts.downloadMs(name));
          // Counted out before the slot is freed: the next holder may start at once.
          downloadingSince = undefined;
          concurrent--;
          ends.push(Date.now());
          opts.onChange?.(name, false, concurrent);
          await gate.releaseAll();
          finished.push(name);
          return;
        }
        if (woken) continue;
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, Math.max(5, (gate.nextAttemptAt() ?? Date.now() + 50) - Date.now()));
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
        wake = undefined;
      }
    } finally {
      opts.signal?.removeEventListener('abort', stop);
      await gate.close();
    }
  };

  await Promise.all(opts.nodes.map(node));
  return { maxConcurrent, finished, durationMs: Date.now() - started, starts, ends, lostWhileDownloading };
}
