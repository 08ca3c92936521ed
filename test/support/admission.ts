// A ValidatingAdmissionPolicy evaluated the way the API server evaluates it
// (k8s.io/apiserver/pkg/admission/plugin/policy/validating): the request
// must match matchConstraints.resourceRules, then every matchCondition must
// be true (else the policy does not apply), then variables are computed in
// order, then every validation must be true; a validation that fails to
// evaluate denies when failurePolicy is Fail; a failed validation's message
// is its messageExpression's value when that evaluates to a string, else its
// message. `params` is the binding's parameter object (a policy with
// paramKind), null without one. CEL runs in
// @marcbachmann/cel-js with undeclared variables dynamic, as `object`,
// `oldObject` and `request` are to a schema-less evaluator. On DELETE
// `object` is null; on CREATE `oldObject` is null.
import { Environment } from '@marcbachmann/cel-js';

type Obj = Record<string, any>;

export interface AdmissionRequest {
  operation: 'CREATE' | 'UPDATE' | 'DELETE';
  resource: { group: string; version: string; resource: string };
  subResource?: string;
  name: string;
  namespace?: string;
  userInfo: { username: string; groups?: string[]; extra?: Record<string, string[]> };
}

export type Verdict = { applies: false } | { applies: true; denied: string[] };

const cel = new Environment({ unlistedVariablesAreDyn: true });

export function admit(policy: Obj, request: AdmissionRequest, oldObject: Obj | null, object: Obj | null, params: Obj | null = null): Verdict {
  const spec = policy.spec;
  const resource = request.resource.resource + (request.subResource ? `/${request.subResource}` : '');
  // "*" matches any value in each list, as in the API server's rule matcher (admission/plugin/webhook/predicates/rules).
  const has = (list: string[], v: string) => list.includes('*') || list.includes(v);
  const ruleMatches = (spec.matchConstraints.resourceRules as Obj[]).some(
    (r) =>
      has(r.apiGroups, request.resource.group) &&
      has(r.apiVersions, request.resource.version) &&
      has(r.operations, request.operation) &&
      r.resources.includes(resource),
  );
  if (!ruleMatches) return { applies: false };
  const context: Record<string, unknown> = { request: { subResource: '', ...request }, object, oldObject, params, namespaceObject: null };
  for (const c of (spec.matchConditions ?? []) as Obj[]) {
    if (cel.evaluate(c.expression, context) !== true) return { applies: false };
  }
  const variables: Record<string, unknown> = {};
  for (const v of (spec.variables ?? []) as Obj[]) variables[v.name] = cel.evaluate(v.expression, { ...context, variables });
  const denied: string[] = [];
  for (const v of spec.validations as Obj[]) {
    let ok: boolean;
    try {
      ok = cel.evaluate(v.expression, { ...context, variables }) === true;
    } catch {
      if (spec.failurePolicy !== 'Fail') continue;
      ok = false;
    }
    if (!ok) denied.push(messageOf(v, { ...context, variables }));
  }
  return { applies: true, denied };
}

/** A failed validation's message: its messageExpression's string (the API server falls back to message when that fails), else message. */
function messageOf(v: Obj, context: Record<string, unknown>): string {
  if (v.messageExpression) {
    try {
      const m = cel.evaluate(v.messageExpression, context);
      if (typeof m === 'string' && m.trim() !== '') return m;
    } catch {
      // the static message instead
    }
  }
  return String(v.message).replace(/\s+/g, ' ').trim();
}
