// Simulated nodes that follow the rollout slot protocol (src/rollout/gate.ts)
// with no agent process around it: each wants one set's images, takes a
// slot through its own RolloutGate, "downloads" for a while, frees the slot.
// Lightweight enough to run a thousand in one process, against the
// in-process API server (LeaseRolloutSlots) or the in-memory twin; used by
// test/integration/rollout-slots.test.ts and meant for benchmarks.
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
}

export interface SimulatedRollout {
  /** The most nodes downloading at the same moment. */
  maxConcurrent: number;
  /** Nodes in the order they finished. */
  finished: string[];
  durationMs: number;
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
  const started = Date.now();

  const node = async (name: string): Promise<void> => {
    const gate = new RolloutGate({ slots: opts.slotsFor(name), logger, ...opts.gate });
    const image = { key: `image-of-${opts.set.name}`, sets: [key] };
    try {
      for (;;) {
        if (Date.now() > deadline) throw new Error(`${name} got no slot of ${opts.set.name} in time`);
        const { allowed } = await gate.admit([image], limits, () => true);
        if (allowed.length > 0) {
          concurrent++;
          maxConcurrent = Math.max(maxConcurrent, concurrent);
          opts.onChange?.(name, true, concurrent);
          await sleep(opts.downloadMs(name));
          // Counted out before the slot is freed: the next holder may start at once.
          concurrent--;
          opts.onChange?.(name, false, concurrent);
          await gate.releaseAll();
          finished.push(name);
          return;
        }
        await sleep(Math.max(5, (gate.nextAttemptAt() ?? Date.now() + 50) - Date.now()));
      }
    } finally {
      await gate.close();
    }
  };

  await Promise.all(opts.nodes.map(node));
  return { maxConcurrent, finished, durationMs: Date.now() - started };
}
