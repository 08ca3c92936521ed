// A ValidatingAdmissionPolicy evaluated the way the API server evaluates it
// (k8s.io/apiserver/pkg/admission/plugin/policy/validating): the request
// must match matchConstraints.resourceRules, then every matchCondition must
// be true (else the policy does not apply), then variables are computed in
// order, then every validation must be true; a validation that fails to
// evaluate denies when failurePolicy is Fail. CEL runs in
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

export function admit(policy: Obj, request: AdmissionRequest, oldObject: Obj | null, object: Obj | null): Verdict {
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
    if (!ok) denied.push(String(v.message).replace(/\s+/g, ' ').trim());
  }
  return { applies: true, denied };
}
