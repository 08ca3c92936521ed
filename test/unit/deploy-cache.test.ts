// deploy/cache/: the pull-through cache an administrator installs, one
// instance per registry, built offline with `kubectl kustomize` from
// overlays as docs/fleet.md writes them (and from examples/registry-cache/)
// and checked object by object: what runs, what reaches it, what it reads.
// The configuration it ships is the one the fleet bed runs as a real cache
// (test/integration/thin-link.test.ts, test/e2e/fleet.test.ts), through the
// environment names it sets here.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { isIPv4 } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parse as parseYaml } from 'yaml';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { selectorMatches } from '../../src/api/selector.ts';
import { PROXY_ENV } from '../support/registry.ts';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const CACHE = path.join(ROOT, 'deploy/cache');

type Obj = Record<string, any>;

const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => p && existsSync(p));
const kubectlMissing = 'kubectl not found (looked at /usr/bin/kubectl and PATH): deploy/cache is NOT checked';
if (!kubectl && process.env.CI !== 'true') process.stderr.write(`\n*** SKIPPING deploy/cache tests: ${kubectlMissing} ***\n\n`);
const skip = !kubectl && process.env.CI !== 'true' ? kubectlMissing : false;

async function kustomize(dir: string): Promise<Obj[]> {
  if (!kubectl) assert.fail(`${kubectlMissing}; CI=true requires it`);
  const { stdout } = await run(kubectl, ['kustomize', dir], { maxBuffer: 16 << 20 });
  return parseYamlDocuments(stdout).map((d) => {
    if ('error' in d) assert.fail(`kubectl kustomize printed invalid YAML: ${d.error}`);
    return d.value as Obj;
  });
}

/** The project's root in a kustomization (kustomize takes relative paths only). */
const AT_ROOT = '@ROOT@';

