// The download progress seam on containerd's Content service
// (src/containerd/content.ts), over an in-memory Content service that
// answers as containerd's does (its ingests' refs as remotes.MakeRefKey
// makes them, `expected` left empty by the local store; Info NOT_FOUND for
// a blob it does not hold). The same client against real containerd 1.7 and
// 2.1 during a slow pull: test/e2e/containerd-content.test.ts.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { COPY_BUFFER_BYTES, ContentDownloads, ingestBytes, ingestDigest, type ContainerdContent, type Ingest } from '../../src/containerd/content.ts';
import { RuntimeError } from '../../src/cri/runtime.ts';

const D = (c: string) => `sha256:${c.repeat(64)}`;

class MemoryContent implements Pick<ContainerdContent, 'listStatuses' | 'info' | 'close'> {
  ingests: Ingest[] = [];
  committed = new Map<string, number>();
  fail: RuntimeError | undefined;
  lists = 0;
  infos: string[] = [];
  async listStatuses(): Promise<Ingest[]> {
    this.lists++;
    if (this.fail) throw this.fail;
    return this.ingests.map((i) => ({ ...i }));
  }
  async info(digest: string): Promise<{ digest: string; size: number } | null> {
    this.infos.push(digest);
    const size = this.committed.get(digest);
    return size === undefined ? null : { digest, size };
  }
  close(): void {}
  /** A blob being written; without times, only its offset counts. */
  writing(digest: string, offset: number, total: number, times: { startedAt: number; updatedAt: number } = { startedAt: 0, updatedAt: 0 }): void {
    this.ingests = this.ingests.filter((i) => i.digest !== digest);
    this.ingests.push({ ref: `layer-${digest}`, digest, offset, total, ...times });
  }
  commit(digest: string): void {
    const i = this.ingests.find((x) => x.digest === digest)!;
    this.ingests = this.ingests.filter((x) => x !== i);
    this.committed.set(digest, i.total);
  }
}

describe('ingestDigest', () => {
  test("the blob is `expected` when containerd gives it, else the digest the ref ends with; nothing for a ref that names none", () => {
    assert.equal(ingestDigest(`layer-${D('a')}`, ''), D('a'));
    assert.equal(ingestDigest(`config-${D('b')}`, ''), D('b'));
    assert.equal(ingestDigest(`manifest-registry.test/app@${D('c')}`, ''), D('c'));
    assert.equal(ingestDigest('anything', D('d')), D('d'));
    assert.equal(ingestDigest(`layer-sha512:${'e'.repeat(128)}`, ''), `sha512:${'e'.repeat(128)}`);
    assert.equal(ingestDigest('upload-1234', ''), undefined);
    assert.equal(ingestDigest(`layer-${D('a')}x`, 'not-a-digest'), undefined);
  });
});

describe('ingestBytes', () => {
  const MiB = COPY_BUFFER_BYTES;
  test("a blob's offset, and what containerd's 1 MiB copy buffer holds since the last write at the rate it arrived so far, never more than the buffer", () => {
    // 2 MiB written in the 4 s since it started, the last write 1 s ago: half a MiB in the buffer.
    const i = { offset: 2 * MiB, startedAt: 10_000, updatedAt: 14_000 };
    assert.equal(ingestBytes(i, 15_000), 2.5 * MiB);
    assert.equal(ingestBytes(i, 14_000), 2 * MiB, 'just written: nothing buffered');
    assert.equal(ingestBytes(i, 60_000), 3 * MiB, 'stalled: at most the buffer');
    assert.equal(ingestBytes(i, 13_000), 2 * MiB, 'a clock behind the last write counts nothing more');
    // The next write adds a full buffer (or the blob's last bytes, then committed): the count never goes back.
    assert.ok(ingestBytes(i, 15_999) <= ingestBytes({ ...i, offset: 3 * MiB, updatedAt: 16_000 }, 16_000));
    assert.equal(ingestBytes({ offset: 0, startedAt: 10_000, updatedAt: 10_000 }, 20_000), 0, 'before the first write the rate is not known');
    assert.equal(ingestBytes({ offset: MiB, startedAt: 0, updatedAt: 0 }, 20_000), MiB, 'without times, the offset');
  });
});

