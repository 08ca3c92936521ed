// Where the node lock (../node-lock.ts) lives, and why there.
//
// One path per node, whatever the node's profile found:
// <--state-dir>/agent.lock, /var/lib/pinset/agent.lock by default. An agent
// that found CRI-O, one that found containerd and one that found no runtime
// yet all take this one file, so "one writer per node" holds between
// agents that disagree about the node (one started while the runtime was
// down, one after it came up). --state-dir is pinset's own folder, writable
// wherever an agent runs: the DaemonSet mounts /var/lib/pinset
// (DirectoryOrCreate) on every node, the systemd unit has
// StateDirectory=pinset, the --drop-pins Jobs mount it too. Not beside
// CRI-O's drop-in: a node without CRI-O has no such folder, and the host's
// /etc is not the agent's to write but for /etc/crio.
//
// Earlier versions kept a CRI-O node's lock beside the drop-in, in
// <parent of crio.conf.d>/.pinset/agent.lock, and the lock of other nodes
// where this one is. During an upgrade (the DaemonSet's old pod beside the
// new one, the systemd unit beside a pod) an agent of an earlier version
// may hold that one. So where CRI-O's configuration folder (the drop-in
// folder's parent) exists, the agent takes that lock too, always after the
// first: two agents of this version meet on the first and never hold one
// each of the two, so neither waits for the other forever; an earlier agent
// holding the second keeps this one waiting, writing nothing, until it
// exits; an earlier agent started while this one runs (a rollback) waits
// for this one.
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import * as path from 'node:path';
import { stagingDirFor } from '../../crio/pinfile.ts';
import { LOCK_FILE_NAME, NodeLock, type LockFileSpec } from '../node-lock.ts';
import type { LockConfig } from './config.ts';

/** The node's lock: one path, whatever the profile found. */
export function nodeLockPath(cfg: Pick<LockConfig, 'stateDir'>): string {
  return path.join(cfg.stateDir, LOCK_FILE_NAME);
}

/** The lock files, in the order they are taken: the node's, then the one earlier versions took on a CRI-O node where CRI-O's configuration folder exists. */
export function nodeLockFiles(cfg: Pick<LockConfig, 'stateDir' | 'dropInDir'>): LockFileSpec[] {
  const files: LockFileSpec[] = [{ path: nodeLockPath(cfg), folderFlag: '--state-dir' }];
  const staging = stagingDirFor(cfg.dropInDir);
  const earlier = path.join(staging, LOCK_FILE_NAME);
  // Best effort: a folder this process cannot write to holds no lock an earlier agent could have made here (../node-lock.ts LockFileSpec).
  if (existsSync(path.dirname(staging)) && earlier !== path.resolve(files[0]!.path)) files.push({ path: earlier, bestEffort: true });
  return files;
}

/** The node lock, saying who this agent is to those that wait for it. */
export function nodeLock(cfg: LockConfig): NodeLock {
  return new NodeLock(nodeLockFiles(cfg), {
    pid: process.pid,
    host: hostname(),
    node: cfg.nodeName,
    runsIn: cfg.runsInPod ? 'pod' : 'host',
    startedAt: new Date(Date.now() - process.uptime() * 1000).toISOString(),
  });
}
