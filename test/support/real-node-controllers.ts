// Kubernetes' own controllers for the node suite's real node (./real-node.ts):
// kube-controller-manager (PINSET_KUBE_CONTROLLER_MANAGER_BIN) and
// kube-scheduler (PINSET_KUBE_SCHEDULER_BIN), built from the same tree as the
// kubelet. They create and place the pods of pinset's DaemonSet and
// Deployment, taint the Node while it is not Ready, and publish what every
// namespace needs (its default ServiceAccount, the kube-root-ca.crt
// ConfigMap). Each runs as a plain process on loopback, with its own client
// certificate (the users their bootstrap RBAC roles are bound to), and is
// stopped by its own PID. Without them the suite imitates the daemonset
// controller and says so.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ServerProcess } from './components.ts';
import { writeKubeconfig, type KubePki } from './kube-pki.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ControllerBins {
  controllerManager: string;
  scheduler: string;
}

/** The binaries when both are given, or why the suite imitates the controllers. */
export function controllerBins(env: NodeJS.ProcessEnv = process.env): ControllerBins | { why: string } {
  const cm = env.PINSET_KUBE_CONTROLLER_MANAGER_BIN;
  const sched = env.PINSET_KUBE_SCHEDULER_BIN;
  if (!cm || !sched) return { why: `${[!cm && 'PINSET_KUBE_CONTROLLER_MANAGER_BIN', !sched && 'PINSET_KUBE_SCHEDULER_BIN'].filter(Boolean).join(' and ')} not set` };
  for (const [k, v] of [['PINSET_KUBE_CONTROLLER_MANAGER_BIN', cm], ['PINSET_KUBE_SCHEDULER_BIN', sched]] as const) if (!existsSync(v)) return { why: `${k}=${v} does not exist` };
  return { controllerManager: cm, scheduler: sched };
}

/**
 * The controllers pinset's objects need, and those a first node meets: the
 * workloads' (daemonset, deployment, replicaset), the garbage collector
 * (owner references), node-lifecycle (the not-ready taints) with
 * taint-eviction, and what every namespace gets (serviceaccount,
 * root-ca-certificate-publisher). A kube-controller-manager built from
 * OpenShift's tree also offers service-ca-certificate-publisher, whose
 * openshift-service-ca.crt ConfigMap that tree's API server adds to every
 * service-account token volume.
 */
const WANTED = [
  'daemonset-controller',
  'deployment-controller',
  'replicaset-controller',
  'garbage-collector-controller',
  'node-lifecycle-controller',
  'taint-eviction-controller',
  'serviceaccount-controller',
  'root-ca-certificate-publisher-controller',
];
const IF_OFFERED = ['service-ca-certificate-publisher-controller'];

export interface RunningControllers {
  controllerManager: ServerProcess;
  scheduler: ServerProcess;
  /** The controllers kube-controller-manager runs. */
  controllers: string[];
  /** Whether it publishes openshift-service-ca.crt (else the bed does). */
  publishesServiceCa: boolean;
  stop(): Promise<void>;
}

export async function startControllers(bins: ControllerBins, o: { state: string; server: string; pki: KubePki }): Promise<RunningControllers> {
  const help = await run(bins.controllerManager, ['--help'], { maxBuffer: 4 << 20 }).then((r) => r.stdout, (e: { stdout?: string }) => e.stdout ?? '');
  const offered = IF_OFFERED.filter((c) => help.includes(c));
  const controllers = [...WANTED, ...offered];
  const cmConfig = await writeKubeconfig(join(o.state, 'kube-controller-manager.kubeconfig'), o.server, o.pki.ca.cert, o.pki.controllerManager, 'system:kube-controller-manager');
  const schedConfig = await writeKubeconfig(join(o.state, 'kube-scheduler.kubeconfig'), o.server, o.pki.ca.cert, o.pki.scheduler, 'system:kube-scheduler');
  const controllerManager = new ServerProcess(
    'kube-controller-manager',
    bins.controllerManager,
    [
      '--kubeconfig', cmConfig,
      '--controllers', controllers.join(','),
      // Each controller with its own service account's token (TokenRequest),
      // bound to its own bootstrap role, as kubeadm runs it.
      '--use-service-account-credentials',
      '--service-account-private-key-file', o.pki.serviceAccount.key,
      '--root-ca-file', o.pki.ca.cert,
      // One instance: no election to wait for.
      '--leader-elect=false',
      // No serving: nothing scrapes it here.
      '--secure-port', '0',
      '--v', '2',
    ],
    join(o.state, 'kube-controller-manager.log'),
  );
  const scheduler = new ServerProcess(
    'kube-scheduler',
    bins.scheduler,
    ['--kubeconfig', schedConfig, '--leader-elect=false', '--secure-port', '0', '--v', '2'],
    join(o.state, 'kube-scheduler.log'),
  );
  const stop = async () => {
    await scheduler.stop();
    await controllerManager.stop();
  };
  // Both log their start; an early exit is a configuration error worth its log.
  await sleep(1500);
  for (const p of [controllerManager, scheduler]) {
    if (!p.running) {
      await stop();
      throw new Error(`${p.name} exited at start (${await p.exited}):\n${p.logTail(20)}`);
    }
  }
  return { controllerManager, scheduler, controllers, publishesServiceCa: offered.length > 0, stop };
}
