// The CRD, the admission policy and the TypeScript validator, checked offline:
// no API server runs here, so the CRD's OpenAPI schema is compiled with ajv
// (its x-kubernetes-* extensions implemented as ajv keywords, CEL rules
// evaluated with @marcbachmann/cel-js), and the corpora must get the same
// verdict from that model of the API server and from src/api/validate.ts.
import { ProgressTracker } from '../../src/controller/progress.ts';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { Ajv, type AnySchemaObject, type ErrorObject, type SchemaValidateFunction } from 'ajv';
import { Environment } from '@marcbachmann/cel-js';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { MAX_NAME_LENGTH, MAX_REFERENCE_LENGTH, REFERENCE_PATTERN } from '../../src/api/reference.ts';
import { API_VERSION, GROUP, KIND, MAX_FIRST_WAVE_NODES, MAX_PINNED_IMAGES, MAX_PULL_SECRETS, PLURAL, VERSION } from '../../src/api/types.ts';
import { describeProblems, MAX_RUNTIME_HANDLER_LENGTH, NAME_PATTERN, RUNTIME_HANDLER_PATTERN, validateSet } from '../../src/api/validate.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const CRD_FILE = path.join(ROOT, 'deploy/crds/pinset.dev_pinnedimagesets.yaml');
const POLICY_FILE = path.join(ROOT, 'deploy/admission/policy.yaml');
const GOOD_DIR = path.join(ROOT, 'test/fixtures/sets/good');
const BAD_DIR = path.join(ROOT, 'test/fixtures/sets/bad');
const EXAMPLES_DIR = path.join(ROOT, 'examples');

type Obj = Record<string, any>;

async function yamlDocuments(file: string): Promise<Obj[]> {
  const docs = parseYamlDocuments(await readFile(file, 'utf8'));
  return docs.map((d) => {
    if ('error' in d) assert.fail(`${path.relative(ROOT, file)}: ${d.error}`);
    return d.value as Obj;
  });
}

async function yamlFiles(dir: string): Promise<string[]> {
  return (await readdir(dir)).filter((f) => f.endsWith('.yaml')).sort().map((f) => path.join(dir, f));
}

const [crd] = await yamlDocuments(CRD_FILE);
const version = crd!.spec.versions.find((v: Obj) => v.name === VERSION);
const schema: Obj = version.schema.openAPIV3Schema;
const specSchema: Obj = schema.properties.spec;
const imageNameSchema: Obj = specSchema.properties.pinnedImages.items.properties.name;

// ---------------------------------------------------------------------------
// CEL, as the API server evaluates it: undeclared variables are dynamic, as
// `self`, `object`, `request` are to a schema-less evaluator.
const cel = new Environment({ unlistedVariablesAreDyn: true });

function celTrue(expression: string, context: Record<string, unknown>): boolean {
  return cel.evaluate(expression, context) === true;
}

// ---------------------------------------------------------------------------
// A model of the API server's create/update validation for this CRD.

/**
 * The structural schema as an ajv schema. kubectl sends requests with
 * fieldValidation=Strict, so unknown fields are errors, not pruned: objects
 * that list their properties get additionalProperties: false.
 */
function forAjv(node: Obj): Obj {
  const out: Obj = { ...node };
  if (node.properties) {
    out.properties = Object.fromEntries(Object.entries(node.properties as Obj).map(([k, v]) => [k, forAjv(v as Obj)]));
    if (node.additionalProperties === undefined && !node['x-kubernetes-preserve-unknown-fields']) out.additionalProperties = false;
  }
  if (node.items) out.items = forAjv(node.items);
  if (node.additionalProperties && typeof node.additionalProperties === 'object') out.additionalProperties = forAjv(node.additionalProperties);
  return out;
}

/** x-kubernetes-list-type: map and set refuse duplicates, as the API server does. */
const listType: SchemaValidateFunction = (kind: string, data: unknown[], parentSchema?: AnySchemaObject) => {
  const keys: string[] = parentSchema?.['x-kubernetes-list-map-keys'] ?? [];
  const keyOf = (item: unknown) =>
    kind === 'map' ? JSON.stringify(keys.map((k) => (item as Obj)?.[k])) : kind === 'set' ? JSON.stringify(item) : undefined;
  const seen = new Set<string>();
  for (let i = 0; i < data.length; i++) {
    const key = keyOf(data[i]);
    if (key === undefined) continue;
    if (seen.has(key)) {
      listType.errors = [{ keyword: 'x-kubernetes-list-type', message: `duplicate entry for key ${key} at index ${i}`, params: { index: i } }];
      return false;
    }
    seen.add(key);
  }
  return true;
};

/** x-kubernetes-validations: every rule must evaluate to true with `self` bound to the value. */
const celRules: SchemaValidateFunction = (rules: Obj[], data: unknown, _parent, dataCxt) => {
  const errors: Partial<ErrorObject>[] = [];
  for (const r of rules) {
    let ok: boolean;
    let message: string = r.message ?? `failed rule: ${r.rule}`;
    try {
      ok = celTrue(r.rule, { self: data });
    } catch (e) {
      ok = false;
      message = `rule ${r.rule} failed to evaluate: ${(e as Error).message}`;
    }
    if (!ok) {
      const base = dataCxt?.instancePath ?? '';
      const field = typeof r.fieldPath === 'string' ? r.fieldPath.replace(/^\./, '/').replaceAll('.', '/') : '';
      errors.push({ keyword: 'x-kubernetes-validations', instancePath: base + field, message, params: { rule: r.rule } });
    }
  }
  celRules.errors = errors;
  return errors.length === 0;
};

const ajv = new Ajv({ allErrors: true, strict: true });
ajv.addKeyword({ keyword: 'x-kubernetes-list-map-keys', schemaType: 'array' });
ajv.addKeyword({ keyword: 'x-kubernetes-list-type', type: 'array', schemaType: 'string', errors: true, validate: listType });
ajv.addKeyword({ keyword: 'x-kubernetes-validations', schemaType: 'array', errors: true, validate: celRules });
ajv.addFormat('int32', { type: 'number', validate: (n: number) => Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31 });
ajv.addFormat('int64', { type: 'number', validate: (n: number) => Number.isSafeInteger(n) });
ajv.addFormat('date-time', /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$/);
const validateSchema = ajv.compile(forAjv(schema));

