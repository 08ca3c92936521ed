// A CRI passthrough in front of a real runtime (containerd), on its own unix
// socket. Every call of the CRI subset in proto/cri-image.proto is forwarded
// byte for byte (unknown fields survive); on the way it records which image
// calls it saw with which ImageSpec.runtime_handler, and it can answer for a
// runtime that does not support a handler by rejecting calls naming it.
// containerd 1.6 ignores runtime_handler, so this is how the e2e tests see
// that the handler reaches the runtime, and how a runtime's refusal looks.
// It can also name the runtime otherwise in Version, for what the agent
// chooses by the runtime's name.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { LOADER_OPTIONS, PROTO_PATH } from './cri-proto.ts';


export interface RecordedCall {
  /** Method name as on the wire, e.g. PullImage. */
  method: string;
  /** ImageSpec.image of the request ('' when the call has none). */
  image: string;
  /** ImageSpec.runtime_handler of the request ('' when unset). */
  runtimeHandler: string;
  /** Whether the call carried an AuthConfig with any field set (never its values). */
  hasAuth: boolean;
  /** gRPC status code the caller got (0 = OK). */
  code: number;
}

export interface HandlerRejection {
  code: grpc.status;
  details: string;
  /** Methods that refuse the handler. Default: every call naming an image. */
  methods?: string[];
}

const identity = (b: Buffer): Buffer => b;

export class CriProxy {
  readonly dir: string;
  readonly socket: string;
  readonly upstream: string;
  readonly calls: RecordedCall[] = [];
  readonly #server: grpc.Server;
  readonly #client: grpc.Client;
  readonly #rejections = new Map<string, HandlerRejection>();
  /** Version answers with this runtime name instead of the runtime's own. */
  runtimeName: string | undefined;

  private constructor(dir: string, upstream: string) {
    this.dir = dir;
    this.socket = path.join(dir, 'cri-proxy.sock');
    this.upstream = upstream;
    this.#server = new grpc.Server();
    this.#client = new grpc.Client(upstream, grpc.credentials.createInsecure());
  }

  /** Listens on a new unix socket in a temp folder and forwards to `upstream` (unix:///...). */
  static async start(upstream: string): Promise<CriProxy> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-criproxy-'));
    const proxy = new CriProxy(dir, upstream);
    try {
      proxy.#registerAll();
      await new Promise<void>((resolve, reject) =>
        proxy.#server.bindAsync(proxy.endpoint, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())),
      );
      return proxy;
    } catch (err) {
      await proxy.stop();
      throw err;
    }
  }

  get endpoint(): string {
    return `unix://${this.socket}`;
  }

  /** Refuse calls whose ImageSpec names this runtime handler, as a runtime without it would. */
  rejectHandler(handler: string, rejection: HandlerRejection): void {
    this.#rejections.set(handler, rejection);
  }

  allowHandler(handler: string): void {
    this.#rejections.delete(handler);
  }

  /** Recorded calls of one method. */
  callsOf(method: string): RecordedCall[] {
    return this.calls.filter((c) => c.method === method);
  }

  clear(): void {
    this.calls.length = 0;
  }

  #registerAll(): void {
    const definition = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    for (const entry of Object.values(definition)) {
      // Services are the entries whose values are method maps (have requestStream).
      if (!entry || typeof entry !== 'object' || 'format' in entry) continue;
      for (const method of Object.values(entry as Record<string, protoLoader.MethodDefinition<object, object>>)) {
        if (typeof method !== 'object' || method === null || !('path' in method) || method.requestStream || method.responseStream) continue;
        this.#registerUnary(method);
      }
    }
  }

  #registerUnary(method: protoLoader.MethodDefinition<object, object>): void {
    const methodName = method.path.split('/').pop() ?? method.path;
    const handler: grpc.handleUnaryCall<Buffer, Buffer> = (call, callback) => {
      const req = method.requestDeserialize(call.request) as {
        image?: { image?: string; runtimeHandler?: string } | null;
        filter?: { image?: { image?: string; runtimeHandler?: string } | null } | null;
        auth?: Record<string, unknown> | null;
      };
      const spec = req.image ?? req.filter?.image ?? null;
      const record: RecordedCall = {
        method: methodName,
        image: spec?.image ?? '',
        runtimeHandler: spec?.runtimeHandler ?? '',
        hasAuth: !!req.auth && Object.values(req.auth).some((v) => typeof v === 'string' && v !== ''),
        code: grpc.status.OK,
      };
      this.calls.push(record);

      const rejection = record.runtimeHandler ? this.#rejections.get(record.runtimeHandler) : undefined;
      if (rejection && spec && (!rejection.methods || rejection.methods.includes(methodName))) {
        record.code = rejection.code;
        callback({ code: rejection.code, details: rejection.details });
        return;
      }

      const deadline = call.getDeadline();
      const forwarded = this.#client.makeUnaryRequest(
        method.path,
        identity,
        identity,
        call.request,
        call.metadata,
        deadline === Infinity ? {} : { deadline },
        (err, res) => {
          if (err) {
            record.code = err.code;
            callback({ code: err.code, details: err.details, metadata: err.metadata });
          } else if (methodName === 'Version' && this.runtimeName !== undefined && res) {
            const version = method.responseDeserialize(res) as { runtimeName?: string };
            callback(null, method.responseSerialize({ ...version, runtimeName: this.runtimeName }));
          } else {
            callback(null, res);
          }
        },
      );
      call.on('cancelled', () => forwarded.cancel());
    };
    this.#server.register(method.path, handler, identity, identity, 'unary');
  }

  /** Closes the listener and the upstream channel, removes the socket folder. */
  async stop(): Promise<void> {
    this.#server.forceShutdown();
    this.#client.close();
    await rm(this.dir, { recursive: true, force: true });
  }
}
