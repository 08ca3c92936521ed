// metav1.LabelSelector matching, with the semantics of
// k8s.io/apimachinery/pkg/apis/meta/v1 LabelSelectorAsSelector: all of
// matchLabels and every matchExpression must hold; an absent or empty
// selector matches everything.
import type { LabelSelector, LabelSelectorRequirement } from './types.ts';

export type Labels = Readonly<Record<string, string>>;

const OPERATORS = new Set(['In', 'NotIn', 'Exists', 'DoesNotExist']);

/** Problems with a selector's shape, as "field: message" strings; empty when valid. */
export function selectorErrors(sel: unknown, field = 'spec.nodeSelector'): string[] {
  if (sel === undefined || sel === null) return [];
  if (typeof sel !== 'object' || Array.isArray(sel)) return [`${field}: must be an object`];
  const errs: string[] = [];
  const s = sel as Record<string, unknown>;
  for (const k of Object.keys(s)) {
    if (k !== 'matchLabels' && k !== 'matchExpressions') errs.push(`${field}.${k}: unknown field`);
  }
  if (s.matchLabels !== undefined) {
    if (typeof s.matchLabels !== 'object' || s.matchLabels === null || Array.isArray(s.matchLabels)) {
      errs.push(`${field}.matchLabels: must be a map of strings`);
    } else {
      for (const [k, v] of Object.entries(s.matchLabels)) {
        if (typeof v !== 'string') errs.push(`${field}.matchLabels[${JSON.stringify(k)}]: must be a string`);
      }
    }
  }
  if (s.matchExpressions !== undefined) {
    if (!Array.isArray(s.matchExpressions)) {
      errs.push(`${field}.matchExpressions: must be a list`);
    } else {
      s.matchExpressions.forEach((e: unknown, i: number) => {
        const f = `${field}.matchExpressions[${i}]`;
        if (typeof e !== 'object' || e === null) return errs.push(`${f}: must be an object`);
        const r = e as Record<string, unknown>;
        if (typeof r.key !== 'string' || r.key === '') errs.push(`${f}.key: must be a non-empty string`);
        if (typeof r.operator !== 'string' || !OPERATORS.has(r.operator)) {
          errs.push(`${f}.operator: must be one of In, NotIn, Exists, DoesNotExist`);
          return;
        }
        const values = r.values;
        if (values !== undefined && (!Array.isArray(values) || values.some((v) => typeof v !== 'string'))) {
          errs.push(`${f}.values: must be a list of strings`);
          return;
        }
        const n = Array.isArray(values) ? values.length : 0;
        if ((r.operator === 'In' || r.operator === 'NotIn') && n === 0) {
          errs.push(`${f}.values: must be non-empty for operator ${r.operator}`);
        }
        if ((r.operator === 'Exists' || r.operator === 'DoesNotExist') && n > 0) {
          errs.push(`${f}.values: must be empty for operator ${r.operator}`);
        }
      });
    }
  }
  return errs;
}

function requirementMatches(req: LabelSelectorRequirement, labels: Labels): boolean {
  const has = Object.prototype.hasOwnProperty.call(labels, req.key);
  switch (req.operator) {
    case 'In':
      return has && (req.values ?? []).includes(labels[req.key]!);
    case 'NotIn':
      return !has || !(req.values ?? []).includes(labels[req.key]!);
    case 'Exists':
      return has;
    case 'DoesNotExist':
      return !has;
  }
}

/** Whether `labels` satisfy `sel`. The selector must have passed selectorErrors. */
export function selectorMatches(sel: LabelSelector | undefined, labels: Labels): boolean {
  if (!sel) return true;
  for (const [k, v] of Object.entries(sel.matchLabels ?? {})) {
    if (!Object.prototype.hasOwnProperty.call(labels, k) || labels[k] !== v) return false;
  }
  for (const req of sel.matchExpressions ?? []) {
    if (!requirementMatches(req, labels)) return false;
  }
  return true;
}

/** True when the selector selects every node (absent or empty). */
export function selectsEverything(sel: LabelSelector | undefined): boolean {
  return !sel || (Object.keys(sel.matchLabels ?? {}).length === 0 && (sel.matchExpressions ?? []).length === 0);
}

/** Parse "k=v,k2=v2" (the --node-labels flag). A bare "k" means k="". */
export function parseLabelList(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of s.split(',')) {
    const p = part.trim();
    if (!p) continue;
    const eq = p.indexOf('=');
    if (eq < 0) out[p] = '';
    else out[p.slice(0, eq).trim()] = p.slice(eq + 1).trim();
  }
  return out;
}

/** A LabelSelector as the API's `labelSelector` query parameter writes it (metav1.FormatLabelSelector). */
export function labelSelectorQuery(sel: LabelSelector): string {
  const parts = Object.entries(sel.matchLabels ?? {}).map(([k, v]) => `${k}=${v}`);
  for (const r of sel.matchExpressions ?? []) {
    const values = `(${[...(r.values ?? [])].sort().join(',')})`;
    if (r.operator === 'In') parts.push(`${r.key} in ${values}`);
    else if (r.operator === 'NotIn') parts.push(`${r.key} notin ${values}`);
    else if (r.operator === 'Exists') parts.push(r.key);
    else parts.push(`!${r.key}`);
  }
  return parts.join(',');
}
