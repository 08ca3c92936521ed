import { encodedSize, encodeNodeStatus, parseNodeStatus as readAnnotation } from '../../src/api/node-status.ts';
import { afterEach, describe, mock, test } from 'node:test';
import assert from 'node:assert/strict';
import { planReconcile, type ObservedSet, type Plan, type PlanInput, type WantedImage } from '../../src/agent/plan.ts';
import type { PullFailure } from '../../src/agent/puller.ts';
import {
  boundedNodeStatus,
  computeSetStatuses,
  cutBytes,
  historyFromStatus,
  makeNodeStatus,
  type SetHistory,
  type StatusFacts,
} from '../../src/agent/status.ts';
import { progressOnly, StatusReporter, type StatusSink } from '../../src/agent/status-reporter.ts';
import { crioPinStatus } from '../../src/crio/crio-pins.ts';
import type { DropinPins } from '../../src/crio/pinfile.ts';
import type { PinProblem } from '../../src/pins/backend.ts';
import { STATUS_MAX_BYTES, STATUS_MAX_MESSAGE_BYTES, type LabelSelector, type NodeSetStatus, type NodeStatus } from '../../src/api/types.ts';
import type { FailureKind } from '../../src/cri/runtime.ts';
import { silentLogger } from '../../src/util/log.ts';
import { SET_REASONS } from '../../src/api/reasons.ts';
import { noSpaceMessage } from '../../src/agent/estimate.ts';
import { PreloadOnly } from '../../src/pins/preload-only.ts';

const ref = (host: string, name: string, c: string) => `${host}/org/${name}@sha256:${c.repeat(64)}`;
const A = ref('quay.io', 'a', 'a');
const B = ref('registry.example.com:5000', 'b', 'b');
const PIN_FILE = '99-pinset-01234567-89ab-4def-8123-456789abcdef.conf';

function observed(name: string, images: string[], opts: { generation?: number; selector?: LabelSelector; runtimeHandler?: string; uid?: string } = {}): ObservedSet {
  return {
    source: 'api',
    origin: 'api',
    object: {
      apiVersion: 'pinset.dev/v1alpha1',
      kind: 'PinnedImageSet',
      metadata: { name, uid: opts.uid ?? `uid-${name}`, generation: opts.generation ?? 1 },
      spec: {
        ...(opts.selector ? { nodeSelector: opts.selector } : {}),
        ...(opts.runtimeHandler ? { runtimeHandler: opts.runtimeHandler } : {}),
        pinnedImages: images.map((n) => ({ name: n })),
      },
    },
  };
}

function plan(sets: ObservedSet[], over: Partial<PlanInput> = {}): Plan {
  return planReconcile({ labels: { zone: 'a' }, apiSets: sets, staticSets: [], staticProblems: [], currentPins: [], carriedPins: [], ...over });
}

/** What CRI-O's pin backend reports (src/crio/crio-pins.ts): the pin file's pins, a write that failed, a reload problem, later drop-ins. */
interface CrioFacts {
  pinsInFile?: ReadonlySet<string>;
  writeError?: string;
  pinProblem?: PinProblem;
  overriding?: DropinPins[];
}

/** Facts where every wanted image is present, in the file, reported pinned. */
function facts(p: Plan, over: Partial<StatusFacts> & CrioFacts = {}): StatusFacts {
  const { pinsInFile, writeError, pinProblem, overriding, ...rest } = over;
  return {
    plan: p,
    pins: crioPinStatus({ pinFile: PIN_FILE, pinsInFile: pinsInFile ?? new Set(p.pins), reportsPins: true, overriding: overriding ?? [], writeError, problem: pinProblem }),
    present: () => true,
    pinnedByRuntime: () => true,
    failure: () => undefined,
    history: new Map(),
    ...rest,
  };
}

function failure(kind: FailureKind, message: string, runtimeDown = false): PullFailure {
  return { kind, runtimeDown, message, failures: 1, nextAttemptAt: 0 };
}

const only = (f: StatusFacts): NodeSetStatus => {
  const { sets } = computeSetStatuses(f);
  assert.equal(sets.length, 1, JSON.stringify(sets));
  return sets[0]!;
};

const isA = (w: WantedImage) => w.reference.reference === A;

