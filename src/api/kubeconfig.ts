// Loading client configuration for the commands. The agent uses only what it
// is told (--kubeconfig) or the in-cluster config, so a node with a stray
// ~/.kube/config does not silently talk to another cluster; the people's
// commands (status) and the controller use kubectl's usual search.
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';

/** --kubeconfig, else in-cluster config inside a pod, else null. */
export function loadAgentKubeConfig(kubeconfig: string | undefined, env = process.env): KubeConfig | null {
  const kc = new KubeConfig();
  if (kubeconfig) {
    kc.loadFromFile(kubeconfig);
    return kc;
  }
  if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT) {
    kc.loadFromCluster();
    return kc;
  }
  return null;
}

/** The service account token every pod gets (client-node's SERVICEACCOUNT_TOKEN_PATH). */
const IN_CLUSTER_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/**
 * --kubeconfig, else kubectl's search: the files in KUBECONFIG (missing ones
 * skipped, as kubectl skips them), else ~/.kube/config, else the in-cluster
 * config of a pod. Throws an Error that names the file, or, when nothing is
 * found, every place it looked.
 */
export function loadClientKubeConfig(kubeconfig: string | undefined, env = process.env, home = os.homedir()): KubeConfig {
  const kc = new KubeConfig();
  let source: string;
  try {
    // The commands' --kubeconfig flag has KUBECONFIG as its environment twin;
    // from there it is a list of files, as kubectl reads it.
    if (kubeconfig && kubeconfig !== env.KUBECONFIG) {
      source = kubeconfig;
      kc.loadFromFile(kubeconfig);
    } else if (env.KUBECONFIG) {
      const files = env.KUBECONFIG.split(path.delimiter).filter(Boolean);
      const present = files.filter((f) => existsSync(f));
      if (present.length === 0) throw new Error(`KUBECONFIG names ${files.join(', ')}, and none of them exists; pass --kubeconfig FILE or fix KUBECONFIG`);
      source = present.join(path.delimiter);
      kc.loadFromFile(present[0]!);
      for (const f of present.slice(1)) {
        const more = new KubeConfig();
        more.loadFromFile(f);
        kc.mergeConfig(more, true);
      }
    } else if (existsSync(path.join(home, '.kube', 'config'))) {
      source = path.join(home, '.kube', 'config');
      kc.loadFromFile(source);
    } else if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT && existsSync(IN_CLUSTER_TOKEN)) {
      source = 'the in-cluster configuration';
      kc.loadFromCluster();
    } else {
      throw new Error(
        `no kubeconfig found: --kubeconfig was not given, KUBECONFIG is not set, ${path.join(home, '.kube', 'config')} does not exist, ` +
          `and this is not a pod in a cluster (${env.KUBERNETES_SERVICE_HOST ? `no service account token at ${IN_CLUSTER_TOKEN}` : 'KUBERNETES_SERVICE_HOST is not set'}); ` +
          'pass --kubeconfig FILE or set KUBECONFIG',
      );
    }
  } catch (err) {
    const msg = (err as Error).message;
    if (msg.startsWith('no kubeconfig found') || msg.startsWith('KUBECONFIG names')) throw err;
    throw new Error(`cannot load the kubeconfig${source! ? ` ${source}` : ''}: ${msg}`);
  }
  if (!kc.getCurrentCluster()) throw new Error(`${source} names no current cluster (current-context); pass --kubeconfig or pick a context`);
  return kc;
}
