// What the runtime holds, as one ListImages answered it: every image indexed
// by each name it shows (lowercased: CRI-O matches case-insensitively), with
// single references replaced as later ImageStatus calls answer.
import type { RuntimeImage } from './runtime.ts';

/** What ListImages answered, indexed by every name it shows (lowercased: CRI-O matches case-insensitively). */
export class RuntimeView {
  readonly images: RuntimeImage[];
  readonly byName = new Map<string, RuntimeImage>();
  constructor(images: RuntimeImage[]) {
    this.images = images;
    for (const img of images) for (const n of [...img.repoDigests, ...img.repoTags]) this.byName.set(n.toLowerCase(), img);
  }
  /** The image the runtime shows under `ref` (as a repo digest or tag), if any. */
  find(ref: string): RuntimeImage | undefined {
    return this.byName.get(ref.toLowerCase());
  }
  /** Replace what is known about one reference (after an ImageStatus). */
  set(ref: string, img: RuntimeImage | null): void {
    if (img) this.byName.set(ref.toLowerCase(), img);
    else this.byName.delete(ref.toLowerCase());
  }
}
