// What kind of cluster the in-process API server stands in for
// (test/support/apiserver.ts), as `pinset preflight` tells one from another:
// the version /version answers (a managed cluster's gitVersion and its
// "30+" minor), resources a server of an older version does not serve
// (ValidatingAdmissionPolicy before Kubernetes 1.30: absent from discovery
// and 404, while the webhook configurations of the same group version are
// there), OpenShift's security.openshift.io group, and ResourceQuotas as the
// real registry stores them (a create's status dropped).
import assert from 'node:assert/strict';
import { describe, test, type TestContext } from 'node:test';
import { ApiServer, type ApiServerOptions, type KubeObject } from '../support/apiserver.ts';

async function startServer(t: TestContext, opts?: ApiServerOptions): Promise<ApiServer> {
  const server = await ApiServer.start(opts);
  t.after(() => server.stop());
  return server;
}

async function call(server: ApiServer, method: string, path: string, body?: unknown): Promise<{ code: number; body: any }> {
  const res = await fetch(server.url + path, { method, headers: body === undefined ? {} : { 'Content-Type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { code: res.status, body: await res.json() };
}

const groupsOf = async (server: ApiServer) => ((await call(server, 'GET', '/apis')).body.groups as { name: string; preferredVersion: { groupVersion: string } }[]).map((g) => g.preferredVersion.groupVersion);
const resourcesOf = async (server: ApiServer, gv: string) => {
  const r = await call(server, 'GET', gv === 'v1' ? '/api/v1' : `/apis/${gv}`);
  return r.code === 200 ? (r.body.resources as { name: string }[]).map((x) => x.name) : r.code;
};

const VAPS = '/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies';
const SCCS = '/apis/security.openshift.io/v1/securitycontextconstraints';
const policy = (name: string): KubeObject => ({ apiVersion: 'admissionregistration.k8s.io/v1', kind: 'ValidatingAdmissionPolicy', metadata: { name }, spec: {} });

describe('the in-process API server as clusters of several kinds', () => {
  test('/version: v1.33.0-pinset-test by default; a managed cluster\'s gitVersion, and its own minor when it differs', async (t) => {
    const plain = await startServer(t);
    assert.deepEqual(
      (({ major, minor, gitVersion }) => ({ major, minor, gitVersion }))((await call(plain, 'GET', '/version')).body),
      { major: '1', minor: '33', gitVersion: 'v1.33.0-pinset-test' },
    );
    const gke = await startServer(t, { version: { gitVersion: 'v1.30.5-gke.1014001', minor: '30+' } });
    const v = (await call(gke, 'GET', '/version')).body;
    assert.deepEqual([v.major, v.minor, v.gitVersion], ['1', '30+', 'v1.30.5-gke.1014001']);
  });

  test('a resource not served: absent from discovery, 404 on every verb and for the test controls; the rest of its group version still served', async (t) => {
    const old = await startServer(t, { version: { gitVersion: 'v1.29.7' }, notServed: ['validatingadmissionpolicies', 'validatingadmissionpolicybindings'] });
    const resources = await resourcesOf(old, 'admissionregistration.k8s.io/v1');
    assert.ok(Array.isArray(resources));
    assert.ok(!resources.includes('validatingadmissionpolicies') && !resources.includes('validatingadmissionpolicybindings'), String(resources));
    assert.ok(resources.includes('validatingwebhookconfigurations') && resources.includes('mutatingwebhookconfigurations'), String(resources));
    assert.ok((await groupsOf(old)).includes('admissionregistration.k8s.io/v1'));
    for (const [method, path, body] of [['GET', VAPS], ['GET', `${VAPS}/p`], ['POST', VAPS, policy('p')]] as const) {
      const r = await call(old, method, path, body);
      assert.equal(r.code, 404, `${method} ${path}`);
      assert.equal(r.body.message, 'the server could not find the requested resource');
    }
    assert.throws(() => old.create(policy('p')), /could not find the requested resource/);

    const current = await startServer(t);
    assert.ok(((await resourcesOf(current, 'admissionregistration.k8s.io/v1')) as string[]).includes('validatingadmissionpolicies'));
    assert.equal((await call(current, 'POST', VAPS, policy('p'))).code, 201);
  });

  test('a group left with nothing served is gone from discovery', async (t) => {
    const server = await startServer(t, { notServed: ['validatingadmissionpolicies', 'validatingadmissionpolicybindings', 'validatingwebhookconfigurations', 'mutatingwebhookconfigurations'] });
    assert.ok(!(await groupsOf(server)).includes('admissionregistration.k8s.io/v1'));
    assert.equal(await resourcesOf(server, 'admissionregistration.k8s.io/v1'), 404);
  });

  test('OpenShift: security.openshift.io/v1 SecurityContextConstraints discovered and stored; elsewhere neither', async (t) => {
    const plain = await startServer(t);
    assert.ok(!(await groupsOf(plain)).includes('security.openshift.io/v1'));
    assert.equal((await call(plain, 'GET', SCCS)).code, 404);

    const openshift = await startServer(t, { openshift: true });
    assert.ok((await groupsOf(openshift)).includes('security.openshift.io/v1'));
    assert.deepEqual(await resourcesOf(openshift, 'security.openshift.io/v1'), ['securitycontextconstraints']);
    const scc = { apiVersion: 'security.openshift.io/v1', kind: 'SecurityContextConstraints', metadata: { name: 'privileged' }, allowHostDirVolumePlugin: true, users: ['system:admin'] };
    assert.equal((await call(openshift, 'POST', SCCS, scc)).code, 201);
    const listed = (await call(openshift, 'GET', SCCS)).body;
    assert.deepEqual(listed.items.map((i: any) => [i.metadata.name, i.allowHostDirVolumePlugin, i.users]), [['privileged', true, ['system:admin']]]);
  });

  test('RBAC names are path segments, as ValidateRBACName checks them: colons taken, "/" and ".." refused', async (t) => {
    const server = await startServer(t);
    const role = (name: string) => ({ apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: { name }, rules: [] });
    const created = await call(server, 'POST', '/apis/rbac.authorization.k8s.io/v1/clusterroles', role('system:openshift:scc:privileged'));
    assert.equal(created.code, 201);
    assert.equal(created.body.metadata.name, 'system:openshift:scc:privileged');
    for (const [name, why] of [['a/b', "may not contain '/'"], ['..', "may not be '..'"], ['50%', "may not contain '%'"]] as const) {
      const r = await call(server, 'POST', '/apis/rbac.authorization.k8s.io/v1/clusterroles', role(name));
      assert.equal(r.code, 422, name);
      assert.equal(r.body.message, `ClusterRole.rbac.authorization.k8s.io "${name}" is invalid: metadata.name: Invalid value: ${JSON.stringify(name)}: ${why}`);
    }
    const ns = await call(server, 'POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'a:b' } });
    assert.equal(ns.code, 422, 'other kinds keep DNS names');
  });

  test('ResourceQuotas: namespaced, with a status subresource; the status a create sends is dropped', async (t) => {
    const server = await startServer(t);
    assert.ok(((await resourcesOf(server, 'v1')) as string[]).includes('resourcequotas'));
    assert.ok(((await resourcesOf(server, 'v1')) as string[]).includes('resourcequotas/status'));
    const quota = {
      apiVersion: 'v1',
      kind: 'ResourceQuota',
      metadata: { name: 'critical-pods' },
      spec: { hard: { pods: '1G' }, scopeSelector: { matchExpressions: [{ operator: 'In', scopeName: 'PriorityClass', values: ['system-node-critical'] }] } },
      status: { hard: { pods: '1G' }, used: { pods: '3' } },
    };
    const created = await call(server, 'POST', '/api/v1/namespaces/pinset-system/resourcequotas', quota);
    assert.equal(created.code, 201);
    assert.deepEqual(created.body.status, {});
    assert.deepEqual(created.body.spec, quota.spec);
    assert.equal((await call(server, 'GET', '/api/v1/namespaces/kube-system/resourcequotas')).body.items.length, 0);
    assert.equal((await call(server, 'GET', '/api/v1/resourcequotas')).body.items.length, 1, 'listed across namespaces');
  });
});
