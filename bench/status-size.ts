// `npm run bench:status-size`: bytes of the node status annotation
// (pinset.dev/status) as agents write it, for the common case and the worst
// case, in format version 2 against version 1. Figures go to BENCHMARKS.md.
// No component is needed; it runs in a second.
import { encodedSize } from '../src/api/node-status.ts';
import { makeNodeStatus } from '../src/agent/status.ts';
import { STATUS_MAX_BYTES, type NodeStatus } from '../src/api/types.ts';
import { downloadingSets, PIN_FILE, typicalSets, worstCaseSets } from '../test/support/node-status-samples.ts';

const AT = '2026-11-21T10:04:05.123Z';

/** Version 1 wrote the in-memory report as it is, with its full keys. */
function v1Size(s: NodeStatus): number {
  return Buffer.byteLength(JSON.stringify({ ...s, version: 1 }));
}

const rows: [string, string, string, string][] = [];
for (const n of [1, 10, 20]) {
  const s = makeNodeStatus('worker-3', PIN_FILE, typicalSets(n), AT);
  rows.push([`${n} typical set(s), Ready, no errors`, String(v1Size({ ...s, node: 'worker-3' })), String(encodedSize(s)), s.truncated ? `${s.sets.length} of ${n} (truncated)` : `all ${n}`]);
}
for (const n of [1, 10]) {
  const s = makeNodeStatus('worker-3', PIN_FILE, downloadingSets(n), AT);
  rows.push([`${n} typical set(s) downloading: Progressing, bytes, rate, pull rate, mirrored, estimate`, String(v1Size({ ...s, node: 'worker-3' })), String(encodedSize(s)), s.truncated ? `${s.sets.length} of ${n} (truncated)` : `all ${n}`]);
}
for (const n of [10, 200]) {
  const all = worstCaseSets(n);
  const s = makeNodeStatus('worker-3', PIN_FILE, all, AT);
  const unbounded = { version: 2 as const, node: 'worker-3', pinFile: PIN_FILE, updatedAt: AT, sets: all };
  rows.push([`${n} worst-case set(s): Degraded, 253-character names, messages at 512 B, an older 1 KiB error each`, String(v1Size(unbounded)), String(encodedSize(s)), s.truncated ? `${s.sets.length} of ${n} (truncated)` : `all ${n}`]);
}

process.stdout.write(`Node status annotation sizes (bytes of JSON); version 2 is bounded at ${STATUS_MAX_BYTES} B\n\n`);
process.stdout.write('| report | version 1 | version 2 | sets kept |\n|---|---:|---:|---|\n');
for (const r of rows) process.stdout.write(`| ${r.join(' | ')} |\n`);
