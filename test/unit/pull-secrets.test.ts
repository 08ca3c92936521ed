// Pull secrets as the agent reads them (src/agent/pull-secrets.ts) and the
// agent's credential order (src/agent/image-credentials.ts): a set's pull
// secrets first, for the images that set wants, then the node's; each bad
// secret named with why, never with its content.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AgentCredentials } from '../../src/agent/image-credentials.ts';
import { planReconcile, type ObservedSet } from '../../src/agent/plan.ts';
import { decodePullSecret, pullSecretView, PullSecrets, type SecretLike, type SecretStore } from '../../src/agent/pull-secrets.ts';
import { MemoryCredentials } from '../../src/registry/credentials.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');
const A = `registry.test/team/a@sha256:${'a'.repeat(64)}`;
const B = `registry.test/team/b@sha256:${'b'.repeat(64)}`;

function secret(name: string, type: string, key: string, content: string): SecretLike {
  return { metadata: { name, namespace: 'pinset-system', resourceVersion: '1' }, type, data: { [key]: b64(content) } };
}
const dockerconfig = (user: string, pw: string) => JSON.stringify({ auths: { 'registry.test': { auth: b64(`${user}:${pw}`) } } });

class MemoryStore implements SecretStore {
  readonly namespace = 'pinset-system';
  readonly secrets = new Map<string, SecretLike>();
  synced = true;
  watched = 0;
  watch(): void {
    this.watched++;
  }
  get(name: string) {
    return this.secrets.get(name);
  }
  async whenSynced() {
    return this.synced;
  }
  put(s: SecretLike): this {
    this.secrets.set(s.metadata!.name!, s);
    return this;
  }
}

function observed(name: string, images: string[], pullSecrets?: string[]): ObservedSet {
  return {
    source: 'api',
    origin: 'api',
    object: { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { ...(pullSecrets ? { pullSecrets: pullSecrets.map((n) => ({ name: n })) } : {}), pinnedImages: images.map((i) => ({ name: i })) } },
  };
}
const plan = (...sets: ObservedSet[]) => planReconcile({ labels: {}, apiSets: sets, staticSets: [], staticProblems: [], currentPins: [], carriedPins: [] });

