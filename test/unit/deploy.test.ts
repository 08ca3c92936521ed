// deploy/: what `kubectl apply -k deploy/` would install, built offline with
// `kubectl kustomize` and checked object by object, plus the systemd unit.
// RBAC is compared as an exact set of (scope, group, resource, verb), so
// widening a Role fails here.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { AGENT_FLAGS } from '../../src/agent/agent-flags.ts';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { PINSET_LABEL, PINSET_LABEL_VALUE } from '../../src/cli/manifests.ts';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const NS = 'pinset-system';
const AGENT_SA = 'pinset-agent';
const CONTROLLER_SA = 'pinset-controller';

type Obj = Record<string, any>;

function findOnPath(cmd: string, preferred: string[]): string | undefined {
  for (const p of preferred) if (existsSync(p)) return p;
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (dir && existsSync(path.join(dir, cmd))) return path.join(dir, cmd);
  }
  return undefined;
}

const kubectl = findOnPath('kubectl', ['/usr/bin/kubectl']);
const kubectlMissing = 'kubectl not found (looked at /usr/bin/kubectl and PATH): the kustomization is NOT checked';
if (!kubectl && process.env.CI !== 'true') process.stderr.write(`\n*** SKIPPING deploy tests: ${kubectlMissing} ***\n\n`);

async function build(dir = 'deploy'): Promise<Obj[]> {
  if (!kubectl) assert.fail(`${kubectlMissing}; CI=true requires it`);
  const { stdout } = await run(kubectl, ['kustomize', path.join(ROOT, dir)], { maxBuffer: 16 << 20 });
  return parseYamlDocuments(stdout).map((d) => {
    if ('error' in d) assert.fail(`kubectl kustomize printed invalid YAML: ${d.error}`);
    return d.value as Obj;
  });
}

