// Flags shared by the commands that ask registries (resolve, size): where
// credentials (files, and the docker credential helpers they name) and
// mirrors come from, deadlines, parallelism, and the client built from
// them. Mirrors come from registries.conf, as CRI-O and podman read it, or,
// given --containerd-hosts-dir, from containerd's registry hosts alone, as a
// containerd node pulls.
import { stat } from 'node:fs/promises';
import { RegistryClient } from '../registry/client.ts';
import { ContainerdHosts } from '../registry/containerd-hosts.ts';
import { authFilePaths, loadAuthFiles } from '../registry/credentials.ts';
import { DEFAULT_REGISTRIES_CONF_DIR, loadRegistriesConf, RegistriesConfError } from '../registry/registries-conf.ts';
import { UsageError, type FlagSpec, type FlagValues } from '../util/flags.ts';

export const REGISTRY_FLAGS: readonly FlagSpec[] = [
  {
    name: 'auth-file',
    env: 'REGISTRY_AUTH_FILE',
    type: 'string',
    help: 'registry credentials (containers auth.json or docker config.json; its credHelpers and credsStore run docker-credential-<name> get); default: $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json, then $DOCKER_CONFIG/config.json or ~/.docker/config.json',
  },
  { name: 'registries-conf', env: 'CONTAINERS_REGISTRIES_CONF', type: 'string', help: 'registries.conf with mirrors and insecure registries (default /etc/containers/registries.conf)' },
  { name: 'registries-conf-dir', env: 'PINSET_REGISTRIES_CONF_DIR', type: 'string', default: DEFAULT_REGISTRIES_CONF_DIR, help: 'drop-in folder of registries.conf' },
  {
    name: 'containerd-hosts-dir',
    env: 'PINSET_CONTAINERD_HOSTS_DIR',
    type: 'string',
    help: 'containerd\'s registry hosts folder (its config_path, e.g. /etc/containerd/certs.d; several joined with ":"): registries are asked as containerd asks them, and registries.conf is not read; default: not used',
  },
  { name: 'timeout', env: 'PINSET_REGISTRY_TIMEOUT', type: 'duration', default: '30s', help: 'deadline for each registry request' },
  { name: 'parallel', env: 'PINSET_REGISTRY_PARALLEL', type: 'int', default: 8, help: 'registry requests in flight at once' },
];

/** A client configured from the flags; credential files that cannot be read are reported on stderr, not fatal. */
export async function registryClientFrom(values: FlagValues, command: string, stderr: NodeJS.WritableStream): Promise<RegistryClient> {
  const hostsDir = values['containerd-hosts-dir'] as string | undefined;
  const containerdHosts = hostsDir ? await containerdHostsFrom(hostsDir, command, stderr) : undefined;
  let registries;
  try {
    if (!containerdHosts) registries = await loadRegistriesConf({ file: values['registries-conf'] as string | undefined, dir: values['registries-conf-dir'] as string });
  } catch (e) {
    if (e instanceof RegistriesConfError) throw new UsageError(e.message);
    throw e;
  }
  const { credentials, problems } = await loadAuthFiles(authFilePaths(values['auth-file'] as string | undefined));
  for (const p of problems) stderr.write(`pinset ${command}: ${p}\n`);
  if ((values.parallel as number) < 1) throw new UsageError('--parallel must be at least 1');
  return new RegistryClient({ registries, containerdHosts, credentials, timeoutMs: values.timeout as number, userAgent: 'pinset' });
}

/** Named on the command line, each folder must be there: containerd would take a mistyped one as no configuration at all. */
async function containerdHostsFrom(dirs: string, command: string, stderr: NodeJS.WritableStream): Promise<ContainerdHosts> {
  const hosts = new ContainerdHosts(dirs, { onProblem: (m) => stderr.write(`pinset ${command}: ${m}\n`) });
  for (const dir of hosts.roots) {
    const st = await stat(dir).catch((e: NodeJS.ErrnoException) => e.code ?? 'unreadable');
    if (typeof st === 'string' || !st.isDirectory()) throw new UsageError(`--containerd-hosts-dir: ${dir} is not a folder${typeof st === 'string' ? ` (${st})` : ''}`);
  }
  return hosts;
}
