// `pinset agent --drop-pins`: remove pinset's pins from this node, once,
// for a node whose agent is gone (uninstalled, or never coming back). It
// runs the agent's own pin backend with nothing to pin:
// - CRI-O: the agent's drop-in is removed (an empty plan removes it, see
//   CrioPins.stage), CRI-O reloaded and the reload confirmed by reading
//   `pinned` back; other drop-ins and crio.conf stay as they are;
// - containerd: pinset's labels (pinset.dev/pinned and the pin label beside
//   it) removed from the records that carry pinset.dev/pinned; a pin set by
//   hand (the pin label without pinset's) stays.
// Then one ListImages confirms through CRI's `pinned`, which is what the
// kubelet's image garbage collection reads: each image pinset pinned is
// reported unpinned, or still pinned by something that is not pinset's
// (said, with what). It takes the node lock first, so it never races a
// running agent; with one running it waits up to --lock-timeout and exits 3.
// Exit 0 when every pin of pinset's is gone, 1 when one could not be
// removed or confirmed, 2 on a usage or configuration error.
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { CriImageRuntime } from '../../cri/client.ts';
import type { ImageRuntime, RuntimeImage, RuntimeInfo } from '../../cri/runtime.ts';
import type { PinBackend, PinRemoval } from '../../pins/backend.ts';
import { helpText, parseFlags, type FlagSpec } from '../../util/flags.ts';
import { createLogger } from '../../util/log.ts';
import { errMessage } from '../../util/problem-log.ts';
import { RetryGate } from '../../util/retry.ts';
import { AGENT_FLAGS } from '../agent-flags.ts';
import { lockConfig, pinsConfig, profileConfig, type LockConfig, type ProfileConfig } from '../boot/config.ts';
import { nodeLock } from '../boot/node-lock-place.ts';
import { nodeProfile, type NodeProfile } from '../boot/node-profile.ts';
import { pinKit, type PinKit } from '../boot/pin-kit.ts';
import { describeHolder } from '../node-lock.ts';
import { RuntimeObserver } from '../runtime-state.ts';

/** Exit status when a running agent held the node lock for all of --lock-timeout. */
export const EXIT_AGENT_RUNNING = 3;

/** The agent's flags that --drop-pins reads. */
const DROP_PINS_READS: ReadonlySet<string> = new Set(['node-name', 'cri-endpoint', 'host-root', 'pin-backend', 'state-dir', 'crio-dropin-dir', 'reload', 'crio-unit', 'reload-confirm-timeout', 'lock-timeout', 'log-level', 'drop-pins']);

/** The agent's flags that --drop-pins reads; the node's name is the host's unless given. */
export const DROP_PINS_FLAGS: readonly FlagSpec[] = AGENT_FLAGS.filter((s) => DROP_PINS_READS.has(s.name)).map((s) =>
  s.name === 'node-name' ? { ...s, required: false, help: 'name of this node, for the node lock\'s record (default: the host name)' } : s,
);

/**
 * The agent's other flags, accepted so that the agent's own command line (a
 * DaemonSet's args, a unit's) works as it is, and ignored: any value, no
 * environment twin read.
 */
const IGNORED_AGENT_FLAGS: readonly FlagSpec[] = AGENT_FLAGS.filter((s) => !DROP_PINS_READS.has(s.name)).map((s) => ({
  name: s.name,
  type: s.type === 'bool' ? 'bool' : 'string',
  allowEmpty: true,
  help: 'accepted and ignored',
}));

const SUMMARY = `Removes pinset's pins from this node once, and exits: the agent's CRI-O drop-in
(CRI-O reloaded), or pinset's labels on containerd's images. Pins that are not
pinset's (other drop-ins, crio.conf, labels set by hand) stay. Confirms through
CRI that the images are no longer pinned. Run it on a node whose agent is gone
(after \`pinset uninstall\`), by hand or as the Job in deploy/drop-pins/. The agent's
other flags are accepted and ignored, so its own command line works as it is.`;

interface DropContext {
  info: RuntimeInfo;
  runtime: ImageRuntime;
  logger: Logger;
  out: (line: string) => void;
}

/** The node's runtime as the agent finds it (or as the flags say), and what it answered; or why nothing can be done (exit 1). */
async function reachRuntime(cfg: ProfileConfig, out: (line: string) => void): Promise<{ profile: NodeProfile; runtime: ImageRuntime; info: RuntimeInfo } | undefined> {
  const profile = await nodeProfile(cfg);
  if (profile.problem) {
    out(`${profile.problem}; nothing was changed`);
    return undefined;
  }
  const runtime = new CriImageRuntime(profile.criEndpoint);
  try {
    return { profile, runtime, info: await runtime.version() };
  } catch (e) {
    out(`cannot reach the container runtime at ${profile.criEndpoint}: ${errMessage(e)}; nothing was changed`);
    runtime.close();
    return undefined;
  }
}

