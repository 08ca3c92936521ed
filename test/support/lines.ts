// Reads a stream of newline-separated records (a watch's event lines) one
// whole line at a time, however the chunks split them.
import type { Readable } from 'node:stream';

/** Calls `onLine` for each complete, non-empty line of `stream`, in order. */
export function onLines(stream: Readable, onLine: (line: string) => void): void {
  stream.setEncoding('utf8');
  let partial = '';
  stream.on('data', (chunk: string) => {
    partial += chunk;
    let nl: number;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      if (line) onLine(line);
    }
  });
}