describe('a pull secret, decoded as the kubelet decodes one', () => {
  test('kubernetes.io/dockerconfigjson and the legacy kubernetes.io/dockercfg', () => {
    const json = decodePullSecret(secret('a', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', dockerconfig('robot', 'pw-1')));
    assert.deepEqual('entries' in json && json.entries, [['registry.test', { username: 'robot', password: 'pw-1' }]]);
    const cfg = decodePullSecret(secret('b', 'kubernetes.io/dockercfg', '.dockercfg', JSON.stringify({ 'registry.test': { username: 'u', password: 'pw-2' } })));
    assert.deepEqual('entries' in cfg && cfg.entries, [['registry.test', { username: 'u', password: 'pw-2' }]]);
  });

  const bad: [string, SecretLike, RegExp][] = [
    ['another type', secret('x', 'Opaque', 'token', 'pw-3'), /^is of type Opaque, not kubernetes\.io\/dockerconfigjson \(or the legacy kubernetes\.io\/dockercfg\)$/],
    ['no type at all is Opaque', { metadata: { name: 'x' }, data: {} }, /is of type Opaque/],
    ['its key missing', { metadata: { name: 'x' }, type: 'kubernetes.io/dockerconfigjson', data: {} }, /^is malformed: it has no \.dockerconfigjson$/],
    ['not JSON', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', '{"auths": pw-3'), /^is malformed: \.dockerconfigjson is not JSON$/],
    ['not a JSON object', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', '["pw-3"]'), /is not a JSON object/],
    ['auths not an object', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', '{"auths": "pw-3"}'), /"auths" is not an object/],
    ['an auth that is not base64', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', '{"auths": {"registry.test": {"auth": "pw-3!!"}}}'), /the entry "registry\.test" has an "auth" that is not base64$/],
    ['an auth without a colon', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', JSON.stringify({ auths: { 'registry.test': { auth: b64('pw-3') } } })), /not base64 of "user:password"/],
    ['a password that is no string', secret('x', 'kubernetes.io/dockercfg', '.dockercfg', '{"registry.test": {"username": "u", "password": 3}}'), /has a "password" that is not a string/],
    ['no credential in it', secret('x', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', '{"auths": {}}'), /^holds no registry credentials/],
  ];
  for (const [what, s, message] of bad) {
    test(`refused, saying why and quoting nothing: ${what}`, () => {
      const d = decodePullSecret(s);
      assert.ok('problem' in d, JSON.stringify(d));
      assert.match(d.problem, message);
      assert.doesNotMatch(d.problem, /pw-3/);
    });
  }

  test('what the watch keeps of a Secret: its type and its pull-secret key, nothing of other types', () => {
    const full = { metadata: { name: 'a', namespace: 'pinset-system', resourceVersion: '7', uid: 'u', managedFields: [] }, type: 'kubernetes.io/dockerconfigjson', data: { '.dockerconfigjson': 'eyJ9', other: 'eA==' } } as SecretLike;
    assert.deepEqual(pullSecretView(full), { metadata: { name: 'a', namespace: 'pinset-system', resourceVersion: '7', uid: 'u' }, type: 'kubernetes.io/dockerconfigjson', data: { '.dockerconfigjson': 'eyJ9' } });
    assert.equal(pullSecretView({ metadata: { name: 't' }, type: 'kubernetes.io/service-account-token', data: { token: 'eA==' } }).data, undefined);
  });
});

describe("the agent's order: a set's pull secrets for the images it wants, then the node's", () => {
  const node = () => new MemoryCredentials().add('registry.test', { username: 'node', password: 'node-pw' }, 'the node');
  const store = () =>
    new MemoryStore()
      .put(secret('team', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', dockerconfig('team-robot', 'team-pw')))
      .put(secret('other', 'kubernetes.io/dockerconfigjson', '.dockerconfigjson', dockerconfig('other-robot', 'other-pw')));

  test('the secrets of the sets that want the image first (all of them, one keyring), then the node\'s', async () => {
    const creds = new AgentCredentials({ node: node(), pullSecrets: new PullSecrets(store()) });
    creds.notePlan(plan(observed('with-team', [A], ['team']), observed('also-a', [A], ['other']), observed('b-only', [B])));
    const a = await creds.credentialsFor({ host: 'registry.test', path: 'team/a', origin: { repository: 'registry.test/team/a', digest: `sha256:${'a'.repeat(64)}` } });
    assert.deepEqual(a.candidates.map((c) => c.auth.username), ['team-robot', 'other-robot', 'node']);
    assert.equal(a.candidates[0]!.from, 'pull secret pinset-system/team (entry registry.test)');
    const b = await creds.credentialsFor({ host: 'registry.test', path: 'team/b', origin: { repository: 'registry.test/team/b', digest: `sha256:${'b'.repeat(64)}` } });
    assert.deepEqual(b.candidates.map((c) => c.auth.username), ['node'], 'another set\'s secrets are not used for an image it does not want');
    const child = await creds.credentialsFor({ host: 'registry.test', path: 'team/a', origin: { repository: 'registry.test/team/a', digest: `sha256:${'c'.repeat(64)}` } });
    assert.deepEqual(child.candidates.map((c) => c.auth.username), ['team-robot', 'other-robot', 'node'], 'a manifest under the index: the sets wanting that repository');
    assert.equal(creds.scrub('saw team-pw and node-pw'), 'saw [redacted] and [redacted]');
  });

  test('the Secrets are watched once a set names one, not before', () => {
    const s = store();
    const creds = new AgentCredentials({ node: node(), pullSecrets: new PullSecrets(s) });
    creds.notePlan(plan(observed('plain', [A])));
    assert.equal(s.watched, 0);
    creds.notePlan(plan(observed('with-team', [A], ['team'])));
    assert.equal(s.watched, 1);
  });

  test('per set, why a pull secret cannot be used; the images of the sets naming a secret', () => {
    const s = store().put(secret('opaque', 'Opaque', 'x', 'y'));
    const creds = new AgentCredentials({ node: node(), pullSecrets: new PullSecrets(s) });
    const p = plan(observed('ok', [A], ['team']), observed('missing', [B], ['team', 'nope', 'opaque']));
    creds.notePlan(p);
    const problems = creds.setProblems(p);
    assert.deepEqual([...problems.keys()], ['api/missing']);
    assert.equal(problems.get('api/missing'), 'pull secret pinset-system/nope does not exist (and 1 more of its pull secrets)');
    assert.deepEqual(creds.imagesUsingSecret('nope'), [`\n${B}`]);
    assert.deepEqual(creds.imagesUsingSecret('team').sort(), [`\n${A}`, `\n${B}`]);
    s.synced = false;
    assert.match(creds.setProblems(p).get('api/ok')!, /cannot be read yet: the Secrets of pinset-system have not been listed/);
  });

  test('without an API server, a set naming a pull secret says it cannot be read; the node\'s credentials still count', async () => {
    const creds = new AgentCredentials({ node: node(), pullSecrets: new PullSecrets(null) });
    const p = plan(observed('with-team', [A], ['team']));
    creds.notePlan(p);
    assert.match(creds.setProblems(p).get('api/with-team')!, /pull secret team cannot be read: the agent runs without an API server/);
    const a = await creds.credentialsFor({ host: 'registry.test', path: 'team/a', origin: { repository: 'registry.test/team/a' } });
    assert.deepEqual(a.candidates.map((c) => c.auth.username), ['node']);
  });
});