describe('ContentDownloads', () => {
  const blobs = new Map([[D('1'), 1000], [D('2'), 500], [D('3'), 10]]);

  test('a blob being written counts its offset (never past its size); one committed since the last read counts whole, told by one Info; other ingests are ignored', async () => {
    const content = new MemoryContent();
    const d = new ContentDownloads(content);
    content.writing(D('1'), 400, 1000);
    content.writing(D('9'), 77, 100); // another pull's blob
    assert.deepEqual(await d.arrived(blobs), new Map([[D('1'), 400]]));
    content.writing(D('1'), 900, 1000);
    content.writing(D('2'), 600, 500);
    assert.deepEqual(await d.arrived(blobs), new Map([[D('1'), 900], [D('2'), 500]]));
    assert.deepEqual(content.infos, [], 'no Info while blobs are being written');
    content.commit(D('1'));
    assert.deepEqual(await d.arrived(blobs), new Map([[D('1'), 1000], [D('2'), 500]]));
    assert.deepEqual(content.infos, [D('1')]);
    await d.arrived(blobs);
    assert.deepEqual(content.infos, [D('1')], 'a committed blob is not asked about again');
  });

  test('a blob dropped (the pull failed) counts nothing; a blob never seen being written is not asked about', async () => {
    const content = new MemoryContent();
    const d = new ContentDownloads(content);
    content.writing(D('2'), 300, 500);
    assert.deepEqual(await d.arrived(blobs), new Map([[D('2'), 300]]));
    content.ingests = [];
    assert.deepEqual(await d.arrived(blobs), new Map());
    assert.deepEqual(content.infos, [D('2')], 'D3, never seen, cost no Info');
    await d.arrived(blobs);
    assert.deepEqual(content.infos, [D('2')], 'nor does D2 again');
  });

  test('a failed read answers what the last one said, and is said; a socket with no Content service is asked once', async () => {
    const problems: string[] = [];
    const content = new MemoryContent();
    const d = new ContentDownloads(content, (what) => problems.push(what));
    content.writing(D('1'), 400, 1000);
    await d.arrived(blobs);
    content.fail = new RuntimeError('Unavailable', 'Content.ListStatuses: UNAVAILABLE: connection refused', 14);
    assert.deepEqual(await d.arrived(blobs), new Map([[D('1'), 400]]));
    assert.match(problems[0]!, /what it said last/);
    content.fail = new RuntimeError('Other', 'Content.ListStatuses: UNIMPLEMENTED: unknown service containerd.services.content.v1.Content', 12);
    assert.deepEqual(await d.arrived(blobs), new Map());
    assert.match(problems[1]!, /images count when they land/);
    const asked = content.lists;
    content.fail = undefined;
    assert.deepEqual(await d.arrived(blobs), new Map());
    assert.equal(content.lists, asked, 'not asked again');
  });

  test('nothing asked about, nothing asked', async () => {
    const content = new MemoryContent();
    assert.deepEqual(await new ContentDownloads(content).arrived(new Map()), new Map());
    assert.equal(content.lists, 0);
  });
});

test("ContentDownloads counts a blob's buffered part on the agent's clock, and never past the blob's size", async () => {
  const content = new MemoryContent();
  let now = 15_000;
  const d = new ContentDownloads(content, () => {}, () => now);
  content.writing(D('1'), 2 * COPY_BUFFER_BYTES, 3 * COPY_BUFFER_BYTES, { startedAt: 10_000, updatedAt: 14_000 });
  const sizes = new Map([[D('1'), 2.2 * COPY_BUFFER_BYTES]]);
  assert.deepEqual(await d.arrived(new Map([[D('1'), 3 * COPY_BUFFER_BYTES]])), new Map([[D('1'), 2.5 * COPY_BUFFER_BYTES]]));
  now = 60_000;
  assert.deepEqual(await d.arrived(sizes), new Map([[D('1'), 2.2 * COPY_BUFFER_BYTES]]));
});
