// How `pinset agent`'s flags wire the pin backends (./pin-choice.ts): which
// runtimes' backends can be made on this node, and where the node lock
// lives. CRI-O's lock sits beside the drop-in it guards (<parent>/.pinset/,
// the folder the DaemonSet mounts); elsewhere (containerd, pre-load only)
// in --state-dir.
import { existsSync } from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { ContainerdImages } from '../containerd/images.ts';
import { ContainerdLabelPins } from '../containerd/label-pins.ts';
import { containerdCanPin } from '../containerd/versions.ts';
import type { ImageRuntime } from '../cri/runtime.ts';
import { LOCK_FILE_NAME, lockPathFor } from './node-lock.ts';
import type { PinBackendFlag, PinBackendMakers } from './pin-choice.ts';

export interface PinWiring {
  /** CRI-O's drop-in folder is used: the pin file is opened and CRI-O's backend can be made. */
  usesDropIn: boolean;
  lockPath: string;
  containerd?: PinBackendMakers['containerd'];
}

export function pinWiring(o: { flag: PinBackendFlag; dropInDir: string; stateDir: string; criEndpoint: string; runtime: ImageRuntime; logger: Logger }): PinWiring {
  // auto: where CRI-O's configuration folder is there (/etc/crio), its drop-in may be the backend.
  const usesDropIn = o.flag === 'crio' || (o.flag === 'auto' && existsSync(path.dirname(path.resolve(o.dropInDir))));
  const containerd: PinBackendMakers['containerd'] =
    o.flag === 'auto' || o.flag === 'containerd'
      ? {
          canPin: containerdCanPin,
          // containerd's Images service answers on the socket CRI uses.
          make: () => new ContainerdLabelPins({ images: new ContainerdImages(o.criEndpoint), runtime: o.runtime, log: o.logger }),
        }
      : undefined;
  return { usesDropIn, lockPath: usesDropIn ? lockPathFor(o.dropInDir) : path.join(o.stateDir, LOCK_FILE_NAME), ...(containerd ? { containerd } : {}) };
}