describe('computeSetStatuses: phases and reasons', () => {
  test('Ready: every image present and pinned', () => {
    const s = only(facts(plan([observed('web', [A, B], { generation: 3 })])));
    assert.equal(s.phase, 'Ready');
    assert.equal(s.reason, 'AllImagesPinned');
    assert.equal(s.name, 'web');
    assert.equal(s.uid, 'uid-web');
    assert.equal(s.source, 'api');
    assert.equal(s.desiredGeneration, 3);
    assert.equal(s.currentGeneration, 3);
    assert.deepEqual(s.images, { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 });
  });

  test('Ready on a runtime that does not report pins (containerd): the file is what counts', () => {
    const s = only(facts(plan([observed('web', [A])]), { pinnedByRuntime: () => undefined }));
    assert.equal(s.phase, 'Ready');
    assert.equal(s.images.pinned, 1);
  });

  test('Pulling: an image missing with no failure', () => {
    const s = only(facts(plan([observed('web', [A, B])]), { present: (w) => !isA(w) }));
    assert.equal(s.phase, 'Progressing');
    assert.equal(s.reason, 'Pulling');
    assert.equal(s.message, '1 of 2 images present');
    assert.equal(s.currentGeneration, 0);
    assert.deepEqual(s.images, { wanted: 2, present: 1, pinned: 2, failed: 0, invalid: 0 });
  });

  test('a cancelled pull is still Pulling, not a failure', () => {
    const s = only(facts(plan([observed('web', [A])]), { present: () => false, failure: () => failure('Canceled', 'cancelled') }));
    assert.equal(s.reason, 'Pulling');
    assert.equal(s.images.failed, 0);
  });

  const kinds: [FailureKind, string, RegExp][] = [
    ['NotFound', 'ImageNotFound', /^registry quay\.io has no image quay\.io\/org\/a@sha256:a{64}: manifest unknown \(retrying\)$/],
    ['Unauthorized', 'Unauthorized', /^registry quay\.io refused the credentials for .* \(check the credentials for quay\.io: the set's pull secrets, the auth file, the credential providers\): 401 Unauthorized \(retrying\)$/],
    ['Unavailable', 'RegistryUnavailable', /^registry quay\.io could not be reached/],
    ['NoSpace', 'NoSpace', /^no space left on the image filesystem while pulling quay\.io\/org\/a/],
    ['Other', 'PullFailed', /^pulling quay\.io\/org\/a@sha256:a{64} failed: /],
  ];
  for (const [kind, reason, message] of kinds) {
    test(`a ${kind} pull failure: Degraded ${reason} with a message naming registry and image`, () => {
      const text = { NotFound: 'manifest unknown', Unauthorized: '401 Unauthorized', Unavailable: 'connection refused', NoSpace: 'no space left on device', Other: 'weird' }[kind as string]!;
      const s = only(facts(plan([observed('web', [A], { generation: 2 })]), { present: () => false, failure: () => failure(kind, text) }));
      assert.equal(s.phase, 'Degraded');
      assert.equal(s.reason, reason);
      assert.match(s.message!, message);
      assert.equal(s.images.failed, 1);
      assert.equal(s.lastFailedGeneration, 2);
      assert.ok(s.lastFailedGenerationError!.startsWith(`${reason}: `));
    });
  }

  test('Unauthorized names the registry host of the failing image (with its port)', () => {
    const s = only(facts(plan([observed('web', [A, B])]), { present: (w) => isA(w), failure: () => failure('Unauthorized', 'denied: requested access to the resource is denied') }));
    assert.equal(s.reason, 'Unauthorized');
    assert.ok(s.message!.includes('registry registry.example.com:5000 refused the credentials'), s.message);
    assert.ok(!s.message!.includes('quay.io'));
  });

  test('a refusal after a credential provider failed: CredentialProviderFailed, naming the provider and the registry\'s answer', () => {
    const provider = 'credential provider ecr-credential-provider failed for quay.io/org/a: exit status 1: no EC2 metadata';
    for (const kind of ['Unauthorized', 'NotFound'] as const) {
      const s = only(facts(plan([observed('web', [A])]), { present: () => false, failure: () => ({ ...failure(kind, 'HTTP 401'), credentialFailure: provider }) }));
      assert.equal(s.phase, 'Degraded');
      assert.equal(s.reason, 'CredentialProviderFailed', kind);
      assert.match(s.message!, /^credential provider ecr-credential-provider failed for quay\.io\/org\/a: exit status 1: no EC2 metadata; pulling quay\.io\/org\/a@sha256:a{64} without its credentials failed: HTTP 401 \(retrying\)$/);
    }
    const down = only(facts(plan([observed('web', [A])]), { present: () => false, failure: () => ({ ...failure('Unavailable', 'connection refused'), credentialFailure: provider }) }));
    assert.equal(down.reason, 'RegistryUnavailable', 'a registry that is down is down, whatever the provider said');
  });

  test('a pull secret that cannot be used: Degraded PullSecretInvalid naming it, even with every image present; other sets unaffected', () => {
    const p = plan([observed('web', [A]), observed('db', [B])]);
    const { sets } = computeSetStatuses(facts(p, { pullSecretProblems: new Map([['api/web', 'pull secret pinset-system/regcred does not exist']]) }));
    const web = sets.find((x) => x.name === 'web')!;
    assert.equal(web.phase, 'Degraded');
    assert.equal(web.reason, 'PullSecretInvalid');
    assert.equal(web.message, 'pull secret pinset-system/regcred does not exist; 1 of 1 images present, pins kept');
    assert.equal(web.images.pinned, 1, 'its pins count and stay');
    assert.equal(sets.find((x) => x.name === 'db')!.phase, 'Ready');
  });

  test('several failures: the most severe names the reason, the count is given', () => {
    const s = only(
      facts(plan([observed('web', [A, B])]), {
        present: () => false,
        failure: (k) => (k.includes('quay.io') ? failure('Unavailable', 'connection refused') : failure('NoSpace', 'no space left on device')),
      }),
    );
    assert.equal(s.reason, 'NoSpace');
    assert.match(s.message!, /\(2 of 2 images failing; retrying\)$/);
  });

  test('a runtime that went away during a pull: RuntimeUnavailable', () => {
    const s = only(facts(plan([observed('web', [A])]), { present: () => false, failure: () => failure('Unavailable', 'PullImage: UNAVAILABLE: connect ENOENT', true) }));
    assert.equal(s.reason, 'RuntimeUnavailable');
  });

  test('a pull error about the runtime handler: RuntimeHandlerRejected', () => {
    const s = only(facts(plan([observed('web', [A], { runtimeHandler: 'kata' })]), { present: () => false, failure: () => failure('Other', 'runtime handler "kata" is not supported') }));
    assert.equal(s.reason, 'RuntimeHandlerRejected');
    assert.match(s.message!, /runtimeHandler "kata"/);
  });

  test('InvalidReference: the good references apply, the set is Degraded naming the bad one', () => {
    const s = only(facts(plan([observed('web', [A, 'quay.io/org/app:1.2'])])));
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'InvalidReference');
    assert.match(s.message!, /^1 reference\(s\) rejected and not pinned, first spec\.pinnedImages\[1\]\.name: "quay\.io\/org\/app:1\.2" names a tag/);
    assert.deepEqual(s.images, { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 1 });
  });

  test('InvalidSpec: reported even though the set is not applied', () => {
    const bad = observed('web', [A, A]);
    const s = only(facts(plan([bad])));
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'InvalidSpec');
    assert.match(s.message!, /^set web \(api\) is not applied: spec\.pinnedImages\[1\]\.name: duplicate/);
  });

  test('a set that does not select the node is not reported', () => {
    const { sets } = computeSetStatuses(facts(plan([observed('here', [A]), observed('there', [B], { selector: { matchLabels: { zone: 'b' } } })])));
    assert.deepEqual(
      sets.map((s) => s.name),
      ['here'],
    );
  });

  test('a pin problem (ReloadNotApplied, CrioConfigRejected) degrades only the sets it affects, unless it affects all', () => {
    const p = plan([observed('web', [A]), observed('db', [B])]);
    const problem = { reason: 'CrioConfigRejected' as const, message: 'CRI-O would refuse /etc/crio/crio.conf.d/50-x: toml: ...', affected: (r: string) => r === A };
    const sets = computeSetStatuses({ ...facts(p, { pinProblem: problem }) }).sets;
    const web = sets.find((s) => s.name === 'web')!;
    const db = sets.find((s) => s.name === 'db')!;
    assert.equal(web.phase, 'Degraded');
    assert.equal(web.reason, 'CrioConfigRejected');
    assert.match(web.message!, /50-x/);
    assert.notEqual(db.reason, 'CrioConfigRejected');
    const all = computeSetStatuses({ ...facts(p, { pinProblem: { ...problem, reason: 'ReloadNotApplied', affectsAll: true } }) }).sets;
    assert.deepEqual(all.map((s) => s.reason), ['ReloadNotApplied', 'ReloadNotApplied']);
  });

  test('PinsOverridden names the overriding file and the pin file', () => {
    const s = only(facts(plan([observed('web', [A])]), { overriding: [{ file: 'zz-local.conf', pins: [] }] }));
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'PinsOverridden');
    assert.ok(s.message!.startsWith(`zz-local.conf sets pinned_images and sorts after ${PIN_FILE}`), s.message);
  });

  test('messages count what they do not list: the first problem, then how many more', () => {
    const files = Array.from({ length: 40 }, (_, i) => ({ file: `zz-${i}-${'x'.repeat(40)}.conf`, pins: [] }));
    const over = only(facts(plan([observed('web', [A])]), { overriding: files }));
    assert.match(over.message!, /^zz-0-x+\.conf \(and 39 more files\) sets pinned_images/);
    const tags = Array.from({ length: 30 }, (_, i) => `quay.io/org/app${i}:1.${i}`);
    const invalid = only(facts(plan([observed('web', [A, ...tags])])));
    assert.match(invalid.message!, /^30 reference\(s\) rejected and not pinned, first spec\.pinnedImages\[1\]\.name: /);
    assert.doesNotMatch(invalid.message!, /pinnedImages\[2\]/);
    for (const s of [over, invalid]) assert.ok(Buffer.byteLength(s.message!) <= STATUS_MAX_MESSAGE_BYTES);
  });

  test('WaitingForRolloutSlot: downloads wait for a slot, the set is Progressing with counts', () => {
    const p = plan([observed('web', [A, B])]);
    const waiting = only(facts(p, { present: (w) => isA(w), rolloutWaits: new Map([['api/web', { maxConcurrentNodes: 50 }]]) }));
    assert.equal(waiting.phase, 'Progressing');
    assert.equal(waiting.reason, 'WaitingForRolloutSlot');
    assert.equal(waiting.message, 'waiting for a rollout slot: at most 50 node(s) download this set at a time; 1 of 2 images present');
    const unreachable = only(facts(p, { present: () => false, rolloutWaits: new Map([['api/web', { maxConcurrentNodes: 5, error: 'connect ECONNREFUSED 10.0.0.1:443' }]]) }));
    assert.equal(unreachable.reason, 'WaitingForRolloutSlot');
    assert.match(unreachable.message!, /^the rollout slots cannot be taken \(retrying\): connect ECONNREFUSED 10\.0\.0\.1:443; 0 of 2 images present$/);
    // Everything present: the wait is over, whatever the gate said last.
    assert.equal(only(facts(p, { rolloutWaits: new Map([['api/web', { maxConcurrentNodes: 5 }]]) })).phase, 'Ready');
    // A node that may not hold slots downloads without one, and says so.
    const unenforced = only(facts(p, { present: () => false, rolloutUnenforced: new Map([['api/web', 'HTTP 403: forbidden']]) }));
    assert.equal(unenforced.reason, 'Pulling');
    assert.equal(unenforced.message, '0 of 2 images present; downloading without a rollout slot, this node may not hold one: HTTP 403: forbidden');
    // A failing image outranks the wait.
    const failing = only(facts(p, { present: () => false, failure: () => failure('NotFound', 'manifest unknown'), rolloutWaits: new Map([['api/web', { maxConcurrentNodes: 5 }]]) }));
    assert.equal(failing.reason, 'ImageNotFound');
  });

  test('ReloadFailed, PinFileWriteFailed and RuntimeUnavailable carry the cause', () => {
    const p = plan([observed('web', [A])]);
    const reload = only(facts(p, { pinProblem: { reason: 'ReloadFailed', message: 'CRI-O was not reloaded: ReloadUnit: unit crio.service not loaded', affected: () => true } }));
    assert.equal(reload.reason, 'ReloadFailed');
    assert.match(reload.message!, /crio\.service not loaded/);
    const write = only(facts(p, { writeError: 'EROFS: read-only file system', pinsInFile: new Set() }));
    assert.equal(only(facts(p, { writeError: 'EROFS: read-only file system' })).phase, 'Ready', 'a set whose pins the previous file holds is not held up');
    assert.equal(write.reason, 'PinFileWriteFailed');
    assert.ok(write.message!.includes(PIN_FILE) && write.message!.includes('EROFS'));
    const down = only(facts(p, { runtimeError: 'connect ENOENT /var/run/crio/crio.sock' }));
    assert.equal(down.phase, 'Degraded');
    assert.equal(down.reason, 'RuntimeUnavailable');
    assert.equal(down.images.present, 0, 'nothing is known present when the runtime cannot be asked');
  });

  test('StaticFileUnreadable: a set held from a file that cannot be read names the file; its images still count', () => {
    const held: ObservedSet = { ...observed('boot', [A]), source: 'static', origin: '/etc/pinset/sets.d/boot.yaml (document 1, line 1)', held: { file: '/etc/pinset/sets.d/boot.yaml', error: 'it is a folder, not a file' } };
    const p = plan([observed('web', [B])], { staticSets: [held] });
    const { sets } = computeSetStatuses(facts(p));
    const boot = sets.find((s) => s.name === 'boot')!;
    assert.equal(boot.phase, 'Degraded');
    assert.equal(boot.reason, 'StaticFileUnreadable');
    assert.match(boot.message!, /static file \/etc\/pinset\/sets\.d\/boot\.yaml cannot be read \(it is a folder, not a file\); set boot keeps the pins/);
    assert.deepEqual(boot.images, { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 });
    assert.equal(sets.find((s) => s.name === 'web')!.phase, 'Ready', 'the other set is untouched');
  });

  test('WaitingForNodeLabels while the labels are unknown', () => {
    const s = only(facts(plan([observed('web', [A], { selector: { matchLabels: { zone: 'a' } } })], { labels: null })));
    assert.equal(s.phase, 'Progressing');
    assert.equal(s.reason, 'WaitingForNodeLabels');
  });

  test('WaitingForPin: present and in the file, but the runtime does not report it pinned yet', () => {
    const s = only(facts(plan([observed('web', [A, B])]), { pinnedByRuntime: (w) => !isA(w) }));
    assert.equal(s.phase, 'Progressing');
    assert.equal(s.reason, 'WaitingForPin');
    assert.equal(s.images.pinned, 1);
  });

  test('not Ready while an image is present but not in the pin file', () => {
    const p = plan([observed('web', [A, B])]);
    const s = only(facts(p, { pinsInFile: new Set([B]), pinnedByRuntime: () => undefined }));
    assert.equal(s.phase, 'Progressing');
    assert.equal(s.reason, 'WaitingForPin');
    assert.ok(s.message!.includes(PIN_FILE), s.message);
    assert.equal(s.images.pinned, 1);
  });

  test('sets are listed by source then name', () => {
    const { sets } = computeSetStatuses(facts(plan([observed('zeta', [A]), observed('alpha', [B])])));
    assert.deepEqual(
      sets.map((s) => s.name),
      ['alpha', 'zeta'],
    );
  });
});

