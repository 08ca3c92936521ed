// A logger whose JSON lines are kept in memory, for tests that assert on
// what was logged.
import { Writable } from 'node:stream';
import { createLogger, type Logger } from '../../src/util/log.ts';

export function captureLogs(level = 'info'): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.trim()) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: createLogger({ level, destination: sink }), lines };
}
