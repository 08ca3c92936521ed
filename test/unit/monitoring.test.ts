// deploy/monitoring: the PodMonitor finds the pods, every rule expression and
// dashboard query parses as PromQL and names only metrics (and labels) the
// agent and the controller really export, read from their own registries, so
// a metric renamed in the code fails here; the alerts fire when they should
// (promtool test rules, Debian's prometheus package).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { copyFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parser } from '@prometheus-io/lezer-promql';
import type { Registry } from 'prom-client';
import { stringify } from 'yaml';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { ControllerMetrics } from '../../src/controller/metrics.ts';
import { AgentMetrics } from '../../src/metrics/agent-metrics.ts';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const MONITORING = path.join(ROOT, 'deploy/monitoring');
type Obj = Record<string, any>;

function onPath(cmd: string): string | undefined {
  for (const dir of ['/usr/bin', ...(process.env.PATH ?? '').split(path.delimiter)]) {
    if (dir && existsSync(path.join(dir, cmd))) return path.join(dir, cmd);
  }
  return undefined;
}
const kubectl = onPath('kubectl');
const promtool = onPath('promtool');
const ci = process.env.CI === 'true';

async function kustomize(dir: string): Promise<Obj[]> {
  if (!kubectl) assert.fail('kubectl not found; CI=true requires it');
  const { stdout } = await run(kubectl, ['kustomize', dir], { maxBuffer: 16 << 20 });
  return parseYamlDocuments(stdout).map((d) => {
    if ('error' in d) assert.fail(d.error);
    return d.value as Obj;
  });
}

// ---------------------------------------------------------------------------
// What the processes export: names and label names from the real registries.

/** Labels every scraped series gets from the target (Prometheus and the PodMonitor's relabelings). */
const TARGET_LABELS = new Set(['job', 'instance', 'namespace', 'pod', 'container', 'endpoint', 'node', 'component']);

async function exported(): Promise<Map<string, Set<string>>> {
  const out = new Map<string, Set<string>>();
  const registries: Registry[] = [new AgentMetrics({ defaultMetrics: true, resyncIntervalSeconds: 300 }).registry, new ControllerMetrics({ defaultMetrics: true }).registry];
  for (const r of registries) {
    for (const m of await r.getMetricsAsJSON()) {
      const labels = new Set<string>();
      for (const v of m.values) for (const k of Object.keys(v.labels ?? {})) labels.add(k);
      const declared = (r.getSingleMetric(m.name) as unknown as { labelNames?: string[] } | undefined)?.labelNames ?? [];
      for (const l of declared) labels.add(l);
      const type = String(m.type);
      if (type === 'histogram') {
        out.set(`${m.name}_bucket`, new Set([...labels, 'le']));
        out.set(`${m.name}_sum`, labels);
        out.set(`${m.name}_count`, labels);
      } else if (type === 'summary') {
        out.set(m.name, new Set([...labels, 'quantile']));
        out.set(`${m.name}_sum`, labels);
        out.set(`${m.name}_count`, labels);
      } else {
        out.set(m.name, labels);
      }
    }
  }
  return out;
}

interface Selector {
  metric: string;
  labels: string[];
}

/** Parse errors, vector selectors and grouping labels of one PromQL expression. */
function analyse(expr: string): { errors: string[]; selectors: Selector[]; grouping: string[] } {
  const tree = parser.parse(expr);
  const errors: string[] = [];
  const selectors: Selector[] = [];
  const grouping: string[] = [];
  const cursor = tree.cursor();
  do {
    const node = cursor.node;
    if (node.type.isError) errors.push(`syntax error at ${node.from}: ${JSON.stringify(expr.slice(Math.max(0, node.from - 20), node.to + 20))}`);
    if (node.name === 'VectorSelector') {
      const ident = node.getChild('Identifier');
      const labels: string[] = [];
      let metric = ident ? expr.slice(ident.from, ident.to) : '';
      const matchers = node.getChild('LabelMatchers');
      const sub = matchers?.cursor();
      if (sub) {
        do {
          if (sub.name === 'LabelName') {
            const name = expr.slice(sub.from, sub.to);
            if (name === '__name__') {
              const value = sub.node.parent?.getChild('StringLiteral');
              if (value) metric = JSON.parse(expr.slice(value.from, value.to)) as string;
            } else labels.push(name);
          }
        } while (sub.next() && sub.from < matchers!.to);
      }
      if (!metric) errors.push(`a selector without a metric name: ${expr.slice(node.from, node.to)}`);
      selectors.push({ metric, labels });
    }
    if (node.name === 'GroupingLabels') {
      for (let c = node.firstChild; c; c = c.nextSibling) if (c.name === 'LabelName') grouping.push(expr.slice(c.from, c.to));
    }
  } while (cursor.next());
  return { errors, selectors, grouping };
}

