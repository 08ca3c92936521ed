// The first wave's records (./first-wave.ts) in coordination.k8s.io/v1
// Leases: seat i's record of set S is the Lease `S-i.landed` in the agents'
// namespace, labelled pinset.dev/first-wave-landed=<set>, owned by the set,
// holderIdentity the member that wrote it last, its landings in two
// annotations (the image list's hash, the bitmap). Never renewed: it
// changes only when a member starts or an image lands, so a node that
// watches it by name hears of nothing else. A write reads the record and
// replaces it with the version read (409: read again and retry once, the
// bits of both writers kept by the caller's update).
import { LANDED_BITS_ANNOTATION, LANDED_IMAGES_ANNOTATION, type LandedRecord, type WaveRecords } from './landed.ts';
import { code, leaseMetadata, microTime, type LeaseApi, type LeaseObject } from './lease-slots.ts';
import { landedName, LANDED_SET_LABEL, type RolloutSet } from './slots.ts';

export interface LeaseWaveRecordsOptions {
  /** Needs watch(). */
  api: LeaseApi;
  namespace: string;
  /** The node's name. */
  identity: string;
  fieldManager: string;
  now?: () => number;
}

function recordOf(l: LeaseObject): LandedRecord | null {
  const a = l.metadata.annotations ?? {};
  const images = a[LANDED_IMAGES_ANNOTATION];
  const landed = a[LANDED_BITS_ANNOTATION];
  if (images === undefined || landed === undefined) return null;
  return { holder: l.spec?.holderIdentity ?? '', images, landed, ...(l.metadata.resourceVersion ? { version: l.metadata.resourceVersion } : {}) };
}

export class LeaseWaveRecords implements WaveRecords {
  readonly identity: string;
  readonly #api: LeaseApi;
  readonly #namespace: string;
  readonly #fieldManager: string;
  readonly #now: () => number;

  constructor(opts: LeaseWaveRecordsOptions) {
    if (!opts.api.watch) throw new Error('the first wave\'s records are followed by a watch: the Lease API given has none');
    this.#api = opts.api;
    this.#namespace = opts.namespace;
    this.identity = opts.identity;
    this.#fieldManager = opts.fieldManager;
    this.#now = opts.now ?? Date.now;
  }

  watch(set: RolloutSet, index: number, onRecord: (r: LandedRecord | null) => void): { close(): Promise<void> } {
    const w = this.#api.watch!(this.#namespace, landedName(set.name, index), {
      object: (l) => onRecord(l ? recordOf(l) : null),
      // Retried inside, paced; the last record seen stays meanwhile.
      failed: () => {},
    });
    return { close: () => w.stop() };
  }

  async write(set: RolloutSet, index: number, update: (current: LandedRecord | null) => LandedRecord): Promise<void> {
    const name = landedName(set.name, index);
    for (let attempt = 0; ; attempt++) {
      const cur = await this.#api.get(this.#namespace, name);
      const before = cur ? recordOf(cur) : null;
      const next = update(before);
      if (before && cur!.spec?.holderIdentity === this.identity && before.images === next.images && before.landed === next.landed) return;
      const annotations = { ...cur?.metadata.annotations, [LANDED_IMAGES_ANNOTATION]: next.images, [LANDED_BITS_ANNOTATION]: next.landed };
      const now = microTime(this.#now());
      try {
        if (cur) {
          const body: LeaseObject = {
            ...cur,
            metadata: { ...leaseMetadata(this.#namespace, set, name, LANDED_SET_LABEL, cur.metadata), annotations },
            spec: { ...cur.spec, holderIdentity: this.identity, renewTime: now },
          };
          await this.#api.replace(this.#namespace, body, this.#fieldManager);
        } else {
          const body: LeaseObject = {
            apiVersion: 'coordination.k8s.io/v1',
            kind: 'Lease',
            metadata: { ...leaseMetadata(this.#namespace, set, name, LANDED_SET_LABEL), annotations },
            spec: { holderIdentity: this.identity, acquireTime: now, renewTime: now },
          };
          await this.#api.create(this.#namespace, body, this.#fieldManager);
        }
        return;
      } catch (e) {
        // Written meanwhile by another member (or taken over): once more on top of it.
        if ((code(e) === 409 || code(e) === 404) && attempt === 0) continue;
        throw e;
      }
    }
  }
}