const skip = !kubectl && process.env.CI !== 'true' ? kubectlMissing : false;
const objects: Obj[] = skip ? [] : await build();
const pkg = JSON.parse(await readFile(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };

function one(kind: string, name: string, namespace?: string): Obj {
  const found = objects.filter((o) => o.kind === kind && o.metadata.name === name && o.metadata.namespace === namespace);
  assert.equal(found.length, 1, `${kind} ${namespace ? namespace + '/' : ''}${name}: expected exactly one`);
  return found[0]!;
}

interface CommandHelp {
  flags: Set<string>;
  env: Set<string>;
  text: string;
}
const helps = new Map<string, Promise<CommandHelp>>();

/** Flags and environment twins from `pinset <command> --help`. */
function helpOf(command: string): Promise<CommandHelp> {
  let h = helps.get(command);
  if (!h) {
    h = run(path.join(ROOT, 'node_modules/.bin/node'), [path.join(ROOT, 'src/cli/main.ts'), command, '--help']).then(({ stdout }) => ({
      flags: new Set([...stdout.matchAll(/^\s+--([a-z0-9-]+)/gm)].map((m) => m[1]!)),
      env: new Set([...stdout.matchAll(/\(env ([A-Z_][A-Z0-9_]*)/g)].map((m) => m[1]!)),
      text: stdout,
    }));
    helps.set(command, h);
  }
  return h;
}

describe('kubectl kustomize deploy', { skip }, () => {
  test('builds exactly the objects an install needs', () => {
    const ids = objects.map((o) => `${o.kind} ${o.metadata.namespace ?? '-'}/${o.metadata.name}`).sort();
    assert.deepEqual(ids, [
      'ClusterRole -/pinset-agent',
      'ClusterRole -/pinset-controller',
      'ClusterRole -/pinset-node-agent',
      'ClusterRoleBinding -/pinset-agent',
      'ClusterRoleBinding -/pinset-controller',
      'ClusterRoleBinding -/pinset-node-agent',
      'CustomResourceDefinition -/pinnedimagesets.pinset.dev',
      'DaemonSet pinset-system/pinset-agent',
      'Deployment pinset-system/pinset-controller',
      'Namespace -/pinset-system',
      'Role default/pinset-agent-events',
      'Role pinset-system/pinset-agent-pull-secrets',
      'Role pinset-system/pinset-agent-rollout-slots',
      'Role pinset-system/pinset-controller',
      'RoleBinding default/pinset-agent-events',
      'RoleBinding pinset-system/pinset-agent-pull-secrets',
      'RoleBinding pinset-system/pinset-agent-rollout-slots',
      'RoleBinding pinset-system/pinset-controller',
      'ServiceAccount pinset-system/pinset-agent',
      'ServiceAccount pinset-system/pinset-controller',
      'ValidatingAdmissionPolicy -/pinset-agent-node-scope',
      'ValidatingAdmissionPolicy -/pinset-agent-rollout-handover',
      'ValidatingAdmissionPolicy -/pinset-agent-rollout-slots',
      'ValidatingAdmissionPolicy -/pinset-controller-rollout-grants',
      'ValidatingAdmissionPolicyBinding -/pinset-agent-node-scope',
      'ValidatingAdmissionPolicyBinding -/pinset-agent-rollout-handover',
      'ValidatingAdmissionPolicyBinding -/pinset-agent-rollout-slots',
      'ValidatingAdmissionPolicyBinding -/pinset-controller-rollout-grants',
    ]);
  });

  test('every object carries pinset\'s label, the one `pinset uninstall` removes by', () => {
    for (const o of objects) assert.equal(o.metadata.labels?.[PINSET_LABEL], PINSET_LABEL_VALUE, `${o.kind} ${o.metadata.name}`);
  });

  test('every container runs the image of this version', () => {
    for (const w of objects.filter((o) => o.kind === 'DaemonSet' || o.kind === 'Deployment')) {
      for (const c of w.spec.template.spec.containers) assert.equal(c.image, `ghcr.io/pinset/pinset:${pkg.version}`, w.metadata.name);
    }
  });

  describe('the agent DaemonSet', () => {
    const ds = () => one('DaemonSet', 'pinset-agent', NS);
    const pod = () => ds().spec.template.spec;
    const container = () => {
      const cs = pod().containers as Obj[];
      assert.equal(cs.length, 1);
      return cs[0]!;
    };

    test('runs `pinset agent` as its service account on every node, whatever the taints, on the node\'s network (before any CNI plugin)', () => {
      assert.deepEqual(container().args, ['agent']);
      assert.equal(container().command, undefined, 'the image ENTRYPOINT starts pinset');
      assert.equal(pod().serviceAccountName, AGENT_SA);
      assert.deepEqual(pod().tolerations, [{ operator: 'Exists' }]);
      assert.equal(pod().priorityClassName, 'system-node-critical');
      // A node without its CNI plugin yet starts host-network pods only (the node suite shows it on a real kubelet).
      assert.equal(pod().hostNetwork, true);
      assert.equal(pod().dnsPolicy, 'Default');
      assert.equal(pod().hostPID, undefined);
      assert.deepEqual(ds().spec.updateStrategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: '10%' } });
      for (const [k, v] of Object.entries(ds().spec.selector.matchLabels as Obj)) assert.equal(ds().spec.template.metadata.labels[k], v);
    });

    test('on Linux nodes only: a node selector on the OS label every kubelet sets', () => {
      assert.deepEqual(pod().nodeSelector, { 'kubernetes.io/os': 'linux' });
    });

    test('NODE_NAME from the downward API, metrics on :9402', () => {
      const env = Object.fromEntries((container().env as Obj[]).map((e) => [e.name, e]));
      assert.deepEqual(env.NODE_NAME.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } });
      assert.equal(env.PINSET_METRICS_ADDR.value, '0.0.0.0:9402');
    });

    test('probes: liveness /healthz and readiness /readyz on :9402', () => {
      assert.deepEqual(container().livenessProbe.httpGet, { path: '/healthz', port: 9402 });
      assert.deepEqual(container().readinessProbe.httpGet, { path: '/readyz', port: 9402 });
    });

    test('resources from the measured footprint', async () => {
      assert.deepEqual(container().resources, { requests: { cpu: '20m', memory: '100Mi' }, limits: { memory: '256Mi' } });
      assert.match(await readFile(path.join(ROOT, 'deploy/agent/daemonset.yaml'), 'utf8'), /BENCHMARKS\.md/);
    });

    test('host paths: the host\'s /run, /var/lib and /etc read-only under /host; writable only CRI-O\'s /etc/crio (over its place under /host/etc) and pinset\'s own state folder', () => {
      const volumes: Record<string, Obj> = Object.fromEntries((pod().volumes as Obj[]).map((v) => [v.name, v.hostPath]));
      const mounts: Record<string, Obj> = Object.fromEntries((container().volumeMounts as Obj[]).map((m) => [m.mountPath, m]));
      const expect: [string, string, string, boolean][] = [
        // host path, hostPath type, mount path, read-only
        // Every runtime's CRI socket and the system bus.
        ['/run', 'Directory', '/host/run', true],
        // The image filesystems, k3s's and RKE2's containerd config and hosts, the kubelet's config.json.
        ['/var/lib', 'Directory', '/host/var/lib', true],
        // crio.conf, /etc/containerd, /etc/containers, the static sets: read, never written.
        ['/etc', 'Directory', '/host/etc', true],
        // One mount for crio.conf.d and the staging folder beside it (a rename between two mounts fails: EXDEV).
        ['/etc/crio', 'DirectoryOrCreate', '/host/etc/crio', false],
        // The node lock: pinset's own folder.
        ['/var/lib/pinset', 'DirectoryOrCreate', '/var/lib/pinset', false],
      ];
      assert.equal(Object.keys(volumes).length, expect.length, 'no other volumes');
      assert.equal(Object.keys(mounts).length, expect.length, 'no other mounts');
      for (const [hostPath, type, mountPath, readOnly] of expect) {
        const vol = Object.entries(volumes).find(([, hp]) => hp?.path === hostPath);
        assert.ok(vol, `no hostPath volume for ${hostPath}`);
        assert.equal(vol[1].type, type, hostPath);
        const m = mounts[mountPath];
        assert.ok(m, `${hostPath} not mounted at ${mountPath}`);
        assert.equal(m.name, vol[0]);
        assert.equal(m.readOnly === true, readOnly, `${mountPath} readOnly`);
      }
      // Created where missing only if it is pinset's own, or CRI-O's folder, which must be writable and so mounted by itself.
      for (const [, hp] of Object.entries(volumes)) {
        if (hp.type === 'DirectoryOrCreate' || hp.type === '' || hp.type === undefined) assert.ok(/\/pinset(\/|$)/.test(hp.path) || hp.path === '/etc/crio', `${hp.path} would be created on nodes that lack it`);
      }
      for (const p of ['/host/run', '/host/var/lib', '/host/etc']) assert.equal(mounts[p]!.mountPropagation, 'HostToContainer', `${p}: what the host mounts or unmounts there later is seen`);
      // The writable /etc/crio sits where the agent looks for it: under the read-only /etc, at the host path under --host-root.
      assert.equal(mounts['/host/etc/crio']!.mountPath, path.posix.join(mounts['/host/etc']!.mountPath, 'crio'));
    });

    test('the agent finds its runtime under /host: no socket and no pin backend named; paths it reads given as the host\'s under /host', () => {
      const env = Object.fromEntries((container().env as Obj[]).map((e) => [e.name, e.value]));
      assert.equal(env.PINSET_HOST_ROOT, '/host');
      assert.equal(env.PINSET_CRI_ENDPOINT, undefined);
      assert.equal(env.PINSET_PIN_BACKEND, undefined);
      assert.deepEqual(container().args, ['agent']);
      for (const [k, v] of Object.entries(env)) if (typeof v === 'string' && v.startsWith('/')) assert.match(v, /^\/host(\/|$)/, `${k} is a host path, seen under /host`);
    });

    test('every mount says why it is there', async () => {
      const text = await readFile(path.join(ROOT, 'deploy/agent/daemonset.yaml'), 'utf8');
      const mountsAt = text.indexOf('volumeMounts:');
      for (const name of (container().volumeMounts as Obj[]).map((m) => m.name)) {
        const at = text.indexOf(`- name: ${name}`, mountsAt);
        assert.ok(at > 0, name);
        assert.match(text.slice(0, at).split('\n').slice(-3).join('\n'), /#/, `no comment right above the mount ${name}`);
      }
    });

    test('security: root without capabilities or privilege, read-only root, RuntimeDefault seccomp, spc_t', () => {
      const sc = container().securityContext;
      assert.equal(sc.runAsUser, 0);
      assert.equal(sc.privileged, false);
      assert.equal(sc.allowPrivilegeEscalation, false);
      assert.deepEqual(sc.capabilities, { drop: ['ALL'] }, 'no capability added back');
      assert.equal(sc.readOnlyRootFilesystem, true);
      assert.deepEqual(sc.seccompProfile, { type: 'RuntimeDefault' });
      assert.deepEqual(sc.seLinuxOptions, { type: 'spc_t' });
      assert.equal(pod().hostUsers, true, 'uid 0 must be the host\'s root for D-Bus and the root-owned files');
    });

    test('every privilege kept is explained in the manifest', async () => {
      const text = await readFile(path.join(ROOT, 'deploy/agent/daemonset.yaml'), 'utf8');
      for (const field of ['runAsUser: 0', 'capabilities:', 'seLinuxOptions:', 'hostUsers: true', 'tolerations:']) {
        const at = text.indexOf(field);
        assert.ok(at > 0, field);
        const before = text.slice(0, at).split('\n').slice(-4).join('\n');
        assert.match(before, /#/, `no comment right above ${field}`);
      }
    });
  });

  describe('the controller Deployment', () => {
    const dep = () => one('Deployment', 'pinset-controller', NS);
    const pod = () => dep().spec.template.spec;
    const container = () => pod().containers[0] as Obj;

    test('two replicas with leader election', () => {
      assert.equal(dep().spec.replicas, 2);
      assert.deepEqual(container().args, ['controller', '--leader-elect']);
      assert.equal(pod().serviceAccountName, CONTROLLER_SA);
      const env = Object.fromEntries((container().env as Obj[]).map((e) => [e.name, e]));
      assert.deepEqual(env.POD_NAME.valueFrom, { fieldRef: { fieldPath: 'metadata.name' } });
      assert.deepEqual(env.POD_NAMESPACE.valueFrom, { fieldRef: { fieldPath: 'metadata.namespace' } });
    });

    test('non-root 65532, read-only root, no capabilities, probes on :9403 (/healthz, /readyz)', () => {
      const sc = { ...pod().securityContext, ...container().securityContext };
      assert.equal(sc.runAsNonRoot, true);
      assert.equal(sc.runAsUser, 65532);
      assert.equal(sc.readOnlyRootFilesystem, true);
      assert.equal(sc.allowPrivilegeEscalation, false);
      assert.deepEqual(sc.capabilities, { drop: ['ALL'] });
      assert.deepEqual(sc.seccompProfile, { type: 'RuntimeDefault' });
      assert.deepEqual(container().livenessProbe.httpGet, { path: '/healthz', port: 9403 });
      assert.deepEqual(container().readinessProbe.httpGet, { path: '/readyz', port: 9403 });
      assert.equal(pod().volumes, undefined, 'no volumes, no host access');
    });
  });

  describe('RBAC: least privilege, exactly', () => {
    /** Every (scope group/resource verb) a service account is granted through the built bindings. */
    function grants(sa: string, kind = 'ServiceAccount'): string[] {
      const out = new Set<string>();
      for (const b of objects.filter((o) => o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding')) {
        const bound = (b.subjects as Obj[]).some((s) => s.kind === kind && s.name === sa && (kind !== 'ServiceAccount' || s.namespace === NS));
        if (!bound) continue;
        const role = one(b.roleRef.kind, b.roleRef.name, b.roleRef.kind === 'Role' ? b.metadata.namespace : undefined);
        const scope = b.kind === 'RoleBinding' ? b.metadata.namespace : 'cluster';
        for (const r of role.rules as Obj[]) {
          assert.equal(r.nonResourceURLs, undefined);
          const names: (string | undefined)[] = r.resourceNames ?? [undefined];
          for (const g of r.apiGroups) {
            for (const res of r.resources) {
              for (const v of r.verbs) for (const n of names) out.add(`${scope} ${g || 'core'}/${res}${n ? `/${n}` : ''} ${v}`);
            }
          }
        }
      }
      return [...out].sort();
    }

    test('the agent: read sets and their one CRD; read and patch Nodes; core Events in "default" only; rollout slot Leases and pull secrets in its namespace only', () => {
      assert.deepEqual(grants(AGENT_SA), [
        'cluster apiextensions.k8s.io/customresourcedefinitions/pinnedimagesets.pinset.dev get',
        'cluster core/nodes list',
        'cluster core/nodes patch',
        'cluster core/nodes watch',
        'cluster pinset.dev/pinnedimagesets list',
        'cluster pinset.dev/pinnedimagesets watch',
        'default core/events create',
        'default core/events patch',
        'pinset-system coordination.k8s.io/leases create',
        'pinset-system coordination.k8s.io/leases delete',
        'pinset-system coordination.k8s.io/leases get',
        'pinset-system coordination.k8s.io/leases list',
        'pinset-system coordination.k8s.io/leases update',
        'pinset-system core/secrets list',
        'pinset-system core/secrets watch',
      ]);
    });

    test('Secrets: the agent may read them in its own namespace, where its pods run, and nowhere else; nothing else may', () => {
      const secretGrants = (sa: string, kind?: string) => grants(sa, kind).filter((g) => g.includes('core/secrets'));
      assert.ok(secretGrants(AGENT_SA).every((g) => g.startsWith(`${NS} `)), 'never cluster-wide, never another namespace');
      assert.ok(!secretGrants(AGENT_SA).some((g) => /secrets (create|update|patch|delete)/.test(g)), 'read only');
      assert.deepEqual(secretGrants(CONTROLLER_SA), []);
      assert.deepEqual(secretGrants('system:nodes', 'Group'), []);
      assert.equal(one('Role', 'pinset-agent-pull-secrets', NS).metadata.namespace, one('DaemonSet', 'pinset-agent', NS).metadata.namespace, 'the namespace the agent reads them from (POD_NAMESPACE) is its pods\'');
    });

    test('the controller: read sets, write their status, list/watch Nodes; its Lease and Events in its namespace only', () => {
      assert.deepEqual(grants(CONTROLLER_SA), [
        'cluster core/nodes list',
        'cluster core/nodes watch',
        'cluster pinset.dev/pinnedimagesets list',
        'cluster pinset.dev/pinnedimagesets watch',
        'cluster pinset.dev/pinnedimagesets/status patch',
        'pinset-system coordination.k8s.io/leases create',
        'pinset-system coordination.k8s.io/leases/pinset-controller get',
        'pinset-system coordination.k8s.io/leases/pinset-controller update',
        'pinset-system core/events create',
        'pinset-system core/events patch',
      ]);
    });

    test('nodes (the kubelet\'s credentials, for the systemd agent): read sets and their one CRD, nothing more', () => {
      // Reading and patching their own Node and recording Events, nodes already may (the Node authorizer).
      assert.deepEqual(grants('system:nodes', 'Group'), [
        'cluster apiextensions.k8s.io/customresourcedefinitions/pinnedimagesets.pinset.dev get',
        'cluster pinset.dev/pinnedimagesets list',
        'cluster pinset.dev/pinnedimagesets watch',
      ]);
    });

    test('no binding grants anything to anyone else', () => {
      for (const b of objects.filter((o) => o.kind.endsWith('Binding') && o.apiVersion.startsWith('rbac'))) {
        for (const s of b.subjects as Obj[]) {
          const serviceAccount = s.kind === 'ServiceAccount' && s.namespace === NS && [AGENT_SA, CONTROLLER_SA].includes(s.name);
          const nodes = s.kind === 'Group' && s.name === 'system:nodes' && b.metadata.name === 'pinset-node-agent';
          assert.ok(serviceAccount || nodes, `${b.metadata.name}: ${JSON.stringify(s)}`);
        }
      }
    });
  });

  describe('the manifests speak the commands\' language', () => {
    for (const [kind, name, command] of [['DaemonSet', 'pinset-agent', 'agent'], ['Deployment', 'pinset-controller', 'controller']] as const) {
      test(`${name}: every argument and environment variable is one \`pinset ${command}\` reads`, async () => {
        const help = await helpOf(command);
        const c = one(kind, name, NS).spec.template.spec.containers[0] as Obj;
        assert.equal(c.args[0], command);
        for (const a of c.args.slice(1) as string[]) assert.ok(help.flags.has(a.replace(/^--/, '').replace(/=.*$/, '')), `unknown flag ${a}`);
        for (const e of c.env as Obj[]) assert.ok(help.env.has(e.name), `pinset ${command} does not read ${e.name}`);
      });
    }

    test('the controller\'s Role names the Lease the controller uses by default', async () => {
      const help = await helpOf('controller');
      const lease = /--lease-name .*default "([^"]+)"/.exec(help.text)?.[1];
      assert.ok(lease, 'no --lease-name default in the help');
      const rules = one('Role', 'pinset-controller', NS).rules as Obj[];
      assert.deepEqual(rules.filter((r) => r.resourceNames).flatMap((r) => r.resourceNames), [lease]);
    });

    test('the metrics addresses are the probed ports', () => {
      for (const [kind, name] of [['DaemonSet', 'pinset-agent'], ['Deployment', 'pinset-controller']] as const) {
        const c = one(kind, name, NS).spec.template.spec.containers[0] as Obj;
        const addr = (c.env as Obj[]).find((e) => /METRICS_ADDR$/.test(e.name))?.value as string;
        assert.equal(Number(addr.split(':').at(-1)), c.livenessProbe.httpGet.port, name);
      }
    });
  });

  test('the admission policies name the agent\'s service account as built here, in any namespace', () => {
    one('ServiceAccount', AGENT_SA, NS);
    const identity = `request.userInfo.username.matches('^system:serviceaccount:[^:]+:${AGENT_SA}$')`;
    const policy = one('ValidatingAdmissionPolicy', 'pinset-agent-node-scope');
    const [nodeScope] = policy.spec.matchConditions.map((c: Obj) => c.expression as string);
    assert.ok(nodeScope!.startsWith(`${identity} ||`), nodeScope);
    const slots = one('ValidatingAdmissionPolicy', 'pinset-agent-rollout-slots');
    const handover = one('ValidatingAdmissionPolicy', 'pinset-agent-rollout-handover');
    for (const p of [slots, handover]) assert.equal(p.spec.matchConditions[0].expression, identity, p.metadata.name);
    const grants = one('ValidatingAdmissionPolicy', 'pinset-controller-rollout-grants');
    const controllerSa = one('Deployment', 'pinset-controller', NS).spec.template.spec.serviceAccountName;
    assert.equal(grants.spec.matchConditions[0].expression, `request.userInfo.username.matches('^system:serviceaccount:[^:]+:${controllerSa}$')`);
    for (const p of [policy, slots, handover, grants]) {
      const binding = one('ValidatingAdmissionPolicyBinding', p.metadata.name);
      assert.equal(binding.spec.policyName, p.metadata.name);
      assert.deepEqual(binding.spec.validationActions, ['Deny']);
    }
  });

  test('the agent finds its slot Leases where its Role lets it write them: POD_NAMESPACE is the pod\'s namespace', async () => {
    const c = one('DaemonSet', 'pinset-agent', NS).spec.template.spec.containers[0] as Obj;
    const env = (c.env as Obj[]).find((e) => e.name === 'POD_NAMESPACE');
    assert.deepEqual(env?.valueFrom, { fieldRef: { fieldPath: 'metadata.namespace' } });
    const help = await helpOf('agent');
    assert.match(help.text, /--lease-namespace .*\(env POD_NAMESPACE/);
    assert.equal(one('Role', 'pinset-agent-rollout-slots', NS).metadata.namespace, one('DaemonSet', 'pinset-agent', NS).metadata.namespace);
  });

  test('the Namespace admits the agent\'s host access', () => {
    assert.equal(one('Namespace', NS).metadata.labels['pod-security.kubernetes.io/enforce'], 'privileged');
  });
});

