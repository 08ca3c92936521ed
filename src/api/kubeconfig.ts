// Loading client configuration for the commands. The agent uses only what it
// is told (--kubeconfig) or the in-cluster config, so a node with a stray
// ~/.kube/config does not silently talk to another cluster; the people's
// commands (status) and the controller use kubectl's usual search.
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

/**
 * --kubeconfig, else kubectl's search (KUBECONFIG, ~/.kube/config,
 * in-cluster). Throws an Error naming the file when it cannot be used.
 */
export function loadClientKubeConfig(kubeconfig: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  try {
    if (kubeconfig) kc.loadFromFile(kubeconfig);
    else kc.loadFromDefault();
  } catch (err) {
    throw new Error(`cannot load the kubeconfig${kubeconfig ? ` ${kubeconfig}` : ''}: ${(err as Error).message}`);
  }
  if (!kc.getCurrentCluster()) throw new Error('the kubeconfig names no current cluster; pass --kubeconfig or run in a cluster');
  return kc;
}