/** k8s.io/apimachinery/pkg/util/validation IsDNS1123Subdomain: what the API server checks a custom resource's name with. */
const K8S_DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

interface ServerError {
  /** JSON pointer of the offending field. */
  path: string;
  message: string;
}

/** What the API server would refuse in a create of `obj` through this CRD. */
function apiServerErrors(obj: unknown): ServerError[] {
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) return [{ path: '', message: 'not an object' }];
  const o = obj as Obj;
  const errors: ServerError[] = [];
  if (o.apiVersion !== API_VERSION || o.kind !== KIND) errors.push({ path: '/kind', message: 'not served by this CRD' });
  const name = o.metadata?.name;
  if (typeof name !== 'string' || name.length === 0 || name.length > 253 || !K8S_DNS1123_SUBDOMAIN.test(name)) {
    errors.push({ path: '/metadata/name', message: 'must be a DNS-1123 subdomain' });
  }
  if (!validateSchema(obj)) {
    for (const e of validateSchema.errors ?? []) {
      const extra =
        e.keyword === 'required' ? `/${e.params.missingProperty}` :
        e.keyword === 'additionalProperties' ? `/${e.params.additionalProperty}` : '';
      errors.push({ path: e.instancePath + extra, message: e.message ?? e.keyword });
    }
  }
  return errors;
}

function tsProblems(obj: unknown): string[] {
  return describeProblems(validateSet(obj));
}

const H = '3ddd18007da0e2a1e7da24b251a2d691f53a918f9e2dedf116c0bd39de1149fe';

function setWith(spec: Obj, name = 'generated'): Obj {
  return { apiVersion: API_VERSION, kind: KIND, metadata: { name }, spec };
}

// ---------------------------------------------------------------------------