// ---------------------------------------------------------------------------
// A pin problem and a pre-load problem at once: the more severe names the
// reason, the message names the other too, and "pre-loaded" is said only
// when every image is present.

const CANNOT_PIN = 'containerd 1.6.20~ds1 does not honour io.cri-containerd.pinned set after the pull; pins need 1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x';
const NO_SPACE = noSpaceMessage(60 * 1024 ** 2, 33 * 1024 ** 2, 85, '/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs', 1, 0);

interface Case {
  reason: string;
  /** The set's images and runtime handler (default [A, B], none). */
  images?: string[];
  runtimeHandler?: string;
  facts: Partial<StatusFacts> & CrioFacts;
}

const problem = (reason: PinProblem['reason'], message: string): CrioFacts => ({ pinProblem: { reason, message, affected: () => true } });

/** What keeps present images from being protected, as each backend reports it. */
const PIN_CASES: Case[] = [
  { reason: 'CrioConfigRejected', facts: { pinProblem: { reason: 'CrioConfigRejected', message: 'CRI-O would refuse /etc/crio/crio.conf.d/50-x.conf: toml: expected newline', affected: () => true, affectsAll: true } } },
  { reason: 'PinsOverridden', facts: { overriding: [{ file: 'zz-local.conf', pins: [] }] } },
  { reason: 'PinFileWriteFailed', facts: { writeError: 'EROFS: read-only file system', pinsInFile: new Set() } },
  { reason: 'ReloadFailed', facts: problem('ReloadFailed', 'CRI-O was not reloaded after its pin list changed (retrying): ReloadUnit: unit crio.service not loaded') },
  { reason: 'ReloadNotApplied', facts: problem('ReloadNotApplied', 'CRI-O did not apply the reload within 5s (retrying)') },
  { reason: 'PinLabelFailed', facts: problem('PinLabelFailed', 'pinning image quay.io/org/a (sha256:aaa): permission denied; no pin is removed, retrying') },
  { reason: 'PinNotReported', facts: problem('PinNotReported', 'containerd 1.7.2 does not report image quay.io/org/a pinned although its record carries io.cri-containerd.pinned=pinned') },
  // containerd's label backend on a version that ignores the label: labels set, CRI reports unpinned.
  { reason: 'RuntimeCannotPin', facts: { pinnedByRuntime: () => false } },
  // The pre-load only backend chosen for such a runtime.
  { reason: 'RuntimeCannotPin', facts: { pinnedByRuntime: () => undefined } },
];
/**
 * The two RuntimeCannotPin cases get their PinStatus here: the pre-load only
 * backend's, or a label backend's (it labels the images present, which CRI
 * then reports unpinned).
 */
function pinsOf(c: Case, i: number, p: Plan, f: Partial<StatusFacts>): Partial<StatusFacts> {
  if (c.reason !== 'RuntimeCannotPin') return {};
  if (i === PIN_CASES.length - 1) return { pins: new PreloadOnly({ logger: silentLogger(), why: CANNOT_PIN }).status() };
  const present = f.runtimeError ? [] : p.wanted.filter((w) => (f.present ?? (() => true))(w)).map((w) => w.reference.reference);
  return { pins: { ...crioPinStatus({ pinFile: PIN_FILE, pinsInFile: new Set(present), reportsPins: true, overriding: [] }), cannotPin: CANNOT_PIN } };
}

const missingA = (w: WantedImage) => !isA(w);
/** What keeps images from being present: image A missing (B present) for each. */
const IMAGE_CASES: Case[] = [
  { reason: 'RuntimeUnavailable', facts: { runtimeError: 'connect ENOENT /run/containerd/containerd.sock' } },
  { reason: 'InvalidReference', images: [A, B, 'quay.io/org/app:1.2'], facts: {} },
  { reason: 'NoSpace', facts: { present: missingA, failure: () => failure('NoSpace', NO_SPACE) } },
  { reason: 'Unauthorized', facts: { present: missingA, failure: () => failure('Unauthorized', 'pull access denied: 401 Unauthorized') } },
  { reason: 'ImageNotFound', facts: { present: missingA, failure: () => failure('NotFound', 'manifest unknown') } },
  { reason: 'RuntimeHandlerRejected', runtimeHandler: 'kata', facts: { present: missingA, failure: () => failure('Other', 'runtime handler "kata" is not supported') } },
  { reason: 'PullFailed', facts: { present: missingA, failure: () => failure('Other', 'unexpected EOF') } },
  { reason: 'RegistryUnavailable', facts: { present: missingA, failure: () => failure('Unavailable', 'dial tcp: connection refused') } },
  { reason: 'WaitingForRolloutSlot', facts: { present: missingA, rolloutWaits: new Map([['api/web', { maxConcurrentNodes: 5 }]]) } },
  { reason: 'Pulling', facts: { present: missingA } },
];

/**
 * Which wins, said as docs/status.md says it (and independently of the table in
 * src/api/reasons.ts): the node's configuration voiding pins wins over
 * everything; otherwise what keeps images from being present wins over a
 * pin that failed to apply, unless it is only progress; RuntimeCannotPin
 * loses to all of them.
 */
