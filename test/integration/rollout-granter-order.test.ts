// The granter's picture when the watch is ahead of a write's answer
// (src/rollout/own-writes.ts), on the in-process API server: the answer to
// a grant is held back while the node takes the slot and then frees it (a
// delete) or stops renewing it, so the granter's watch shows what followed
// the grant before the granter hears its write went through. The freed or
// expired slot must go to the next node at once (or at its expiry), as it
// does when the answer comes first; a picture that took the older answer
// would keep the slot held in the granted node's name for the accept
// window, then write over that version and be refused, with no event left
// to bring another pass.
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiServer } from '../support/apiserver.ts';
import { KubeHttp } from '../../src/api/kube-http.ts';
import { RolloutGranter, type GrantedSet } from '../../src/rollout/granter.ts';
import { clientNodeLeaseApi } from '../../src/rollout/lease-api.ts';
import { LeaseRolloutSlots, type LeaseApi } from '../../src/rollout/lease-slots.ts';
import { GRANT_ANNOTATION, queueName, setLabelValue, slotName, type HeldSlot, type QueueTicket, type RolloutSet } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

const NS = 'pinset-system';
const ACCEPT_MS = 10_000;

/** The granter's client, whose answers to the requests `hold` picks are kept back (the request itself is done) until `release()`. */
class HeldAnswers extends KubeHttp {
  hold: ((method: string, path: string) => boolean) | undefined;
  readonly #held: (() => void)[] = [];
  heldCount = 0;

  override async json<T>(...args: Parameters<KubeHttp['json']>): Promise<T> {
    const answer = await super.json<T>(...args);
    if (this.hold?.(args[0], args[1])) {
      this.heldCount++;
      await new Promise<void>((r) => this.#held.push(r));
    }
    return answer;
  }

  release(): void {
    this.hold = undefined;
    for (const r of this.#held.splice(0)) r();
  }
}

let api: ApiServer;
let leaseApi: LeaseApi;
let http: HeldAnswers;
let granter: RolloutGranter;
const limits = new Map<string, GrantedSet>();
/** Every node's place in a queue, left when the test ends (passed or not). */
const tickets: QueueTicket[] = [];

before(async () => {
  api = await ApiServer.start({ bookmarkIntervalMs: 1_000 });
  leaseApi = clientNodeLeaseApi(api.kubeConfig());
});
after(async () => {
  await api.stop();
});
beforeEach(async () => {
  limits.clear();
  for (const l of api.list('leases')) api.remove('leases', l.metadata.name!, l.metadata.namespace);
  api.requests.length = 0;
});

async function startGranter(): Promise<void> {
  http = new HeldAnswers(api.kubeConfig(), { userAgent: 'pinset-controller' });
  granter = new RolloutGranter({ http, namespace: NS, log: silentLogger(), setOf: (label) => limits.get(label), fieldManager: 'pinset-controller', identity: 'granter-test', acceptMs: ACCEPT_MS });
  granter.start();
  granter.setLeading(true);
  await api.waitFor(() => granter.synced, 5000, 'the granter watching');
}

async function stopGranter(): Promise<void> {
  await Promise.all(tickets.splice(0).map((t) => t.leave()));
  http.release();
  await granter.stop();
  http.close();
}

const slotsOf = (identity: string, leaseDurationMs = 60_000) => new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity, fieldManager: 'pinset-agent', leaseDurationMs });

/** `slots` joins the set's queue; the names of the slots granted to it. */
async function queue(slots: LeaseRolloutSlots, set: RolloutSet): Promise<{ granted: string[]; ticket: QueueTicket }> {
  const granted: string[] = [];
  const ticket = await slots.join!(set, { granted: (n) => granted.push(n), removed: () => {}, failed: (e) => assert.fail(e.message) });
  tickets.push(ticket);
  return { granted, ticket };
}

function limited(name: string, max: number): RolloutSet {
  const uid = `uid-${name}`;
  limits.set(setLabelValue(name), { name, uid, limits: { rollout: max } });
  return { name, uid, maxConcurrentNodes: max };
}