/** Builds a kustomization written into a temporary folder (with `files` beside it); AT_ROOT stands for the project's root. */
async function buildWith(kustomization: string, files: Record<string, string> = {}): Promise<Obj[]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-deploy-cache-'));
  try {
    await writeFile(path.join(dir, 'kustomization.yaml'), kustomization.replaceAll(AT_ROOT, path.relative(dir, ROOT)));
    for (const [name, text] of Object.entries(files)) await writeFile(path.join(dir, name), text);
    return await kustomize(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const one = (objs: Obj[], kind: string, name?: string): Obj => {
  const found = objs.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  assert.equal(found.length, 1, `exactly one ${kind}${name ? ` ${name}` : ''}: ${found.map((o) => o.metadata.name).join(', ')}`);
  return found[0]!;
};

const envOf = (deployment: Obj): Record<string, Obj> => Object.fromEntries((deployment.spec.template.spec.containers[0].env as Obj[]).map((e) => [e.name, e]));

/** The overlay of one instance, as docs/fleet.md writes it. */
const INSTANCE = (components: string[]) => `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: pinset-system
nameSuffix: -quay
labels:
  - pairs: {app.kubernetes.io/instance: quay}
    includeSelectors: true
components: [${components.map((c) => `${AT_ROOT}/${c}`).join(', ')}]
patches:
  - target: {kind: ConfigMap, name: registry-cache-upstream}
    patch: |-
      - {op: replace, path: /data/remoteurl, value: https://quay.io}
  - target: {kind: Service, name: registry-cache}
    patch: |-
      - {op: add, path: /spec/clusterIP, value: 10.96.200.10}
`;

describe('kubectl kustomize with deploy/cache', { skip }, async () => {
  const objs = skip ? [] : await buildWith(INSTANCE(['deploy/cache']));

  test('one instance: its Deployment, its Service, its two ConfigMaps, nothing else', () => {
    assert.deepEqual(
      objs.map((o) => `${o.kind} ${o.metadata.namespace}/${o.metadata.name.replace(/-[a-z0-9]{10}$/, '-<hash>')}`).sort(),
      [
        'ConfigMap pinset-system/registry-cache-config-quay-<hash>',
        'ConfigMap pinset-system/registry-cache-upstream-quay-<hash>',
        'Deployment pinset-system/registry-cache-quay',
        'Service pinset-system/registry-cache-quay',
      ],
    );
  });

  test('distribution in proxy mode for the registry the overlay names: its remoteurl from the environment, as distribution reads it', () => {
    const d = one(objs, 'Deployment');
    const env = envOf(d);
    const upstream = one(objs, 'ConfigMap', env[PROXY_ENV.remoteurl]!.valueFrom.configMapKeyRef.name);
    assert.equal(upstream.data[env[PROXY_ENV.remoteurl]!.valueFrom.configMapKeyRef.key], 'https://quay.io');
    assert.deepEqual(Object.keys(env), [PROXY_ENV.remoteurl], 'no credentials without deploy/cache/credentials');
  });

  test('its configuration is deploy/cache/config.yml as it is (what the fleet bed runs), on the port and storage the pod gives it', async () => {
    const d = one(objs, 'Deployment');
    const pod = d.spec.template.spec;
    const c = pod.containers[0];
    const configVolume = (pod.volumes as Obj[]).find((v) => v.configMap)!;
    const config = one(objs, 'ConfigMap', configVolume.configMap.name);
    assert.equal(config.data['config.yml'], await readFile(path.join(CACHE, 'config.yml'), 'utf8'));
    const mount = (c.volumeMounts as Obj[]).find((m) => m.name === configVolume.name)!;
    assert.deepEqual(c.args, ['serve', `${mount.mountPath}/config.yml`]);
    const parsed = parseYaml(config.data['config.yml']) as Obj;
    assert.equal(parsed.proxy, undefined, 'the registry it caches comes from the environment only');
    assert.equal(parsed.http.addr, `:${c.ports[0].containerPort}`);
    const storage = (c.volumeMounts as Obj[]).find((m) => m.mountPath === parsed.storage.filesystem.rootdirectory);
    assert.ok(storage, 'the storage folder is a volume');
    assert.deepEqual((pod.volumes as Obj[]).find((v) => v.name === storage.name), { name: storage.name, emptyDir: {} }, 'an emptyDir by default');
  });

  test('the placeholder upstream names no registry (.invalid): a cache left with it serves nothing, and the nodes go to the registry itself', async () => {
    const bare = await buildWith(`apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents: [${AT_ROOT}/deploy/cache]\n`);
    const upstream = one(bare.filter((o) => o.metadata.name.startsWith('registry-cache-upstream')), 'ConfigMap');
    assert.match(upstream.data.remoteurl, /^https:\/\/[^/]+\.invalid$/);
  });

  test('one replica, replaced not rolled (its storage is mounted by one pod at a time), least privilege', () => {
    const d = one(objs, 'Deployment');
    assert.equal(d.spec.replicas, 1, 'replicas share nothing: each would fetch its own copy over the link');
    assert.deepEqual(d.spec.strategy, { type: 'Recreate' });
    const pod = d.spec.template.spec;
    assert.equal(pod.automountServiceAccountToken, false);
    assert.equal(pod.securityContext.runAsNonRoot, true);
    assert.deepEqual(pod.securityContext.seccompProfile, { type: 'RuntimeDefault' });
    const sc = pod.containers[0].securityContext;
    assert.equal(sc.allowPrivilegeEscalation, false);
    assert.equal(sc.readOnlyRootFilesystem, true);
    assert.deepEqual(sc.capabilities, { drop: ['ALL'] });
    assert.equal(pod.hostNetwork, undefined);
    assert.ok(pod.containers[0].resources.limits.memory);
    for (const p of [pod.containers[0].readinessProbe, pod.containers[0].livenessProbe]) assert.deepEqual(p.httpGet, { path: '/v2/', port: 'http' });
  });

  test('the nodes reach it at the fixed clusterIP the overlay chose, on the container\'s port, and it selects its own pods', () => {
    const s = one(objs, 'Service');
    const d = one(objs, 'Deployment');
    assert.equal(s.spec.type, 'ClusterIP');
    assert.equal(s.spec.clusterIP, '10.96.200.10');
    assert.deepEqual(s.spec.ports, [{ name: 'http', port: 5000, targetPort: 'http' }]);
    assert.equal(d.spec.template.spec.containers[0].ports[0].name, 'http');
    assert.ok(selectorMatches({ matchLabels: s.spec.selector }, d.spec.template.metadata.labels));
    assert.equal(s.spec.selector['app.kubernetes.io/instance'], 'quay');
  });

  test('deploy/cache/pvc: the storage on a PersistentVolumeClaim of its own, nothing else changed', async () => {
    const withPvc = await buildWith(INSTANCE(['deploy/cache', 'deploy/cache/pvc']));
    const pvc = one(withPvc, 'PersistentVolumeClaim');
    assert.equal(pvc.metadata.name, 'registry-cache-quay');
    assert.deepEqual(pvc.spec.accessModes, ['ReadWriteOnce']);
    const d = one(withPvc, 'Deployment');
    const storage = (d.spec.template.spec.volumes as Obj[]).find((v) => v.name === 'storage');
    assert.deepEqual(storage, { name: 'storage', persistentVolumeClaim: { claimName: 'registry-cache-quay' } });
    const others = (o: Obj[]) => o.filter((x) => x.kind !== 'PersistentVolumeClaim' && x.kind !== 'Deployment');
    assert.deepEqual(others(withPvc), others(objs));
  });

  test('deploy/cache/credentials: the registry\'s username and password from the instance\'s Secret, as distribution reads them', async () => {
    const withCredentials = await buildWith(
      `${INSTANCE(['deploy/cache', 'deploy/cache/credentials'])}secretGenerator:\n  - name: registry-cache-upstream\n    envs: [upstream-credentials.env]\n`,
      { 'upstream-credentials.env': 'username=robot\npassword=not-a-real-one\n' },
    );
    const env = envOf(one(withCredentials, 'Deployment'));
    const secret = one(withCredentials, 'Secret');
    for (const [key, name] of [['username', PROXY_ENV.username], ['password', PROXY_ENV.password]] as const) {
      assert.deepEqual(env[name]!.valueFrom.secretKeyRef, { name: secret.metadata.name, key }, `${name} from the instance's Secret`);
      assert.ok(secret.data[key]);
    }
    assert.match(secret.metadata.name, /^registry-cache-upstream-quay-/);
  });
});

describe('kubectl kustomize examples/registry-cache: two registries, two caches', { skip }, async () => {
  let objs: Obj[] = [];
  if (!skip) {
    // The example with its credentials file, which is kept out of version control, written beside it.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-example-cache-'));
    try {
      await cp(path.join(ROOT, 'examples/registry-cache'), path.join(dir, 'registry-cache'), { recursive: true });
      for (const sub of await readdir(path.join(dir, 'registry-cache'), { withFileTypes: true })) {
        if (!sub.isDirectory()) continue;
        const file = path.join(dir, 'registry-cache', sub.name, 'kustomization.yaml');
        await writeFile(file, (await readFile(file, 'utf8')).replaceAll('../../../deploy/cache', path.relative(path.dirname(file), CACHE)));
      }
      await mkdir(path.join(dir, 'registry-cache', 'private'), { recursive: true });
      await writeFile(path.join(dir, 'registry-cache', 'private', 'upstream-credentials.env'), 'username=robot\npassword=not-a-real-one\n');
      objs = await kustomize(path.join(dir, 'registry-cache'));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  test('each instance has its own name, its own registry, its own address, and selects only its own pods', () => {
    const deployments = objs.filter((o) => o.kind === 'Deployment');
    const services = objs.filter((o) => o.kind === 'Service');
    assert.deepEqual(deployments.map((d) => d.metadata.name).sort(), ['registry-cache-private', 'registry-cache-quay']);
    assert.equal(new Set(objs.map((o) => `${o.kind}/${o.metadata.name}`)).size, objs.length, 'no two objects share a name');
    const want: Record<string, string> = { quay: 'https://quay.io', private: 'https://registry.example.com' };
    const ips = new Set<string>();
    for (const s of services) {
      assert.ok(isIPv4(s.spec.clusterIP), `${s.metadata.name}: a fixed clusterIP`);
      ips.add(s.spec.clusterIP);
      const selected = deployments.filter((d) => selectorMatches({ matchLabels: s.spec.selector }, d.spec.template.metadata.labels));
      assert.deepEqual(selected.map((d) => d.metadata.name), [s.metadata.name], `${s.metadata.name} selects its own pods only`);
      const d = selected[0]!;
      const ref = envOf(d)[PROXY_ENV.remoteurl]!.valueFrom.configMapKeyRef;
      const instance = s.metadata.name.replace('registry-cache-', '');
      assert.equal(one(objs, 'ConfigMap', ref.name).data[ref.key], want[instance]);
    }
    assert.equal(ips.size, 2);
    assert.ok(envOf(deployments.find((d) => d.metadata.name.endsWith('-private'))!)[PROXY_ENV.password], 'the private registry\'s cache has its credentials');
    assert.equal(envOf(deployments.find((d) => d.metadata.name.endsWith('-quay'))!)[PROXY_ENV.password], undefined, 'the public one has none');
  });
});
