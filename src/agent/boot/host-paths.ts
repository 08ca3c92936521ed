// Host paths and where this process sees them: under --host-root (the
// DaemonSet mounts the host's /run, /etc and /var/lib under /host; on the
// host itself it is /).
import * as path from 'node:path';

/** Host path `p` as this process sees it under `hostRoot` (/ on the host itself). /var/run is /run on every systemd host (FHS 3.0). */
export function hostPath(hostRoot: string, p: string): string {
  if (hostRoot === '/' || hostRoot === '') return p;
  const onHost = p.startsWith('/var/run/') ? p.slice('/var'.length) : p;
  return path.join(hostRoot, onHost);
}

/** A host path as this process sees it, back to the host's (for reports). */
export function fromHostRoot(hostRoot: string, p: string): string {
  if (hostRoot === '/' || hostRoot === '' || !p.startsWith(`${hostRoot.replace(/\/$/, '')}/`)) return p;
  return p.slice(hostRoot.replace(/\/$/, '').length);
}