function expectedWinner(pin: string, image: string): string {
  if (pin === 'CrioConfigRejected' || pin === 'PinsOverridden') return pin;
  if (pin === 'RuntimeCannotPin') return image;
  return image === 'WaitingForRolloutSlot' || image === 'Pulling' ? pin : image;
}

describe('computeSetStatuses: a pin problem and a pre-load problem at once', () => {
  PIN_CASES.forEach((pin, i) => {
    for (const image of IMAGE_CASES) {
      const label = `${pin.reason}${pin.reason === 'RuntimeCannotPin' ? (i === PIN_CASES.length - 1 ? ' (pre-load only)' : ' (labels ignored)') : ''} with ${image.reason}`;
      test(label, () => {
        const p = plan([observed('web', image.images ?? [A, B], { runtimeHandler: image.runtimeHandler })]);
        const s = only(facts(p, { ...pin.facts, ...image.facts, ...pinsOf(pin, i, p, image.facts) }));
        const winner = expectedWinner(pin.reason, image.reason);
        const loser = winner === pin.reason ? image.reason : pin.reason;
        assert.equal(s.reason, winner, s.message);
        assert.equal(s.phase, winner === 'WaitingForRolloutSlot' || winner === 'Pulling' ? 'Progressing' : 'Degraded');
        // Progress beside a fault is in the counts; a fault beside anything is named.
        if (loser === 'WaitingForRolloutSlot' || loser === 'Pulling') assert.doesNotMatch(s.message!, /; also /);
        else assert.ok(s.message!.includes(`; also ${loser}: `), `the message names ${loser} too: ${s.message}`);
        assert.ok(Buffer.byteLength(s.message!) <= STATUS_MAX_MESSAGE_BYTES);
        const allPresent = s.images.present === s.images.wanted;
        if (!allPresent) assert.doesNotMatch(s.message!, /pre-?load/i, 'nothing claims the images are pre-loaded while one is missing');
        if (image.reason === 'NoSpace') assert.match(s.message!, /needs 60\.0 MiB, 33\.0 MiB free below the 85% watermark/, 'the estimate\'s figures');
        if (pin.reason === 'RuntimeCannotPin') {
          assert.ok(s.message!.includes('pins need 1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x'), 'the versions that pin');
          assert.equal(s.images.pinned, 0);
        }
      });
    }
  });

  test('RuntimeCannotPin alone, every image present: Degraded, pre-loaded and not protected, 0 pinned, with the versions that pin', () => {
    const p = plan([observed('web', [A, B])]);
    for (const pins of [new PreloadOnly({ logger: silentLogger(), why: CANNOT_PIN }).status(), { ...crioPinStatus({ pinFile: PIN_FILE, pinsInFile: new Set(p.pins), reportsPins: true, overriding: [] }), cannotPin: CANNOT_PIN }]) {
      const s = only(facts(p, { pins, pinnedByRuntime: () => (pins.preloadOnly ? undefined : false) }));
      assert.equal(s.phase, 'Degraded');
      assert.equal(s.reason, 'RuntimeCannotPin');
      assert.equal(s.message, `2 of 2 images present (pre-loaded) but not pinned: ${CANNOT_PIN}; nothing keeps the kubelet's image garbage collection from removing them`);
      assert.deepEqual(s.images, { wanted: 2, present: 2, pinned: 0, failed: 0, invalid: 0 });
    }
  });

  test('pre-loading chosen (--pin-backend none): Ready PreloadedNotPinned once present; a failing pull is said as on any node', () => {
    const p = plan([observed('web', [A, B])]);
    const pins = new PreloadOnly({ logger: silentLogger() }).status();
    const s = only(facts(p, { pins, pinnedByRuntime: () => undefined }));
    assert.equal(s.phase, 'Ready');
    assert.equal(s.reason, 'PreloadedNotPinned');
    const failing = only(facts(p, { pins, pinnedByRuntime: () => undefined, present: missingA, failure: () => failure('NotFound', 'manifest unknown') }));
    assert.equal(failing.reason, 'ImageNotFound');
    assert.doesNotMatch(failing.message!, /also|pre-?load/);
    assert.equal(only(facts(p, { pins, pinnedByRuntime: () => undefined, present: missingA })).reason, 'Pulling');
  });

  test('a long message keeps the other problem: the own part is cut, not the "also"', () => {
    const p = plan([observed('web', [A, B])]);
    const pins = new PreloadOnly({ logger: silentLogger(), why: CANNOT_PIN }).status();
    const s = only(facts(p, { pins, pinnedByRuntime: () => undefined, present: missingA, failure: () => failure('Other', 'x'.repeat(2000)) }));
    assert.equal(s.reason, 'PullFailed');
    assert.ok(Buffer.byteLength(s.message!) <= STATUS_MAX_MESSAGE_BYTES);
    assert.ok(s.message!.endsWith(`; also RuntimeCannotPin: ${CANNOT_PIN}`), s.message);
    assert.match(s.message!, /^pulling quay\.io\/org\/a@sha256:a{64} failed: x+\.\.\.; also /);
  });

  test('three kinds at once: a static file that cannot be read names the worst pin and image problems too', () => {
    const held: ObservedSet = { ...observed('boot', [A, B]), source: 'static', origin: '/etc/pinset/sets.d/boot.yaml (document 1, line 1)', held: { file: '/etc/pinset/sets.d/boot.yaml', error: 'EIO' } };
    const p = plan([], { staticSets: [held] });
    const s = only(facts(p, { ...problem('ReloadFailed', 'CRI-O was not reloaded'), present: missingA, failure: () => failure('NotFound', 'manifest unknown') }));
    assert.equal(s.reason, 'StaticFileUnreadable');
    assert.match(s.message!, /; also ImageNotFound: registry quay\.io has no image .*; also ReloadFailed: CRI-O was not reloaded$/);
  });
});

describe('the order of reasons', () => {
  test('each reason once; what keeps images away, and progress, outrank RuntimeCannotPin; a drop-in voiding every pin outranks them all', () => {
    const reasons = SET_REASONS.map((r) => r.reason);
    assert.equal(new Set(reasons).size, reasons.length, 'no reason twice');
    assert.ok(reasons.indexOf('NoSpace') < reasons.indexOf('RuntimeCannotPin'));
    assert.ok(reasons.indexOf('Pulling') < reasons.indexOf('RuntimeCannotPin'));
    assert.ok(reasons.indexOf('PinsOverridden') < reasons.indexOf('RuntimeUnavailable'));
  });
});