export async function runDropPins(argv: string[]): Promise<number> {
  const { values: f } = parseFlags([...DROP_PINS_FLAGS, ...IGNORED_AGENT_FLAGS], argv);
  if (f.help) {
    process.stdout.write(helpText('pinset agent --drop-pins [flags]', SUMMARY, DROP_PINS_FLAGS));
    return 0;
  }
  // The sections of the agent's configuration it needs, from its own flags, once.
  const nodeName = String(f['node-name'] || hostname());
  const cfg = { profile: profileConfig(f), pins: pinsConfig(f), lock: lockConfig(f, nodeName) };
  // stdout carries the report; logs go to stderr.
  const logger = createLogger({ level: String(f['log-level']), base: { node: nodeName }, destination: process.stderr });
  const out = (line: string) => process.stdout.write(`${line}\n`);
  const reached = await reachRuntime(cfg.profile, out);
  if (!reached) return 1;
  const { profile, runtime, info } = reached;
  try {
    return await withNodeLock(cfg.lock, logger, out, async () => {
      const kit = await pinKit(profile, cfg.pins, { runtime, logger });
      try {
        return await dropPins({ info, runtime, logger, out }, kit);
      } finally {
        kit.close();
      }
    });
  } finally {
    runtime.close();
  }
}

/** Runs `work` with the node lock held (as the agent takes it: never beside a running agent); exit 3 when an agent held it for all of --lock-timeout, 2 when it cannot be taken. */
async function withNodeLock(cfg: LockConfig, logger: Logger, out: (line: string) => void, work: () => Promise<number>): Promise<number> {
  const lock = nodeLock(cfg);
  let locked: boolean;
  try {
    locked = await lock.acquire({ timeoutMs: cfg.timeoutMs, onWait: (h, file) => logger.warn({ lock: file, holder: h }, `${describeHolder(h)} holds the node lock; waiting up to --lock-timeout`) });
  } catch (e) {
    out(`cannot take the node lock ${lock.path}: ${errMessage(e)}; nothing was changed`);
    return 2;
  }
  if (!locked) {
    out(
      `a pinset agent is running on this node (it held the node lock ${lock.path} for all of --lock-timeout); nothing was changed. ` +
        'It keeps the pins its sets ask for: delete the sets (or run `pinset uninstall`), or stop the agent first (its DaemonSet, or `systemctl stop pinset-agent`)',
    );
    return EXIT_AGENT_RUNNING;
  }
  try {
    return await work();
  } finally {
    lock.release();
  }
}

async function dropPins(c: DropContext, kit: PinKit): Promise<number> {
  const backend = kit.removal(c.info);
  if (typeof backend === 'string') {
    c.out(backend);
    return 0;
  }
  try {
    return await removeAndConfirm(c, backend);
  } finally {
    backend.close();
  }
}

/** Nothing planned: CRI-O's file goes (and CRI-O is reloaded), containerd's own labels go; then CRI says what is still pinned. */
async function removeAndConfirm(c: DropContext, backend: PinBackend): Promise<number> {
  const observer = new RuntimeObserver(c.runtime, c.logger, new RetryGate('reaching the container runtime', c.logger));
  const held = await backend.observe();
  const before = await observer.observe();
  if (before.error) {
    c.out(`cannot list the runtime's images: ${before.error}; nothing was changed`);
    return 1;
  }
  // What CRI reported before (the backend refreshes the snapshot as it confirms).
  const pinnedBefore = [...before.view.images];
  await backend.stage([]);
  await backend.sync(before, [], new AbortController().signal);
  const problem = backend.status().problemFor(held.current);
  if (problem) {
    c.out(`${problem.reason}: ${problem.message}`);
    c.out('pinset\'s pins may still be in effect on this node; run `pinset agent --drop-pins` again once the cause is fixed');
    return 1;
  }
  const removal = await backend.removal();
  c.out(removal.done);
  return await confirm(c, pinnedBefore, removal);
}

/**
 * Reads back through CRI every image pinset's pins held (an image pinned
 * before whose name one of them matches: a reference, or on CRI-O a
 * carried pattern); exit 0 when none is still pinned by pinset's alone.
 */
async function confirm(c: DropContext, before: readonly RuntimeImage[], removal: PinRemoval): Promise<number> {
  let now: RuntimeImage[];
  try {
    now = await c.runtime.listImages();
  } catch (e) {
    c.out(`cannot list the runtime's images to confirm: ${errMessage(e)}`);
    return 1;
  }
  const byId = new Map(now.map((i) => [i.id, i]));
  let unpinned = 0;
  const kept: string[] = [];
  const stuck: string[] = [];
  for (const was of before) {
    const name = was.pinned ? removal.heldAs(was) : undefined;
    const img = name === undefined ? undefined : byId.get(was.id);
    if (!img) continue; // not one of pinset's, or gone meanwhile
    const by = img.pinned ? removal.pinnedBy(img) : undefined;
    if (!img.pinned) unpinned++;
    else if (by) kept.push(`${name}: still pinned by ${by}`);
    else stuck.push(name!);
  }
  c.out(`confirmed through CRI: ${unpinned} image(s) no longer pinned${kept.length ? `, ${kept.length} still pinned by a pin that is not pinset's (kept)` : ''}`);
  for (const k of kept) c.out(`  ${k}`);
  if (stuck.length === 0) return 0;
  c.out(`${stuck.length} image(s) still reported pinned with nothing but pinset's removed pin to pin them, first ${stuck[0]}: ${removal.notApplied}`);
  return 1;
}
