// The runtime's parts, built from the node's profile: the CRI client on the
// socket that answered (or one that says why none was settled on), and the
// disk check on the image filesystem as this process sees it (under
// --host-root).
import type { Logger } from 'pino';
import { CriImageRuntime } from '../../cri/client.ts';
import type { ImageRuntime, RuntimeInfo } from '../../cri/runtime.ts';
import { describeFilesystem, DiskCheck, statfsUsage } from '../disk.ts';
import { hostPath } from './host-paths.ts';
import { UnsettledRuntime, type NodeProfile } from './node-profile.ts';

export interface RuntimeParts {
  runtime: ImageRuntime;
  /** The runtime's last answer to CRI Version, for parts that ask between reconciles (the size estimate's mirrors). */
  lastAnswer(): RuntimeInfo | undefined;
  diskCheck: DiskCheck;
  close(): void;
}

/** The CRI client, remembering what the runtime last said it is. */
class AnsweringRuntime extends CriImageRuntime {
  answer: RuntimeInfo | undefined;
  override async version(): Promise<RuntimeInfo> {
    this.answer = await super.version();
    return this.answer;
  }
}

export function runtimeParts(profile: NodeProfile, o: { highWatermarkPercent: number; logger: Logger }): RuntimeParts {
  const runtime = profile.problem ? new UnsettledRuntime(profile.problem) : new AnsweringRuntime(profile.criEndpoint);
  const { hostRoot } = profile;
  // ImageFsInfo names host paths; they are measured where this process sees them.
  const diskCheck = new DiskCheck(runtime, {
    highWatermarkPercent: o.highWatermarkPercent,
    logger: o.logger,
    usageOf: (p) => statfsUsage(hostPath(hostRoot, p)),
    describe: (p, size) => describeFilesystem(hostPath(hostRoot, p), size),
  });
  return {
    runtime,
    lastAnswer: () => (runtime instanceof AnsweringRuntime ? runtime.answer : undefined),
    diskCheck,
    close: () => runtime.close(),
  };
}
