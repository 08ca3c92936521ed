// Heap held per Node by each way of caching Nodes, for the choice in
// src/controller/observed-nodes.ts: 5000 realistic Nodes (bench/scale-nodes.ts,
// with a version 2 status annotation of 11 sets), each kept as
//   - the whole Node, parsed from its JSON (what the controller kept before
//     it watched metadata only);
//   - its metadata only, parsed (a PartialObjectMetadata, managedFields and all);
//   - the annotation's text with the labels (parsing it again on every roll-up);
//   - the annotation parsed whole (readNodeStatus) with the labels;
//   - the compact copy the controller keeps (observeNode).
// Each in a fresh heap: V8's heapUsed after a full GC, before and after.
//
//   node --expose-gc bench/node-cache-heap.ts        # a few seconds
import { makeNodeStatus } from '../src/agent/status.ts';
import { encodeNodeStatus, readNodeStatus } from '../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus } from '../src/api/types.ts';
import { observeNode, SharedValues } from '../src/controller/observed-nodes.ts';
import { NODE_POOLS, nodeName, realisticNode } from './scale-nodes.ts';

const NODES = Number(process.env.BENCH_SCALE_NODES ?? 5000);
const gc = (globalThis as { gc?: () => void }).gc;

function setsOf(i: number): NodeSetStatus[] {
  const names = [...Array.from({ length: 10 }, (_, k) => `fleet-set-${k}`), `pool-${i % NODE_POOLS}-apps`];
  return names.map((name, k) => ({
    name,
    uid: `0b6e1c2a-0d7b-4c56-9a51-${String(k).padStart(12, '0')}`,
    source: 'api',
    desiredGeneration: 1,
    currentGeneration: 1,
    images: { wanted: 50, present: 50, pinned: 50, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
  }));
}

/** The Node's JSON as the API server sends it, with managedFields of the shape the stand-in records. */
function nodeJson(i: number): string {
  const n = realisticNode(i);
  n.metadata.annotations = { ...n.metadata.annotations, [STATUS_ANNOTATION]: encodeNodeStatus(makeNodeStatus(nodeName(i), '99-pinset-x.conf', setsOf(i), new Date().toISOString())) };
  n.metadata.resourceVersion = String(1000 + i);
  n.metadata.uid = `uid-${i}`;
  n.metadata.managedFields = [
    { manager: 'kubelet', operation: 'Update', apiVersion: 'v1', time: '2026-11-20T08:14:03Z', fieldsType: 'FieldsV1', fieldsV1: { 'f:metadata': { 'f:labels': Object.fromEntries(Object.keys(n.metadata.labels ?? {}).map((k) => [`f:${k}`, {}])) } } },
    { manager: 'pinset-agent', operation: 'Update', apiVersion: 'v1', time: '2026-11-20T08:14:03Z', fieldsType: 'FieldsV1', fieldsV1: { 'f:metadata': { 'f:annotations': { [`f:${STATUS_ANNOTATION}`]: {} } } } },
  ];
  return JSON.stringify(n);
}

type Keep = (json: string, shared: SharedValues) => unknown;

const WAYS: [string, Keep][] = [
  ['whole Node', (json) => JSON.parse(json)],
  ['metadata only (PartialObjectMetadata)', (json) => ({ kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: JSON.parse(json).metadata })],
  ['labels + annotation text', (json) => {
    const m = JSON.parse(json).metadata;
    return { name: m.name, labels: m.labels, raw: m.annotations[STATUS_ANNOTATION] };
  }],
  ['labels + annotation parsed whole', (json) => {
    const m = JSON.parse(json).metadata;
    return { name: m.name, labels: m.labels, reading: readNodeStatus(m.annotations) };
  }],
  ['compact, shared (observeNode)', (json, shared) => observeNode(JSON.parse(json), shared)],
];

/** Heap bytes that `keep` holds for every Node; what it kept is dropped before this returns. */
function heldBy(jsons: readonly string[], keep: Keep): number {
  const full = () => {
    gc!();
    gc!();
    return process.memoryUsage().heapUsed;
  };
  const shared = new SharedValues();
  const before = full();
  let kept: unknown[] | undefined = jsons.map((j) => keep(j, shared));
  const after = full();
  if (kept.length !== jsons.length) throw new Error('lost nodes');
  kept = undefined;
  return after - before;
}

export function measure(): { way: string; bytesPerNode: number; mbFor: number }[] {
  if (!gc) throw new Error('run with node --expose-gc');
  const jsons = Array.from({ length: NODES }, (_, i) => nodeJson(i));
  return WAYS.map(([way, keep]) => {
    const bytes = heldBy(jsons, keep);
    return { way, bytesPerNode: Math.round(bytes / NODES), mbFor: +(bytes / 1e6).toFixed(1) };
  });
}

if (import.meta.main) {
  const rows = measure();
  process.stdout.write(`Heap held per Node, ${NODES} Nodes (${nodeJson(7).length} B of JSON each)\n\n| kept | bytes per Node | MB for ${NODES} |\n|---|---:|---:|\n`);
  for (const r of rows) process.stdout.write(`| ${r.way} | ${r.bytesPerNode} | ${r.mbFor} |\n`);
}
