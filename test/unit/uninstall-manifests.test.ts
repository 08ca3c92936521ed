// What `pinset uninstall` removes is read from the manifests themselves
// (src/cli/manifests.ts), so it must be exactly what `kubectl kustomize`
// builds from them: for deploy/ and deploy/containerd/, from a folder, a
// rendered file and the copy that ships with pinset. And the Jobs of
// deploy/drop-pins/ must run `pinset agent --drop-pins` with the agent
// DaemonSet's own mounts and security, per runtime.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile, mkdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { inRemovalOrder } from '../../src/cli/cluster-objects.ts';
import { describeObject, readManifests, shippedManifests } from '../../src/cli/manifests.ts';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => existsSync(p));
const skip = !kubectl && process.env.CI !== 'true' ? 'kubectl not found: the manifests are not compared with kubectl kustomize' : false;

type Obj = Record<string, any>;

async function kustomize(dir: string): Promise<{ text: string; objects: Obj[] }> {
  if (!kubectl) assert.fail('kubectl not found; CI=true requires it');
  const { stdout } = await run(kubectl, ['kustomize', path.join(ROOT, dir)], { maxBuffer: 16 << 20 });
  return { text: stdout, objects: parseYamlDocuments(stdout).map((d) => ('error' in d ? assert.fail(d.error) : (d.value as Obj))) };
}

const ids = (objects: readonly Obj[]) =>
  objects.map((o) => `${o.apiVersion} ${describeObject(o.name !== undefined ? { kind: o.kind, name: o.name, namespace: o.namespace } : { kind: o.kind, name: o.metadata!.name, namespace: o.metadata!.namespace })}`).sort();

describe('the objects pinset uninstall removes are the ones the manifests build', { skip }, () => {
  for (const dir of ['deploy', 'deploy/containerd']) {
    test(`${dir}: read as a folder and as kubectl kustomize's output, the same objects kubectl kustomize builds`, async () => {
      const built = await kustomize(dir);
      const fromFolder = await readManifests(path.join(ROOT, dir));
      assert.deepEqual(ids(fromFolder.objects), ids(built.objects));
      const tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-manifests-'));
      try {
        await writeFile(path.join(tmp, 'rendered.yaml'), built.text);
        assert.deepEqual(ids((await readManifests(path.join(tmp, 'rendered.yaml'))).objects), ids(built.objects));
      } finally {
        await rm(tmp, { recursive: true, force: true });
      }
    });
  }

  test('by default, the deploy/ that ships with pinset', async () => {
    assert.equal(path.resolve(shippedManifests()!), path.join(ROOT, 'deploy'));
    assert.deepEqual(ids((await readManifests(undefined)).objects), ids((await kustomize('deploy')).objects));
  });

  test('the CRD is read whole, so it can be installed again from it', async () => {
    const crd = (await readManifests(path.join(ROOT, 'deploy'))).objects.find((o) => o.kind === 'CustomResourceDefinition')!;
    assert.deepEqual(crd.doc, (await kustomize('deploy/crds')).objects[0]);
  });
});

