// What the reconcile core hands a pin backend (src/pins/backend.ts
// RuntimeState), made from CRI's answers now: for tests that drive a
// backend without the core.
import type { ImageRuntime, RuntimeImage } from '../../src/cri/runtime.ts';
import { RuntimeView } from '../../src/cri/view.ts';
import type { PinTarget, RuntimeState } from '../../src/pins/backend.ts';

export async function observedRuntime(cri: ImageRuntime): Promise<RuntimeState> {
  const info = await cri.version();
  let view = new RuntimeView(await cri.listImages());
  return {
    answered: true,
    info,
    error: undefined,
    get view() {
      return view;
    },
    async refresh(images: RuntimeImage[]) {
      view = new RuntimeView(images);
    },
  };
}

export const pinTargets = (...refs: string[]): PinTarget[] => refs.map((ref) => ({ ref, runtimeHandler: '' }));