const holderOf = (name: string) => (api.get('leases', name, NS)?.spec as { holderIdentity?: string } | undefined)?.holderIdentity;
const grantOf = (set: string, node: string) => api.get('leases', queueName(set, node), NS)?.metadata.annotations?.[GRANT_ANNOTATION];
/** The controller's slot writes the API server refused (409: written over a version that was not the last; 404: over one deleted). */
const refusedSlotWrites = (set: string) => api.requests.filter((r) => r.userAgent.startsWith('pinset-controller') && r.method === 'PUT' && r.path.includes(`/leases/${slotName(set, 0)}`) && r.status >= 400).length;

/**
 * Node `a` queues for the set's one slot; the granter grants it, and the
 * answer to the grant's last request (the PATCH that marks a's entry) is
 * held. Meanwhile `a`, told by its entry, takes the slot, and `then` runs.
 */
async function grantWithAnswerHeld(set: RolloutSet, a: LeaseRolloutSlots, then: (slot: HeldSlot) => Promise<void>): Promise<void> {
  http.hold = (method, path) => method === 'PATCH' && path.endsWith(`/leases/${queueName(set.name, 'a')}`);
  const { granted, ticket } = await queue(a, set);
  await api.waitFor(() => granted.length === 1, 5000, 'a told of its grant');
  await api.waitFor(() => http.heldCount === 1, 5000, 'the answer to the grant held back');
  const slot = await a.accept!(set, granted[0]!);
  assert.ok(slot, 'a took its grant');
  await ticket.leave();
  await then(slot);
}

describe('the granter when its watch is ahead of its own write', () => {
  test('the slot freed (deleted) before the grant\'s answer: the deletion wins, the next node is granted at once', async () => {
    await startGranter();
    try {
      const set = limited('freed', 1);
      await grantWithAnswerHeld(set, slotsOf('a'), async (slot) => {
        await slotsOf('a').release(slot);
        assert.equal(api.get('leases', slotName('freed', 0), NS), undefined, 'a freed the slot');
      });
      const { granted } = await queue(slotsOf('b'), set);
      // The granter's watch shows the deletion and b's entry while its pass still waits for the answer.
      await sleep(500);
      http.release();
      await api.waitFor(() => granted.length === 1, 3000, 'b granted the freed slot at once, not after the accept window');
      assert.equal(holderOf(slotName('freed', 0)), 'b');
      assert.equal(grantOf('freed', 'b'), slotName('freed', 0));
      assert.equal(refusedSlotWrites('freed'), 0);
    } finally {
      await stopGranter();
    }
  });

  test('the slot taken (a newer version) before the grant\'s answer, then its holder dies: granted when the holder\'s lease expires', async () => {
    await startGranter();
    try {
      const set = limited('taken', 1);
      // a takes the slot with a 2 s lease and renews it no more (it died).
      await grantWithAnswerHeld(set, slotsOf('a', 2_000), async () => {});
      const { granted } = await queue(slotsOf('b'), set);
      await sleep(500);
      http.release();
      // The picture keeps a's own 2 s lease, not the grant's 10 s accept window the answer carried.
      await api.waitFor(() => granted.length === 1, 6000, 'b granted the slot once a\'s lease expired');
      assert.equal(holderOf(slotName('taken', 0)), 'b');
      assert.equal(refusedSlotWrites('taken'), 0, 'the grant was written over the version the API server holds');
    } finally {
      await stopGranter();
    }
  });

  test('the answer first (the usual order): the granter plans on its write at once, and an event of the version it replaced does not undo it', async () => {
    await startGranter();
    try {
      const set = limited('usual', 1);
      const a = slotsOf('a');
      const { granted, ticket } = await queue(a, set);
      await api.waitFor(() => granted.length === 1, 5000, 'a told of its grant');
      // b queues while a has not taken its grant: the slot is a's for the accept window, b waits.
      const { granted: bGranted } = await queue(slotsOf('b'), set);
      await sleep(500);
      assert.deepEqual(bGranted, [], 'the slot granted to a is not granted again');
      const slot = (await a.accept!(set, granted[0]!))!;
      await ticket.leave();
      await a.release(slot);
      await api.waitFor(() => bGranted.length === 1, 3000, 'b granted once a freed the slot');
      assert.equal(refusedSlotWrites('usual'), 0);
    } finally {
      await stopGranter();
    }
  });
});
