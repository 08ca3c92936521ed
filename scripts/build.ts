// `npm run build`: the shipped form of pinset. esbuild bundles the CLI
// (src/cli/main.ts, which loads each command on demand; dist/pinset.mjs) and
// the kubectl plugin (dist/kubectl-pinset.mjs) into dist/ as ES
// modules for Node.js 24, tree-shaken and minified, with code splitting: every
// dynamic import() of the sources stays a separate file loaded only when that
// code runs (each command; in the agent the Kubernetes client, the D-Bus
// client, prom-client and systeminformation). proto/ is copied to dist/proto
// as the reference of the wire format; the CRI client carries its JSON
// descriptor inline (src/cri/wire.ts).
//
// Why a bundle: Node.js keeps the source text and compiled code of every
// module it loads, and importing @kubernetes/client-node from node_modules
// loads all of its generated API models (about 88 MB resident, BENCHMARKS.md).
// A tree-shaken bundle keeps only what pinset calls.
//
// deploy/ is copied to dist/deploy: `pinset uninstall` removes what those
// manifests install, read from the copy that ships with the bundle
// (src/cli/manifests.ts).
//
// dist/ needs no node_modules: every dependency is inlined. What is left as a
// run-time require() is a Node.js built-in or an optional package that its
// caller wraps in try/catch (scripts/build.ts `OPTIONAL_AT_RUNTIME`).
//
// dist/build-info.json records a hash of everything the bundle is made from,
// so the end-to-end tests and the benchmarks can refuse a stale bundle
// (bundleProblem below).
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmod, cp, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { builtinModules } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import type * as esbuild from 'esbuild';

export const ROOT = path.resolve(import.meta.dirname, '..');
export const DIST = path.join(ROOT, 'dist');
/** The CLI in the bundle: `node dist/pinset.mjs <command>`. */
export const BUNDLE_CLI = path.join(DIST, 'pinset.mjs');
const BUILD_INFO = 'build-info.json';

/**
 * Options for Node.js itself, carried by the bundle's first line
 * (`#!/usr/bin/env -S node ...`), so the image's ENTRYPOINT, the systemd
 * unit's /usr/local/bin/pinset and anyone running dist/pinset.mjs get them.
 * Several are V8 flags that NODE_OPTIONS does not accept. Each one's cost
 * and saving is measured in BENCHMARKS.md (memory).
 */
export const NODE_FLAGS: readonly string[] = [
  // V8 sizes the young generation for the machine's memory, not the
  // container's: up to 16 MB semi-spaces on a large node, which the agent
  // never needs.
  '--max-semi-space-size=1',
  // Grow the old generation slowly and give memory back sooner: the heap
  // after a 1000-image reconcile is half its size with Node's defaults.
  '--optimize-for-size',
  // No optimizing JavaScript compilers: Maglev and TurboFan keep their
  // compile zones' memory (malloc arenas of background threads) and the
  // optimized code, 30-40 MB after a large reconcile, to speed up code that
  // waits on the runtime and the API almost all the time. The interpreter
  // and the baseline compiler (Sparkplug) remain.
  '--no-maglev',
  '--no-turbofan',
  // The Kubernetes client's HTTP parser (undici's llhttp) is WebAssembly:
  // compiled at once by the baseline compiler (Liftoff) and never
  // recompiled by the optimizing one, which costs about 12 MB.
  '--no-wasm-dynamic-tiering',
  '--no-wasm-tier-up',
];

/**
 * Entry points: output name (in dist/, .mjs) to source, one per program (bin
 * in package.json). Commands reached through the CLI's import() need no
 * entry of their own.
 */
const ENTRIES: Record<string, string> = {
  pinset: 'scripts/bundle-entries/pinset.ts',
  'kubectl-pinset': 'src/cli/kubectl-pinset.ts',
};

/**
 * Packages a bundled module may require() at run time although they are not
 * installed: each is optional and its caller catches the failure.
 *  - bufferutil, utf-8-validate: ws's native speed-ups;
 *  - supports-color: debug's colour detection;
 *  - abstract-socket: dbus-native, only for unix:abstract= bus addresses;
 *  - osx-temperature-sensor, macos-temperature-sensor: systeminformation on macOS.
 */
export const OPTIONAL_AT_RUNTIME = ['bufferutil', 'utf-8-validate', 'supports-color', 'abstract-socket', 'osx-temperature-sensor', 'macos-temperature-sensor'];