describe('reading manifests', () => {
  test('a kustomization that renames or moves objects is refused, saying to render it with kubectl kustomize', async () => {
    const tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-manifests-'));
    try {
      await mkdir(path.join(tmp, 'overlay'));
      await writeFile(path.join(tmp, 'overlay', 'kustomization.yaml'), `resources:\n  - ${path.join(ROOT, 'deploy')}\nnamespace: elsewhere\nnamePrefix: my-\n`);
      await assert.rejects(readManifests(path.join(tmp, 'overlay')), /sets namePrefix, namespace, which this reader does not apply; render it first: `kubectl kustomize .*overlay \| pinset uninstall --manifests -`/);
      await writeFile(path.join(tmp, 'bad.yaml'), 'kind: Namespace\nmetadata: {name: x}\n');
      await assert.rejects(readManifests(path.join(tmp, 'bad.yaml')), /bad\.yaml, the document at line 1: not a Kubernetes object/);
      await assert.rejects(readManifests(path.join(tmp, 'missing')), /missing does not exist/);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  });

  test('removal order: the agents and the controller first, then admission, bindings, roles, accounts; the CRD and the namespace last', async () => {
    const { objects } = await readManifests(path.join(ROOT, 'deploy'));
    const order = inRemovalOrder(objects).map((o) => o.kind);
    assert.equal(order.length, objects.length);
    assert.deepEqual(order.slice(0, 2).sort(), ['DaemonSet', 'Deployment']);
    assert.deepEqual(order.slice(-2), ['CustomResourceDefinition', 'Namespace']);
    assert.ok(order.lastIndexOf('ValidatingAdmissionPolicyBinding') < order.indexOf('ValidatingAdmissionPolicy'), 'a binding before its policy');
    assert.ok(order.lastIndexOf('ClusterRoleBinding') < order.indexOf('ClusterRole'), 'bindings before roles');
  });
});

describe('deploy/drop-pins: `pinset agent --drop-pins` as a Job, with the agent\'s own mounts', { skip }, () => {
  for (const [file, overlay] of [['crio.yaml', 'deploy'], ['containerd.yaml', 'deploy/containerd']] as const) {
    test(`${file}: the flags --drop-pins reads, the DaemonSet's image, security and host paths (a subset, the same way), no API access`, async () => {
      const docs = parseYamlDocuments(await readFile(path.join(ROOT, 'deploy/drop-pins', file), 'utf8')).map((d) => ('error' in d ? assert.fail(d.error) : (d.value as Obj)));
      assert.deepEqual(docs.map((d) => d.kind), ['Namespace', 'Job']);
      const job = docs[1]!;
      const pod = job.spec.template.spec;
      const ds = (await kustomize(overlay)).objects.find((o) => o.kind === 'DaemonSet')!;
      const agentPod = ds.spec.template.spec;
      const [c] = pod.containers as Obj[];
      const [agent] = agentPod.containers as Obj[];
      assert.equal(c!.image, agent!.image);
      assert.deepEqual(c!.securityContext, agent!.securityContext);
      assert.equal(pod.automountServiceAccountToken, false);
      assert.equal(pod.restartPolicy, 'Never');
      assert.equal(pod.nodeName, 'REPLACE-WITH-NODE-NAME');
      // Every argument the agent's DaemonSet gives for its runtime, and --drop-pins.
      assert.deepEqual(c!.args, ['agent', '--drop-pins', ...(agent!.args as string[]).slice(1)]);
      const { stdout } = await run(path.join(ROOT, 'node_modules/.bin/node'), [path.join(ROOT, 'src/cli/main.ts'), 'agent', '--drop-pins', '--help']);
      for (const a of c!.args.slice(1) as string[]) assert.match(stdout, new RegExp(`^\\s+${a.replace(/=.*$/, '')}\\b`, 'm'), `pinset agent --drop-pins reads ${a}`);
      const volumes = new Map((agentPod.volumes as Obj[]).map((v) => [v.name, v]));
      const mounts = new Map((agent!.volumeMounts as Obj[]).map((m) => [m.mountPath, m]));
      for (const m of c!.volumeMounts as Obj[]) {
        const theirs = mounts.get(m.mountPath);
        assert.ok(theirs, `${m.mountPath} is mounted by the agent too`);
        assert.equal(Boolean(m.readOnly), Boolean(theirs.readOnly), `${m.mountPath} read-only as the agent's`);
        const mine = (pod.volumes as Obj[]).find((v) => v.name === m.name)!;
        const agentHostPath = volumes.get(theirs.name)!.hostPath;
        // The CRI-O Job runs on CRI-O nodes only: its /etc/crio is never created (type Directory), where the DaemonSet's must be.
        const want = file === 'crio.yaml' && agentHostPath.path === '/etc/crio' ? { ...agentHostPath, type: 'Directory' } : agentHostPath;
        assert.deepEqual(mine.hostPath, want, `${m.mountPath}: the same host path`);
      }
    });
  }
});
