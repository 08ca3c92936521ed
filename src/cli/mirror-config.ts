// `pinset mirror-config`: the node configuration that sends a runtime's
// pulls of a registry through a pull-through cache (deploy/cache/), the
// cache first and the registry itself after it. pinset never writes these
// files: an administrator (or the tool that owns the node's configuration)
// saves what this prints.
//
// - containerd: a hosts.toml for the registry's folder under config_path
//   (docs/hosts.md: "hosts will be tried first in the order listed. If all
//   hosts are tried then `server` will be used as a fallback"). containerd
//   reads it on the next pull, with no restart. One registry per file.
// - CRI-O: a registries.conf.d drop-in, one [[registry]] per registry with
//   the cache as its [[registry.mirror]]; containers/image tries mirrors in
//   order and the registry's own location last
//   (sysregistriesv2.PullSourcesFromReference). CRI-O reads it on reload.
// - k3s and RKE2 write containerd's hosts.toml themselves from
//   /etc/rancher/{k3s,rke2}/registries.yaml at start, over any hand-written
//   one: their entries (`mirrors`) are printed for that file instead.
// - OpenShift's Machine Config Operator owns registries.conf on its nodes:
//   an ImageDigestMirrorSet is printed instead (pinset's sets pull by
//   digest, which is what that kind applies to).
//
// Every file is built with the TOML or YAML library from checked values;
// comments carry only the checked host names and URLs.
import { stringify as stringifyToml } from 'smol-toml';
import { Document } from 'yaml';
import { hostDirectory } from '../registry/hosts-toml.ts';
import { parseImageName } from '../registry/names.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import type { CommandIO } from './resolve.ts';

export const RUNTIMES = ['containerd', 'crio', 'k3s', 'openshift'] as const;
export type MirrorRuntime = (typeof RUNTIMES)[number];

const FLAGS: readonly FlagSpec[] = [
  {
    name: 'runtime',
    env: 'PINSET_MIRROR_CONFIG_RUNTIME',
    type: 'string',
    default: 'containerd',
    choices: [...RUNTIMES],
    help: "the nodes' configuration to print: containerd (a hosts.toml), crio (a registries.conf.d drop-in), k3s (registries.yaml entries, k3s and RKE2), openshift (an ImageDigestMirrorSet)",
  },
  {
    name: 'server',
    env: 'PINSET_MIRROR_CONFIG_SERVER',
    type: 'string',
    help: "containerd and crio, one REGISTRY only: where the registry itself is reached after the cache (a URL), when not at its own name over HTTPS",
  },
  {
    name: 'name',
    env: 'PINSET_MIRROR_CONFIG_NAME',
    type: 'string',
    default: 'pinset-registry-cache',
    help: 'openshift: the ImageDigestMirrorSet\'s name',
  },
];

const USAGE = 'pinset mirror-config [--runtime containerd|crio|k3s|openshift] [--server URL] [--name NAME] REGISTRY=CACHE_URL...';
const SUMMARY =
  "Prints the node configuration that sends the runtime's pulls of each REGISTRY through its pull-through\n" +
  'cache at CACHE_URL first, and to the registry itself when the cache cannot serve them (deploy/cache/).\n' +
  'containerd: one REGISTRY, a hosts.toml for /etc/containerd/certs.d/<REGISTRY>/; crio: a drop-in for\n' +
  '/etc/containers/registries.conf.d/; k3s: entries for /etc/rancher/{k3s,rke2}/registries.yaml; openshift:\n' +
  'an ImageDigestMirrorSet. Nothing is written: save the output where it says.\n' +
  'Exit status: 0 printed, 2 usage error. See docs/fleet.md.';

export const flags = FLAGS;

/** One registry and the cache in front of it. */
export interface CacheRoute {
  /** The registry's host[:port], as image names spell it (docker.io for Docker Hub). */
  registry: string;
  /** The cache's URL, origin only (http://10.96.0.50:5000). */
  cache: URL;
}

/** The registry's own endpoint, when it is not https://<registry>. */
export interface Upstream {
  url: URL;
}