// deploy/containerd: an alias of deploy/, kept for installs made with it.

describe('kubectl kustomize deploy/containerd', { skip }, async () => {
  test('builds exactly what deploy/ builds', async () => {
    assert.deepEqual(await build('deploy/containerd'), objects);
  });
});

// ---------------------------------------------------------------------------
// deploy/credential-providers: components that give the agent the kubelet's
// credential provider plugins on EKS, GKE and AKS nodes.

/** `kubectl kustomize` of a kustomization made in a temp folder: resources and components named relative to it. */
async function buildOverlay(resources: string[], components: string[]): Promise<Obj[]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-overlay-'));
  try {
    const rel = (p: string) => path.relative(dir, path.join(ROOT, p));
    await writeFile(
      path.join(dir, 'kustomization.yaml'),
      JSON.stringify({ apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', resources: resources.map(rel), components: components.map(rel) }),
    );
    const { stdout } = await run(kubectl!, ['kustomize', dir], { maxBuffer: 16 << 20 });
    return parseYamlDocuments(stdout).map((d) => {
      if ('error' in d) assert.fail(d.error);
      return d.value as Obj;
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe('kubectl kustomize with deploy/credential-providers/<cloud>', { skip }, async () => {
  const clouds: [string, { config: string; binDir: string; extra: string[] }][] = [
    ['eks', { config: '/etc/eks/image-credential-provider/config.json', binDir: '/etc/eks/image-credential-provider', extra: [] }],
    ['gke', { config: '/etc/srv/kubernetes/cri_auth_config.yaml', binDir: '/home/kubernetes/bin', extra: [] }],
    ['aks', { config: '/var/lib/kubelet/credential-provider-config.yaml', binDir: '/var/lib/kubelet/credential-provider', extra: ['/etc/kubernetes/azure.json'] }],
  ];
  const base: Obj[] = skip ? [] : await build('deploy');
  const agentOf = (objs: Obj[]) => objs.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'pinset-agent')!;
  for (const [cloud, want] of clouds) {
    test(`${cloud}: the agent on the host network, the kubelet's config and plugins read-only at the kubelet's paths, through flags it reads; nothing else changed`, async () => {
      const built = await buildOverlay(['deploy'], [`deploy/credential-providers/${cloud}`]);
      const id = (o: Obj) => `${o.kind} ${o.metadata.namespace ?? '-'}/${o.metadata.name}`;
      assert.deepEqual(built.map(id).sort(), base.map(id).sort());
      for (const o of built) if (o.kind !== 'DaemonSet') assert.deepEqual(o, base.find((b) => id(b) === id(o)), id(o));
      const pod = agentOf(built).spec.template.spec;
      assert.equal(pod.hostNetwork, true, 'the plugins reach the cloud\'s metadata service as the node');
      const c = pod.containers[0] as Obj;
      const env = Object.fromEntries((c.env as Obj[]).map((e) => [e.name, e.value]));
      assert.equal(env.PINSET_IMAGE_CREDENTIAL_PROVIDER_CONFIG, want.config);
      assert.equal(env.PINSET_IMAGE_CREDENTIAL_PROVIDER_BIN_DIR, want.binDir);
      const help = await helpOf('agent');
      for (const e of c.env as Obj[]) assert.ok(help.env.has(e.name), `pinset agent does not read ${e.name}`);
      const volumes: Record<string, Obj> = Object.fromEntries((pod.volumes as Obj[]).map((v) => [v.name, v.hostPath]));
      const mounts = c.volumeMounts as Obj[];
      const before = agentOf(base).spec.template.spec.containers[0].volumeMounts as Obj[];
      const added = mounts.filter((m) => !before.some((b) => b.mountPath === m.mountPath));
      for (const m of added) {
        assert.equal(m.readOnly, true, `${m.mountPath} is read-only`);
        assert.equal(volumes[m.name]?.path, m.mountPath, `${m.mountPath} is the host's own path`);
      }
      const covered = (p: string) => added.some((m) => p === m.mountPath || p.startsWith(`${m.mountPath}/`));
      for (const p of [want.config, want.binDir, ...want.extra]) assert.ok(covered(p), `${p} is mounted`);
      assert.equal(added.length, new Set([want.config, want.binDir, ...want.extra].map((p) => added.find((m) => p === m.mountPath || p.startsWith(`${m.mountPath}/`))!.mountPath)).size, 'no other mount');
    });
  }
});

// ---------------------------------------------------------------------------
// deploy/critical-pods-quota: for clusters that admit the agent's priority
// class only in namespaces with a ResourceQuota for it (GKE).

describe('kubectl kustomize with deploy/critical-pods-quota', { skip }, async () => {
  test("adds one ResourceQuota, in the agent's namespace, whose scope covers the agent's priority class and no other; nothing else changed", async () => {
    const base = await build('deploy');
    const built = await buildOverlay(['deploy'], ['deploy/critical-pods-quota']);
    const id = (o: Obj) => `${o.kind} ${o.metadata.namespace ?? '-'}/${o.metadata.name}`;
    const added = built.filter((o) => !base.some((b) => id(b) === id(o)));
    assert.deepEqual(added.map(id), ['ResourceQuota pinset-system/pinset-critical-pods']);
    for (const o of built) if (o !== added[0]) assert.deepEqual(o, base.find((b) => id(b) === id(o)), id(o));
    const agent = base.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'pinset-agent')!;
    const quota = added[0]!;
    assert.equal(quota.metadata.namespace, agent.metadata.namespace);
    assert.equal(quota.metadata.labels['app.kubernetes.io/part-of'], 'pinset');
    assert.deepEqual(quota.spec.scopeSelector.matchExpressions, [{ scopeName: 'PriorityClass', operator: 'In', values: [agent.spec.template.spec.priorityClassName] }]);
    assert.deepEqual(Object.keys(quota.spec.hard), ['pods'], 'counts pods and nothing else');
  });
});

// ---------------------------------------------------------------------------
// deploy/kubelet-config: aliases that add nothing. The agent finds the
// kubelet's configuration on the node by itself (src/kubelet/layouts.ts);
// the components stay so that kustomizations naming them go on building.

describe('kubectl kustomize with deploy/kubelet-config/<distribution>: aliases of what the agent finds by itself', { skip }, async () => {
  for (const name of ['kubeadm', 'kubeadm,kubeadm-config-dir', 'k3s', 'rke2', 'eks']) {
    test(`${name}: builds exactly what deploy/ builds, and says why in its file`, async () => {
      const built = await buildOverlay(['deploy'], name.split(',').map((c) => `deploy/kubelet-config/${c}`));
      assert.deepEqual(built, objects);
      const agent = built.find((o) => o.kind === 'DaemonSet' && o.metadata.name === 'pinset-agent')!;
      const env = (agent.spec.template.spec.containers[0].env as Obj[]).map((e) => e.name);
      assert.ok(!env.some((e) => e.startsWith('PINSET_KUBELET_')), `no kubelet path set: ${env.join(', ')}`);
      for (const c of name.split(',')) {
        const text = await readFile(path.join(ROOT, 'deploy/kubelet-config', c, 'kustomization.yaml'), 'utf8');
        assert.match(text, /An alias that adds nothing/);
        assert.deepEqual(await readdir(path.join(ROOT, 'deploy/kubelet-config', c)), ['kustomization.yaml'], 'no patch left beside it');
      }
    });
  }
});

// ---------------------------------------------------------------------------
// What the agent may write on a node: CRI-O's folder and pinset's state
// folder, and nothing else, whichever components are added.

/** Every host path a pod template of `objs` mounts writable (a mount without readOnly), sorted. */
function writableHostPaths(objs: Obj[]): string[] {
  const out = new Set<string>();
  for (const o of objs) {
    const pod = o.spec?.template?.spec;
    if (!pod) continue;
    const hostPaths = new Map<string, string>((pod.volumes ?? []).filter((v: Obj) => v.hostPath).map((v: Obj) => [v.name, v.hostPath.path]));
    for (const c of [...(pod.initContainers ?? []), ...(pod.containers ?? [])] as Obj[]) {
      for (const m of (c.volumeMounts ?? []) as Obj[]) if (hostPaths.has(m.name) && m.readOnly !== true) out.add(hostPaths.get(m.name)!);
    }
  }
  return [...out].sort();
}

describe('writable host paths: CRI-O\'s folder and pinset\'s state only', { skip }, async () => {
  const allowed = ['/etc/crio', '/var/lib/pinset'];
  test('kubectl kustomize deploy/ and deploy/containerd/', async () => {
    assert.deepEqual(writableHostPaths(objects), allowed);
    assert.deepEqual(writableHostPaths(await build('deploy/containerd')), allowed);
  });

  const components = [
    ...['eks', 'gke', 'aks'].map((c) => `deploy/credential-providers/${c}`),
    ...['kubeadm', 'kubeadm-config-dir', 'k3s', 'rke2', 'eks'].map((c) => `deploy/kubelet-config/${c}`),
    'deploy/placement/no-control-plane',
  ];
  test('with each component: what a component mounts is read-only', async () => {
    for (const c of components) {
      const built = await buildOverlay(['deploy'], c.endsWith('kubeadm-config-dir') ? ['deploy/kubelet-config/kubeadm', c] : [c]);
      assert.deepEqual(writableHostPaths(built), allowed, c);
    }
  });

  test('the drop-pins Jobs: CRI-O\'s folder (on CRI-O nodes only) and the lock\'s folder', async () => {
    const job = async (f: string) => parseYamlDocuments(await readFile(path.join(ROOT, 'deploy/drop-pins', f), 'utf8')).map((d) => ('value' in d ? (d.value as Obj) : assert.fail(d.error)));
    assert.deepEqual(writableHostPaths(await job('crio.yaml')), allowed);
    assert.deepEqual(writableHostPaths(await job('containerd.yaml')), ['/var/lib/pinset']);
    const crioVolumes = (await job('crio.yaml')).find((o) => o.kind === 'Job')!.spec.template.spec.volumes as Obj[];
    assert.equal(crioVolumes.find((v) => v.hostPath.path === '/etc/crio')?.hostPath.type, 'Directory', 'the CRI-O Job never creates /etc/crio');
  });
});

describe('kubectl kustomize with deploy/placement/no-control-plane', { skip }, async () => {
  test('the agent is kept off control-plane nodes by a required node affinity; it still tolerates every taint; nothing else changed', async () => {
    const base = objects;
    const built = await buildOverlay(['deploy'], ['deploy/placement/no-control-plane']);
    const id = (o: Obj) => `${o.kind} ${o.metadata.namespace ?? '-'}/${o.metadata.name}`;
    assert.deepEqual(built.map(id).sort(), base.map(id).sort());
    for (const o of built) if (o.kind !== 'DaemonSet') assert.deepEqual(o, base.find((b) => id(b) === id(o)), id(o));
    const pod = built.find((o) => o.kind === 'DaemonSet')!.spec.template.spec;
    assert.deepEqual(pod.affinity, {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: [{ matchExpressions: [{ key: 'node-role.kubernetes.io/control-plane', operator: 'DoesNotExist' }, { key: 'node-role.kubernetes.io/master', operator: 'DoesNotExist' }] }],
        },
      },
    });
    assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
    const { affinity: _a, ...rest } = pod;
    const { affinity: _b, ...baseRest } = base.find((o) => o.kind === 'DaemonSet')!.spec.template.spec;
    assert.deepEqual(rest, baseRest);
  });
});

// ---------------------------------------------------------------------------

const UNIT = path.join(ROOT, 'deploy/systemd/pinset-agent.service');

/** Key=value pairs per [Section] (a key may repeat). */
function parseUnit(text: string): Record<string, Record<string, string[]>> {
  const out: Record<string, Record<string, string[]>> = {};
  let section = '';
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#') || line.startsWith(';')) continue;
    const s = /^\[(.+)\]$/.exec(line);
    if (s) {
      section = s[1]!;
      out[section] ??= {};
      continue;
    }
    const eq = line.indexOf('=');
    assert.ok(eq > 0 && section, `not a key=value line in a section: ${line}`);
    ((out[section]![line.slice(0, eq)] ??= [])).push(line.slice(eq + 1));
  }
  return out;
}

