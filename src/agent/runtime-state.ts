// The image runtime as the reconcile sees it: the connection's state across
// reconciles (RuntimeObserver: has it answered Version since its last
// outage, at what pace it is retried) and one reconcile's view of what it
// holds (RuntimeSnapshot: one ListImages, ImageStatus for images kept under
// a runtime handler, what pulls and verification learned since).
//
// A CRI-O that has not answered Version may still be in its first ~50 ms,
// where a SIGHUP kills it (facts/crio-pinning.md): it is never reloaded
// before answering, and after an outage or a change of its socket it must
// answer again.
import type { Logger } from 'pino';
import type { ImageRuntime, RuntimeImage, RuntimeInfo } from '../cri/runtime.ts';
import { RuntimeView } from '../cri/view.ts';
import type { RuntimeState } from '../pins/backend.ts';
import { mapLimit } from '../util/limit.ts';
import { errMessage } from '../util/problem-log.ts';
import type { RetryGate } from '../util/retry.ts';
import type { WantedImage } from './plan.ts';

/**
 * ImageStatus calls at once when verifying pulled images. A thousand at once
 * (a large set's first reconcile) held a thousand gRPC calls and HTTP/2
 * streams at the same moment: 20 MB more peak memory to verify 1000 images
 * 0.1 s sooner (BENCHMARKS.md, footprint).
 */
const VERIFY_PARALLEL = 8;

export class RuntimeObserver {
  private readonly runtime: ImageRuntime;
  private readonly log: Logger;
  readonly gate: RetryGate;
  private readonly endpoint: string | undefined;
  answered = false;
  info: RuntimeInfo | undefined;

  constructor(runtime: ImageRuntime, log: Logger, gate: RetryGate, endpoint?: string | null) {
    this.runtime = runtime;
    this.log = log;
    this.gate = gate;
    this.endpoint = endpoint ?? undefined;
  }

  private versioned: Promise<RuntimeInfo | undefined> = Promise.resolve(undefined);

  /** Version (until answered since the last outage) and ListImages; a failure is the snapshot's error, never thrown. */
  observe(): Promise<RuntimeSnapshot> {
    const version = this.answered ? Promise.resolve() : this.runtime.version().then((info) => {
      if (JSON.stringify(info) !== JSON.stringify(this.info)) this.log.info({ runtime: info }, 'connected to the container runtime');
      this.info = info;
      this.answered = true;
    });
    this.versioned = version.then(() => this.info, () => this.info);
    return version
      .then(() => this.runtime.listImages())
      .then(
        (images) => {
          this.gate.succeed();
          return new RuntimeSnapshot(this.runtime, this.log, images, undefined, this);
        },
        (e: unknown) => {
          const error = errMessage(e);
          this.answered = false;
          this.gate.fail(error, { endpoint: this.endpoint, note: 'pins kept' });
          return new RuntimeSnapshot(this.runtime, this.log, [], error, this);
        },
      );
  }

  /** What the runtime is: known from an earlier answer, or this observation's Version (undefined if it has never answered). */
  identified(): Promise<RuntimeInfo | undefined> {
    return this.info ? Promise.resolve(this.info) : this.versioned;
  }

  /** The runtime's socket changed: a new process (or none), which must answer before it is signalled. */
  restarted(): void {
    this.answered = false;
  }
}

export class RuntimeSnapshot implements RuntimeState {
  private readonly runtime: ImageRuntime;
  private readonly log: Logger;
  private readonly observer: RuntimeObserver;
  readonly error: string | undefined;
  view: RuntimeView;
  /** ImageStatus of the images wanted under a runtime handler, by wanted key. */
  private readonly handlerImages = new Map<string, RuntimeImage | null>();
  private wanted: readonly WantedImage[] = [];

  constructor(runtime: ImageRuntime, log: Logger, images: RuntimeImage[], error: string | undefined, observer: RuntimeObserver) {
    this.runtime = runtime;
    this.log = log;
    this.error = error;
    this.observer = observer;
    this.view = new RuntimeView(images);
  }

  get answered(): boolean {
    return this.observer.answered;
  }

  get info(): RuntimeInfo | undefined {
    return this.observer.info;
  }

  /** Images wanted under a runtime handler are not in ListImages by that handler: each is asked for. */
  async readHandlerImages(wanted: readonly WantedImage[]): Promise<void> {
    this.wanted = wanted;
    if (this.error) return;
    for (const w of wanted) {
      if (!w.runtimeHandler) continue;
      try {
        this.handlerImages.set(w.key, await this.runtime.imageStatus(w.reference.reference, w.runtimeHandler));
      } catch (e) {
        this.log.warn({ image: w.reference.reference, runtimeHandler: w.runtimeHandler, err: errMessage(e) }, 'image status failed');
      }
    }
  }

  async refresh(images: RuntimeImage[]): Promise<void> {
    this.view = new RuntimeView(images);
    await this.readHandlerImages(this.wanted);
  }

  /** The image the runtime shows under the set's reference (by its name or, on CRI-O, by digest within its repo). */
  found(w: WantedImage): RuntimeImage | null | undefined {
    return w.runtimeHandler ? this.handlerImages.get(w.key) : (this.view.find(w.reference.reference) ?? null);
  }

  /** Digests of all content the runtime holds, under any name. */
  heldDigests(): Set<string> {
    return new Set(this.view.images.flatMap((i) => i.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1))));
  }

  /** Until verified, a pulled image counts as present with the runtime's answer to PullImage (progress reports while the others still pull). */
  landed(w: WantedImage, imageRef: string | undefined, pinned: boolean): void {
    const img: RuntimeImage = { id: imageRef ?? '', repoTags: [], repoDigests: [w.reference.reference], size: 0, pinned, runtimeHandler: w.runtimeHandler };
    if (w.runtimeHandler) this.handlerImages.set(w.key, img);
    else this.view.set(w.reference.reference, img);
  }

  /** Verify: ImageStatus of each pulled image, at most VERIFY_PARALLEL at once, once the pulls are done (so it never competes with them). */
  async verify(pulled: readonly WantedImage[]): Promise<void> {
    await mapLimit(pulled, VERIFY_PARALLEL, async (w) => {
      try {
        const st = await this.runtime.imageStatus(w.reference.reference, w.runtimeHandler);
        if (w.runtimeHandler) this.handlerImages.set(w.key, st);
        else if (st) this.view.set(w.reference.reference, st);
        else {
          this.view.set(w.reference.reference, null);
          this.log.warn({ image: w.reference.reference }, 'pulled, but the runtime does not report the image');
        }
      } catch (e) {
        this.log.warn({ image: w.reference.reference, err: errMessage(e) }, 'image status after pull failed');
      }
    });
  }
}