/** Problems of one expression against what the processes export. */
function problemsOf(expr: string, metrics: Map<string, Set<string>>): string[] {
  const { errors, selectors, grouping } = analyse(expr);
  const problems = [...errors];
  if (selectors.length === 0) problems.push('names no metric');
  const allLabels = new Set([...TARGET_LABELS, ...[...metrics.values()].flatMap((s) => [...s])]);
  for (const s of selectors) {
    const labels = metrics.get(s.metric);
    if (!labels) {
      problems.push(`${s.metric} is not a metric the agent or the controller exports`);
      continue;
    }
    for (const l of s.labels) if (!labels.has(l) && !TARGET_LABELS.has(l)) problems.push(`${s.metric} has no label ${l}`);
  }
  for (const l of grouping) if (!allLabels.has(l)) problems.push(`no metric has the label ${l} (in by/on/ignoring)`);
  return problems;
}

/** Grafana's variables, replaced the way Grafana does before the query reaches Prometheus. */
function grafanaToPromql(expr: string): string {
  return expr
    .replaceAll('$__rate_interval', '5m')
    .replaceAll('$__interval', '1m')
    .replaceAll('$__range', '1h')
    .replace(/\$\{?node\}?/g, '.*');
}

const rule = (await readFile(path.join(MONITORING, 'prometheusrule.yaml'), 'utf8').then((t) => parseYamlDocuments(t)))[0] as { value: Obj };
const rules: Obj[] = rule.value.spec.groups.flatMap((g: Obj) => g.rules as Obj[]);
const dashboard = JSON.parse(await readFile(path.join(MONITORING, 'grafana-dashboard.json'), 'utf8')) as Obj;
const queries: { panel: string; expr: string }[] = (dashboard.panels as Obj[]).flatMap((p) => (p.targets as Obj[]).map((t) => ({ panel: p.title as string, expr: t.expr as string })));
const metrics = await exported();

