// How the node's profile (./node-profile.ts) wires the pin backends
// (./pin-choice.ts): which runtimes' backends can be made on this node.
// CRI-O's lock sits beside the drop-in it guards (<parent>/.pinset/, the
// folder the DaemonSet mounts); elsewhere (containerd, pre-load only) in
// --state-dir: the profile says which.
import type { Logger } from 'pino';
import { ContainerdImages } from '../containerd/images.ts';
import { ContainerdLabelPins } from '../containerd/label-pins.ts';
import { containerdCanPin } from '../containerd/versions.ts';
import type { ImageRuntime } from '../cri/runtime.ts';
import type { NodeProfile } from './node-profile.ts';
import type { PinBackendMakers } from './pin-choice.ts';

export interface PinWiring {
  /** CRI-O's drop-in folder is used: the pin file is opened and CRI-O's backend can be made. */
  usesDropIn: boolean;
  lockPath: string;
  containerd?: PinBackendMakers['containerd'];
}

export function pinWiring(o: { profile: NodeProfile; runtime: ImageRuntime; logger: Logger }): PinWiring {
  const { profile } = o;
  const containerd: PinBackendMakers['containerd'] =
    profile.pinBackend === 'auto' || profile.pinBackend === 'containerd'
      ? {
          canPin: containerdCanPin,
          // containerd's Images service answers on the socket CRI uses.
          make: () => new ContainerdLabelPins({ images: new ContainerdImages(profile.criEndpoint), runtime: o.runtime, log: o.logger }),
        }
      : undefined;
  return { usesDropIn: profile.usesDropIn, lockPath: profile.lockPath, ...(containerd ? { containerd } : {}) };
}
