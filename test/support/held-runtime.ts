// An in-memory image runtime for the agent's unit tests whose downloads
// wait until released: a pull of content it holds under another name adds
// the name at once (a name-only pull); a download is listed, then lands when
// the test releases it (all at once, or image by image: released or failed).
import type { ImageFilesystem, ImageRuntime, RuntimeImage, RuntimeInfo } from '../../src/cri/runtime.ts';

/** A runtime whose downloads wait until released (all, or one image); what was downloaded is listed. */
export class HeldRuntime implements ImageRuntime {
  images: RuntimeImage[] = [];
  downloads: string[] = [];
  #release: (() => void) | undefined;
  #gate: Promise<void> | undefined;
  /** Downloads held one by one, by reference: released or failed each on its own. */
  readonly #each = new Map<string, { done: Promise<void>; release: () => void; fail: (e: Error) => void }>();
  hold(): void {
    this.#gate = new Promise((r) => (this.#release = r));
  }
  release(): void {
    this.#release?.();
    this.#gate = undefined;
  }
  holdEach(refs: readonly string[]): void {
    for (const ref of refs) {
      let release!: () => void;
      let fail!: (e: Error) => void;
      const done = new Promise<void>((res, rej) => ((release = res), (fail = rej)));
      done.catch(() => {});
      this.#each.set(ref, { done, release, fail });
    }
  }
  releaseOne(ref: string): void {
    this.#each.get(ref)!.release();
    this.#each.delete(ref);
  }
  failOne(ref: string, e: Error): void {
    this.#each.get(ref)!.fail(e);
    this.#each.delete(ref);
  }
  async version(): Promise<RuntimeInfo> {
    return { runtimeName: 'memory', runtimeVersion: '0', runtimeApiVersion: 'v1' };
  }
  async listImages(): Promise<RuntimeImage[]> {
    return this.images.map((i) => ({ ...i, repoDigests: [...i.repoDigests] }));
  }
  async imageStatus(ref: string): Promise<RuntimeImage | null> {
    return this.images.find((i) => i.repoDigests.includes(ref)) ?? null;
  }
  async pullImage(ref: string): Promise<string> {
    const id = `id-${ref.split('@')[1]}`;
    const existing = this.images.find((i) => i.id === id);
    if (existing) {
      existing.repoDigests.push(ref); // content held: a new name only
      return id;
    }
    this.downloads.push(ref);
    await this.#gate;
    await this.#each.get(ref)?.done;
    this.images.push({ id, repoTags: [], repoDigests: [ref], size: 1, pinned: false, runtimeHandler: '' });
    return id;
  }
  async imageFsInfo(): Promise<ImageFilesystem[]> {
    return [{ mountpoint: '/var/lib/containers/storage', usedBytes: 0 }];
  }
  close(): void {}
}
