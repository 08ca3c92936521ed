// dist/pinset.mjs: `pinset`. The sources start the CLI from src/cli/main.ts
// when it is the program (import.meta.main); in the bundle that module
// shares a file with the kubectl plugin's entry, where import.meta.main is
// false, so this entry starts it instead.
//
// First it turns on V8's code cache for the modules it loads next (every
// command is an import() of its own), from dist/compile-cache, which `npm
// run build` fills (scripts/build.ts bakeCompileCache): a module found there
// is not parsed again. `pinset agent --once` starts about 15 ms sooner
// (BENCHMARKS.md, footprint). The cache is portable (its entries are named
// relative to it), so it holds wherever dist/ is copied: the image's
// /app/dist, the systemd unit's /usr/local/lib/pinset. It is only read
// where dist/ is read-only; an entry that does not match (another Node.js,
// other V8 flags, another user, changed files) is ignored and the module
// compiled as without it. NODE_COMPILE_CACHE chooses another folder;
// NODE_DISABLE_COMPILE_CACHE=1 turns it off.
import module from 'node:module';
import { fileURLToPath } from 'node:url';
import { runAsProgram } from '../../src/cli/main.ts';

// @types/node knows only the folder argument; Node.js 24.21 also takes { directory, portable }.
(module.enableCompileCache as unknown as ((opts: { directory: string; portable: boolean }) => unknown) | undefined)?.({
  directory: fileURLToPath(new URL('./compile-cache', import.meta.url)),
  portable: true,
});
runAsProgram(process.argv.slice(2), { prog: 'pinset' });