/** What the bundle is made from: the sources, the proto files, the manifests it ships, the locked dependencies and the build (scripts/). */
async function inputFiles(): Promise<string[]> {
  const out: string[] = [];
  async function walk(rel: string): Promise<void> {
    for (const e of await readdir(path.join(ROOT, rel), { withFileTypes: true })) {
      const p = path.posix.join(rel, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) out.push(p);
    }
  }
  await walk('src');
  await walk('proto');
  await walk('deploy');
  await walk('scripts');
  out.push('package.json', 'package-lock.json');
  return out.sort();
}

/** sha256 over the paths and contents of the bundle's inputs. */
export async function sourceHash(): Promise<string> {
  const h = createHash('sha256');
  for (const f of await inputFiles()) {
    h.update(`${f}\0`);
    h.update(await readFile(path.join(ROOT, f)));
    h.update('\0');
  }
  return h.digest('hex');
}

export interface BuildInfo {
  sourceHash: string;
  nodeFlags: readonly string[];
  esbuild: string;
  builtAt: string;
}

/**
 * Why dist/ cannot be used as a bundle of the current sources, or null if it
 * can. A stale bundle tested or measured in place of the sources would make a
 * green run mean nothing.
 */
export async function bundleProblem(dist = DIST): Promise<string | null> {
  let info: BuildInfo;
  try {
    info = JSON.parse(await readFile(path.join(dist, BUILD_INFO), 'utf8')) as BuildInfo;
  } catch {
    return `${path.relative(ROOT, dist) || dist}/ holds no bundle (no ${BUILD_INFO}): run \`npm run build\``;
  }
  const now = await sourceHash();
  if (info.sourceHash !== now) {
    return `${path.relative(ROOT, dist) || dist}/ was built (${info.builtAt}) from other sources than these (src/, proto/, scripts/ or the dependencies changed since): run \`npm run build\``;
  }
  return null;
}

export interface BuildResult {
  outdir: string;
  metafile: esbuild.Metafile;
  info: BuildInfo;
}

/**
 * Bundle into `outdir` (default dist/). The folder is replaced whole: it is
 * built beside it and renamed into place, so no old chunk survives and a
 * failed build leaves the previous bundle as it was.
 */
