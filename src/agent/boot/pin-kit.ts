// What a node runs to pin, decided and built in one place, from the node's
// profile and the configuration. The agent and `pinset agent --drop-pins`
// both take their pin backend from here; nothing downstream chooses again.
//
// The decisions:
// - pinPlan, once per profile: what the runtime found calls for.
//   --pin-backend auto narrows to CRI-O's drop-in on a CRI-O layout and to
//   containerd's labels where containerd answered; CRI-O's drop-in folder is
//   used where that backend may serve (with --cri-endpoint and auto: where
//   CRI-O's configuration folder is there, so pins written while CRI-O is
//   down apply at its start). No runtime settled on: pre-load only.
// - decidePinBackend, at each CRI Version answer: CRI-O -> its drop-in;
//   containerd from 1.6.25, 1.7.10 and 2.x -> its image labels; an older
//   containerd or another runtime -> pre-load only, the node status naming
//   what would pin (RuntimeCannotPin). Until the runtime first answers,
//   CRI-O's drop-in is kept when it is used. crio, containerd: that backend
//   whatever the runtime says (containerd's still needs a version that
//   honours its label); none: pre-load only.
// - removalBackend, for --drop-pins: the backend of the runtime that
//   answered, whatever its version (labels set by a containerd that does
//   not honour them are removed too).
//
// What is built: CRI-O's pin file (opened with the node lock held: it
// cleans up after a killed agent) and its reloader, only where the drop-in
// is used; containerd's Images client on the CRI socket, made when its
// backend is chosen; the choice that keeps the backend in use
// (src/pins/choice.ts); and, where the runtime is (or may be) containerd,
// the download progress its Content service tells (src/pins/downloads.ts:
// CRI-O's profile leaves it out, and an image counts when it lands).
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { ContainerdContent, ContentDownloads } from '../../containerd/content.ts';
import { ContainerdImages } from '../../containerd/images.ts';
import { ContainerdLabelPins } from '../../containerd/label-pins.ts';
import { containerdCanPin, type CanPin } from '../../containerd/versions.ts';
import type { ImageRuntime, RuntimeInfo } from '../../cri/runtime.ts';
import { CrioPins } from '../../crio/crio-pins.ts';
import { PinFile, type PinFileHooks } from '../../crio/pinfile.ts';
import { createReloader } from '../../crio/reload.ts';
import type { Reloader } from '../../crio/reloader.ts';
import type { ReloadSyncOptions } from '../../crio/reload-sync.ts';
import type { PinBackend } from '../../pins/backend.ts';
import type { DownloadProgress } from '../../pins/downloads.ts';
import { PinChoice, runtimeLabel, type PinBackendFlag, type PinDecision, type Wake } from '../../pins/choice.ts';
import type { BackoffPolicy } from '../../util/backoff.ts';
import { STEP_RETRY } from '../../util/retry.ts';
import type { PinsConfig } from './config.ts';

/** What pinPlan reads of what was found on the node (./node-profile.ts FoundRuntime). */
export interface FoundForPins {
  source: 'detected' | 'flags';
  layout?: string;
  runtime?: RuntimeInfo;
  dropInDir: string;
  problem?: string;
}

/** What the runtime found calls for; the node's profile carries it. */
export interface PinPlan {
  /** --pin-backend as what was found narrows it: the backend the runtime calls for, or `auto` while that depends on its answer. */
  pinBackend: PinBackendFlag;
  /** CRI-O's drop-in folder is used: its pin file is opened and CRI-O's backend can be made. */
  usesDropIn: boolean;
}

export function pinPlan(found: FoundForPins, flag: PinBackendFlag): PinPlan {
  if (found.problem) return { pinBackend: 'none', usesDropIn: false };
  if (found.source === 'flags') return { pinBackend: flag, usesDropIn: flag === 'crio' || (flag === 'auto' && existsSync(path.dirname(path.resolve(found.dropInDir)))) };
  let pinBackend = flag;
  // decidePinBackend still checks that this containerd's version honours the label.
  if (flag === 'auto' && found.layout === 'crio') pinBackend = 'crio';
  else if (flag === 'auto' && found.runtime?.runtimeName.toLowerCase() === 'containerd') pinBackend = 'containerd';
  return { pinBackend, usesDropIn: pinBackend === 'crio' };
}

