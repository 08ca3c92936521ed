// A node's CRI-O side, wired as on a real node: a private system bus with a
// systemd stand-in whose ReloadUnit("crio.service") does what CRI-O's unit
// does (ExecReload=kill -HUP $MAINPID): it signals the CRI-O stand-in and the
// job ends "done" at once, while CRI-O re-reads its files 10-40 ms later and
// may refuse them. Point the agent at `endpoint`, `dropInDir`, `stateDir`
// (its node lock) and `env.DBUS_SYSTEM_BUS_ADDRESS`. With `hostRoot`, each
// is where a CRI-O node keeps it under that root (/run/crio/crio.sock,
// /etc/crio/crio.conf.d, /var/lib/pinset, /run/dbus/system_bus_socket), for
// an agent that finds them itself.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startPrivateBus, startSystemdStandIn, type PrivateBus, type SystemdStandIn } from './dbus.ts';
import { startFakeCrio, type CatalogueImage, type FakeCrio, type FakeCrioOptions } from './fake-crio.ts';

export interface CrioNode {
  bus: PrivateBus;
  systemd: SystemdStandIn;
  crio: FakeCrio;
  /** CRI-O's drop-in folder (created empty). */
  dropInDir: string;
  /** The agent's --state-dir on this node (not created): where its node lock lives. */
  stateDir: string;
  /** CRI endpoint, unix:///... */
  endpoint: string;
  /** Environment for a process that should reach this bus as its system bus. */
  env: { DBUS_SYSTEM_BUS_ADDRESS: string };
  stop(): Promise<void>;
}

export async function startCrioNode(
  opts: { catalogue?: Record<string, CatalogueImage>; hostRoot?: string } & Omit<FakeCrioOptions, 'dropInDir' | 'catalogue' | 'socketPath'> = {},
): Promise<CrioNode> {
  const dir = await mkdtemp(join(tmpdir(), 'pinset-node-'));
  const root = opts.hostRoot;
  const dropInDir = root ? join(root, 'etc/crio/crio.conf.d') : join(dir, 'crio.conf.d');
  const stateDir = root ? join(root, 'var/lib/pinset') : join(dir, 'state');
  await mkdir(dropInDir, { recursive: true });
  if (root) await mkdir(join(root, 'run/crio'), { recursive: true });
  if (root) await mkdir(join(root, 'run/dbus'), { recursive: true });
  const cleanups: Array<() => Promise<void> | void> = [() => rm(dir, { recursive: true, force: true })];
  const stop = async () => {
    // Last started, first stopped; each runs once.
    while (cleanups.length > 0) await cleanups.pop()!();
  };
  try {
    const crio = await startFakeCrio({ ...opts, dropInDir, ...(root ? { socketPath: join(root, 'run/crio/crio.sock') } : {}) });
    cleanups.push(() => crio.stop());
    const bus = await startPrivateBus(root ? join(root, 'run/dbus/system_bus_socket') : undefined);
    cleanups.push(() => bus.dispose());
    const systemd = await startSystemdStandIn({ address: bus.address, units: ['crio.service'], onReload: () => crio.sighup() });
    cleanups.push(() => systemd.close());
    return { bus, systemd, crio, dropInDir, stateDir, endpoint: crio.endpoint, env: { DBUS_SYSTEM_BUS_ADDRESS: bus.address }, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
