// One gRPC channel to a runtime's unix socket, shared by every unary call a
// client makes on it (CRI's services; containerd's own Images service, on
// the same socket), with the reconnect policy both need.
import * as grpc from '@grpc/grpc-js';
import { classifyGrpcError } from './classify.ts';
import type { UnaryMethod } from './wire.ts';

/** Normalise "unix:///path", "/path" and "unix:/path" to a target grpc-js accepts. */
export function criTarget(endpoint: string): string {
  if (endpoint.startsWith('/')) return `unix://${endpoint}`;
  if (endpoint.startsWith('unix:') && !endpoint.startsWith('unix://')) return `unix://${endpoint.slice(5)}`;
  return endpoint;
}

/** The file path of a unix-socket endpoint ("unix:///run/x.sock", "/run/x.sock"), or null for anything else. */
export function unixSocketPath(endpoint: string): string | null {
  const t = criTarget(endpoint);
  return t.startsWith('unix://') ? t.slice('unix://'.length) : null;
}

/** One grpc-js client, and the calls running on it. */
interface Connection {
  client: grpc.Client;
  inflight: number;
  /** A call on it failed because the runtime could not be reached. */
  broken: boolean;
}

export interface UnaryCallOptions {
  /** No deadline when undefined (a pull: slow is not stuck). */
  deadlineMs?: number;
  signal?: AbortSignal;
  metadata?: Record<string, string>;
  /** The call's name in errors, e.g. "PullImage" or "Images.Update"; default the method's path. */
  label?: string;
}

export class RuntimeChannel {
  readonly endpoint: string;
  private conn: Connection;

  constructor(endpoint: string) {
    this.endpoint = endpoint;
    this.conn = this.connect();
  }

  private connect(): Connection {
    const options: grpc.ChannelOptions = {
      // Large ListImages answers (thousands of images) exceed the 4 MiB default.
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
      // grpc-js shares one connection among every client of a target with
      // the same options: a fresh channel after an outage would inherit the
      // old connection's reconnect backoff from any other client of the
      // socket (CRI's and the Images service's are two). Its own pool makes
      // a fresh channel connect at once.
      'grpc.use_local_subchannel_pool': 1,
    };
    return { client: new grpc.Client(criTarget(this.endpoint), grpc.credentials.createInsecure(), options), inflight: 0, broken: false };
  }

  /**
   * The connection for the next call. After the runtime could not be
   * reached, grpc-js keeps failing calls at once with the last error until
   * its own reconnect backoff (up to 2 min) runs out, so a runtime that came
   * back would go unnoticed that long: the next call after such a failure
   * gets a fresh channel, which connects right away. The agent paces those
   * calls itself. The old channel closes once its calls are done.
   */
  private current(): Connection {
    if (this.conn.broken) {
      const old = this.conn;
      this.conn = this.connect();
      if (old.inflight === 0) old.client.close();
    }
    return this.conn;
  }

  /** One unary call; failures are RuntimeErrors (./classify.ts). */
  call<T>(method: UnaryMethod, req: object, opts: UnaryCallOptions = {}): Promise<T> {
    const conn = this.current();
    const { signal } = opts;
    const metadata = new grpc.Metadata();
    for (const [k, v] of Object.entries(opts.metadata ?? {})) metadata.set(k, v);
    conn.inflight++;
    return new Promise<T>((resolve, reject) => {
      const callOpts: grpc.CallOptions = opts.deadlineMs ? { deadline: Date.now() + opts.deadlineMs } : {};
      const call = conn.client.makeUnaryRequest(method.path, method.serialize, method.deserialize, req, metadata, callOpts, (err, res) => {
        signal?.removeEventListener('abort', onAbort);
        conn.inflight--;
        if (err && err.code === grpc.status.UNAVAILABLE) conn.broken = true;
        if (conn !== this.conn && conn.inflight === 0) conn.client.close();
        if (err) reject(classifyGrpcError(err, opts.label ?? method.path));
        else resolve(res as T);
      });
      const onAbort = () => call.cancel();
      if (signal) {
        if (signal.aborted) call.cancel();
        else signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  close(): void {
    this.conn.client.close();
  }
}
