// Bounded concurrency for many independent calls: a thousand calls started
// at once hold a thousand requests, their buffers and their callbacks at the
// same moment (a thousand CRI calls at once cost the agent about 20 MB of
// peak memory, BENCHMARKS.md, footprint).

/** Run `fn` over `items` with at most `limit` at once; results in input order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(Math.max(1, limit), items.length) }, worker));
  return out;
}
