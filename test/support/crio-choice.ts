// An agent's pin backend for tests that build the Agent in-process: CRI-O's,
// on a pin file the test opened (and may wrap), always chosen, as the
// composition root's pin kit (src/agent/boot/pin-kit.ts) makes it on a
// CRI-O node.
import type { Logger } from 'pino';
import type { ImageRuntime } from '../../src/cri/runtime.ts';
import { CrioPins } from '../../src/crio/crio-pins.ts';
import type { PinFile } from '../../src/crio/pinfile.ts';
import type { Reloader } from '../../src/crio/reloader.ts';
import { PinChoice } from '../../src/pins/choice.ts';
import type { BackoffPolicy } from '../../src/util/backoff.ts';
import { STEP_RETRY } from '../../src/util/retry.ts';

export function crioChoice(o: { pinFile: PinFile; reloader: Reloader; runtime: ImageRuntime; logger: Logger; retryPolicy?: BackoffPolicy }): PinChoice {
  return new PinChoice({
    decide: () => ({ backend: 'crio' }),
    make: (_backend, wake) => new CrioPins({ pinFile: o.pinFile, reloader: o.reloader, runtime: o.runtime, logger: o.logger, retryPolicy: o.retryPolicy ?? STEP_RETRY, now: Date.now, onWritable: wake }),
    flag: 'crio',
    logger: o.logger,
  });
}