describe('computeSetStatuses: generation history', () => {
  test('currentGeneration follows Ready; a failure records lastFailedGeneration and its error', () => {
    let history: Map<string, SetHistory> = new Map();
    const step = (generation: number, over: Partial<StatusFacts>) => {
      const r = computeSetStatuses(facts(plan([observed('web', [A], { generation })]), { history, ...over }));
      history = r.history;
      return r.sets[0]!;
    };
    const g1 = step(1, {});
    assert.equal(g1.currentGeneration, 1);
    assert.equal(g1.lastFailedGeneration, undefined);

    const g2 = step(2, { present: () => false, failure: () => failure('NotFound', 'manifest unknown') });
    assert.equal(g2.desiredGeneration, 2);
    assert.equal(g2.currentGeneration, 1, 'the last completed generation stays');
    assert.equal(g2.lastFailedGeneration, 2);
    assert.match(g2.lastFailedGenerationError!, /^ImageNotFound: registry quay\.io has no image/);

    const g2pulling = step(2, { present: () => false });
    assert.equal(g2pulling.phase, 'Progressing');
    assert.equal(g2pulling.currentGeneration, 1);
    assert.equal(g2pulling.lastFailedGeneration, 2, 'the failure is remembered while retrying');

    const g2ready = step(2, {});
    assert.equal(g2ready.currentGeneration, 2);
    assert.equal(g2ready.lastFailedGeneration, 2);
  });

  test('the message is at most 512 bytes and the error kept per set at most 1 KiB, cut on a character boundary', () => {
    const huge = 'é'.repeat(5000);
    const s = only(facts(plan([observed('web', [A])]), { present: () => false, failure: () => failure('Other', huge) }));
    assert.ok(Buffer.byteLength(s.lastFailedGenerationError!) <= 1024);
    assert.ok(Buffer.byteLength(s.message!) <= STATUS_MAX_MESSAGE_BYTES);
    assert.equal(s.lastFailedGenerationError, `${s.reason}: ${s.message}`, 'a set failing now keeps its message as its error');
    assert.ok(!s.lastFailedGenerationError!.includes('\uFFFD'), 'a character was split');
    assert.ok(s.lastFailedGenerationError!.endsWith('...'));
  });

  test('an image filesystem that cannot be measured is said in the node status, bounded, and read back', () => {
    const why = 'the image filesystem /var/lib/containers/storage/overlay-images (CRI ImageFsInfo) is not visible to the agent ' + 'x'.repeat(3000);
    const st = makeNodeStatus('node-1', PIN_FILE, [], '2025-01-01T00:00:00Z', { imageFilesystemError: why });
    assert.ok(st.imageFilesystemError!.startsWith('the image filesystem /var/lib/containers/storage/overlay-images'));
    assert.ok(Buffer.byteLength(st.imageFilesystemError!) <= 1024);
    assert.equal(readAnnotation(encodeNodeStatus(st)).status?.imageFilesystemError, st.imageFilesystemError, 'written and read in version 2');
    assert.equal(readAnnotation(JSON.stringify({ ...st, version: 1 })).status?.imageFilesystemError, st.imageFilesystemError, 'and read in version 1');
    assert.equal(progressOnly(makeNodeStatus('node-1', PIN_FILE, [], 'x'), st), false, 'news: written at once');
    assert.equal(makeNodeStatus('node-1', PIN_FILE, [], '2025-01-01T00:00:00Z', { imageFilesystemError: null }).imageFilesystemError, undefined);
  });

  test('a node that cannot pin is said once in the node status (cannotPin), bounded, read back in both versions, and shortened with the messages', () => {
    const p = plan([observed('web', [A]), observed('db', [B])]);
    const pins = new PreloadOnly({ logger: silentLogger(), why: CANNOT_PIN }).status();
    const { sets } = computeSetStatuses(facts(p, { pins, pinnedByRuntime: () => undefined }));
    const st = makeNodeStatus('node-1', pins.where, sets, '2025-01-01T00:00:00Z', { cannotPin: pins.cannotPin });
    assert.equal(st.cannotPin, CANNOT_PIN);
    const written = JSON.parse(encodeNodeStatus(st)) as Record<string, unknown>;
    assert.equal(written.cannotPin, CANNOT_PIN, 'one key on the document, whatever the number of sets');
    assert.equal(readAnnotation(encodeNodeStatus(st)).status?.cannotPin, CANNOT_PIN);
    assert.equal(readAnnotation(JSON.stringify({ ...st, version: 1 })).status?.cannotPin, CANNOT_PIN, 'and read in version 1');
    assert.equal(readAnnotation(JSON.stringify({ ...st, cannotPin: 42 })).status?.cannotPin, undefined, 'a malformed one is left out');
    assert.equal(makeNodeStatus('node-1', PIN_FILE, [], 'x').cannotPin, undefined, 'absent where pins work');
    assert.ok(Buffer.byteLength(makeNodeStatus('n', PIN_FILE, [], 'x', { cannotPin: 'é'.repeat(3000) }).cannotPin!) <= 1024);
    const many = Array.from({ length: 60 }, (_, i) => ({ ...sets[0]!, name: `set-${i}-${'x'.repeat(30)}` }));
    const bounded = makeNodeStatus('node-1', pins.where, many, 'x', { cannotPin: CANNOT_PIN + ' ' + 'y'.repeat(900) });
    assert.ok(encodedSize(bounded) <= STATUS_MAX_BYTES);
    assert.ok(bounded.cannotPin!.startsWith(CANNOT_PIN.slice(0, 100)) && Buffer.byteLength(bounded.cannotPin!) <= 160, 'kept, cut like the messages');
    // Becoming able to pin (an upgraded runtime), or unable, is news: written at once.
    assert.equal(progressOnly(st, { ...st, cannotPin: undefined }), false);
    assert.equal(progressOnly({ ...st, cannotPin: undefined }, st), false);
  });

  test('the kubelet\'s credential verification: in the node status, read back, a malformed one left out, a change written at once', () => {
    const kv = { policy: 'NeverVerifyAllowlistedImages', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf', refuses: ['db', 'web (static)'], refusesMore: 2 };
    const st = makeNodeStatus('node-1', PIN_FILE, [], '2025-01-01T00:00:00Z', { kubeletVerification: kv });
    assert.deepEqual(JSON.parse(encodeNodeStatus(st)).kubeletVerification, kv, 'one key on the document');
    assert.deepEqual(readAnnotation(encodeNodeStatus(st)).status?.kubeletVerification, kv);
    const doc = (v: unknown) => JSON.stringify({ version: 2, pinFile: '', updatedAt: '', sets: [], kubeletVerification: v });
    for (const bad of [null, 'AlwaysVerify', { source: 'x' }, { policy: 7, source: 'x' }, { policy: 'AlwaysVerify' }]) {
      assert.equal(readAnnotation(doc(bad)).status?.kubeletVerification, undefined, JSON.stringify(bad));
    }
    assert.deepEqual(readAnnotation(doc({ policy: 'AlwaysVerify', source: 's', refuses: [1], refusesMore: -1 })).status?.kubeletVerification, { policy: 'AlwaysVerify', source: 's' }, 'bad parts dropped alone');
    assert.equal(progressOnly(st, makeNodeStatus('node-1', PIN_FILE, [], 'x', { kubeletVerification: { ...kv, refuses: ['db'] } })), false, 'news: written at once');
    assert.equal(progressOnly(st, makeNodeStatus('node-1', PIN_FILE, [], 'x', { kubeletVerification: { ...kv } })), true);
    const big = boundedNodeStatus({ ...st, kubeletVerification: { ...kv, source: 'z'.repeat(1000) }, sets: Array.from({ length: 60 }, (_, i) => entry(`set-${i}`, 'Degraded', 'y'.repeat(400))) });
    assert.ok(Buffer.byteLength(big.kubeletVerification!.source) <= 163 && big.kubeletVerification!.policy === kv.policy, 'kept over the size bound, its source cut like the messages');
  });

  test('the pin count and why pins are kept: in the node status, bounded, read back; unknown stays unknown', () => {
    const why = `3 pin(s) kept that no set asks for now: the CustomResourceDefinition pinnedimagesets.pinset.dev is being deleted ${'x'.repeat(2000)}`;
    const st = makeNodeStatus('node-1', PIN_FILE, [], '2025-01-01T00:00:00Z', { pins: 3, pinsKept: why });
    assert.ok(Buffer.byteLength(st.pinsKept!) <= STATUS_MAX_MESSAGE_BYTES);
    const read = readAnnotation(encodeNodeStatus(st)).status!;
    assert.equal(read.pins, 3);
    assert.equal(read.pinsKept, st.pinsKept);
    assert.equal(readAnnotation(encodeNodeStatus(makeNodeStatus('node-1', PIN_FILE, [], 'x', { pins: 0 }))).status!.pins, 0, '0 is written, not left out');
    assert.equal(readAnnotation(encodeNodeStatus(makeNodeStatus('node-1', PIN_FILE, [], 'x'))).status!.pins, undefined, 'unknown is left out');
    for (const bad of [-1, 1.5, '3', null]) {
      assert.equal(readAnnotation(JSON.stringify({ version: 2, pinFile: '', updatedAt: '', sets: [], pins: bad })).status!.pins, undefined, `pins ${JSON.stringify(bad)} is no count`);
    }
    // Over the size bound, pinsKept is cut like the messages.
    const big = boundedNodeStatus({ ...st, sets: Array.from({ length: 60 }, (_, i) => entry(`set-${i}`, 'Degraded', 'y'.repeat(400))) });
    assert.ok(Buffer.byteLength(big.pinsKept!) <= 163);
    assert.ok(encodedSize(big) <= STATUS_MAX_BYTES);
  });

  test('the pin count reaching or leaving 0, becoming known, or another reason pins are kept: news; another non-zero count: progress', () => {
    const at = (pins: number | undefined, pinsKept?: string): NodeStatus => ({ ...nodeStatus([entry('web', 'Progressing', 'a')]), ...(pins === undefined ? {} : { pins }), ...(pinsKept ? { pinsKept } : {}) });
    assert.equal(progressOnly(at(2), at(3)), true, 'a pulling node labelling more images');
    assert.equal(progressOnly(at(2), at(0)), false, 'no pins left: what `pinset uninstall` waits for');
    assert.equal(progressOnly(at(0), at(1)), false);
    assert.equal(progressOnly(at(undefined), at(2)), false);
    assert.equal(progressOnly(at(2), at(2, 'kept: the CRD is missing')), false);
  });

  test('history survives a restart through the annotation', () => {
    const first = computeSetStatuses(facts(plan([observed('web', [A], { generation: 4 })]), { present: () => false, failure: () => failure('NotFound', 'x') }));
    const annotation = encodeNodeStatus(makeNodeStatus('node-1', PIN_FILE, first.sets, '2025-01-01T00:00:00Z'));
    const restored = historyFromStatus(readAnnotation(annotation).status ?? null);
    assert.deepEqual(restored.get('api/web'), first.history.get('api/web'));
    assert.equal(readAnnotation('not json').status, undefined);
    assert.equal(readAnnotation(JSON.stringify({ version: 3, sets: [] })).status, undefined);
  });
});

describe('cutBytes', () => {
  test('leaves short text alone and cuts long text without splitting characters', () => {
    assert.equal(cutBytes('abc', 10), 'abc');
    for (const s of ['a'.repeat(100), '€'.repeat(100), '😀'.repeat(100), 'a' + '😀'.repeat(100)]) {
      const c = cutBytes(s, 50);
      assert.ok(Buffer.byteLength(c) <= 50, c);
      assert.ok(!c.includes('\uFFFD'));
      assert.ok(s.startsWith(c.slice(0, -3)));
    }
  });
});

function entry(name: string, phase: NodeSetStatus['phase'], message?: string): NodeSetStatus {
  return {
    name,
    source: 'api',
    desiredGeneration: 1,
    currentGeneration: phase === 'Ready' ? 1 : 0,
    images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 },
    phase,
    reason: phase === 'Ready' ? 'AllImagesPinned' : phase === 'Degraded' ? 'ImageNotFound' : 'Pulling',
    ...(message ? { message } : {}),
  };
}