describe('deploy/systemd/pinset-agent.service', async () => {
  const text = await readFile(UNIT, 'utf8');
  const unit = parseUnit(text);
  const svc = unit.Service ?? {};
  const get = (k: string) => svc[k]?.at(-1);

  test('runs `pinset agent` as a simple service that always restarts and logs to the journal', () => {
    assert.equal(get('Type'), 'simple');
    assert.match(get('ExecStart') ?? '', /^\/usr\/local\/bin\/pinset agent(\s|$)/);
    assert.equal(get('Restart'), 'always');
    assert.equal(get('StandardOutput'), 'journal');
    assert.ok(svc.Environment?.some((e) => e.startsWith('NODE_NAME=')), 'NODE_NAME set');
    assert.deepEqual(unit.Install?.WantedBy, ['multi-user.target']);
  });

  test('ExecStart and Environment use only flags and variables `pinset agent` knows', async () => {
    const help = await helpOf('agent');
    const args = (get('ExecStart') ?? '').split(/\s+/).slice(2);
    for (const a of args.filter((x) => x.startsWith('--'))) assert.ok(help.flags.has(a.slice(2).replace(/=.*$/, '')), `unknown flag ${a}`);
    // NODE_OPTIONS is for Node.js itself (V8 heap sizing), not the agent.
    for (const e of svc.Environment ?? []) assert.ok(help.env.has(e.split('=')[0]!) || e.startsWith('NODE_OPTIONS='), `pinset agent does not read ${e}`);
  });

  test('talks to the API with the node\'s own credentials (the kubelet\'s kubeconfig), which the policy and RBAC expect', async () => {
    assert.ok(svc.Environment?.includes('KUBECONFIG=/var/lib/kubelet/kubeconfig'), 'the kubelet\'s kubeconfig');
    assert.equal(get('Restart'), 'always', 'restarted when the kubeconfig appears (the agent exits 75)');
    assert.match(text, /system:node:<name>/);
    const policy = await readFile(path.join(ROOT, 'deploy/admission/policy.yaml'), 'utf8');
    assert.match(policy, /request\.userInfo\.username\.startsWith\('system:node:'\)/);
  });

  test('hardened, with the writable folders the agent needs: /etc/crio where it exists (crio.conf.d and the staging folder beside it, as one mount), and its own state folder (the node lock on containerd)', () => {
    assert.equal(get('ProtectSystem'), 'strict');
    assert.deepEqual(svc.ReadWritePaths, ['-/etc/crio'], '"-": no /etc/crio on a containerd host must not stop the unit');
    // StateDirectory=pinset is /var/lib/pinset, made writable: the agent's default --state-dir.
    assert.deepEqual(svc.StateDirectory, ['pinset']);
    assert.equal(AGENT_FLAGS.find((f) => f.name === 'state-dir')?.default, '/var/lib/pinset');
    for (const u of ['crio.service', 'containerd.service', 'k3s.service', 'k3s-agent.service', 'rke2-server.service', 'rke2-agent.service']) assert.ok(unit.Unit?.After?.join(' ').split(/\s+/).includes(u), `After= ${u}`);
    assert.equal(get('NoNewPrivileges'), 'yes');
    assert.equal(get('CapabilityBoundingSet'), '', 'no capabilities');
    for (const k of ['ProtectHome', 'PrivateTmp', 'PrivateDevices', 'ProtectKernelTunables', 'ProtectKernelModules', 'ProtectControlGroups', 'RestrictSUIDSGID', 'LockPersonality']) {
      assert.equal(get(k), 'yes', k);
    }
    assert.match(get('RestrictAddressFamilies') ?? '', /\bAF_UNIX\b/, 'Unix sockets for CRI-O and D-Bus');
    assert.notEqual(get('MemoryDenyWriteExecute'), 'yes', 'V8 needs W+X memory');
    assert.equal(get('PrivateNetwork'), undefined, 'the agent talks to the API server');
  });

  const analyze = findOnPath('systemd-analyze', []);
  test('systemd-analyze verify finds nothing to complain about', { skip: analyze ? false : 'systemd-analyze not installed' }, async (t) => {
    // verify insists that ExecStart exists: point it at a stand-in.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-unit-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const stub = path.join(dir, 'pinset');
    await writeFile(stub, '#!/bin/sh\nexit 0\n');
    await chmod(stub, 0o755);
    const copy = path.join(dir, 'pinset-agent.service');
    await copyFile(UNIT, copy);
    await writeFile(copy, text.replaceAll('/usr/local/bin/pinset', stub));
    const { stdout, stderr } = await run(analyze!, ['verify', copy], { env: { ...process.env, SYSTEMD_LOG_LEVEL: 'warning' } }).catch((e: { stdout: string; stderr: string }) => e);
    assert.equal((stdout + stderr).trim(), '', 'systemd-analyze verify output');
  });
});
