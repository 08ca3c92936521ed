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
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { CriImageRuntime } from '../cri/client.ts';
import type { ImageRuntime, RuntimeImage, RuntimeInfo } from '../cri/runtime.ts';
import { ContainerdImages } from '../containerd/images.ts';
import { PIN_LABEL, PIN_VALUE, OWN_LABEL } from '../containerd/label-pins.ts';
import { CrioPins } from '../crio/crio-pins.ts';
import { pinMatches } from '../crio/pin-match.ts';
import { PinFile } from '../crio/pinfile.ts';
import type { createReloader } from '../crio/reload.ts';
import type { PinBackend } from '../pins/backend.ts';
import { helpText, parseFlags, type FlagSpec } from '../util/flags.ts';
import { createLogger } from '../util/log.ts';
import { errMessage } from '../util/problem-log.ts';
import { RetryGate, STEP_RETRY } from '../util/retry.ts';
import { AGENT_FLAGS, profileFlags } from './agent-flags.ts';
import { nodeProfile } from './node-profile.ts';
import { reloaderFor } from './runtime-parts.ts';
import { describeHolder, NodeLock } from './node-lock.ts';
import type { PinBackendFlag } from './pin-choice.ts';
import { pinWiring } from './pin-wiring.ts';
import { RuntimeObserver } from './runtime-state.ts';

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

/** Why an image is still pinned once pinset's pins are gone: what pins it (not pinset's), or undefined. */
type PinnedBy = (img: RuntimeImage) => string | undefined;

export async function runDropPins(argv: string[]): Promise<number> {
  const { values: f } = parseFlags([...DROP_PINS_FLAGS, ...IGNORED_AGENT_FLAGS], argv);
  if (f.help) {
    process.stdout.write(helpText('pinset agent --drop-pins [flags]', SUMMARY, DROP_PINS_FLAGS));
    return 0;
  }
  const nodeName = String(f['node-name'] || hostname());
  // stdout carries the report; logs go to stderr.
  const logger = createLogger({ level: String(f['log-level']), base: { node: nodeName }, destination: process.stderr });
  const out = (line: string) => process.stdout.write(`${line}\n`);
  // The node's runtime as the agent finds it (or as the flags say).
  const profile = await nodeProfile(profileFlags(f));
  if (profile.problem) {
    out(`${profile.problem}; nothing was changed`);
    return 1;
  }
  const endpoint = profile.criEndpoint;
  const dropInDir = profile.dropInDir;
  const reloader = reloaderFor(f, logger);
  const runtime = new CriImageRuntime(endpoint);
  const close = () => {
    runtime.close();
    reloader.close();
  };
  let info: RuntimeInfo;
  try {
    info = await runtime.version();
  } catch (e) {
    out(`cannot reach the container runtime at ${endpoint}: ${errMessage(e)}; nothing was changed`);
    close();
    return 1;
  }
  const flag = f['pin-backend'] as PinBackendFlag;
  const pins = pinWiring({ profile, runtime, logger });
  const lock = new NodeLock(pins.lockPath, { pid: process.pid, host: hostname(), node: nodeName, runsIn: process.env.KUBERNETES_SERVICE_HOST ? 'pod' : 'host', startedAt: new Date().toISOString() });
  let locked: boolean;
  try {
    locked = await lock.acquire({
      timeoutMs: Number(f['lock-timeout']),
      onWait: (h) => logger.warn({ lock: lock.path, holder: h }, `${describeHolder(h)} holds the node lock; waiting up to --lock-timeout`),
    });
  } catch (e) {
    out(`cannot take the node lock ${lock.path}: ${errMessage(e)}; nothing was changed`);
    close();
    return 2;
  }
  if (!locked) {
    out(
      `a pinset agent is running on this node (it held the node lock ${lock.path} for all of --lock-timeout); nothing was changed. ` +
        'It keeps the pins its sets ask for: delete the sets (or run `pinset uninstall`), or stop the agent first (its DaemonSet, or `systemctl stop pinset-agent`)',
    );
    close();
    return EXIT_AGENT_RUNNING;
  }
  try {
    return await dropPins({ info, runtime, reloader, flag, dropInDir, pins, endpoint, logger, out, pinWaitTimeoutMs: Number(f['reload-confirm-timeout']) });
  } finally {
    lock.release();
    close();
  }
}

interface DropContext {
  info: RuntimeInfo;
  runtime: ImageRuntime;
  reloader: ReturnType<typeof createReloader>;
  flag: PinBackendFlag;
  dropInDir: string;
  pins: ReturnType<typeof pinWiring>;
  endpoint: string;
  logger: Logger;
  out: (line: string) => void;
  pinWaitTimeoutMs: number;
}

/** The backend of the runtime that answered, whatever its version: labels set by a containerd that does not honour them are removed too. */
async function backendFor(c: DropContext): Promise<{ backend: PinBackend; pinFile?: PinFile } | string> {
  const name = c.info.runtimeName.toLowerCase();
  const kind = c.flag === 'auto' ? (name === 'cri-o' ? 'crio' : name === 'containerd' ? 'containerd' : 'none') : c.flag;
  if (kind === 'crio') {
    if (!c.pins.usesDropIn && !existsSync(c.dropInDir)) return `CRI-O's drop-in folder ${c.dropInDir} is not there: no pinset drop-in to remove`;
    const pinFile = await PinFile.open(c.dropInDir);
    const backend = new CrioPins({
      pinFile,
      reloader: c.reloader,
      runtime: c.runtime,
      logger: c.logger,
      pinWaitTimeoutMs: c.pinWaitTimeoutMs,
      retryPolicy: STEP_RETRY,
      now: Date.now,
      onWritable: () => {},
    });
    return { backend, pinFile };
  }
  if (kind === 'containerd' && c.pins.containerd) return { backend: c.pins.containerd.make() };
  return `the runtime ${c.info.runtimeName} ${c.info.runtimeVersion} holds no pins of pinset's (${kind === 'none' ? '--pin-backend none' : 'no pin backend for it'}): nothing to remove`;
}

