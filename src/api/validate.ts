// One validator for PinnedImageSet objects, implementing the same rules as
// the CRD's structural schema (deploy/crds/): used by the agent on every set
// it reads (API or static folder) and by `pinset validate`.
import { parseReference, quote, type ParsedReference } from './reference.ts';
import { selectorErrors } from './selector.ts';
import { API_VERSION, KIND, MAX_FIRST_WAVE_NODES, MAX_PINNED_IMAGES, MAX_PULL_SECRETS } from './types.ts';

/** metadata.name of a cluster-scoped object: a DNS-1123 subdomain. */
export const NAME_PATTERN = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$';
export const MAX_OBJECT_NAME_LENGTH = 253;
/** A RuntimeClass handler is a DNS-1123 label. */
export const RUNTIME_HANDLER_PATTERN = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$';
export const MAX_RUNTIME_HANDLER_LENGTH = 63;

const nameRe = new RegExp(NAME_PATTERN);
const handlerRe = new RegExp(RUNTIME_HANDLER_PATTERN);

export interface ImageProblem {
  index: number;
  field: string;
  name: string;
  error: string;
}

export interface SetValidation {
  /** Errors that make the whole set unusable ("field: message"). */
  errors: string[];
  /** References that fail the grammar; the set's other references stay usable. */
  imageProblems: ImageProblem[];
  /** The valid references, in order, de-duplicated. */
  images: ParsedReference[];
  /** spec.pullSecrets' names, in order (empty when the field has errors). */
  pullSecrets: string[];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Upper bound of int32, the CRD's format for maxConcurrentNodes. */
const MAX_INT32 = 2 ** 31 - 1;

const ROLLOUT_FIELDS = ['maxConcurrentNodes', 'firstWave'];

/**
 * spec.rollout: absent, or {maxConcurrentNodes?: integer >= 1, firstWave?:
 * {nodes: integer from 1 to MAX_FIRST_WAVE_NODES}}. A null is absent, as the
 * API server prunes nulls of fields that are not nullable.
 */
function rolloutErrors(rollout: unknown): string[] {
  if (rollout === undefined || rollout === null) return [];
  if (!isObject(rollout)) return ['spec.rollout: must be an object, e.g. {maxConcurrentNodes: 50}'];
  const errors: string[] = [];
  for (const k of Object.keys(rollout)) if (!ROLLOUT_FIELDS.includes(k)) errors.push(`spec.rollout.${k}: unknown field (known: ${ROLLOUT_FIELDS.join(', ')})`);
  const n = rollout.maxConcurrentNodes;
  if (n !== undefined && n !== null && (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > MAX_INT32)) {
    errors.push(`spec.rollout.maxConcurrentNodes: ${quote(String(n))} must be an integer of at least 1 (leave it out for no limit)`);
  }
  errors.push(...firstWaveErrors(rollout.firstWave));
  return errors;
}

/** spec.rollout.firstWave: absent, or {nodes: integer from 1 to MAX_FIRST_WAVE_NODES}. */
function firstWaveErrors(wave: unknown): string[] {
  if (wave === undefined || wave === null) return [];
  const field = 'spec.rollout.firstWave';
  if (!isObject(wave)) return [`${field}: must be an object, e.g. {nodes: 1}`];
  const errors: string[] = [];
  for (const k of Object.keys(wave)) if (k !== 'nodes') errors.push(`${field}.${k}: unknown field (known: nodes)`);
  const n = wave.nodes;
  if (n === undefined || n === null) errors.push(`${field}.nodes: required, how many nodes fetch each image first (1 to ${MAX_FIRST_WAVE_NODES}); leave firstWave out for none`);
  else if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > MAX_FIRST_WAVE_NODES) {
    errors.push(`${field}.nodes: ${quote(String(n))} must be an integer from 1 to ${MAX_FIRST_WAVE_NODES} (the nodes that fetch each image first; one is enough in front of a cache)`);
  }
  return errors;
}

/**
 * spec.pullSecrets: absent, or a list of {name} naming Secrets (DNS
 * subdomains), each once, at most MAX_PULL_SECRETS. A null is absent, as
 * the API server prunes it.
 */
