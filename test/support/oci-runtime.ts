// Which OCI runtime podman runs the image with in the tests, chosen for
// the host's cgroup layout. Hosts differ:
// - unified: /sys/fs/cgroup is cgroup2 (every controller there);
// - legacy: cgroup v1 hierarchies only;
// - hybrid: v1 hierarchies, and a cgroup2 mount beside them
//   (systemd's /sys/fs/cgroup/unified). When that v2 mount holds a
//   controller (hugetlb, say), crun 1.8 refuses every container: "cgroups in
//   hybrid mode not supported, drop all controllers from cgroupv2". runc
//   runs on all three.
// podman's default is crun when both are installed, so the tests name the
// runtime themselves: runc, which works on every layout and is what the
// nodes' CRI-O and containerd run here; crun only where runc is missing and
// crun does not refuse the layout.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { findBinary } from './components.ts';

export type CgroupLayout = 'unified' | 'hybrid' | 'legacy' | 'none';

export interface CgroupFacts {
  layout: CgroupLayout;
  /** Mount point of the cgroup2 hierarchy, when there is one. */
  v2Mount?: string;
  /** The controllers the cgroup2 hierarchy holds (its cgroup.controllers). */
  v2Controllers: string[];
}

/**
 * The layout from /proc/self/mountinfo's text, as crun decides it
 * (libcrun_get_cgroup_mode): cgroup2 at /sys/fs/cgroup is unified; a
 * cgroup2 mount anywhere else beside v1 hierarchies is hybrid.
 */
export function cgroupLayoutOf(mountinfo: string, root = '/sys/fs/cgroup'): { layout: CgroupLayout; v2Mount?: string } {
  let v2Mount: string | undefined;
  let v1 = false;
  for (const line of mountinfo.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const mountPoint = line.slice(0, sep).split(' ')[4];
    const fsType = line.slice(sep + 3).split(' ')[0];
    if (!mountPoint) continue;
    if (fsType === 'cgroup2') {
      if (mountPoint === root) return { layout: 'unified', v2Mount: mountPoint };
      v2Mount ??= mountPoint;
    } else if (fsType === 'cgroup') {
      v1 = true;
    }
  }
  if (v1) return v2Mount ? { layout: 'hybrid', v2Mount } : { layout: 'legacy' };
  return v2Mount ? { layout: 'hybrid', v2Mount } : { layout: 'none' };
}

/** This host's cgroup layout and the controllers its cgroup2 hierarchy holds. */
export function hostCgroups(): CgroupFacts {
  let mountinfo = '';
  try {
    mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return { layout: 'none', v2Controllers: [] };
  }
  const { layout, v2Mount } = cgroupLayoutOf(mountinfo);
  let v2Controllers: string[] = [];
  if (v2Mount) {
    try {
      v2Controllers = readFileSync(path.join(v2Mount, 'cgroup.controllers'), 'utf8').split(/\s+/).filter(Boolean);
    } catch {
      // unreadable: treated as holding none
    }
  }
  return { layout, ...(v2Mount ? { v2Mount } : {}), v2Controllers };
}

/** True when crun 1.8 refuses every container on this layout. */
export function crunRefuses(c: CgroupFacts): boolean {
  return c.layout === 'hybrid' && c.v2Controllers.length > 0;
}

export function describeCgroups(c: CgroupFacts): string {
  if (c.layout !== 'hybrid') return `cgroups ${c.layout}`;
  const held = c.v2Controllers.length > 0 ? `holding ${c.v2Controllers.join(', ')}` : 'holding no controller';
  return `cgroups hybrid (v1 hierarchies, cgroup2 at ${c.v2Mount} ${held})`;
}

export type RuntimeChoice = { runtime: 'runc' | 'crun'; path: string; why: string } | { runtime: null; problem: string };

/** The runtime for `podman --runtime`, given the layout and where runc and crun are (null: not installed). */
export function chooseOciRuntime(c: CgroupFacts, found: { runc: string | null; crun: string | null }): RuntimeChoice {
  const layout = describeCgroups(c);
  if (found.runc) return { runtime: 'runc', path: found.runc, why: `runc (${found.runc}), as on the nodes; ${layout}` };
  if (crunRefuses(c)) {
    return {
      runtime: null,
      problem: `${layout}: crun refuses every container there ("cgroups in hybrid mode not supported") and runc is not installed; install it with: sudo apt-get install -y --no-install-recommends runc`,
    };
  }
  if (found.crun) return { runtime: 'crun', path: found.crun, why: `crun (${found.crun}), runc not being installed; ${layout}` };
  return { runtime: null, problem: `neither runc nor crun is installed; install one with: sudo apt-get install -y --no-install-recommends runc` };
}

let chosen: RuntimeChoice | undefined;

/** The choice for this host (made once per test process). */
export function hostOciRuntime(): RuntimeChoice {
  chosen ??= chooseOciRuntime(hostCgroups(), { runc: findBinary('runc'), crun: findBinary('crun') });
  return chosen;
}