/** The backends that can be made on this node. */
interface Makers {
  /** Absent when CRI-O's drop-in folder is not used on this node. */
  crio?: (wake: Wake) => PinBackend;
  containerd?: {
    /** Whether this containerd version reports the label as `pinned`, and if not, what would. */
    canPin(version: string): CanPin;
    make(): PinBackend;
  };
}

/** The backend `flag` asks for on a runtime that answered `info` (undefined: not yet). Pure. */
export function decidePinBackend(flag: PinBackendFlag, info: RuntimeInfo | undefined, makers: Pick<Makers, 'crio'> & { containerd?: Pick<NonNullable<Makers['containerd']>, 'canPin'> }): PinDecision {
  const name = (info?.runtimeName ?? '').toLowerCase();
  const containerd = (): PinDecision => {
    if (!makers.containerd) return { backend: 'none', why: 'containerd pins need its Images service on the CRI socket, which this agent was not set up to use' };
    if (!info) return { backend: 'containerd' };
    const can = makers.containerd.canPin(info.runtimeVersion);
    return can.ok ? { backend: 'containerd' } : { backend: 'none', why: can.why };
  };
  switch (flag) {
    case 'none':
      return { backend: 'none' };
    case 'crio':
      return makers.crio ? { backend: 'crio' } : { backend: 'none', why: "CRI-O's drop-in folder cannot be used on this node" };
    case 'containerd':
      return containerd();
    case 'auto':
      if (!info) return makers.crio ? { backend: 'crio' } : { backend: 'none', quiet: true };
      if (name === 'cri-o') return makers.crio ? { backend: 'crio' } : { backend: 'none', why: `the runtime is ${runtimeLabel(info)}, but its drop-in folder cannot be used on this node` };
      if (name === 'containerd') return containerd();
      return { backend: 'none', why: `the runtime ${runtimeLabel(info)} has no pin backend in pinset (CRI-O and containerd have)` };
  }
}

/** What the kit reads of the node's profile. */
export type KitProfile = PinPlan & { hostRoot: string; criEndpoint: string; dropInDir: string; runtime?: RuntimeInfo; problem?: string };

/** What the backends are handed: the CRI client they confirm through, and where they report. */
export interface PinKitParts {
  runtime: ImageRuntime;
  logger: Logger;
  metrics?: ReloadSyncOptions['metrics'];
  events?: ReloadSyncOptions['events'];
  /** Pace of each failing step (default STEP_RETRY) and the clock: tests shorten them. */
  retryPolicy?: BackoffPolicy;
  now?: () => number;
}

export interface PinKit {
  /** The agent's pin backend: chosen again as the runtime answers CRI Version. */
  choice: PinChoice;
  /** `--drop-pins`: the backend that removes pinset's pins from the runtime that answered `info`, or why there is nothing to remove. */
  removal(info: RuntimeInfo): PinBackend | string;
  /** CRI-O's pin file, where its drop-in is used. */
  pinFile?: PinFile;
  /** What the runtime tells of downloads under way: containerd's Content service; absent on CRI-O. */
  downloads?: DownloadProgress;
  close(): void;
}

/** PINSET_TEST_SIGKILL_AT: the process SIGKILLs itself right after that step of a pin file write, as a crash or power loss would stop it there. */
function crashHooks(at: PinsConfig['killAfterStep']): PinFileHooks {
  return at ? { afterStep: (step) => void (step === at && process.kill(process.pid, 'SIGKILL')) } : {};
}

/**
 * CRI-O's drop-in, where it is used: its pin file and its reloader. The
 * staging folder is made now: one that cannot be (a read-only root, CRI-O's
 * folder not mounted writable) stops the agent at start saying what it
 * needs, rather than failing every write.
 */