describe('deploy/monitoring', () => {
  test('the analysis catches what it must: a syntax error, an unknown metric, an unknown label', () => {
    assert.ok(problemsOf('sum(rate(pinset_pulls_total[5m]', metrics).some((p) => p.startsWith('syntax error')));
    assert.deepEqual(problemsOf('rate(pinset_pull_total[5m])', metrics), ['pinset_pull_total is not a metric the agent or the controller exports']);
    assert.deepEqual(problemsOf('pinset_sets{phaze="Ready"}', metrics), ['pinset_sets has no label phaze']);
    assert.deepEqual(problemsOf('sum by (zone) (pinset_sets)', metrics), ['no metric has the label zone (in by/on/ignoring)']);
    assert.deepEqual(problemsOf('histogram_quantile(0.9, sum by (le) (rate(pinset_pull_duration_seconds_bucket[5m])))', metrics), []);
  });

  test('the alerts cover what operators need: Degraded 15 minutes, pins overridden, an agent not reconciling, reloads failing, a kubelet that would pull pinned images again offline', () => {
    const byName = Object.fromEntries(rules.map((r) => [r.alert, r]));
    assert.deepEqual(Object.keys(byName).sort(), [
      'PinnedImageSetDegraded',
      'PinnedImageSetPinsOverridden',
      'PinsetAgentNotReconciling',
      'PinsetControllerNotLeading',
      'PinsetKubeletVerifiesPinnedImages',
      'PinsetReloadFailing',
    ]);
    assert.match(byName.PinsetKubeletVerifiesPinnedImages.expr, /by \(namespace, pod, node, set, policy\) \(pinset_kubelet_verification_refused_sets\)/);
    assert.equal(byName.PinnedImageSetDegraded.for, '15m');
    assert.match(byName.PinsetAgentNotReconciling.expr, /3 \* pinset_resync_interval_seconds/);
    for (const r of rules) {
      assert.ok(r.labels?.severity, `${r.alert}: a severity`);
      assert.ok(r.annotations?.summary && r.annotations?.description, `${r.alert}: summary and description`);
    }
  });

  test('the agent\'s refused sets: a series per set and policy, those no longer refused gone at the next report', async () => {
    const m = new AgentMetrics();
    m.reportKubeletRefused('AlwaysVerify', ['edge', 'boot (static)']);
    const series = async () => ((await m.registry.getSingleMetric('pinset_kubelet_verification_refused_sets')!.get()).values as { labels: Record<string, string>; value: number }[]).map((v) => `${v.labels.set}|${v.labels.policy}=${v.value}`).sort();
    assert.deepEqual(await series(), ['boot (static)|AlwaysVerify=1', 'edge|AlwaysVerify=1']);
    m.reportKubeletRefused('NeverVerifyAllowlistedImages', ['edge']);
    assert.deepEqual(await series(), ['edge|NeverVerifyAllowlistedImages=1']);
    m.reportKubeletRefused('NeverVerifyAllowlistedImages', []);
    assert.deepEqual(await series(), []);
  });

  for (const r of rules) {
    test(`rule ${r.alert}: parses and names only exported metrics and labels`, () => {
      assert.deepEqual(problemsOf(r.expr as string, metrics), [], r.expr);
    });
  }

  for (const q of queries) {
    test(`dashboard panel "${q.panel}": ${q.expr}`, () => {
      assert.deepEqual(problemsOf(grafanaToPromql(q.expr), metrics), []);
    });
  }

  test('the dashboard\'s node variable reads an exported metric and label', () => {
    const node = (dashboard.templating.list as Obj[]).find((v) => v.name === 'node')!;
    const m = /^label_values\((\w+), (\w+)\)$/.exec(node.definition as string);
    assert.ok(m, node.definition);
    assert.ok(metrics.has(m[1]!), m[1]);
    assert.ok(TARGET_LABELS.has(m[2]!) || metrics.get(m[1]!)!.has(m[2]!));
    assert.deepEqual(
      (dashboard.panels as Obj[]).map((p) => p.title),
      [...new Set((dashboard.panels as Obj[]).map((p) => p.title))],
      'panel titles are unique',
    );
  });

  test('kustomize: a PodMonitor on the agent\'s and the controller\'s metrics ports, the rule, the dashboard; none of it in the default install', { skip: !kubectl && !ci ? 'kubectl not installed' : false }, async () => {
    const objects = await kustomize(MONITORING);
    assert.deepEqual(objects.map((o) => `${o.kind} ${o.metadata.namespace}/${o.metadata.name}`).sort(), [
      'ConfigMap pinset-system/pinset-grafana-dashboard',
      'PodMonitor pinset-system/pinset',
      'PrometheusRule pinset-system/pinset',
    ]);
    const cm = objects.find((o) => o.kind === 'ConfigMap')!;
    assert.equal(cm.metadata.labels.grafana_dashboard, '1');
    assert.deepEqual(JSON.parse(cm.data['pinset.json']), dashboard);

    const install = await kustomize(path.join(ROOT, 'deploy'));
    assert.deepEqual(install.filter((o) => String(o.apiVersion).startsWith('monitoring.coreos.com')), [], 'kubectl apply -k deploy/ works without the Prometheus operator');
    const pm = objects.find((o) => o.kind === 'PodMonitor')!;
    const port = pm.spec.podMetricsEndpoints[0].port as string;
    const expr = pm.spec.selector.matchExpressions[0] as Obj;
    for (const kind of ['DaemonSet', 'Deployment']) {
      const w = install.find((o) => o.kind === kind)!;
      const tpl = w.spec.template;
      assert.equal(w.metadata.namespace, pm.metadata.namespace);
      assert.ok(expr.operator === 'In' && (expr.values as string[]).includes(tpl.metadata.labels[expr.key]), `${kind} pods selected`);
      assert.ok((tpl.spec.containers[0].ports as Obj[]).some((p) => p.name === port), `${kind} has a port named ${port}`);
    }
  });

  test('promtool: the rules check, and the alerts fire (and stay quiet) as test/fixtures/monitoring/alerts.test.yaml expects', { skip: !promtool && !ci ? 'promtool not installed (Debian package prometheus)' : false }, async (t) => {
    if (!promtool) assert.fail('promtool not found; CI=true requires it (.ci/setup installs prometheus)');
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-promtool-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    await writeFile(path.join(dir, 'rules.yaml'), stringify({ groups: rule.value.spec.groups }));
    await copyFile(path.join(ROOT, 'test/fixtures/monitoring/alerts.test.yaml'), path.join(dir, 'alerts.test.yaml'));
    const check = await run(promtool, ['check', 'rules', path.join(dir, 'rules.yaml')]).catch((e: { stdout: string; stderr: string }) => assert.fail(e.stdout + e.stderr));
    assert.match(check.stdout, new RegExp(`SUCCESS: ${rules.length} rules found`));
    const tested = await run(promtool, ['test', 'rules', path.join(dir, 'alerts.test.yaml')], { cwd: dir }).catch((e: { stdout: string; stderr: string }) =>
      assert.fail(e.stdout + e.stderr),
    );
    assert.match(tested.stdout, /SUCCESS/);
  });
});
