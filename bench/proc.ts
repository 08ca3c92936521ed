// What /proc says of a process, for the benchmarks: resident memory and CPU
// time. NaN when the process is gone.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;

/** VmRSS and VmHWM (the peak since start or the last clear_refs) in kB, from /proc/<pid>/status. */
export function procStatus(pid: number | undefined): { rssKb: number; hwmKb: number } {
  try {
    if (!pid) throw new Error('no pid');
    const text = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
    return { rssKb: kb('VmRSS'), hwmKb: kb('VmHWM') };
  } catch {
    return { rssKb: NaN, hwmKb: NaN };
  }
}

/** utime + stime in ms, from /proc/<pid>/stat (counted in clock ticks, 10 ms at USER_HZ 100). */
export function cpuMs(pid: number | undefined): number {
  try {
    if (!pid) throw new Error('no pid');
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) in parentheses: state is field 3, utime 14, stime 15.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(rest[11]) + Number(rest[12])) * 1000) / CLK_TCK;
  } catch {
    return NaN;
  }
}

/** Resident memory by what backs it, in bytes, from /proc/<pid>/smaps: the node binary, shared libraries, the rest (anonymous: heaps, stacks, JIT code). */
export function rssByBacking(pid: number): { rss: number; nodeBinary: number; libraries: number; anonymous: number } {
  const out = { rss: 0, nodeBinary: 0, libraries: 0, anonymous: 0 };
  let where: 'nodeBinary' | 'libraries' | 'anonymous' = 'anonymous';
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) {
      const p = head[1]!;
      where = p.endsWith('/node') ? 'nodeBinary' : /\.so(\.|$)/.test(p) ? 'libraries' : 'anonymous';
      continue;
    }
    const m = /^Rss:\s+(\d+) kB/.exec(line);
    if (m) {
      out[where] += Number(m[1]) * 1024;
      out.rss += Number(m[1]) * 1024;
    }
  }
  return out;
}
