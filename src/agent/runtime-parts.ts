// The runtime's parts, built from the node's profile: the CRI client on the
// socket that answered (or one that says why none was settled on), CRI-O's
// reloader, the pin backends that can be made here, the node lock where the
// profile puts it, and the disk check on the image filesystem as this
// process sees it (under --host-root).
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { CriImageRuntime } from '../cri/client.ts';
import type { ImageRuntime } from '../cri/runtime.ts';
import { createReloader } from '../crio/reload.ts';
import type { Reloader, ReloadMode } from '../crio/reloader.ts';
import { UsageError, type FlagValues } from '../util/flags.ts';
import { describeFilesystem, DiskCheck, statfsUsage } from './disk.ts';
import { hostPath, UnsettledRuntime, type NodeProfile } from './node-profile.ts';
import { NodeLock } from './node-lock.ts';
import { pinWiring, type PinWiring } from './pin-wiring.ts';

/** systemd's system bus on the host. */
const SYSTEM_BUS_SOCKET = '/run/dbus/system_bus_socket';

export interface RuntimeParts {
  runtime: ImageRuntime;
  reloader: Reloader;
  pins: PinWiring;
  lock: NodeLock;
  diskCheck: DiskCheck;
  close(): void;
}

/** CRI-O's reloader as the flags say, on the system bus where the host's /run is seen (DBUS_SYSTEM_BUS_ADDRESS, when set, wins). */
export function reloaderFor(f: FlagValues, logger: Logger): Reloader {
  const hostRoot = String(f['host-root'] || '/');
  const busAddress = hostRoot !== '/' && !process.env.DBUS_SYSTEM_BUS_ADDRESS ? `unix:path=${hostPath(hostRoot, SYSTEM_BUS_SOCKET)}` : undefined;
  try {
    return createReloader(f.reload as ReloadMode, { unit: String(f['crio-unit']), logger, ...(busAddress ? { busAddress } : {}) });
  } catch (e) {
    throw new UsageError(`--crio-unit: ${(e as Error).message}`);
  }
}

export function runtimeParts(f: FlagValues, o: { profile: NodeProfile; logger: Logger; inCluster: boolean }): RuntimeParts {
  const { profile, logger } = o;
  const runtime: ImageRuntime = profile.problem ? new UnsettledRuntime(profile.problem) : new CriImageRuntime(profile.criEndpoint);
  const hostRoot = String(f['host-root'] || '/');
  const reloader = reloaderFor(f, logger);
  const pins = pinWiring({ profile, runtime, logger });
  const lock = new NodeLock(pins.lockPath, {
    pid: process.pid,
    host: hostname(),
    node: String(f['node-name']),
    runsIn: o.inCluster ? 'pod' : 'host',
    startedAt: new Date(Date.now() - process.uptime() * 1000).toISOString(),
  });
  // ImageFsInfo names host paths; they are measured where this process sees them.
  const diskCheck = new DiskCheck(runtime, {
    highWatermarkPercent: Number(f['image-fs-high-watermark']),
    logger,
    usageOf: (p) => statfsUsage(hostPath(hostRoot, p)),
    describe: (p, size) => describeFilesystem(hostPath(hostRoot, p), size),
  });
  return {
    runtime,
    reloader,
    pins,
    lock,
    diskCheck,
    close: () => {
      runtime.close();
      reloader.close();
    },
  };
}
