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