export async function build(opts: { outdir?: string } = {}): Promise<BuildResult> {
  // Loaded here, not at the top: the tests import bundleProblem() and need no bundler for it.
  const esbuild = await import('esbuild');
  const outdir = opts.outdir ?? DIST;
  const hash = await sourceHash();
  const staging = `${outdir}.building-${process.pid}`;
  await rm(staging, { recursive: true, force: true });
  try {
    const result = await esbuild.build({
      absWorkingDir: ROOT,
      entryPoints: ENTRIES,
      outdir: staging,
      bundle: true,
      splitting: true,
      format: 'esm',
      platform: 'node',
      target: 'node24',
      outExtension: { '.js': '.mjs' },
      // Whitespace and syntax are minified, identifiers are not: stack traces
      // and heap snapshots keep the sources' function and class names, and
      // the saving of short names is small once the code is compiled
      // (BENCHMARKS.md, memory).
      minifyWhitespace: true,
      minifySyntax: true,
      minifyIdentifiers: false,
      treeShaking: true,
      // Maps for reading a stack trace back to src/ (`node --enable-source-maps`
      // or any source-map tool); not loaded by default, since Node.js keeps a
      // parsed map in memory for every module once source maps are enabled.
      sourcemap: 'linked',
      sourcesContent: false,
      legalComments: 'none',
      metafile: true,
      logLevel: 'silent',
      // CommonJS dependencies call require() for Node.js built-ins; an ES
      // module has none, so each file gets one.
      banner: { js: "import{createRequire as __pinsetCreateRequire}from'node:module';const require=__pinsetCreateRequire(import.meta.url);" },
      // Never inline one of these: a run-time require() of a package that is
      // not there must be one of the optional ones (checked below).
      external: OPTIONAL_AT_RUNTIME,
      plugins: [
        // @kubernetes/client-node's index re-exports every module (exec,
        // attach, port-forward, cp with its tar and WebSocket packages...);
        // its package does not declare them free of import-time side
        // effects, so without this they would all be kept.
        pureModules(/node_modules\/@kubernetes\/client-node\//),
        slimUndici(),
        builtinsThroughRequire(),
      ],
    });
    for (const w of result.warnings) process.stderr.write(`build: warning: ${w.text}${w.location ? ` (${w.location.file}:${w.location.line})` : ''}\n`);
    checkExternals(result.metafile);
    await cp(path.join(ROOT, 'proto'), path.join(staging, 'proto'), { recursive: true });
    await cp(path.join(ROOT, 'deploy'), path.join(staging, 'deploy'), { recursive: true });
    await writeFile(path.join(staging, 'meta.json'), JSON.stringify(result.metafile));
    await writeFile(path.join(staging, 'licenses.txt'), await licenses(result.metafile));
    for (const name of Object.keys(ENTRIES)) await setHashbang(path.join(staging, `${name}.mjs`));
    await bakeCompileCache(staging);
    const info: BuildInfo = { sourceHash: hash, nodeFlags: NODE_FLAGS, esbuild: esbuild.version, builtAt: new Date().toISOString() };
    await writeFile(path.join(staging, BUILD_INFO), JSON.stringify(info, null, 2) + '\n');
    await rm(outdir, { recursive: true, force: true });
    await mkdir(path.dirname(outdir), { recursive: true });
    await rename(staging, outdir);
    return { outdir, metafile: result.metafile, info };
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

/**
 * The folder in dist/ that holds V8's code cache for the bundle's modules:
 * scripts/bundle-entries/pinset.ts turns the cache on there before it loads
 * a command.
 */
export const COMPILE_CACHE = 'compile-cache';

/**
 * Fill dist/compile-cache: a Node.js with NODE_FLAGS (the cache is only
 * taken by a Node.js of the same version and V8 flags) imports every file
 * of the bundle but the programs themselves, and Node.js writes each
 * module's code cache (portable: named relative to the folder, so it holds
 * wherever dist/ is copied). Built as the user who builds, as the image's
 * build stage does as root: Node.js keeps one cache per user, so the agent
 * (root) finds it; a process of another user compiles as without it.
 * Importing runs each file's top level, which only defines things: the
 * programs (not imported here) are what start a command.
 */
async function bakeCompileCache(dir: string): Promise<void> {
  const programs = new Set(Object.keys(ENTRIES).map((n) => `${n}.mjs`));
  const files = (await readdir(dir)).filter((f) => f.endsWith('.mjs') && !programs.has(f)).sort();
  const script = [
    "import module from 'node:module';",
    `const r = module.enableCompileCache({ directory: ${JSON.stringify(path.join(dir, COMPILE_CACHE))}, portable: true });`,
    "if (r.status !== module.constants.compileCacheStatus.ENABLED) throw new Error(`compile cache: ${r.message ?? r.status}`);",
    `for (const f of ${JSON.stringify(files.map((f) => pathToFileURL(path.join(dir, f)).href))}) await import(f);`,
    'module.flushCompileCache();',
    'process.exit(0);',
  ].join('\n');
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME };
  await new Promise<void>((resolve, reject) => {
    execFile(process.execPath, [...NODE_FLAGS, '--input-type=module', '-e', script], { env, timeout: 120_000 }, (err, _stdout, stderr) =>
      err ? reject(new Error(`build: baking the compile cache failed: ${stderr || err.message}`)) : resolve(),
    );
  });
}

/** Mark the modules whose path matches as free of import-time side effects, so tree shaking may drop them whole. */
function pureModules(re: RegExp): esbuild.Plugin {
  return {
    name: 'pure-modules',
    setup(b) {
      b.onResolve({ filter: /.*/ }, async (args) => {
        if (args.pluginData === 'pure') return undefined;
        const r = await b.resolve(args.path, { kind: args.kind, importer: args.importer, resolveDir: args.resolveDir, pluginData: 'pure' });
        if (r.errors.length || !re.test(r.path)) return undefined;
        return { ...r, sideEffects: false };
      });
    },
  };
}

/**
 * Node.js built-ins loaded with require(), not import. An ES import of a
 * built-in makes Node.js read every one of its exports to build the module
 * namespace, getters included: for node:http that is its lazy WebSocket,
 * MessageEvent and CloseEvent, which load Node.js's own copy of undici
 * (about 14 MB resident, never used). require() reads nothing.
 */
function builtinsThroughRequire(): esbuild.Plugin {
  const NS = 'builtin-require';
  return {
    name: 'builtins-through-require',
    setup(b) {
      b.onResolve({ filter: /^(node:)?[a-z][a-z0-9_/]*$/ }, (args) => {
        if (!BUILTINS.has(args.path)) return undefined;
        if (args.namespace === NS) return { path: args.path, external: true };
        return { path: args.path.startsWith('node:') ? args.path : `node:${args.path}`, namespace: NS };
      });
      b.onLoad({ filter: /.*/, namespace: NS }, (args) => ({ contents: `module.exports = require(${JSON.stringify(args.path)});`, loader: 'js' }));
    },
  };
}

/** `undici` as scripts/bundle-shims/undici.mjs: the few things the Kubernetes client and the registry client take from it. */
function slimUndici(): esbuild.Plugin {
  const shim = path.join(ROOT, 'scripts/bundle-shims/undici.mjs');
  return {
    name: 'slim-undici',
    setup(b) {
      b.onResolve({ filter: /^undici$/ }, (args) => (args.importer === shim ? undefined : { path: shim }));
      // The shim's deep imports, past undici's "exports" map.
      b.onResolve({ filter: /^undici\/lib\// }, (args) => ({ path: path.join(ROOT, 'node_modules', args.path) }));
    },
  };
}
/** The entry's first line: run by `node` from PATH with NODE_FLAGS (env -S: coreutils 8.30 and later). */
async function setHashbang(file: string): Promise<void> {
  const text = await readFile(file, 'utf8');
  const body = text.startsWith('#!') ? text.slice(text.indexOf('\n') + 1) : text;
  await writeFile(file, `#!/usr/bin/env -S node ${NODE_FLAGS.join(' ')}\n${body}`);
  await chmod(file, 0o755);
}

/** The Node.js options a program's first line asks for (`#!/usr/bin/env [-S] node <options>`); none for other lines. */
export function hashbangNodeFlags(programText: string): string[] {
  const first = programText.slice(0, programText.indexOf('\n'));
  const m = /^#!\/usr\/bin\/env(?: -S)? node((?: \S+)*)\s*$/.exec(first);
  return m ? m[1]!.split(' ').filter(Boolean) : [];
}

const BUILTINS = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));

/** Every import left in the output is a Node.js built-in or an optional package. */
function checkExternals(meta: esbuild.Metafile): void {
  const bad = new Set<string>();
  for (const out of Object.values(meta.outputs)) {
    for (const imp of out.imports) {
      if (!imp.external) continue;
      if (BUILTINS.has(imp.path) || OPTIONAL_AT_RUNTIME.includes(imp.path)) continue;
      bad.add(imp.path);
    }
  }
  if (bad.size) throw new Error(`the bundle would need these at run time, and dist/ ships no node_modules: ${[...bad].join(', ')}`);
}

/** The license texts of the packages inlined into the bundle (they ship without their node_modules folders). */
async function licenses(meta: esbuild.Metafile): Promise<string> {
  const dirs = new Set<string>();
  for (const out of Object.values(meta.outputs)) {
    for (const input of Object.keys(out.inputs)) {
      const m = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input);
      if (m) dirs.add(m[1]!);
    }
  }
  const parts: string[] = [];
  for (const dir of [...dirs].sort()) {
    const pkg = JSON.parse(await readFile(path.join(ROOT, dir, 'package.json'), 'utf8')) as { name: string; version: string; license?: string };
    const files = (await readdir(path.join(ROOT, dir))).filter((f) => /^(licen[cs]e|copying|notice)/i.test(f)).sort();
    const texts = await Promise.all(files.map((f) => readFile(path.join(ROOT, dir, f), 'utf8')));
    parts.push(`${pkg.name} ${pkg.version} (${pkg.license ?? 'license not stated'})\n\n${texts.join('\n\n').trim() || '(no license file in the package)'}\n`);
  }
  return `Third-party packages inlined into this bundle, with their licenses.\n\n${parts.join(`\n${'-'.repeat(72)}\n\n`)}`;
}

/** Bytes per output file and, within each, per package: what tree shaking kept. */
export function sizeReport(meta: esbuild.Metafile): string {
  const rows: string[] = [];
  for (const [file, out] of Object.entries(meta.outputs).sort((a, b) => b[1].bytes - a[1].bytes)) {
    if (file.endsWith('.map')) continue;
    const byPackage = new Map<string, number>();
    for (const [input, v] of Object.entries(out.inputs)) {
      const m = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(input);
      const key = m ? m[1]! : 'pinset';
      byPackage.set(key, (byPackage.get(key) ?? 0) + v.bytesInOutput);
    }
    const top = [...byPackage].sort((a, b) => b[1] - a[1]).slice(0, 6).map(([k, v]) => `${k} ${(v / 1024).toFixed(0)}K`);
    rows.push(`${path.basename(file).padEnd(36)} ${`${(out.bytes / 1024).toFixed(0)}K`.padStart(6)}  ${top.join(', ')}`);
  }
  return rows.join('\n');
}

if (import.meta.main) {
  const t0 = performance.now();
  const r = await build();
  if (process.argv.includes('--sizes')) process.stdout.write(`${sizeReport(r.metafile)}\n`);
  process.stdout.write(`build: ${path.relative(ROOT, r.outdir)}/ in ${Math.round(performance.now() - t0)} ms (sources ${r.info.sourceHash.slice(0, 12)})\n`);
}