/** A URL with a scheme of http or https and nothing after host:port; else a usage error naming `what`. */
function originUrl(text: string, what: string): URL {
  let u: URL;
  try {
    u = new URL(text);
  } catch {
    throw new UsageError(`${what} ${JSON.stringify(text)} is not a URL (e.g. http://10.96.200.10:5000)`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new UsageError(`${what} ${JSON.stringify(text)}: the scheme must be http or https`);
  if (u.username || u.password) throw new UsageError(`${what}: no credentials in the URL (a mirror gets none; the cache holds the registry's own)`);
  if ((u.pathname !== '/' && u.pathname !== '') || u.search || u.hash) throw new UsageError(`${what} ${JSON.stringify(text)}: give the scheme, host and port only`);
  return new URL(u.origin);
}

/** REGISTRY=CACHE_URL, checked: the registry as an image name's host, the cache as an http(s) origin. */
export function parseRoute(arg: string): CacheRoute {
  const eq = arg.indexOf('=');
  if (eq <= 0) throw new UsageError(`${JSON.stringify(arg)}: write REGISTRY=CACHE_URL, e.g. quay.io=http://10.96.200.10:5000`);
  const registry = arg.slice(0, eq);
  const parsed = parseImageName(`${registry}/pinset:latest`);
  if (!parsed.ok || parsed.value.host !== registry || registry.includes('/')) {
    throw new UsageError(`${JSON.stringify(registry)} is not a registry host as image names spell it (host or host:port, e.g. quay.io, registry.example.com:5000)`);
  }
  return { registry: registry.toLowerCase(), cache: originUrl(arg.slice(eq + 1), `the cache of ${registry}`) };
}

/** host[:port] of a URL, as containers/image and ImageDigestMirrorSets name a location (no scheme). */
function hostPort(u: URL): string {
  return u.host;
}

/** The URL as containerd's hosts.toml spells a host: scheme://host[:port], no trailing slash. */
function hostUrl(u: URL): string {
  return u.origin;
}

/** Where containerd reaches a registry itself: Docker Hub's real host for docker.io (containerd's default), else https://<registry>. */
export function defaultServer(registry: string): string {
  return registry === 'docker.io' ? 'https://registry-1.docker.io' : `https://${registry}`;
}

function comment(lines: readonly string[]): string {
  return lines.map((l) => (l ? `# ${l}` : '#')).join('\n') + '\n';
}

/** containerd's hosts.toml: the cache as the one [host] (pull and resolve), the registry as `server`. */
export function renderHostsToml(route: CacheRoute, upstream?: Upstream): string {
  const server = upstream ? hostUrl(upstream.url) : defaultServer(route.registry);
  const cache = hostUrl(route.cache);
  const body = stringifyToml({ server, host: { [cache]: { capabilities: ['pull', 'resolve'] } } });
  return (
    comment([
      `From \`pinset mirror-config\`: containerd pulls ${route.registry} images`,
      `from the cache at ${cache} first,`,
      `and from ${server} when the cache cannot serve them.`,
      `Save as <config_path>/${hostDirectory(route.registry)}/hosts.toml (config_path: the`,
      "registry setting of containerd's CRI plugin, often /etc/containerd/certs.d).",
      'containerd reads it on the next pull; no restart. It replaces a hosts.toml of',
      'this registry: carry over what yours had.',
    ]) +
    '\n' +
    body +
    '\n'
  );
}

/**
 * A registries.conf.d drop-in: one [[registry]] per route, its prefix and
 * location the registry (or --server's host), the cache as its one mirror.
 * A cache reached over http is `insecure` (containers/image: plain HTTP or
 * an unverified certificate).
 */
export function renderCrioDropin(routes: readonly CacheRoute[], upstream?: Upstream): string {
  const registry = routes.map((r) => {
    const location = upstream ? hostPort(upstream.url) : r.registry;
    return {
      prefix: r.registry,
      location,
      ...(upstream?.url.protocol === 'http:' ? { insecure: true } : {}),
      mirror: [{ location: hostPort(r.cache), ...(r.cache.protocol === 'http:' ? { insecure: true } : {}) }],
    };
  });
  return (
    comment([
      'From `pinset mirror-config --runtime crio`: CRI-O pulls these registries\' images from their',
      'cache first, and from the registry itself when the cache does not have the manifest.',
      'Save as /etc/containers/registries.conf.d/50-pinset-registry-cache.conf, then reload CRI-O',
      '(systemctl reload crio). A [[registry]] here replaces one with the same prefix from',
      'registries.conf or an earlier drop-in: carry over what that one had (other mirrors, insecure).',
      ...routes.map((r) => `${r.registry}: cache ${hostUrl(r.cache)}`),
    ]) +
    '\n' +
    stringifyToml({ registry }) +
    '\n'
  );
}

/** k3s/RKE2 registries.yaml entries: each registry's cache as its endpoint; k3s tries the registry itself after its endpoints. */
export function renderK3sRegistries(routes: readonly CacheRoute[]): string {
  const doc = new Document({ mirrors: Object.fromEntries(routes.map((r) => [r.registry, { endpoint: [hostUrl(r.cache)] }])) });
  doc.commentBefore = [
    ' From `pinset mirror-config --runtime k3s`: k3s and RKE2 write containerd\'s hosts.toml',
    ' from /etc/rancher/k3s/registries.yaml (RKE2: /etc/rancher/rke2/registries.yaml) at start,',
    ' over any written by hand. Add these mirrors to that file on every node and restart k3s',
    ' (or rke2-server / rke2-agent). After its endpoints k3s tries the registry itself, unless',
    ' it runs with --disable-default-registry-endpoint.',
  ].join('\n');
  return doc.toString({ lineWidth: 0 });
}

/** An OpenShift ImageDigestMirrorSet: each registry's cache as its mirror, the registry itself still contacted. */
export function renderImageDigestMirrorSet(routes: readonly CacheRoute[], name: string): string {
  const doc = new Document({
    apiVersion: 'config.openshift.io/v1',
    kind: 'ImageDigestMirrorSet',
    metadata: { name },
    spec: {
      imageDigestMirrors: routes.map((r) => ({ source: r.registry, mirrors: [hostPort(r.cache)], mirrorSourcePolicy: 'AllowContactingSource' })),
    },
  });
  const http = routes.filter((r) => r.cache.protocol === 'http:').map((r) => hostPort(r.cache));
  doc.commentBefore = [
    ' From `pinset mirror-config --runtime openshift`: the Machine Config Operator writes',
    ' registries.conf on every node from ImageDigestMirrorSets; apply this with `oc apply -f`.',
    ' It applies to pulls by digest, as pinset\'s sets pull.',
    ...(http.length
      ? [` A cache on plain HTTP must also be listed in image.config.openshift.io/cluster`, ` spec.registrySources.insecureRegistries: ${http.join(', ')}.`]
      : []),
  ].join('\n');
  return doc.toString({ lineWidth: 0 });
}

/** What to print for these routes on this runtime; throws UsageError for a combination that has no meaning. */
export function render(runtime: MirrorRuntime, routes: readonly CacheRoute[], opts: { server?: string; name?: string } = {}): string {
  const seen = new Set<string>();
  for (const r of routes) {
    if (seen.has(r.registry)) throw new UsageError(`${r.registry} is given twice: one cache per registry`);
    seen.add(r.registry);
  }
  let upstream: Upstream | undefined;
  if (opts.server !== undefined && opts.server !== '') {
    if (runtime !== 'containerd' && runtime !== 'crio') throw new UsageError(`--server goes with --runtime containerd or crio (${runtime} reaches the registry at its own name)`);
    if (routes.length !== 1) throw new UsageError('--server goes with one REGISTRY');
    upstream = { url: originUrl(opts.server, '--server') };
  }
  switch (runtime) {
    case 'containerd':
      if (routes.length !== 1) throw new UsageError('containerd reads one hosts.toml per registry, in its own folder: give one REGISTRY=CACHE_URL per run');
      return renderHostsToml(routes[0]!, upstream);
    case 'crio':
      return renderCrioDropin(routes, upstream);
    case 'k3s':
      return renderK3sRegistries(routes);
    case 'openshift':
      return renderImageDigestMirrorSet(routes, opts.name || 'pinset-registry-cache');
  }
}

export async function run(argv: string[], io: CommandIO = { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const { values, positional } = parseFlags(FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, FLAGS));
    return 0;
  }
  if (positional.length === 0) throw new UsageError(`give REGISTRY=CACHE_URL, e.g. quay.io=http://10.96.200.10:5000\nusage: ${USAGE}`);
  const name = values.name as string;
  if (!/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(name) || name.length > 253) throw new UsageError(`--name ${JSON.stringify(name)} must be a lowercase DNS subdomain`);
  const routes = positional.map(parseRoute);
  io.stdout.write(render(values.runtime as MirrorRuntime, routes, { server: values.server as string | undefined, name }));
  return 0;
}
