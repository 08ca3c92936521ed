// The bare loop of `npm run bench` section 1 as a process of its own, run
// with the agent's Node.js flags: `node <flags> bench/bare-client.ts
// <endpoint> <parallel> <ref>...` makes the PullImage calls, <parallel> at
// a time, and prints one JSON line: the loop's wall time and its own CPU
// time (ms). What a client costs when it runs as the agent runs, without
// any of the agent's code.
import { CriClient, criPackage } from '../test/support/containerd.ts';

const [endpoint, parallel, ...refs] = process.argv.slice(2);
if (!endpoint || !parallel || refs.length === 0) {
  console.error('usage: bare-client.ts <endpoint> <parallel> <ref>...');
  process.exit(2);
}
// The proto is loaded before the clock starts, as the agent and the
// benchmark's own process have it loaded (22 ms with these flags).
criPackage();
const t0 = performance.now();
const cpu0 = process.cpuUsage();
const cri = new CriClient(endpoint);
let next = 0;
await Promise.all(
  Array.from({ length: Number(parallel) }, async () => {
    while (next < refs.length) await cri.pullImage(refs[next++]!);
  }),
);
const ms = performance.now() - t0;
const cpu = process.cpuUsage(cpu0);
cri.close();
console.log(JSON.stringify({ ms, cpuMs: (cpu.user + cpu.system) / 1000 }));