describe('CRD: one grammar with the TypeScript validator', () => {
  test('names the API the code uses', () => {
    assert.equal(crd!.apiVersion, 'apiextensions.k8s.io/v1');
    assert.equal(crd!.metadata.name, `${PLURAL}.${GROUP}`);
    assert.equal(crd!.spec.group, GROUP);
    assert.equal(crd!.spec.scope, 'Cluster');
    assert.equal(crd!.spec.names.kind, KIND);
    assert.equal(crd!.spec.names.plural, PLURAL);
    assert.deepEqual(crd!.spec.names.shortNames, ['pis']);
    assert.deepEqual(crd!.spec.versions.map((v: Obj) => v.name), [VERSION]);
    assert.equal(version.served, true);
    assert.equal(version.storage, true);
    assert.deepEqual(version.subresources, { status: {} });
  });

  test('printer columns: Ready, Nodes and Age by default', () => {
    const cols = (version.additionalPrinterColumns as Obj[]).filter((c) => !c.priority);
    assert.deepEqual(
      cols.map((c) => [c.name, c.type, c.jsonPath]),
      [
        ['Ready', 'integer', '.status.nodes.ready'],
        ['Nodes', 'integer', '.status.nodes.matched'],
        ['Age', 'date', '.metadata.creationTimestamp'],
      ],
    );
  });

  test('printer columns with -o wide: the Progressing and Degraded counts, the progress and the ETA as the controller writes them', () => {
    const cols = (version.additionalPrinterColumns as Obj[]).filter((c) => c.priority === 1);
    assert.deepEqual(
      cols.map((c) => [c.name, c.type, c.jsonPath]),
      [
        ['Progressing', 'integer', '.status.nodes.progressing'],
        ['Degraded', 'integer', '.status.nodes.degraded'],
        ['Progress', 'string', '.status.progress.summary'],
        // A string: a date column prints the time since it, and a time to come as "<invalid>".
        ['ETA', 'string', '.status.progress.estimatedCompletionTime'],
      ],
    );
    const all = (version.additionalPrinterColumns as Obj[]).map((c) => c.name);
    assert.equal(all.at(-1), 'Age', 'Age stays the last column');
  });

  test('the reference pattern is REFERENCE_PATTERN and the limits are the TypeScript constants', () => {
    assert.equal(imageNameSchema.pattern, REFERENCE_PATTERN);
    assert.equal(imageNameSchema.maxLength, MAX_REFERENCE_LENGTH);
    const list = specSchema.properties.pinnedImages;
    assert.equal(list.minItems, 1);
    assert.equal(list.maxItems, MAX_PINNED_IMAGES);
    assert.equal(list['x-kubernetes-list-type'], 'map');
    assert.deepEqual(list['x-kubernetes-list-map-keys'], ['name']);
    const handler = specSchema.properties.runtimeHandler;
    assert.equal(handler.pattern, `^$|${RUNTIME_HANDLER_PATTERN}`, 'empty (the default handler) or RUNTIME_HANDLER_PATTERN');
    assert.equal(handler.maxLength, MAX_RUNTIME_HANDLER_LENGTH);
    assert.deepEqual(specSchema.required, ['pinnedImages']);
    assert.deepEqual(schema.required, ['spec']);
    assert.deepEqual(specSchema.properties.nodeSelector.properties.matchExpressions.items.properties.operator.enum, ['In', 'NotIn', 'Exists', 'DoesNotExist']);
  });

  test('the patterns are plain RE2: no look-around or back-references (the API server compiles them with Go regexp)', () => {
    for (const p of [REFERENCE_PATTERN, handlerPattern()]) {
      assert.doesNotMatch(p, /\(\?[=!<]|\\[1-9]/);
    }
  });

  test('the name validation the TypeScript validator applies is the API server\'s', () => {
    assert.equal(NAME_PATTERN, K8S_DNS1123_SUBDOMAIN.source);
  });

  test('the schema is structural: every field has a type; map-list keys are required; metadata is left to the server', () => {
    const walk = (node: Obj, at: string) => {
      assert.ok(node.type || node['x-kubernetes-int-or-string'] || node['x-kubernetes-preserve-unknown-fields'], `${at}: no type`);
      for (const k of ['anyOf', 'oneOf', 'allOf', 'not', '$ref', 'additionalItems', 'default', 'nullable']) {
        assert.equal(node[k], undefined, `${at}: ${k} is not used in this schema`);
      }
      if (node['x-kubernetes-list-type'] === 'map') {
        for (const key of node['x-kubernetes-list-map-keys']) assert.ok(node.items.required?.includes(key), `${at}: map key ${key} must be required`);
      }
      for (const [k, v] of Object.entries((node.properties ?? {}) as Obj)) walk(v, `${at}.${k}`);
      if (node.items) walk(node.items, `${at}[]`);
      if (typeof node.additionalProperties === 'object') walk(node.additionalProperties, `${at}{}`);
    };
    walk(schema, '');
    assert.deepEqual(schema.properties.metadata, { type: 'object' });
  });
});

function handlerPattern(): string {
  return specSchema.properties.runtimeHandler.pattern;
}

describe('CRD: CEL rules on selector requirements', () => {
  const item = specSchema.properties.nodeSelector.properties.matchExpressions.items;
  const rules: Obj[] = item['x-kubernetes-validations'];
  const passes = (self: Obj) => rules.filter((r) => !celTrue(r.rule, { self })).map((r) => r.message);

  test('there are exactly the two rules these samples cover', () => {
    assert.equal(rules.length, 2);
  });

  const allowed: Obj[] = [
    { key: 'zone', operator: 'In', values: ['a'] },
    { key: 'zone', operator: 'NotIn', values: ['a', 'b'] },
    { key: 'zone', operator: 'Exists' },
    { key: 'zone', operator: 'Exists', values: [] },
    { key: 'zone', operator: 'DoesNotExist' },
  ];
  for (const self of allowed) {
    test(`allows ${JSON.stringify(self)}`, () => assert.deepEqual(passes(self), []));
  }
  const denied: [Obj, RegExp][] = [
    [{ key: 'zone', operator: 'In' }, /non-empty when operator is In or NotIn/],
    [{ key: 'zone', operator: 'In', values: [] }, /non-empty when operator is In or NotIn/],
    [{ key: 'zone', operator: 'NotIn' }, /non-empty when operator is In or NotIn/],
    [{ key: 'zone', operator: 'Exists', values: ['a'] }, /empty when operator is Exists or DoesNotExist/],
    [{ key: 'zone', operator: 'DoesNotExist', values: ['a'] }, /empty when operator is Exists or DoesNotExist/],
  ];
  for (const [self, message] of denied) {
    test(`denies ${JSON.stringify(self)}`, () => {
      const failed = passes(self);
      assert.equal(failed.length, 1);
      assert.match(failed[0], message);
    });
  }
});

describe('corpora: the CRD and the TypeScript validator agree', async () => {
  const goodFiles = [...(await yamlFiles(GOOD_DIR)), ...(await yamlFiles(EXAMPLES_DIR))];
  for (const file of goodFiles) {
    const docs = await yamlDocuments(file);
    test(`${path.relative(ROOT, file)}: every document accepted by both`, () => {
      assert.ok(docs.length > 0);
      for (const doc of docs) {
        assert.deepEqual(apiServerErrors(doc), [], `API server model refuses ${doc.metadata?.name}`);
        assert.deepEqual(tsProblems(doc), [], `validateSet refuses ${doc.metadata?.name}`);
      }
    });
  }

  // For each bad file: the field the TypeScript validator names and the JSON
  // pointer the API server model refuses, so a file refused for the wrong
  // reason (a typo in the fixture) does not pass.
  const image0 = { ts: 'spec.pinnedImages[0].name', api: '/spec/pinnedImages/0/name' };
  const requirement = (f: string) => ({ ts: `spec.nodeSelector.matchExpressions[0].${f}`, api: `/spec/nodeSelector/matchExpressions/0/${f}` });
  const expected: Record<string, { ts: string; api: string }> = {
    'bad-object-name': { ts: 'metadata.name', api: '/metadata/name' },
    'bad-operator': requirement('operator'),
    'bare-name': image0,
    duplicate: { ts: 'spec.pinnedImages[1].name', api: '/spec/pinnedImages' },
    'empty-key': requirement('key'),
    'empty-name': image0,
    'exists-with-values': requirement('values'),
    'first-wave-no-nodes': { ts: 'spec.rollout.firstWave.nodes', api: '/spec/rollout/firstWave/nodes' },
    'first-wave-too-many': { ts: 'spec.rollout.firstWave.nodes', api: '/spec/rollout/firstWave/nodes' },
    'image-as-string': { ts: 'spec.pinnedImages[0].name', api: '/spec/pinnedImages/0' },
    'images-not-list': { ts: 'spec.pinnedImages', api: '/spec/pinnedImages' },
    'in-without-values': requirement('values'),
    injection: image0,
    'label-value-not-string': { ts: 'spec.nodeSelector.matchLabels["replicas"]', api: '/spec/nodeSelector/matchLabels/replicas' },
    'name-too-long': image0,
    'no-host': image0,
    'no-images': { ts: 'spec.pinnedImages', api: '/spec/pinnedImages' },
    'no-spec': { ts: 'spec', api: '/spec' },
    'notin-empty-values': requirement('values'),
    'other-algorithm': image0,
    'pull-secret-name': { ts: 'spec.pullSecrets[0].name', api: '/spec/pullSecrets/0/name' },
    'rollout-not-integer': { ts: 'spec.rollout.maxConcurrentNodes', api: '/spec/rollout/maxConcurrentNodes' },
    'rollout-unknown-field': { ts: 'spec.rollout.maxConcurrentNode', api: '/spec/rollout/maxConcurrentNode' },
    'rollout-zero': { ts: 'spec.rollout.maxConcurrentNodes', api: '/spec/rollout/maxConcurrentNodes' },
    'runtime-handler': { ts: 'spec.runtimeHandler', api: '/spec/runtimeHandler' },
    'short-digest': image0,
    tag: image0,
    'tag-and-digest': image0,
    'unknown-selector-field': { ts: 'spec.nodeSelector.matchLabel', api: '/spec/nodeSelector/matchLabel' },
    'uppercase-hex': image0,
    'uppercase-path': image0,
    'zero-items': { ts: 'spec.pinnedImages', api: '/spec/pinnedImages' },
  };
  const badFiles = await yamlFiles(BAD_DIR);

  test('every bad file has an expectation and every expectation a file', () => {
    assert.deepEqual(badFiles.map((f) => path.basename(f, '.yaml')).sort(), Object.keys(expected).sort());
  });

  for (const file of badFiles) {
    const docs = await yamlDocuments(file);
    const want = expected[path.basename(file, '.yaml')];
    test(`${path.relative(ROOT, file)}: refused by both, for the same field`, () => {
      assert.equal(docs.length, 1, 'a bad file holds exactly one document');
      const api = apiServerErrors(docs[0]);
      const ts = tsProblems(docs[0]);
      assert.ok(want, 'no expectation for this file');
      assert.ok(api.some((e) => e.path === want.api), `API server model: expected an error at ${want.api}, got ${JSON.stringify(api)}`);
      assert.ok(ts.some((p) => p.startsWith(`${want.ts}:`)), `validateSet: expected a problem at ${want.ts}, got ${JSON.stringify(ts)}`);
    });
  }

  test('the injection attempt is refused by the pattern itself, newline and all', () => {
    const evil = `quay.io/org/app@sha256:${H}"]\n[crio.runtime]\ndefault_runtime = "evil"`;
    assert.doesNotMatch(evil, new RegExp(imageNameSchema.pattern, 'u'));
    assert.doesNotMatch(`quay.io/org/app@sha256:${H}\n`, new RegExp(imageNameSchema.pattern, 'u'), '$ must not accept a trailing newline');
  });

  test(`${MAX_PINNED_IMAGES} images accepted by both, ${MAX_PINNED_IMAGES + 1} refused by both`, () => {
    const images = (n: number) => Array.from({ length: n }, (_, i) => ({ name: `quay.io/org/app${i}@sha256:${H}` }));
    const atMax = setWith({ pinnedImages: images(MAX_PINNED_IMAGES) });
    assert.deepEqual(apiServerErrors(atMax), []);
    assert.deepEqual(tsProblems(atMax), []);
    const over = setWith({ pinnedImages: images(MAX_PINNED_IMAGES + 1) });
    assert.ok(apiServerErrors(over).some((e) => e.path === '/spec/pinnedImages'));
    assert.ok(tsProblems(over).some((p) => p.startsWith('spec.pinnedImages:')));
  });

  test(`a name of exactly ${MAX_NAME_LENGTH} characters (a ${MAX_REFERENCE_LENGTH}-character reference) accepted by both`, () => {
    const name = 'quay.io/' + 'a'.repeat(MAX_NAME_LENGTH - 'quay.io/'.length);
    const ref = `${name}@sha256:${H}`;
    assert.equal(ref.length, MAX_REFERENCE_LENGTH);
    const set = setWith({ pinnedImages: [{ name: ref }] });
    assert.deepEqual(apiServerErrors(set), []);
    assert.deepEqual(tsProblems(set), []);
  });

  test('a status as the controller writes it is accepted; a malformed one is refused', () => {
    const status = {
      observedGeneration: 2,
      nodes: { matched: 3, ready: 1, progressing: 1, degraded: 1 },
      degradedNodes: [{ name: 'worker-3', reason: 'ImageNotFound', message: 'manifest unknown' }],
      conditions: [{ type: 'Ready', status: 'False', reason: 'NodesNotReady', message: '1 of 3', observedGeneration: 2, lastTransitionTime: '2025-01-02T03:04:05Z' }],
    };
    const ok = { ...setWith({ pinnedImages: [{ name: `quay.io/org/app@sha256:${H}` }] }), status };
    assert.deepEqual(apiServerErrors(ok), []);
    const eleven = Array.from({ length: 11 }, (_, i) => ({ name: `worker-${i}`, reason: 'PullFailed', message: 'x' }));
    assert.ok(apiServerErrors({ ...ok, status: { ...status, degradedNodes: eleven } }).some((e) => e.path === '/status/degradedNodes'));
    const badCondition = { ...status.conditions[0], status: 'Maybe' };
    assert.ok(apiServerErrors({ ...ok, status: { ...status, conditions: [badCondition] } }).some((e) => e.path === '/status/conditions/0/status'));
  });

  test('status.progress as the controller computes it is accepted, in bytes and in images; a malformed one is refused', () => {
    const set = setWith({ pinnedImages: [{ name: `quay.io/org/app@sha256:${H}` }] });
    const tracker = new ProgressTracker(60_000);
    const at = (s: number) => new Date(Date.UTC(2025, 0, 2, 3, 4, s));
    const work = (present: number, unit: 'bytes' | 'images' = 'bytes') => ({ unit, present, total: 4000, remaining: 4000 - present, nodes: 4, done: 0, downloading: 2, waiting: 2, degraded: 0 });
    tracker.observe({ name: 'b', generation: 1 }, work(1000), at(0));
    const bytes = tracker.observe({ name: 'b', generation: 1 }, work(1500), at(10));
    assert.equal(bytes.rate, 50);
    assert.ok(bytes.estimatedCompletionTime);
    tracker.observe({ name: 'i', generation: 1 }, work(1000, 'images'), at(0));
    const images = tracker.observe({ name: 'i', generation: 1 }, work(1003, 'images'), at(9));
    assert.equal(images.rate, 0.33, 'images per second, to two decimals');
    for (const progress of [bytes, images]) assert.deepEqual(apiServerErrors({ ...set, status: { observedGeneration: 1, progress } }), []);
    const bad = (over: Record<string, unknown>) => apiServerErrors({ ...set, status: { observedGeneration: 1, progress: { ...bytes, ...over } } }).map((e) => e.path);
    assert.ok(bad({ unit: 'kilobytes' }).includes('/status/progress/unit'));
    assert.ok(bad({ present: -1 }).includes('/status/progress/present'));
    assert.ok(bad({ summary: 'x'.repeat(257) }).includes('/status/progress/summary'));
    assert.ok(bad({ rate: -2 }).includes('/status/progress/rate'));
    const { summary: _s, ...noSummary } = bytes;
    assert.ok(apiServerErrors({ ...set, status: { progress: noSummary } }).some((e) => e.path === '/status/progress/summary' || e.path === '/status/progress'));
  });
});

// ---------------------------------------------------------------------------
// The admission policy, evaluated the way the API server evaluates a
// ValidatingAdmissionPolicy: matchConstraints, then matchConditions (all
// true, or the policy does not apply), then variables, then every
// validation (false or an evaluation error denies, with failurePolicy Fail).

const policyDocs = await yamlDocuments(POLICY_FILE);
const policy = policyDocs.find((d) => d.kind === 'ValidatingAdmissionPolicy')!;
const binding = policyDocs.find((d) => d.kind === 'ValidatingAdmissionPolicyBinding')!;

interface AdmissionRequest {
  operation: 'CREATE' | 'UPDATE' | 'DELETE';
  resource: { group: string; version: string; resource: string };
  subResource?: string;
  name: string;
  userInfo: { username: string; groups?: string[]; extra?: Record<string, string[]> };
}

type Verdict = { applies: false } | { applies: true; denied: string[] };

function admit(request: AdmissionRequest, oldObject: Obj, object: Obj): Verdict {
  const spec = policy.spec;
  const resource = request.resource.resource + (request.subResource ? `/${request.subResource}` : '');
  const ruleMatches = (spec.matchConstraints.resourceRules as Obj[]).some(
    (r) =>
      r.apiGroups.includes(request.resource.group) &&
      r.apiVersions.includes(request.resource.version) &&
      r.operations.includes(request.operation) &&
      r.resources.includes(resource),
  );
  if (!ruleMatches) return { applies: false };
  const context: Record<string, unknown> = { request: { subResource: '', ...request }, object, oldObject, params: null, namespaceObject: null };
  for (const c of (spec.matchConditions ?? []) as Obj[]) {
    if (!celTrue(c.expression, context)) return { applies: false };
  }
  const variables: Record<string, unknown> = {};
  for (const v of (spec.variables ?? []) as Obj[]) variables[v.name] = cel.evaluate(v.expression, { ...context, variables });
  const denied: string[] = [];
  for (const v of spec.validations as Obj[]) {
    let ok: boolean;
    try {
      ok = celTrue(v.expression, { ...context, variables });
    } catch (e) {
      assert.equal(spec.failurePolicy, 'Fail');
      ok = false;
    }
    if (!ok) denied.push(v.message);
  }
  return { applies: true, denied };
}

const AGENT = 'system:serviceaccount:pinset-system:pinset-agent';
const NODE_CLAIM = 'authentication.kubernetes.io/node-name';

function node(name: string): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      labels: { 'kubernetes.io/hostname': name, 'node-role.kubernetes.io/worker': '' },
      annotations: { 'node.alpha.kubernetes.io/ttl': '0', 'pinset.dev/status': '{"version":1,"sets":[]}' },
    },
    spec: { podCIDR: '10.244.1.0/24', taints: [{ key: 'dedicated', value: 'gpu', effect: 'NoSchedule' }] },
    status: { conditions: [{ type: 'Ready', status: 'True' }] },
  };
}