function nodeStatus(sets: NodeSetStatus[]): NodeStatus {
  return { version: 2, node: 'node-1', pinFile: PIN_FILE, updatedAt: '2025-01-01T00:00:00Z', sets };
}

describe('boundedNodeStatus: the 16 KiB bound, measured as written', () => {
  test('a small status is returned as is', () => {
    const s = nodeStatus([entry('a', 'Ready')]);
    assert.equal(boundedNodeStatus(s), s);
  });

  test('long messages are shortened first; every set is kept', () => {
    const sets = Array.from({ length: 40 }, (_, i) => {
      const e = entry(`set-${i}`, 'Degraded', 'x'.repeat(500));
      return { ...e, lastFailedGeneration: 1, lastFailedGenerationError: `${e.reason}: ${e.message}` };
    });
    assert.ok(encodedSize(nodeStatus(sets)) > STATUS_MAX_BYTES);
    const out = boundedNodeStatus(nodeStatus(sets));
    assert.ok(encodedSize(out) <= STATUS_MAX_BYTES);
    assert.equal(out.sets.length, 40);
    assert.equal(out.truncated, undefined);
    assert.ok(out.sets.every((s) => Buffer.byteLength(s.message!) <= 160));
    // A set failing now writes its message once: the error follows the shortened message.
    assert.ok(out.sets.every((s) => s.lastFailedGenerationError === `${s.reason}: ${s.message}`));
  });

  test('too many sets: truncated, Degraded first, then Progressing, then Ready', () => {
    const sets: NodeSetStatus[] = [];
    for (let i = 0; i < 2000; i++) sets.push(entry(`ready-${String(i).padStart(4, '0')}-${'r'.repeat(40)}`, 'Ready'));
    for (let i = 0; i < 5; i++) sets.push(entry(`progressing-${i}`, 'Progressing', 'waiting'));
    for (let i = 0; i < 5; i++) sets.push(entry(`degraded-${i}`, 'Degraded', 'broken'));
    const input = nodeStatus(sets);
    assert.ok(encodedSize(input) > STATUS_MAX_BYTES);
    const out = boundedNodeStatus(input);
    const size = encodedSize(out);
    assert.ok(size <= STATUS_MAX_BYTES, `${size} bytes`);
    assert.ok(size > STATUS_MAX_BYTES - 1024, 'the room is used');
    assert.equal(out.truncated, true);
    assert.ok(out.sets.length < sets.length);
    assert.deepEqual(
      out.sets.slice(0, 10).map((s) => s.phase),
      [...Array(5).fill('Degraded'), ...Array(5).fill('Progressing')],
    );
    assert.ok(out.sets.slice(10).every((s) => s.phase === 'Ready'));
    assert.ok(readAnnotation(encodeNodeStatus(out)).status);
    assert.equal(readAnnotation(encodeNodeStatus(out)).status?.truncated, true);
  });

  test('a smaller bound is honoured', () => {
    const out = boundedNodeStatus(nodeStatus(Array.from({ length: 50 }, (_, i) => entry(`s${i}`, 'Degraded', 'm'))), 2000);
    assert.ok(encodedSize(out) <= 2000);
    assert.equal(out.truncated, true);
  });
});

// ---------------------------------------------------------------------------

/** An in-memory sink: records every write, can fail or hold writes on demand. */
class MemorySink implements StatusSink {
  written: NodeStatus[] = [];
  attempts = 0;
  failNext = 0;
  hold: Promise<void> | undefined;
  async write(status: NodeStatus): Promise<void> {
    this.attempts++;
    if (this.hold) await this.hold;
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('connection refused');
    }
    this.written.push(structuredClone(status));
  }
  names(): string[] {
    return this.written.map((s) => s.sets.map((x) => `${x.name}:${x.phase}:${x.message ?? ''}`).join(','));
  }
}

const settle = () => new Promise<void>((r) => setImmediate(r));

const ready = (name = 'web', updatedAt = '2025-01-01T00:00:00Z') => ({ ...nodeStatus([entry(name, 'Ready')]), updatedAt });
const progressing = (message: string) => nodeStatus([entry('web', 'Progressing', message)]);

