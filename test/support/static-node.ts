// A node of its own for `pinset agent` in a test: a static sets folder, a
// state folder for the node lock, no CRI-O folder, an auth file, metrics off.
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { stringify as dumpYaml } from 'yaml';
import type { PinnedImageSet } from '../../src/api/types.ts';

export interface StaticNode {
  dir: string;
  /** The agent's flags; `extra` from the options at the end. */
  flags: string[];
  /** Replaces the static folder's sets with these. */
  writeSets(...sets: PinnedImageSet[]): Promise<void>;
}

/**
 * `dir` becomes the node's folder. The auth file is `authFile`, else
 * `<dir>/none.json`, which does not exist: no credentials.
 */
export async function staticNode(dir: string, nodeName: string, criEndpoint: string, opts: { authFile?: string; extra?: string[] } = {}): Promise<StaticNode> {
  const staticDir = path.join(dir, 'sets.d');
  await mkdir(staticDir, { recursive: true });
  const flags = [
    '--node-name', nodeName,
    '--static-dir', staticDir,
    '--cri-endpoint', criEndpoint,
    '--crio-dropin-dir', path.join(dir, 'no-crio', 'crio.conf.d'),
    '--state-dir', path.join(dir, 'state'),
    '--auth-file', opts.authFile ?? path.join(dir, 'none.json'),
    '--metrics-addr', '',
    ...(opts.extra ?? []),
  ];
  const writeSets = (...sets: PinnedImageSet[]) => writeFile(path.join(staticDir, 'sets.yaml'), sets.map((s) => dumpYaml(s)).join('---\n'));
  return { dir, flags, writeSets };
}