function patchRequest(nodeName: string, userInfo: AdmissionRequest['userInfo']): AdmissionRequest {
  return { operation: 'UPDATE', resource: { group: '', version: 'v1', resource: 'nodes' }, name: nodeName, userInfo };
}

function agentOn(nodeName: string): AdmissionRequest['userInfo'] {
  return { username: AGENT, groups: ['system:serviceaccounts', 'system:serviceaccounts:pinset-system'], extra: { [NODE_CLAIM]: [nodeName], 'authentication.kubernetes.io/pod-name': ['pinset-agent-x7k2p'] } };
}

function edited(base: Obj, edit: (n: Obj) => void): Obj {
  const copy = structuredClone(base);
  edit(copy);
  return copy;
}

describe('admission policy: the agent (service account) may patch only its own Node, only pinset.dev/ annotations', () => {
  const old = node('worker-1');
  const newStatus = edited(old, (n) => (n.metadata.annotations['pinset.dev/status'] = '{"version":1,"sets":[{"name":"a"}]}'));

  test('the binding enforces the policy with Deny', () => {
    assert.equal(binding.spec.policyName, policy.metadata.name);
    assert.deepEqual(binding.spec.validationActions, ['Deny']);
    assert.equal(policy.spec.failurePolicy, 'Fail');
    assert.equal(policy.apiVersion, 'admissionregistration.k8s.io/v1');
  });

  test('allowed: the agent updates its own Node\'s pinset.dev/status', () => {
    assert.deepEqual(admit(patchRequest('worker-1', agentOn('worker-1')), old, newStatus), { applies: true, denied: [] });
  });

  test('allowed: the first pinset.dev/ annotation on a Node that had no annotations at all', () => {
    const bare = edited(old, (n) => delete n.metadata.annotations);
    const first = edited(bare, (n) => (n.metadata.annotations = { 'pinset.dev/status': '{}' }));
    assert.deepEqual(admit(patchRequest('worker-1', agentOn('worker-1')), bare, first), { applies: true, denied: [] });
  });

  test('allowed: removing its own pinset.dev/ annotation, even the last one', () => {
    const only = edited(old, (n) => (n.metadata.annotations = { 'pinset.dev/status': '{}' }));
    const none = edited(only, (n) => delete n.metadata.annotations);
    assert.deepEqual(admit(patchRequest('worker-1', agentOn('worker-1')), only, none), { applies: true, denied: [] });
    const removed = edited(old, (n) => delete n.metadata.annotations['pinset.dev/status']);
    assert.deepEqual(admit(patchRequest('worker-1', agentOn('worker-1')), old, removed), { applies: true, denied: [] });
  });

  test('denied: the agent of worker-2 patching worker-1', () => {
    const v = admit(patchRequest('worker-1', agentOn('worker-2')), old, newStatus);
    assert.ok(v.applies);
    assert.equal(v.denied.length, 1);
    assert.match(v.denied[0]!, /only its own Node/);
  });

  test('denied: a token without the node-name claim, or with more than one node', () => {
    const tokens: AdmissionRequest['userInfo'][] = [
      { username: AGENT },
      { username: AGENT, extra: {} },
      { username: AGENT, extra: { 'authentication.kubernetes.io/pod-name': ['p'] } },
      { username: AGENT, extra: { [NODE_CLAIM]: [] } },
      { username: AGENT, extra: { [NODE_CLAIM]: ['worker-1', 'worker-2'] } },
    ];
    for (const userInfo of tokens) {
      const v = admit(patchRequest('worker-1', userInfo), old, newStatus);
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1, JSON.stringify(userInfo));
      assert.match(v.denied[0]!, /only its own Node/);
    }
  });

  const denials: [string, (n: Obj) => void, RegExp][] = [
    ['changing another annotation', (n) => (n.metadata.annotations['node.alpha.kubernetes.io/ttl'] = '30'), /add or change only annotations under pinset.dev\//],
    ['adding another annotation', (n) => (n.metadata.annotations['example.com/owner'] = 'me'), /add or change only annotations under pinset.dev\//],
    ['an annotation that only looks like pinset.dev/', (n) => (n.metadata.annotations['pinset.dev.evil.com/x'] = '1'), /add or change only annotations under pinset.dev\//],
    ['removing another annotation', (n) => delete n.metadata.annotations['node.alpha.kubernetes.io/ttl'], /remove only annotations under pinset.dev\//],
    ['removing every annotation', (n) => delete n.metadata.annotations, /remove only annotations under pinset.dev\//],
    ['changing a label', (n) => (n.metadata.labels['node-role.kubernetes.io/worker'] = 'no'), /labels/],
    ['adding a label', (n) => (n.metadata.labels['pinset.dev/ready'] = 'true'), /labels/],
    ['removing every label', (n) => delete n.metadata.labels, /labels/],
    ['removing a taint', (n) => (n.spec.taints = []), /spec/],
    ['cordoning the Node', (n) => (n.spec.unschedulable = true), /spec/],
    ['adding a finalizer', (n) => (n.metadata.finalizers = ['example.com/hold']), /finalizers/],
  ];
  for (const [what, edit, message] of denials) {
    test(`denied: ${what}, even on its own Node and together with a pinset.dev/ change`, () => {
      const v = admit(patchRequest('worker-1', agentOn('worker-1')), old, edited(newStatus, edit));
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1, JSON.stringify(v.denied));
      assert.match(v.denied[0]!, message);
    });
  }

  test('not in the way of anyone else: the kubelet or an administrator changing labels and taints', () => {
    const relabeled = edited(old, (n) => {
      n.metadata.labels.foo = 'bar';
      n.spec.taints = [];
    });
    assert.deepEqual(admit(patchRequest('worker-1', { username: 'system:node:worker-1', extra: {} }), old, relabeled), { applies: false });
    assert.deepEqual(admit(patchRequest('worker-1', { username: 'kubernetes-admin' }), old, relabeled), { applies: false });
    // Another service account with a similar name is not the agent.
    assert.deepEqual(admit(patchRequest('worker-1', { username: `${AGENT}-2` }), old, relabeled), { applies: false });
  });
});

describe('admission policy: with a node\'s own credentials (system:node:<name>), only pinset.dev/ annotations of Node <name>', () => {
  const old = node('worker-1');
  const newStatus = edited(old, (n) => (n.metadata.annotations['pinset.dev/status'] = '{"version":1,"sets":[{"name":"a"}]}'));
  const nodeUser = (name: string): AdmissionRequest['userInfo'] => ({ username: `system:node:${name}`, groups: ['system:nodes', 'system:authenticated'] });

  test('allowed: the systemd agent on worker-1 updates worker-1\'s pinset.dev/status', () => {
    assert.deepEqual(admit(patchRequest('worker-1', nodeUser('worker-1')), old, newStatus), { applies: true, denied: [] });
  });

  test('allowed: adding the first and removing the last pinset.dev/ annotation on its own Node', () => {
    const bare = edited(old, (n) => delete n.metadata.annotations);
    const first = edited(bare, (n) => (n.metadata.annotations = { 'pinset.dev/status': '{}' }));
    assert.deepEqual(admit(patchRequest('worker-1', nodeUser('worker-1')), bare, first), { applies: true, denied: [] });
    assert.deepEqual(admit(patchRequest('worker-1', nodeUser('worker-1')), first, bare), { applies: true, denied: [] });
  });

  test('denied: worker-2\'s credentials writing worker-1\'s pinset.dev/ annotation, or removing it', () => {
    for (const [before, after] of [[old, newStatus], [old, edited(old, (n) => delete n.metadata.annotations['pinset.dev/status'])]] as const) {
      const v = admit(patchRequest('worker-1', nodeUser('worker-2')), before, after);
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1);
      assert.match(v.denied[0]!, /only its own Node/);
    }
  });

  const denials: [string, (n: Obj) => void, RegExp][] = [
    ['changing a label', (n) => (n.metadata.labels['node-role.kubernetes.io/worker'] = 'no'), /labels/],
    ['removing a taint', (n) => (n.spec.taints = []), /spec/],
    ['changing another annotation', (n) => (n.metadata.annotations['node.alpha.kubernetes.io/ttl'] = '30'), /add or change only annotations under pinset.dev\//],
    ['adding a finalizer', (n) => (n.metadata.finalizers = ['example.com/hold']), /finalizers/],
  ];
  for (const [what, edit, message] of denials) {
    test(`denied: a pinset.dev/ change together with ${what}, the same limits as the service account's`, () => {
      const v = admit(patchRequest('worker-1', nodeUser('worker-1')), old, edited(newStatus, edit));
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1, JSON.stringify(v.denied));
      assert.match(v.denied[0]!, message);
    });
  }

  test('not in the kubelet\'s way: its own updates that leave pinset.dev/ annotations alone are not in scope', () => {
    const kubeletEdits: ((n: Obj) => void)[] = [
      (n) => (n.metadata.labels['node.kubernetes.io/instance-type'] = 'm5.large'),
      (n) => (n.metadata.annotations['volumes.kubernetes.io/controller-managed-attach-detach'] = 'true'),
      (n) => (n.spec.podCIDR = '10.244.9.0/24'),
      (n) => (n.status.conditions = [{ type: 'Ready', status: 'False' }]),
      (n) => delete n.metadata.annotations['node.alpha.kubernetes.io/ttl'],
    ];
    for (const edit of kubeletEdits) {
      assert.deepEqual(admit(patchRequest('worker-1', nodeUser('worker-1')), old, edited(old, edit)), { applies: false });
    }
    // Another node's credentials on this Node: NodeRestriction's business, not this policy's, unless pinset.dev/ changes.
    assert.deepEqual(admit(patchRequest('worker-1', nodeUser('worker-2')), old, edited(old, kubeletEdits[0]!)), { applies: false });
  });
});

describe('CRD: spec.rollout.maxConcurrentNodes', () => {
  const rollout: Obj = specSchema.properties.rollout;
  const withRollout = (r: unknown) => setWith({ rollout: r, pinnedImages: [{ name: `quay.io/org/app@sha256:${H}` }] });

  test('an int32 with a CEL rule (>= 1) whose message says how to have no limit', () => {
    assert.equal(rollout.type, 'object');
    assert.deepEqual(Object.keys(rollout.properties), ['maxConcurrentNodes', 'firstWave']);
    assert.equal(rollout.properties.maxConcurrentNodes.type, 'integer');
    assert.equal(rollout.properties.maxConcurrentNodes.format, 'int32');
    assert.equal(rollout['x-kubernetes-validations'].length, 1);
    assert.match(rollout['x-kubernetes-validations'][0].message, /at least 1; leave it out for no limit/);
    assert.equal(specSchema.required.includes('rollout'), false, 'optional');
  });

  const accepted: unknown[] = [{}, { maxConcurrentNodes: 1 }, { maxConcurrentNodes: 50 }, { maxConcurrentNodes: 2 ** 31 - 1 }];
  for (const r of accepted) {
    test(`accepted by both: rollout ${JSON.stringify(r)}`, () => {
      assert.deepEqual(apiServerErrors(withRollout(r)), []);
      assert.deepEqual(tsProblems(withRollout(r)), []);
    });
  }
  const refused: [unknown, string][] = [
    [{ maxConcurrentNodes: 0 }, '/spec/rollout/maxConcurrentNodes'],
    [{ maxConcurrentNodes: -3 }, '/spec/rollout/maxConcurrentNodes'],
    [{ maxConcurrentNodes: 2.5 }, '/spec/rollout/maxConcurrentNodes'],
    [{ maxConcurrentNodes: 2 ** 31 }, '/spec/rollout/maxConcurrentNodes'],
    [{ maxConcurrentNodes: '5' }, '/spec/rollout/maxConcurrentNodes'],
    [{ maxNodes: 5 }, '/spec/rollout/maxNodes'],
    [5, '/spec/rollout'],
  ];
  for (const [r, at] of refused) {
    test(`refused by both: rollout ${JSON.stringify(r)}`, () => {
      const api = apiServerErrors(withRollout(r));
      assert.ok(api.some((e) => e.path === at), `API server model: expected an error at ${at}, got ${JSON.stringify(api)}`);
      const ts = tsProblems(withRollout(r));
      const field = at.slice(1).replaceAll('/', '.');
      assert.ok(ts.some((p) => p.startsWith(`${field}:`)), `validateSet: expected a problem at ${field}, got ${JSON.stringify(ts)}`);
    });
  }

  test('a null is no limit for the agent, as the API server prunes it (the field is not nullable)', () => {
    assert.deepEqual(tsProblems(withRollout({ maxConcurrentNodes: null })), []);
    assert.deepEqual(tsProblems(withRollout(null)), []);
  });

  test('the CEL rule on its own: 0 is refused with its message, 1 and an absent field pass', () => {
    const rule = rollout['x-kubernetes-validations'][0].rule as string;
    assert.equal(celTrue(rule, { self: {} }), true);
    assert.equal(celTrue(rule, { self: { maxConcurrentNodes: 1 } }), true);
    assert.equal(celTrue(rule, { self: { maxConcurrentNodes: 0 } }), false);
  });
});

describe('CRD: spec.rollout.firstWave', () => {
  const wave: Obj = specSchema.properties.rollout.properties.firstWave;
  const withWave = (w: unknown, rollout: Obj = {}) => setWith({ rollout: { ...rollout, firstWave: w }, pinnedImages: [{ name: `quay.io/org/app@sha256:${H}` }] });

  test('an object with nodes required, an int32 from 1 to MAX_FIRST_WAVE_NODES by a CEL rule whose message says how to have none', () => {
    assert.equal(wave.type, 'object');
    assert.deepEqual(Object.keys(wave.properties), ['nodes']);
    assert.deepEqual(wave.required, ['nodes']);
    assert.equal(wave.properties.nodes.type, 'integer');
    assert.equal(wave.properties.nodes.format, 'int32');
    const [rule] = wave['x-kubernetes-validations'];
    assert.match(rule.message, new RegExp(`from 1 to ${MAX_FIRST_WAVE_NODES}; leave firstWave out for none`));
    assert.equal(celTrue(rule.rule, { self: { nodes: MAX_FIRST_WAVE_NODES } }), true);
    assert.equal(celTrue(rule.rule, { self: { nodes: MAX_FIRST_WAVE_NODES + 1 } }), false);
    assert.equal(celTrue(rule.rule, { self: { nodes: 0 } }), false);
    assert.equal(celTrue(rule.rule, { self: {} }), true, 'a missing nodes is the required rule\'s, said once');
  });

  const accepted: [unknown, Obj?][] = [[{ nodes: 1 }], [{ nodes: MAX_FIRST_WAVE_NODES }], [{ nodes: 2 }, { maxConcurrentNodes: 1 }]];
  for (const [w, r] of accepted) {
    test(`accepted by both: firstWave ${JSON.stringify(w)} ${r ? JSON.stringify(r) : ''}`, () => {
      assert.deepEqual(apiServerErrors(withWave(w, r)), []);
      assert.deepEqual(tsProblems(withWave(w, r)), []);
    });
  }
  const refused: [unknown, string][] = [
    [{ nodes: 0 }, '/spec/rollout/firstWave/nodes'],
    [{ nodes: MAX_FIRST_WAVE_NODES + 1 }, '/spec/rollout/firstWave/nodes'],
    [{ nodes: 1.5 }, '/spec/rollout/firstWave/nodes'],
    [{ nodes: '1' }, '/spec/rollout/firstWave/nodes'],
    [{}, '/spec/rollout/firstWave/nodes'],
    [{ nodes: 1, node: 1 }, '/spec/rollout/firstWave/node'],
    [true, '/spec/rollout/firstWave'],
  ];
  for (const [w, at] of refused) {
    test(`refused by both: firstWave ${JSON.stringify(w)}`, () => {
      const api = apiServerErrors(withWave(w));
      assert.ok(api.some((e) => e.path === at), `API server model: expected an error at ${at}, got ${JSON.stringify(api)}`);
      const ts = tsProblems(withWave(w));
      const field = at.slice(1).replaceAll('/', '.');
      assert.ok(ts.some((p) => p.startsWith(`${field}:`)), `validateSet: expected a problem at ${field}, got ${JSON.stringify(ts)}`);
    });
  }

  test('the validator says what to write', () => {
    assert.deepEqual(tsProblems(withWave({ nodes: 0 })), ['spec.rollout.firstWave.nodes: "0" must be an integer from 1 to 10 (the nodes that fetch each image first; one is enough in front of a cache)']);
    assert.deepEqual(tsProblems(withWave({})), ['spec.rollout.firstWave.nodes: required, how many nodes fetch each image first (1 to 10); leave firstWave out for none']);
    assert.deepEqual(tsProblems(withWave(null)), [], 'a null is none, as the API server prunes it');
  });
});

describe('CRD: spec.pullSecrets', () => {
  const list: Obj = specSchema.properties.pullSecrets;
  const withSecrets = (p: unknown) => setWith({ pullSecrets: p, pinnedImages: [{ name: `quay.io/org/app@sha256:${H}` }] });

  test('a map list keyed by name, at most MAX_PULL_SECRETS, each a Secret\'s name (NAME_PATTERN)', () => {
    assert.equal(list.type, 'array');
    assert.equal(list.maxItems, MAX_PULL_SECRETS);
    assert.equal(list['x-kubernetes-list-type'], 'map');
    assert.deepEqual(list['x-kubernetes-list-map-keys'], ['name']);
    assert.deepEqual(Object.keys(list.items.properties), ['name']);
    assert.equal(list.items.properties.name.pattern, NAME_PATTERN);
    assert.equal(specSchema.required.includes('pullSecrets'), false, 'optional');
  });

  const accepted: unknown[] = [[], [{ name: 'regcred' }], [{ name: 'a' }, { name: 'team-a.registry' }], Array.from({ length: MAX_PULL_SECRETS }, (_, i) => ({ name: `s${i}` }))];
  for (const p of accepted) {
    test(`accepted by both: pullSecrets of ${JSON.stringify(p).slice(0, 60)}`, () => {
      assert.deepEqual(apiServerErrors(withSecrets(p)), []);
      assert.deepEqual(tsProblems(withSecrets(p)), []);
      assert.deepEqual(validateSet(withSecrets(p)).pullSecrets, (p as { name: string }[]).map((x) => x.name));
    });
  }
  const refused: [unknown, string][] = [
    [[{ name: 'RegCred' }], '/spec/pullSecrets/0/name'],
    [[{ name: '' }], '/spec/pullSecrets/0/name'],
    [[{ name: 'a' }, { name: 'a' }], '/spec/pullSecrets'],
    [[{ name: 'a', namespace: 'kube-system' }], '/spec/pullSecrets/0/namespace'],
    [[{}], '/spec/pullSecrets/0/name'],
    [['regcred'], '/spec/pullSecrets/0'],
    ['regcred', '/spec/pullSecrets'],
    [Array.from({ length: MAX_PULL_SECRETS + 1 }, (_, i) => ({ name: `s${i}` })), '/spec/pullSecrets'],
  ];
  for (const [p, at] of refused) {
    test(`refused by both: pullSecrets ${JSON.stringify(p).slice(0, 60)}`, () => {
      const api = apiServerErrors(withSecrets(p));
      assert.ok(api.some((e) => e.path === at), `API server model: expected an error at ${at}, got ${JSON.stringify(api)}`);
      const ts = tsProblems(withSecrets(p));
      const field = at.slice(1).replaceAll('/', '.').replace(/\.(\d+)/g, '[$1]');
      assert.ok(ts.some((x) => x.startsWith(field)), `validateSet: expected a problem at ${field}, got ${JSON.stringify(ts)}`);
      assert.deepEqual(validateSet(withSecrets(p)).pullSecrets, [], 'a set whose pullSecrets are wrong names none');
    });
  }

  test('a null is none, as the API server prunes it', () => {
    assert.deepEqual(tsProblems(withSecrets(null)), []);
  });
});