async function dropPins(c: DropContext): Promise<number> {
  const chosen = await backendFor(c);
  if (typeof chosen === 'string') {
    c.out(chosen);
    return 0;
  }
  const { backend, pinFile } = chosen;
  const signal = new AbortController().signal;
  try {
    const observer = new RuntimeObserver(c.runtime, c.logger, new RetryGate('reaching the container runtime', c.logger));
    const held = await backend.observe();
    const heldBefore = backend.status().held;
    const fileExisted = pinFile ? existsSync(pinFile.path) : false;
    const before = await observer.observe();
    if (before.error) {
      c.out(`cannot list the runtime's images: ${before.error}; nothing was changed`);
      return 1;
    }
    // What CRI reported before (the backend refreshes the snapshot as it confirms).
    const pinnedBefore = [...before.view.images];
    // Nothing planned: CRI-O's file goes (and CRI-O is reloaded), containerd's own labels go.
    await backend.stage([]);
    await backend.sync(before, [], signal);
    const st = backend.status();
    const problem = st.problemFor(held.current);
    if (problem) {
      c.out(`${problem.reason}: ${problem.message}`);
      c.out('pinset\'s pins may still be in effect on this node; run `pinset agent --drop-pins` again once the cause is fixed');
      return 1;
    }
    if (backend.name === 'crio') {
      c.out(fileExisted ? `removed ${pinFile!.path} (${held.current.length} pin(s)); CRI-O ${c.reloader.mode === 'none' ? 'not reloaded (--reload none)' : `reloaded (${c.reloader.mode})`}` : `no pinset drop-in in ${c.dropInDir}: nothing to remove`);
    } else {
      c.out(heldBefore ? `removed pinset's labels (${OWN_LABEL}, ${PIN_LABEL}) from ${heldBefore} image record(s) in containerd` : 'no containerd image carries pinset\'s label: nothing to remove');
    }
    // Confirmation through CRI: every image pinset pinned, as CRI reports it now.
    const pinnedBy = backend.name === 'crio' ? await crioPinnedBy(pinFile!) : await containerdPinnedBy(c.endpoint);
    return await confirm(c, held.current, pinnedBefore, pinnedBy);
  } finally {
    backend.close();
  }
}

/** What still pins an image on CRI-O: the last file that sets pinned_images (CRI-O keeps only its list), or the pause image. */
async function crioPinnedBy(pinFile: PinFile): Promise<PinnedBy> {
  const scan = await pinFile.scan();
  const last = scan.overriding.at(-1) ?? scan.before.at(-1);
  return (img) => {
    const names = [...img.repoTags, ...img.repoDigests];
    if (scan.pauseImage && names.some((n) => pinMatches(scan.pauseImage, n))) return `CRI-O's pause image (${scan.pauseImage})`;
    const pattern = last?.pins.find((p) => names.some((n) => pinMatches(p, n)));
    return pattern && last ? `${last.file} (pinned_images "${pattern}")` : undefined;
  };
}

/** What still pins an image on containerd: a record of it with the pin label and without pinset's. */
async function containerdPinnedBy(endpoint: string): Promise<PinnedBy> {
  const images = new ContainerdImages(endpoint);
  let records: Awaited<ReturnType<ContainerdImages['list']>> = [];
  try {
    records = (await images.list([`labels."${PIN_LABEL}"`])).filter((r) => r.labels[PIN_LABEL] === PIN_VALUE && !(OWN_LABEL in r.labels));
  } catch {
    records = [];
  } finally {
    images.close();
  }
  return (img) => {
    const id = img.id.includes(':') ? img.id : `sha256:${img.id}`;
    const digests = new Set(img.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1)));
    const r = records.find((x) => x.name === id || (x.target && digests.has(x.target.digest)));
    return r ? `the label ${PIN_LABEL}=${PIN_VALUE} on ${r.name} (not pinset's)` : undefined;
  };
}

/**
 * Reads back through CRI every image pinset's pins held (an image pinned
 * before whose name one of them matches: a reference, or on CRI-O a
 * carried pattern); exit 0 when none is still pinned by pinset's alone.
 */
async function confirm(c: DropContext, refs: readonly string[], before: readonly RuntimeImage[], pinnedBy: PinnedBy): Promise<number> {
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
    const names = [...was.repoDigests, ...was.repoTags];
    if (!was.pinned || !refs.some((r) => names.some((n) => pinMatches(r, n)))) continue;
    const img = byId.get(was.id);
    if (!img) continue; // gone meanwhile
    const name = names.find((n) => refs.some((r) => pinMatches(r, n))) ?? img.id;
    if (!img.pinned) {
      unpinned++;
      continue;
    }
    const by = pinnedBy(img);
    if (by) kept.push(`${name}: still pinned by ${by}`);
    else stuck.push(name);
  }
  c.out(`confirmed through CRI: ${unpinned} image(s) no longer pinned${kept.length ? `, ${kept.length} still pinned by a pin that is not pinset's (kept)` : ''}`);
  for (const k of kept) c.out(`  ${k}`);
  if (stuck.length === 0) return 0;
  c.out(`${stuck.length} image(s) still reported pinned with nothing but pinset's removed pin to pin them, first ${stuck[0]}: ${c.reloader.mode === 'none' && c.info.runtimeName.toLowerCase() === 'cri-o' ? 'reload CRI-O (systemctl reload crio) to apply the change' : 'the runtime has not applied the change; run `pinset agent --drop-pins` again'}`);
  return 1;
}