describe('StatusReporter', () => {
  afterEach(() => mock.timers.reset());

  test('writes only when the content changes (the time stamp alone is no change)', async () => {
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 10 });
    r.report(ready('web', 'T1'));
    await r.flush();
    r.report(ready('web', 'T2'));
    await r.flush();
    assert.equal(sink.written.length, 1);
    r.report(ready('api', 'T3'));
    await r.flush();
    assert.deepEqual(sink.names(), ['web:Ready:', 'api:Ready:']);
    assert.equal(r.writes, 2);
    r.close();
  });

  test('the annotation found at start counts as written', async () => {
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), initial: ready('web', 'yesterday') });
    r.report(ready('web', 'today'));
    await r.flush();
    assert.equal(sink.attempts, 0);
    r.close();
  });

  test('while Progressing, writes are coalesced: the latest content wins', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 1_000_000;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 5_000, now: () => now });
    r.report(progressing('0 of 3 images present'));
    await settle();
    assert.deepEqual(sink.names(), ['web:Progressing:0 of 3 images present'], 'the first write is not delayed');
    now += 1_000;
    r.report(progressing('1 of 3 images present'));
    r.report(progressing('2 of 3 images present'));
    await settle();
    assert.equal(sink.written.length, 1, 'held back inside the interval');
    mock.timers.tick(4_000);
    now += 4_000;
    await settle();
    assert.deepEqual(sink.names(), ['web:Progressing:0 of 3 images present', 'web:Progressing:2 of 3 images present']);
    r.close();
  });

  test('a change back to what is written cancels the pending write', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 0;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 5_000, now: () => now });
    r.report(progressing('a'));
    await settle();
    r.report(progressing('b'));
    r.report(progressing('a'));
    mock.timers.tick(5_000);
    now += 5_000;
    await settle();
    assert.deepEqual(sink.names(), ['web:Progressing:a']);
    r.close();
  });

  test('a status reported while a write is in flight is written after it', async () => {
    const sink = new MemorySink();
    let release!: () => void;
    sink.hold = new Promise<void>((r) => (release = r));
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 10 });
    r.report(ready('first'));
    await settle();
    r.report(ready('second'));
    sink.hold = undefined;
    release();
    await settle();
    assert.deepEqual(sink.names(), ['first:Ready:', 'second:Ready:']);
    r.close();
  });

  test('content going back to what was written while another write is in flight lands after it: a drop-in read half-written, then whole', async () => {
    const sink = new MemorySink();
    const kv = (policy: string, refuses?: string[]) => ({ ...ready('web'), kubeletVerification: { policy, source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf', ...(refuses ? { refuses } : {}) } });
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 60_000 });
    r.report(kv('NeverVerifyAllowlistedImages'));
    await r.flush();
    let release!: () => void;
    sink.hold = new Promise<void>((res) => (release = res));
    r.report(kv('Invalid')); // the drop-in read half-written: its write starts and waits on the API
    await settle();
    r.report(kv('NeverVerifyAllowlistedImages')); // read whole, as written before the write in flight
    sink.hold = undefined;
    release();
    await settle();
    await settle();
    assert.deepEqual(
      sink.written.map((w) => w.kubeletVerification?.policy),
      ['NeverVerifyAllowlistedImages', 'Invalid', 'NeverVerifyAllowlistedImages'],
      'the Node ends with what the files say now, not with the half-written reading',
    );
    r.close();
  });

  test('a change of kubeletVerification alone (policy, refuses) is written at once, even while progress waits its turn', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 0;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 60_000, now: () => now });
    const at = (message: string, kv: NodeStatus['kubeletVerification']) => ({ ...progressing(message), kubeletVerification: kv });
    const allowlisted = { policy: 'NeverVerifyAllowlistedImages', source: 'a.conf' };
    r.report(at('0 of 3 images present', allowlisted));
    await settle();
    now += 100;
    r.report(at('1 of 3 images present', allowlisted)); // progress: waits a minute
    await settle();
    assert.equal(sink.written.length, 1);
    now += 100;
    r.report(at('1 of 3 images present', { ...allowlisted, refuses: ['web'] }));
    await settle();
    now += 100;
    r.report(at('1 of 3 images present', { policy: 'AlwaysVerify', source: 'a.conf', refuses: ['web'] }));
    await settle();
    assert.deepEqual(
      sink.written.map((w) => [w.kubeletVerification?.policy, w.kubeletVerification?.refuses ?? []]),
      [['NeverVerifyAllowlistedImages', []], ['NeverVerifyAllowlistedImages', ['web']], ['AlwaysVerify', ['web']]],
      'each written within the same tick, with the progress that waited',
    );
    assert.equal(sink.written.at(-1)!.sets[0]!.message, '1 of 3 images present');
    r.close();
  });

  test('a failed write is retried with backoff, and the newest content lands', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    const sink = new MemorySink();
    sink.failNext = 2;
    const r = new StatusReporter(sink, { logger: silentLogger() });
    r.report(ready('v1'));
    await settle();
    assert.equal(sink.attempts, 1);
    assert.equal(sink.written.length, 0);
    mock.timers.tick(1_000); // first retry within base (1 s)
    await settle();
    assert.equal(sink.attempts, 2);
    r.report(ready('v2')); // newer content while waiting to retry
    mock.timers.tick(2_000); // second retry within 2 s
    await settle();
    assert.equal(sink.attempts, 3);
    assert.deepEqual(sink.names(), ['v2:Ready:']);
    assert.equal(r.writes, 1);
    r.close();
  });

  test('a change of phase is written at once, even right after a write; progress alone waits its turn', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 0;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 60_000, now: () => now });
    r.report(ready('web'));
    await settle();
    now += 100;
    r.report(progressing('0 of 3 images present')); // Ready -> Progressing: news
    await settle();
    assert.deepEqual(sink.names(), ['web:Ready:', 'web:Progressing:0 of 3 images present']);
    now += 100;
    r.report(progressing('1 of 3 images present')); // progress only: waits
    await settle();
    assert.equal(sink.written.length, 2);
    now += 100;
    r.report(ready('web')); // Progressing -> Ready: news, and it replaces the waiting progress
    await settle();
    assert.deepEqual(sink.names(), ['web:Ready:', 'web:Progressing:0 of 3 images present', 'web:Ready:']);
    mock.timers.tick(60_000);
    now += 60_000;
    await settle();
    assert.equal(sink.written.length, 3, 'the progress that waited is not written after the news');
    r.close();
  });

  test('a new set, a generation change or a set gone is news too; a reason or message change inside a phase is progress', () => {
    const base = nodeStatus([entry('web', 'Progressing', 'a')]);
    const failing = nodeStatus([entry('web', 'Degraded', 'registry quay.io could not be reached (2 of 40 images failing; retrying)')]);
    const changes: [string, NodeStatus, boolean][] = [
      ['reason: Pulling to WaitingForRolloutSlot (the slot was lost)', nodeStatus([{ ...entry('web', 'Progressing', 'a'), reason: 'WaitingForRolloutSlot' }]), false],
      ['reason: Pulling to WaitingForPin', nodeStatus([{ ...entry('web', 'Progressing', 'a'), reason: 'WaitingForPin' }]), false],
      ['bytes and rate', nodeStatus([{ ...entry('web', 'Progressing', 'a'), bytes: { present: 10, total: 100 }, rate: 5 }]), false],
      ['message', nodeStatus([entry('web', 'Progressing', 'b')]), false],
      ['Degraded: counts and message move together (pulls go on beside a failing image)', nodeStatus([{ ...entry('web', 'Degraded', 'registry quay.io could not be reached (1 of 40 images failing; retrying)'), images: { wanted: 40, present: 39, pinned: 40, failed: 1, invalid: 0 } }]), false],
      ['Degraded: another error, counts standing still', nodeStatus([entry('web', 'Degraded', 'registry quay.io refused the credentials')]), true],
      ['Degraded: another reason', nodeStatus([{ ...entry('web', 'Degraded', 'registry quay.io could not be reached (2 of 40 images failing; retrying)'), reason: 'Unauthorized' }]), true],
      ['a set added', nodeStatus([entry('web', 'Progressing', 'a'), entry('db', 'Ready')]), true],
      ['a set gone', nodeStatus([]), true],
      ['a new generation', nodeStatus([{ ...entry('web', 'Progressing', 'a'), desiredGeneration: 2 }]), true],
      ['the set recreated (new uid)', nodeStatus([{ ...entry('web', 'Progressing', 'a'), uid: 'other' }]), true],
    ];
    for (const [what, next, news] of changes) {
      assert.equal(!progressOnly(next.sets[0]?.phase === 'Degraded' ? failing : base, next), news, what);
    }
    assert.equal(progressOnly(undefined, base), false, 'the first write is news');
  });

  test('a set that starts downloading is news: from a reason under which it downloads nothing (a rollout slot, the first wave, its labels) to Pulling', () => {
    const with_ = (reason: string, message: string) => nodeStatus([{ ...entry('web', 'Progressing', message), reason }]);
    for (const waiting of ['WaitingForRolloutSlot', 'WaitingForFirstWave', 'WaitingForNodeLabels']) {
      assert.equal(progressOnly(with_(waiting, '0 of 3 images present'), with_('Pulling', '0 of 3 images present')), false, waiting);
      assert.equal(progressOnly(with_(waiting, '0 of 3 images present'), with_(waiting, '1 of 3 images present')), true, `${waiting}, counts moving`);
    }
    assert.equal(progressOnly(with_('Pulling', '1 of 3 images present'), with_('WaitingForRolloutSlot', '1 of 3 images present')), true, 'a lost slot waits its turn');
  });

  test('a set that waited for a rollout slot costs one more write: WaitingForRolloutSlot, Pulling as the slot is taken, Ready', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 1_000_000;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), now: () => now, initial: nodeStatus([]) });
    const at = (reason: string, message: string) => nodeStatus([{ ...entry('web', 'Progressing', message), reason }]);
    r.report(at('WaitingForRolloutSlot', 'waiting for a rollout slot; 0 of 40 images present'));
    await settle();
    now += 10_000;
    mock.timers.tick(10_000);
    r.report(at('Pulling', '0 of 40 images present'));
    await settle();
    assert.equal(sink.written.length, 2, 'Pulling is written as the slot is taken, not a minute later');
    now += 20_000;
    mock.timers.tick(20_000);
    r.report(at('Pulling', '20 of 40 images present'));
    await settle();
    r.report(ready('web'));
    await settle();
    assert.deepEqual(sink.written.map((w) => w.sets[0]!.reason), ['WaitingForRolloutSlot', 'Pulling', 'AllImagesPinned']);
    r.close();
  });

  /** When (seconds from the first report) a reporter writes progress reported every `stepMs` for `forMs`. */
  async function progressWritesAt(progressIntervalMs: number | undefined, stepMs: number, forMs: number): Promise<number[]> {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 0;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), now: () => now, ...(progressIntervalMs !== undefined ? { progressIntervalMs } : {}) });
    const writesAt: number[] = [];
    let n = 0;
    for (let t = 0; t <= forMs; t += stepMs) {
      mock.timers.tick(t - now);
      now = t;
      r.report(progressing(`${n++} images present`));
      await settle();
      while (writesAt.length < sink.written.length) writesAt.push(now / 1000);
    }
    r.close();
    return writesAt;
  }

  test('progress alone: the first write a minute after the last, then twice as long each time, up to 5 minutes', async () => {
    assert.deepEqual(await progressWritesAt(undefined, 5_000, 20 * 60_000), [0, 60, 180, 420, 720, 1020]);
  });

  test('the cap on the progress pace is 5 x the first wait: --status-progress-interval 1s writes at 1, 3, 7, then every 5 s', async () => {
    assert.deepEqual(await progressWritesAt(1_000, 100, 20_000), [0, 1, 3, 7, 12, 17]);
  });

  test('a set rollout costs at most 3 writes: Progressing at once, one progress update, Ready at once', async () => {
    // A set of 40 images pulled in 150 s; the agent recomputes its status every 5 s while pulling.
    for (const durationS of [30, 150]) {
      mock.timers.enable({ apis: ['setTimeout'] });
      let now = 1_000_000;
      const sink = new MemorySink();
      const r = new StatusReporter(sink, { logger: silentLogger(), now: () => now, initial: nodeStatus([]) });
      for (let t = 0; t < durationS; t += 5) {
        const present = Math.floor((40 * t) / durationS);
        r.report(progressing(`${present} of 40 images present`));
        await settle();
        if (t === 0) assert.equal(sink.written.length, 1, 'Progressing is written when the pulls start');
        mock.timers.tick(5_000);
        now += 5_000;
        await settle();
      }
      r.report(ready('web'));
      await settle();
      const phases = sink.written.map((w) => w.sets[0]?.phase);
      assert.equal(phases[0], 'Progressing');
      assert.equal(phases.at(-1), 'Ready', 'Ready is written at once');
      assert.ok(sink.written.length <= 3, `${durationS} s: ${sink.names().join(' | ')}`);
      assert.equal(sink.written.length, durationS > 60 ? 3 : 2);
      r.close();
      mock.timers.reset();
    }
  });

  test('flush() writes what is pending at once (shutdown, --once)', async () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    let now = 0;
    const sink = new MemorySink();
    const r = new StatusReporter(sink, { logger: silentLogger(), progressIntervalMs: 60_000, now: () => now });
    r.report(progressing('a'));
    await settle();
    now += 1;
    r.report(progressing('b'));
    await r.flush();
    assert.deepEqual(sink.names(), ['web:Progressing:a', 'web:Progressing:b']);
    r.close();
  });
});

