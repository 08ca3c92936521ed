// Text cut to a size in bytes, as the node status bounds its messages.

/** Cut to at most `max` bytes of UTF-8 without splitting a character ("..." marks the cut). */
export function cutBytes(s: string, max: number): string {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= max) return s;
  let end = Math.max(0, max - 3);
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8') + '...';
}