function pullSecretErrors(list: unknown): { errors: string[]; names: string[] } {
  if (list === undefined || list === null) return { errors: [], names: [] };
  if (!Array.isArray(list)) return { errors: ['spec.pullSecrets: must be a list of {name: <Secret in the agents\' namespace>}'], names: [] };
  const errors: string[] = [];
  const names: string[] = [];
  if (list.length > MAX_PULL_SECRETS) errors.push(`spec.pullSecrets: has ${list.length} items; at most ${MAX_PULL_SECRETS} are allowed`);
  list.forEach((item: unknown, i: number) => {
    const field = `spec.pullSecrets[${i}]`;
    if (!isObject(item)) return void errors.push(`${field}: must be an object {name: <Secret name>}`);
    for (const k of Object.keys(item)) if (k !== 'name') errors.push(`${field}.${k}: unknown field (known: name)`);
    const name = item.name;
    if (typeof name !== 'string' || name.length === 0) return void errors.push(`${field}.name: required, the name of a Secret in the agents' namespace`);
    if (name.length > MAX_OBJECT_NAME_LENGTH || !nameRe.test(name)) return void errors.push(`${field}.name: ${quote(name)} must be a lowercase DNS subdomain (a Secret's name)`);
    const first = names.indexOf(name);
    if (first >= 0) return void errors.push(`${field}.name: duplicate of spec.pullSecrets[${first}].name ${quote(name)}`);
    names.push(name);
  });
  return { errors, names: errors.length === 0 ? names : [] };
}

export function validateSet(obj: unknown): SetValidation {
  const errors: string[] = [];
  const imageProblems: ImageProblem[] = [];
  const images: ParsedReference[] = [];
  let pullSecrets: string[] = [];
  if (!isObject(obj)) return { errors: ['must be an object'], imageProblems, images, pullSecrets };

  if (obj.apiVersion !== API_VERSION) errors.push(`apiVersion: must be ${API_VERSION}, not ${quote(String(obj.apiVersion))}`);
  if (obj.kind !== KIND) errors.push(`kind: must be ${KIND}, not ${quote(String(obj.kind))}`);

  const md = obj.metadata;
  if (!isObject(md)) {
    errors.push('metadata: must be an object with a name');
  } else if (typeof md.name !== 'string' || md.name.length === 0) {
    errors.push('metadata.name: required');
  } else if (md.name.length > MAX_OBJECT_NAME_LENGTH || !nameRe.test(md.name)) {
    errors.push(`metadata.name: ${quote(md.name)} must be a lowercase DNS subdomain (letters, digits, '-', '.') of at most ${MAX_OBJECT_NAME_LENGTH} characters`);
  }

  const spec = obj.spec;
  if (!isObject(spec)) {
    errors.push('spec: required');
    return { errors, imageProblems, images, pullSecrets };
  }
  errors.push(...selectorErrors(spec.nodeSelector));
  if (spec.runtimeHandler !== undefined && spec.runtimeHandler !== '') {
    if (typeof spec.runtimeHandler !== 'string' || spec.runtimeHandler.length > MAX_RUNTIME_HANDLER_LENGTH || !handlerRe.test(spec.runtimeHandler)) {
      errors.push(`spec.runtimeHandler: ${quote(String(spec.runtimeHandler))} must be a DNS label (a RuntimeClass handler name)`);
    }
  }
  errors.push(...rolloutErrors(spec.rollout));
  const secrets = pullSecretErrors(spec.pullSecrets);
  errors.push(...secrets.errors);
  pullSecrets = secrets.names;
  const list = spec.pinnedImages;
  if (!Array.isArray(list)) {
    errors.push('spec.pinnedImages: required, a list of {name: <digest reference>}');
    return { errors, imageProblems, images, pullSecrets };
  }
  if (list.length < 1) errors.push('spec.pinnedImages: must have at least 1 item');
  if (list.length > MAX_PINNED_IMAGES) errors.push(`spec.pinnedImages: has ${list.length} items; at most ${MAX_PINNED_IMAGES} are allowed`);

  const seen = new Map<string, number>();
  list.forEach((item: unknown, index: number) => {
    const field = `spec.pinnedImages[${index}].name`;
    const name = isObject(item) ? item.name : undefined;
    if (typeof name !== 'string') {
      imageProblems.push({ index, field, name: String(name), error: 'required, a string' });
      return;
    }
    const first = seen.get(name);
    if (first !== undefined) {
      // The CRD declares a map list keyed by name: the API server refuses duplicates.
      errors.push(`${field}: duplicate of spec.pinnedImages[${first}].name ${quote(name)}`);
      return;
    }
    seen.set(name, index);
    const r = parseReference(name);
    if (r.ok) images.push(r.value);
    else imageProblems.push({ index, field, name, error: r.error });
  });
  return { errors, imageProblems, images, pullSecrets };
}

/** Human summary of every problem, one per line, each prefixed with the field. */
export function describeProblems(v: SetValidation): string[] {
  return [...v.errors, ...v.imageProblems.map((p) => `${p.field}: ${p.error}`)];
}