async function crioDropIn(profile: KitProfile, cfg: PinsConfig, logger: Logger): Promise<{ pinFile: PinFile; reloader: Reloader } | undefined> {
  if (!profile.usesDropIn) return undefined;
  const reloader = createReloader(cfg.reload, { unit: cfg.crioUnit, logger, ...(cfg.busAddress ? { busAddress: cfg.busAddress } : {}) });
  try {
    const pinFile = await PinFile.open(profile.dropInDir, { hooks: crashHooks(cfg.killAfterStep) });
    await mkdir(pinFile.stagingDir, { recursive: true, mode: 0o700 });
    return { pinFile, reloader };
  } catch (e) {
    reloader.close();
    throw e;
  }
}

function makers(profile: KitProfile, cfg: PinsConfig, parts: PinKitParts, crio: { pinFile: PinFile; reloader: Reloader } | undefined): Makers {
  const { runtime, logger } = parts;
  const retryPolicy = parts.retryPolicy ?? STEP_RETRY;
  const now = parts.now ?? Date.now;
  const reports = { metrics: parts.metrics, events: parts.events, pinWaitTimeoutMs: cfg.confirmTimeoutMs };
  return {
    ...(crio ? { crio: (wake: Wake) => new CrioPins({ ...crio, ...reports, runtime, logger, retryPolicy, now, onWritable: wake }) } : {}),
    ...(profile.pinBackend === 'auto' || profile.pinBackend === 'containerd'
      ? // containerd's Images service answers on the socket CRI uses.
        { containerd: { canPin: containerdCanPin, make: () => new ContainerdLabelPins({ images: new ContainerdImages(profile.criEndpoint), runtime, log: logger, policy: retryPolicy, now }) } }
      : {}),
  };
}

/** --drop-pins: the backend of the runtime that answered, whatever its version, or why there is nothing to remove. */
function removalBackend(profile: KitProfile, info: RuntimeInfo, m: Makers): PinBackend | string {
  const name = info.runtimeName.toLowerCase();
  const flag = profile.pinBackend;
  const kind = flag === 'auto' ? (name === 'cri-o' ? 'crio' : name === 'containerd' ? 'containerd' : 'none') : flag;
  if (kind === 'crio') return m.crio ? m.crio(() => {}) : `CRI-O's drop-in folder ${profile.dropInDir} is not there: no pinset drop-in to remove`;
  if (kind === 'containerd' && m.containerd) return m.containerd.make();
  return `the runtime ${info.runtimeName} ${info.runtimeVersion} holds no pins of pinset's (${flag === 'none' ? '--pin-backend none' : 'no pin backend for it'}): nothing to remove`;
}

/**
 * containerd's Content service on the CRI socket, where the runtime is
 * containerd, or not known yet and not CRI-O by the profile (a socket that
 * turns out to serve no Content service is not asked again). A problem is
 * logged when it differs from the last one.
 */
function downloadProgress(profile: KitProfile, logger: Logger): DownloadProgress | undefined {
  const name = profile.runtime?.runtimeName.toLowerCase();
  if (profile.problem || (name !== undefined ? name !== 'containerd' : profile.pinBackend === 'crio')) return undefined;
  let said = '';
  return new ContentDownloads(new ContainerdContent(profile.criEndpoint), (what, err) => {
    if (`${what}\n${err}` !== said) logger.warn({ err }, what);
    said = `${what}\n${err}`;
  });
}

/** The kit. Opens CRI-O's pin file: call it with the node lock held. */
export async function pinKit(profile: KitProfile, cfg: PinsConfig, parts: PinKitParts): Promise<PinKit> {
  const crio = await crioDropIn(profile, cfg, parts.logger);
  const m = makers(profile, cfg, parts, crio);
  const downloads = downloadProgress(profile, parts.logger);
  const choice = new PinChoice({
    decide: (info) => decidePinBackend(profile.pinBackend, info, m),
    make: (backend, wake) => (backend === 'crio' ? m.crio!(wake) : m.containerd!.make()),
    flag: profile.pinBackend,
    logger: parts.logger,
  });
  return {
    choice,
    removal: (info) => removalBackend(profile, info, m),
    ...(crio ? { pinFile: crio.pinFile } : {}),
    ...(downloads ? { downloads } : {}),
    close: () => {
      choice.close();
      crio?.reloader.close();
      downloads?.close();
    },
  };
}
