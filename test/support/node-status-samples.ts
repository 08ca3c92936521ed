// Node status reports of realistic shape, for the size tests
// (test/unit/node-status.test.ts) and the size figures in BENCHMARKS.md
// (bench/status-size.ts).
import type { NodeSetStatus } from '../../src/api/types.ts';

export const PIN_FILE = '99-pinset-6f1c2a4e-0d7b-4c56-9a51-3e8f0b2d7c11.conf';

/** A set name as people write them: a purpose, a version, a role (16 to 30 characters). */
const TYPICAL_NAMES = [
  'upgrade-4-16-3-workers',
  'upgrade-4-16-3-masters',
  'edge-apps-2025-11',
  'observability-stack-v2',
  'gpu-operator-24-9',
  'ingress-and-dns',
  'storage-csi-drivers-v3',
  'ml-inference-runtime',
  'logging-agents-prod',
  'service-mesh-1-24',
];

function uid(i: number): string {
  const h = (n: number) => (n * 2654435761 + i * 40503).toString(16).padStart(8, '0').slice(-8);
  return `${h(1)}-${h(2).slice(0, 4)}-4${h(3).slice(0, 3)}-8${h(4).slice(0, 3)}-${h(5)}${h(6).slice(0, 4)}`;
}

/** `n` Ready sets from the API, no errors, each with its total bytes (about 32 MB an image): the common case. */
export function typicalSets(n: number): NodeSetStatus[] {
  return Array.from({ length: n }, (_, i) => {
    const images = [412, 36, 120, 18, 250, 9, 64, 31, 22, 140][i % 10]!;
    const generation = 1 + ((i * 7) % 12);
    const total = images * 32_051_337 + i;
    return {
      name: TYPICAL_NAMES[i % TYPICAL_NAMES.length]! + (i >= TYPICAL_NAMES.length ? `-${i}` : ''),
      uid: uid(i),
      source: 'api',
      desiredGeneration: generation,
      currentGeneration: generation,
      images: { wanted: images, present: images, pinned: images, failed: 0, invalid: 0 },
      bytes: { present: total, total },
      phase: 'Ready',
      reason: 'AllImagesPinned',
    } satisfies NodeSetStatus;
  });
}

/** `n` typical sets still downloading: Progressing, with their counts, bytes present of the total and a rate. */
export function downloadingSets(n: number): NodeSetStatus[] {
  return typicalSets(n).map((s) => {
    const present = Math.floor(s.images.wanted / 3);
    return {
      ...s,
      currentGeneration: s.desiredGeneration - 1,
      images: { ...s.images, present },
      bytes: { present: Math.floor(s.bytes!.total / 3) + 12_345, total: s.bytes!.total },
      rate: 11_811_160,
      pullRate: 52_428_800,
      mirrored: true,
      estimatedBytes: 2 * s.bytes!.total,
      phase: 'Progressing',
      reason: 'Pulling',
      message: `${present} of ${s.images.wanted} images present`,
    } satisfies NodeSetStatus;
  });
}

/**
 * `n` Degraded sets with the longest names (253 characters), messages at
 * their limit and an older failure of another kind each: more than any
 * annotation may hold.
 */
export function worstCaseSets(n: number): NodeSetStatus[] {
  return Array.from({ length: n }, (_, i) => {
    const name = `${String(i).padStart(4, '0')}-${'x'.repeat(248)}`;
    const message = `registry quay.io refused the credentials for quay.io/org/app-${i}@sha256:${'a'.repeat(64)} (check the entry for quay.io in the auth file): ${'e'.repeat(400)}`.slice(0, 512);
    return {
      name,
      uid: uid(i),
      source: 'api',
      desiredGeneration: 1_000_000 + i,
      currentGeneration: 999_999 + i,
      lastFailedGeneration: 999_998 + i,
      lastFailedGenerationError: `RegistryUnavailable: ${'r'.repeat(1000)}`,
      images: { wanted: 5000, present: 4321, pinned: 5000, failed: 679, invalid: 12 },
      estimatedBytes: 987_654_321_098,
      bytes: { present: 853_333_444_555, total: 987_654_321_098 },
      rate: 123_456_789,
      phase: 'Degraded',
      reason: 'Unauthorized',
      message,
    } satisfies NodeSetStatus;
  });
}
