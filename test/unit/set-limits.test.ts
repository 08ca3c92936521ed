// deploy/set-limits: the opt-in admission policy that limits the registries
// a PinnedImageSet may name and the pull Secrets it may use, to the lists of
// the ConfigMap pinset-set-limits. Rendered with `kubectl kustomize` over
// deploy/ (and into another namespace), evaluated with the CEL admission of
// ../support/admission.ts, the ConfigMap as the binding's parameter.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { admit, type AdmissionRequest } from '../support/admission.ts';

type Obj = Record<string, any>;
const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => existsSync(p));
const skip = !kubectl && process.env.CI !== 'true' ? 'kubectl not found: the kustomization is NOT rendered' : false;
const D = (c: string) => `sha256:${c.repeat(64)}`;

let work: string;
before(async () => {
  work = await mkdtemp(path.join(os.tmpdir(), 'pinset-set-limits-'));
});
after(async () => {
  await rm(work, { recursive: true, force: true });
});

/** deploy/ with the component, optionally into another namespace, as kubectl renders it. */
async function render(namespace?: string): Promise<Obj[]> {
  if (!kubectl) assert.fail('kubectl not found; CI=true requires it');
  const dir = await mkdtemp(path.join(work, 'overlay-'));
  const rel = (p: string) => path.relative(dir, path.join(ROOT, p));
  await writeFile(path.join(dir, 'kustomization.yaml'), JSON.stringify({ apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', ...(namespace ? { namespace } : {}), resources: [rel('deploy')], components: [rel('deploy/set-limits')] }));
  const { stdout } = await run(kubectl, ['kustomize', dir], { maxBuffer: 16 << 20 });
  return parseYamlDocuments(stdout).map((d) => ('value' in d ? (d.value as Obj) : assert.fail(d.error)));
}

const one = (objs: Obj[], kind: string, name: string) => objs.find((o) => o.kind === kind && o.metadata.name === name) ?? assert.fail(`${kind} ${name} not rendered`);

function set(images: string[], pullSecrets?: string[]): Obj {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'apps' }, spec: { pinnedImages: images.map((name) => ({ name })), ...(pullSecrets ? { pullSecrets: pullSecrets.map((name) => ({ name })) } : {}) } };
}

const author: AdmissionRequest['userInfo'] = { username: 'jane', groups: ['team-a', 'system:authenticated'] };
const write = (operation: 'CREATE' | 'UPDATE'): AdmissionRequest => ({ operation, resource: { group: 'pinset.dev', version: 'v1alpha1', resource: 'pinnedimagesets' }, name: 'apps', userInfo: author });

describe('deploy/set-limits', { skip }, () => {
  let objects: Obj[] = [];
  let policy: Obj;
  let limits: Obj;
  before(async () => {
    if (skip) return;
    objects = await render();
    policy = one(objects, 'ValidatingAdmissionPolicy', 'pinset-set-limits');
    limits = one(objects, 'ConfigMap', 'pinset-set-limits');
  });
  /** The ConfigMap as an administrator edits it. */
  const edited = (data: Record<string, string>): Obj => ({ ...limits, data });
  let params: Obj;
  before(() => {
    if (!skip) params = edited({ registries: '# ours\nregistry.example.com\n  quay.io/example-org  \n\nghcr.io/example/app\n', pullSecrets: 'regcred\n# old: legacy\n' });
  });

  test('rendered: the ConfigMap in the agents\' namespace, the binding enforcing with Deny, refusing every write while the ConfigMap is missing', () => {
    assert.equal(limits.metadata.namespace, 'pinset-system');
    assert.equal(limits.metadata.labels['app.kubernetes.io/part-of'], 'pinset', 'uninstall removes it with the rest');
    const binding = one(objects, 'ValidatingAdmissionPolicyBinding', 'pinset-set-limits');
    assert.deepEqual(binding.spec, { policyName: 'pinset-set-limits', validationActions: ['Deny'], paramRef: { name: 'pinset-set-limits', namespace: 'pinset-system', parameterNotFoundAction: 'Deny' } });
    assert.equal(policy.spec.failurePolicy, 'Fail');
    assert.deepEqual(policy.spec.paramKind, { apiVersion: 'v1', kind: 'ConfigMap' });
  });

  test('allowed: images on a listed host, under a listed path, a listed repository with its tag; a listed pull Secret', () => {
    const ok = set([`registry.example.com/x/y@${D('a')}`, `quay.io/example-org/app@${D('b')}`, `ghcr.io/example/app@${D('c')}`, `ghcr.io/example/app:1.0@${D('d')}`], ['regcred']);
    assert.deepEqual(admit(policy, write('CREATE'), null, ok, params), { applies: true, denied: [] });
  });

  const refusals: [string, Obj, RegExp][] = [
    ['an image on another registry', set([`registry.example.com/x@${D('a')}`, `evil.example/x@${D('b')}`]), new RegExp(`^images on a registry sets may not name here \\(ConfigMap pinset-system/pinset-set-limits, key registries\\): evil\\.example/x@${D('b')}$`)],
    ['a host that only starts like a listed one', set([`registry.example.com.evil.example/x@${D('a')}`]), /key registries\): registry\.example\.com\.evil\.example\/x@/],
    ['another port of a listed host', set([`registry.example.com:5000/x@${D('a')}`]), /key registries\): registry\.example\.com:5000\/x@/],
    ['another path on a host listed with a path', set([`quay.io/other-org/app@${D('a')}`, `quay.io/example-organisation/app@${D('b')}`]), /key registries\): quay\.io\/other-org\/app@sha256:a+, quay\.io\/example-organisation\/app@/],
    ['another repository beside a listed one', set([`ghcr.io/example/app2@${D('a')}`]), /key registries\): ghcr\.io\/example\/app2@/],
    ['a pull Secret not listed (nor one commented out)', set([`registry.example.com/x@${D('a')}`], ['regcred', 'legacy', 'cluster-admin-token']), /^pull Secrets sets may not use here \(ConfigMap pinset-system\/pinset-set-limits, key pullSecrets\): legacy, cluster-admin-token$/],
  ];
  for (const [what, obj, message] of refusals) {
    test(`refused: ${what}, naming it`, () => {
      const v = admit(policy, write('CREATE'), null, obj, params);
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1, JSON.stringify(v.denied));
      assert.match(v.denied[0]!, message);
    });
  }

  test('the ConfigMap as shipped (every entry commented out) allows no registry and no pull Secret: the administrator lists them first', () => {
    const v = admit(policy, write('CREATE'), null, set([`registry.example.com/x@${D('a')}`], ['regcred']), limits);
    assert.ok(v.applies);
    assert.equal(v.denied.length, 2, JSON.stringify(v.denied));
  });

  test('a key left out limits nothing of its kind', () => {
    const onlySecrets = edited({ pullSecrets: 'regcred' });
    assert.deepEqual(admit(policy, write('CREATE'), null, set([`anywhere.example/x@${D('a')}`], ['regcred']), onlySecrets), { applies: true, denied: [] });
    const v = admit(policy, write('CREATE'), null, set([`anywhere.example/x@${D('a')}`], ['other']), onlySecrets);
    assert.ok(v.applies && v.denied.length === 1 && /key pullSecrets/.test(v.denied[0]!));
  });

  test('an update that leaves the spec as it was is not checked (a set from before the limits can be relabelled); one that changes it is', () => {
    const old = set([`evil.example/x@${D('a')}`]);
    const relabelled = { ...old, metadata: { ...old.metadata, labels: { team: 'a' } } };
    assert.deepEqual(admit(policy, write('UPDATE'), old, relabelled, params), { applies: false });
    const changed = set([`evil.example/x@${D('a')}`, `registry.example.com/x@${D('b')}`]);
    const v = admit(policy, write('UPDATE'), old, changed, params);
    assert.ok(v.applies && v.denied.length === 1 && /evil\.example/.test(v.denied[0]!));
    // The controller writes the status subresource, which the policy does not match.
    assert.deepEqual(admit(policy, { ...write('UPDATE'), subResource: 'status' }, old, { ...old, status: { observedGeneration: 1 } }, params), { applies: false });
  });

  test('rendered into another namespace, the binding names the ConfigMap where it went', async () => {
    const moved = await render('shared-tools');
    assert.equal(one(moved, 'ConfigMap', 'pinset-set-limits').metadata.namespace, 'shared-tools');
    assert.deepEqual(one(moved, 'ValidatingAdmissionPolicyBinding', 'pinset-set-limits').spec.paramRef, { name: 'pinset-set-limits', namespace: 'shared-tools', parameterNotFoundAction: 'Deny' });
  });
});