describe('computeSetStatuses: bytes and rate', () => {
  const GiB = 1024 ** 3;

  test('a set downloading carries the bytes and the rate it is given; a Ready one all present of the total, no rate', () => {
    const p = plan([observed('web', [A, B])]);
    const bytes = new Map([['api/web', { present: 3 * GiB, total: 8 * GiB }]]);
    const pulling = only(facts(p, { present: isA, bytes, rates: new Map([['api/web', 5_452_595.4]]) }));
    assert.equal(pulling.phase, 'Progressing');
    assert.deepEqual(pulling.bytes, { present: 3 * GiB, total: 8 * GiB });
    assert.equal(pulling.rate, 5_452_595.4);
    const done = only(facts(p, { bytes: new Map([['api/web', { present: 8 * GiB, total: 8 * GiB }]]), rates: new Map([['api/web', 1]]) }));
    assert.equal(done.phase, 'Ready');
    assert.deepEqual(done.bytes, { present: 8 * GiB, total: 8 * GiB });
    assert.equal(done.rate, undefined);
    // Written as the annotation says them: [present, total] while downloading, [total] when all are present, the rate in whole bytes.
    const doc = JSON.parse(encodeNodeStatus(makeNodeStatus('n', PIN_FILE, [pulling], '2026-01-01T00:00:00Z'))).sets[0];
    assert.deepEqual([doc.bytes, doc.rate], [[3 * GiB, 8 * GiB], 5_452_595]);
    assert.deepEqual(JSON.parse(encodeNodeStatus(makeNodeStatus('n', PIN_FILE, [done], '2026-01-01T00:00:00Z'))).sets[0].bytes, [8 * GiB]);
    // Without sizes (a set waiting for a slot has asked nothing), no bytes.
    assert.equal(only(facts(p, { present: isA })).bytes, undefined);
  });

  test('a Ready set keeps its total across a restart from its last annotation, at the same generation and uid only', () => {
    const p = plan([observed('web', [A, B], { generation: 3 })]);
    const first = computeSetStatuses(facts(p, { bytes: new Map([['api/web', { present: 8 * GiB, total: 8 * GiB }]]) }));
    const annotation = encodeNodeStatus(makeNodeStatus('node-1', PIN_FILE, first.sets, '2026-01-01T00:00:00Z'));
    const history = historyFromStatus(readAnnotation(annotation).status ?? null);
    // The agent restarted: no sizes known (a complete set asks the registries nothing).
    const again = computeSetStatuses(facts(p, { history }));
    assert.deepEqual(again.sets[0]!.bytes, { present: 8 * GiB, total: 8 * GiB });
    // And carried on through the next report, still without sizes.
    assert.deepEqual(computeSetStatuses(facts(p, { history: again.history })).sets[0]!.bytes, { present: 8 * GiB, total: 8 * GiB });
    // Another generation, or the set recreated under the same name: that total is not its own.
    assert.equal(only(facts(plan([observed('web', [A, B], { generation: 4 })]), { history })).bytes, undefined);
    assert.equal(only(facts(plan([observed('web', [A, B], { generation: 3, uid: 'other' })]), { history })).bytes, undefined);
    // Nor while it is not Ready: then the bytes are counted, or absent.
    assert.equal(only(facts(p, { history, present: isA })).bytes, undefined);
  });

  test('the annotation stays within its bound with bytes and rates on every set', () => {
    const sets: NodeSetStatus[] = Array.from({ length: 200 }, (_, i) => ({
      ...entry(`set-${String(i).padStart(3, '0')}-${'x'.repeat(240)}`, 'Progressing', 'm'.repeat(600)),
      bytes: { present: 123_456_789_012 + i, total: 987_654_321_098 },
      rate: 123_456_789,
      estimatedBytes: 1_975_308_642_196,
    }));
    const status = makeNodeStatus('n', PIN_FILE, sets, '2026-01-01T00:00:00Z');
    assert.ok(encodedSize(status) <= STATUS_MAX_BYTES, String(encodedSize(status)));
    assert.equal(status.truncated, true);
    assert.deepEqual(readAnnotation(encodeNodeStatus(status)).status!.sets[0]!.bytes, sets[0]!.bytes);
  });
});

describe('computeSetStatuses: the disk estimate', () => {
  test('a set still pulling shows its estimate in bytes, and says when the estimate is unknown; a Ready set shows none', () => {
    const p = plan([observed('web', [A, B])]);
    const pulling = only(facts(p, { present: isA, estimates: new Map([['api/web', { bytes: 3_000_000, unknown: 'registry.example.com:5000 cannot be reached: ECONNREFUSED' }]]) }));
    assert.equal(pulling.phase, 'Progressing');
    assert.equal(pulling.estimatedBytes, 3_000_000);
    assert.match(pulling.message!, /^1 of 2 images present; size estimate unknown, so only the watermark was checked: registry\.example\.com:5000 cannot be reached/);
    const ready = only(facts(p, { estimates: new Map([['api/web', { bytes: 3_000_000 }]]) }));
    assert.equal(ready.phase, 'Ready');
    assert.equal(ready.estimatedBytes, undefined);
    // The annotation reader keeps the field, and refuses a malformed one.
    const doc = (e: unknown) => JSON.stringify({ version: 1, node: 'n', pinFile: PIN_FILE, updatedAt: '2026-01-01T00:00:00Z', sets: [{ ...pulling, estimatedBytes: e }] });
    assert.equal(readAnnotation(doc(3_000_000)).status?.sets[0]?.estimatedBytes, 3_000_000);
    assert.equal(readAnnotation(doc(-1)).status?.sets.length ?? 0, 0);
  });
});
