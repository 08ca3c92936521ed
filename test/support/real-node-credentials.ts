// Registry credentials on the node suite's real node (./real-node.ts), as a
// node has them whose container runtime holds none: two registries behind
// htpasswd (distribution) on loopback, each accepting one user of its own,
// and known to the runtime without any credential. On containerd each has a
// made-up name its hosts.toml maps to it. CRI-O (containers/image) never
// sends a pull's credentials to a registries.conf location on another host
// than the image's (docker/docker_image_src.go: "we must not blindly send
// the credentials intended for the primary endpoint to mirrors"), so there
// the images are named by the registry's own address, which its
// registries.conf marks insecure. The two registries:
//  - the plugin's (containerd: private.registry.test), whose credential only
//    the kubelet's credential provider plugin gives: the test plugin
//    (./test-credential-provider.mjs)
//    and one CredentialProviderConfig, in the folder the shipped EKS
//    component (deploy/credential-providers/eks) mounts read-only into the
//    agent's pod, at the paths it names. The kubelet reads the same two
//    files through its own flags (--image-credential-provider-config,
//    --image-credential-provider-bin-dir), under the bed's host root;
//  - the pull secret's (containerd: secret.registry.test), whose credential
//    only a pull secret in the agents' namespace holds.
// The one plugin file runs in two places: on the host, as the kubelet's
// child, and in pinset's image, as the agent's. Its shebang is
// `/usr/bin/env node`, as a plugin written in Node.js would have it: the
// image has Node.js on its PATH (/usr/local/bin), and the kubelet is started
// with this Node.js's folder first on its PATH. The kubelet's environment
// also names an exec log (TEST_PLUGIN_LOG), which its plugin children
// inherit and the agent's (in a read-only container) do not: the log holds
// the kubelet's execs, and the agent's metrics count its own.
import { randomBytes } from 'node:crypto';
import { mkdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { installTestPlugin, TEST_PLUGIN_NAME, writeProviderConfig } from './credential-plugin.ts';
import { DEPLOY_DIR } from './real-node-deploy.ts';
import type { RuntimeName } from './real-node-runtime.ts';
import { Registry, type RegistryCredentials } from './registry.ts';

/** containerd's name of the plugin's registry. */
export const PLUGIN_REGISTRY = 'private.registry.test';
/** containerd's name of the registry only the pull secret has a credential for (no plugin matches it). */
export const SECRET_REGISTRY = 'secret.registry.test';
/** The kustomize component that mounts the plugin folder into the agent's pod: the shipped EKS one (nothing in it is specific to ECR). */
export const PROVIDER_COMPONENT = join(DEPLOY_DIR, 'credential-providers', 'eks');
export const PULL_SECRET_NAME = 'node-suite-registry';
/** The args the config gives the plugin (the exec log shows them). */
export const PLUGIN_ARGS = ['--from-config'];

export interface NodeCredentials {
  pluginRegistry: Registry;
  secretRegistry: Registry;
  /** The registry host images name: the plugin's matchImages, and the pull secret's key. */
  pluginHost: string;
  secretHost: string;
  /** The credential file and plugin folder as the agent's pod sees them (the component's paths). */
  configPath: string;
  binDir: string;
  /** The kubelet's flags naming the same files on the host, and what its environment adds. */
  kubeletArgs: string[];
  kubeletEnv: Record<string, string>;
  /** The plugin's exec log, written by the execs the kubelet makes. */
  kubeletExecLog: string;
  /** The Secret (kubernetes.io/dockerconfigjson) holding secret.registry.test's credential. */
  pullSecret: Record<string, unknown>;
  /** Every secret string the bed holds, with a name to report it by (a message never prints the value). */
  secrets: Array<{ what: string; value: string }>;
  stop(): Promise<void>;
}

/** The config file and bin folder the component points the agent at (its env), read from the component. */
async function componentPaths(): Promise<{ config: string; binDir: string }> {
  const patch = parseYaml(await readFile(join(PROVIDER_COMPONENT, 'daemonset-patch.yaml'), 'utf8'));
  const env = (patch?.spec?.template?.spec?.containers?.[0]?.env ?? []) as Array<{ name: string; value?: string }>;
  const value = (name: string) => {
    const v = env.find((e) => e.name === name)?.value;
    if (!v) throw new Error(`${PROVIDER_COMPONENT}/daemonset-patch.yaml sets no ${name}`);
    return v;
  };
  return { config: value('PINSET_IMAGE_CREDENTIAL_PROVIDER_CONFIG'), binDir: value('PINSET_IMAGE_CREDENTIAL_PROVIDER_BIN_DIR') };
}

const b64 = (s: string) => Buffer.from(s).toString('base64');
/** Distinctive and new at every run, so a search for it cannot match anything else. */
const password = (what: string) => `${what}-${randomBytes(12).toString('hex')}`;

/** Starts the two registries and writes the plugin and its config under `hostRoot` for a node on `runtime`; `state` holds the exec log. */
export async function startNodeCredentials(hostRoot: string, state: string, runtime: RuntimeName): Promise<NodeCredentials> {
  const pluginUser: RegistryCredentials = { username: 'node-robot', password: password('Plugin-pw') };
  const secretUser: RegistryCredentials = { username: 'puller', password: password('PullSecret-pw') };
  const pluginRegistry = await Registry.start({ auth: pluginUser });
  let secretRegistry: Registry | undefined;
  try {
    secretRegistry = await Registry.start({ auth: secretUser });
    const pluginHost = runtime === 'crio' ? pluginRegistry.host : PLUGIN_REGISTRY;
    const secretHost = runtime === 'crio' ? secretRegistry.host : SECRET_REGISTRY;
    const paths = await componentPaths();
    const host = (p: string) => join(hostRoot, p);
    await mkdir(host(paths.binDir), { recursive: true });
    await mkdir(dirname(host(paths.config)), { recursive: true });
    await installTestPlugin(host(paths.binDir), TEST_PLUGIN_NAME, '/usr/bin/env node');
    await writeProviderConfig(
      host(paths.config),
      [
        {
          matchImages: [pluginHost],
          defaultCacheDuration: '10m',
          args: PLUGIN_ARGS,
          env: { TEST_PLUGIN_USERNAME: pluginUser.username, TEST_PLUGIN_PASSWORD: pluginUser.password, TEST_PLUGIN_CACHE_KEY_TYPE: 'Registry' },
        },
      ],
      paths.config.endsWith('.json') ? 'json' : 'yaml',
    );
    const kubeletExecLog = join(state, 'kubelet-plugin-execs.log');
    const dockerConfig = b64(JSON.stringify({ auths: { [secretHost]: { auth: b64(`${secretUser.username}:${secretUser.password}`) } } }));
    const registries = { pluginRegistry, secretRegistry };
    return {
      ...registries,
      pluginHost,
      secretHost,
      configPath: paths.config,
      binDir: paths.binDir,
      kubeletArgs: ['--image-credential-provider-config', host(paths.config), '--image-credential-provider-bin-dir', host(paths.binDir)],
      kubeletEnv: { PATH: `${dirname(process.execPath)}:${process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin'}`, TEST_PLUGIN_LOG: kubeletExecLog },
      kubeletExecLog,
      pullSecret: {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: PULL_SECRET_NAME },
        type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': dockerConfig },
      },
      secrets: [
        { what: "the plugin's password", value: pluginUser.password },
        { what: "the plugin's credential, base64", value: b64(`${pluginUser.username}:${pluginUser.password}`) },
        { what: "the pull secret's password", value: secretUser.password },
        { what: "the pull secret's credential, base64", value: b64(`${secretUser.username}:${secretUser.password}`) },
        { what: "the pull secret's .dockerconfigjson", value: dockerConfig },
      ],
      stop: async () => {
        await registries.pluginRegistry.stop();
        await registries.secretRegistry.stop();
      },
    };
  } catch (err) {
    await pluginRegistry.stop();
    await secretRegistry?.stop();
    throw err;
  }
}

/** Which of the bed's secrets `text` holds, by name. */
export function secretsIn(text: string, secrets: NodeCredentials['secrets']): string[] {
  return secrets.filter((s) => text.includes(s.value)).map((s) => s.what);
}
