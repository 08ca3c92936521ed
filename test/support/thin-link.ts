// A thin link to a registry, on loopback: an HTTP forwarder whose only way
// to the registry is a shaped pipe. Every byte it forwards, in either
// direction, waits for tokens from one bucket per direction, filled at the
// link's rate (a token bucket, as a router's policer or `tc tbf` shapes a
// WAN link): concurrent transfers share the rate, and a reader that wants
// more waits, so the sender is slowed by TCP's own backpressure.
//
// Each request goes to the registry on a TCP connection of its own, so its
// bytes on the wire in both directions (request line, headers and body up;
// status line, headers and body down) are read exactly off that socket and
// kept per request, with the client's User-Agent: a pull-through cache's
// fetches and a runtime's own can be told apart.
//
// hold() stops the link, or the transfers it picks (no body byte passes
// until release()), to catch every node asking at the same moment.
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Transform, type TransformCallback } from 'node:stream';

/** One request that crossed the link. */
export interface LinkTransfer {
  method: string;
  path: string;
  /** The registry's answer; 0 until it came (502 when it never did). */
  status: number;
  userAgent: string;
  /** Bytes towards the registry on the wire: request line, headers, body. */
  bytesUp: number;
  /** Bytes from the registry on the wire: status line, headers, body. */
  bytesDown: number;
  /** ms since the epoch. */
  startedAt: number;
  endedAt?: number;
}

/**
 * Tokens are bytes. `take(n)` resolves once n bytes may pass; waiters are
 * served first come, first served, so concurrent transfers share the rate.
 * `burst` bounds what an idle link saves up.
 */
export class TokenBucket {
  readonly bytesPerSecond: number;
  readonly burst: number;
  #tokens: number;
  #last = performance.now();
  readonly #queue: { n: number; resolve: () => void }[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(bytesPerSecond: number, burst: number) {
    if (!(bytesPerSecond > 0)) throw new Error(`a link needs a rate above 0, not ${bytesPerSecond}`);
    this.bytesPerSecond = bytesPerSecond;
    this.burst = burst;
    this.#tokens = burst;
  }

  take(n: number): Promise<void> {
    if (n > this.burst) throw new Error(`take(${n}): more than the burst (${this.burst}) can never pass at once; split it`);
    return new Promise((resolve) => {
      this.#queue.push({ n, resolve });
      this.#pump();
    });
  }

  #refill(): void {
    const now = performance.now();
    this.#tokens = Math.min(this.burst, this.#tokens + ((now - this.#last) * this.bytesPerSecond) / 1000);
    this.#last = now;
  }

  #pump(): void {
    this.#refill();
    while (this.#queue.length > 0 && this.#tokens >= this.#queue[0]!.n) {
      const w = this.#queue.shift()!;
      this.#tokens -= w.n;
      w.resolve();
    }
    if (this.#queue.length === 0 || this.#timer) return;
    const wait = Math.max(1, Math.ceil(((this.#queue[0]!.n - this.#tokens) * 1000) / this.bytesPerSecond));
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#pump();
    }, wait);
  }

  close(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}

/** A stream that lets its bytes through as `pass` allows, in pieces of at most `piece` bytes. */
class Shaped extends Transform {
  readonly #pass: (n: number) => Promise<void>;
  readonly #piece: number;

  constructor(pass: (n: number) => Promise<void>, piece: number) {
    super();
    this.#pass = pass;
    this.#piece = piece;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    void (async () => {
      for (let at = 0; at < chunk.length; at += this.#piece) {
        const part = chunk.subarray(at, at + this.#piece);
        await this.#pass(part.length);
        if (this.destroyed) return;
        this.push(part);
      }
      done();
    })();
  }
}

export interface ThinLinkOptions {
  /** The registry behind the link: http://host:port. */
  target: string;
  /** The link's rate in each direction, bits per second. */
  bitsPerSecond: number;
}

export class ThinLink {
  readonly transfers: LinkTransfer[] = [];
  readonly #server: http.Server;
  readonly #target: URL;
  readonly #down: TokenBucket;
  readonly #up: TokenBucket;
  /** Upstream sockets of transfers still running, to read their counts so far. */
  readonly #open = new Map<LinkTransfer, Socket>();
  readonly #piece: number;
  #hold: { match: (t: LinkTransfer) => boolean; released: Promise<void>; release: () => void } | undefined;

  private constructor(opts: ThinLinkOptions) {
    this.#target = new URL(opts.target);
    const bytesPerSecond = opts.bitsPerSecond / 8;
    // 50 ms of the rate, at least 64 KiB: a busy event loop that wakes late
    // loses little, and an idle link lends no more than a router's queue would.
    const burst = Math.max(64 * 1024, Math.round(bytesPerSecond / 20));
    this.#down = new TokenBucket(bytesPerSecond, burst);
    this.#up = new TokenBucket(bytesPerSecond, burst);
    this.#piece = Math.min(16 * 1024, burst);
    this.#server = http.createServer((req, res) => this.#forward(req, res));
  }

  static async start(opts: ThinLinkOptions): Promise<ThinLink> {
    const link = new ThinLink(opts);
    await new Promise<void>((resolve, reject) => {
      link.#server.once('error', reject);
      link.#server.listen(0, '127.0.0.1', resolve);
    });
    return link;
  }

  #forward(req: http.IncomingMessage, res: http.ServerResponse): void {
    const t: LinkTransfer = {
      method: req.method ?? '',
      path: req.url ?? '',
      status: 0,
      userAgent: String(req.headers['user-agent'] ?? ''),
      bytesUp: 0,
      bytesDown: 0,
      startedAt: Date.now(),
    };
    this.transfers.push(t);
    let finished = false;
    const finish = (socket: Socket | undefined) => {
      if (finished) return;
      finished = true;
      if (socket) {
        t.bytesUp = socket.bytesWritten;
        t.bytesDown = socket.bytesRead;
      }
      t.endedAt = Date.now();
      this.#open.delete(t);
    };
    // agent: false, one connection per request: its socket's counts are this request's bytes.
    const upstream = http.request({
      host: this.#target.hostname,
      port: this.#target.port,
      method: req.method,
      path: req.url,
      headers: { ...req.headers, host: this.#target.host },
      agent: false,
    });
    upstream.on('socket', (s) => {
      this.#open.set(t, s);
      s.once('close', () => finish(s));
    });
    upstream.on('response', (up) => {
      t.status = up.statusCode ?? 0;
      res.writeHead(up.statusCode ?? 502, up.headers);
      up.pipe(new Shaped((n) => this.#pass(t, this.#down, n), this.#piece)).pipe(res);
    });
    upstream.on('error', (e) => {
      if (t.status === 0) t.status = 502;
      if (!res.headersSent) {
        res.writeHead(502);
        res.end(String(e));
      } else res.destroy();
    });
    // A client that goes away (a cancelled pull) ends the transfer on the link too.
    res.on('close', () => {
      if (!res.writableFinished) upstream.destroy();
    });
    req.pipe(new Shaped((n) => this.#pass(t, this.#up, n), this.#piece)).pipe(upstream);
  }

  /** Resolves when `n` bytes of `t` may cross: not while the link holds it, then as the bucket allows. */
  async #pass(t: LinkTransfer, bucket: TokenBucket, n: number): Promise<void> {
    while (this.#hold?.match(t)) await this.#hold.released;
    await bucket.take(n);
  }

  /** http://127.0.0.1:<port>: the registry, as seen across the link. */
  get url(): string {
    return `http://${this.hostPort}`;
  }

  get hostPort(): string {
    return `127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  get bitsPerSecond(): number {
    return this.#down.bytesPerSecond * 8;
  }

  /** Bytes from the registry so far, transfers still running included. */
  egressBytes(): number {
    let sum = 0;
    for (const t of this.transfers) sum += this.#open.get(t)?.bytesRead ?? t.bytesDown;
    return sum;
  }

  /** Bytes towards the registry so far, transfers still running included. */
  ingressBytes(): number {
    let sum = 0;
    for (const t of this.transfers) sum += this.#open.get(t)?.bytesWritten ?? t.bytesUp;
    return sum;
  }

  /** Transfers still running. */
  get inFlight(): number {
    return this.#open.size;
  }

  /** GETs of one blob (by digest) that crossed the link. */
  blobGets(digest: string): LinkTransfer[] {
    return this.transfers.filter((t) => t.method === 'GET' && t.path.includes(`/blobs/${digest}`));
  }

  /**
   * Until release(), no body byte of the transfers `match` picks (every one
   * by default) crosses, in either direction: they wait, as on a link that
   * stalls. Their requests still reach the registry.
   */
  hold(match: (t: LinkTransfer) => boolean = () => true): void {
    this.release();
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    this.#hold = { match, released, release };
  }

  release(): void {
    const h = this.#hold;
    this.#hold = undefined;
    h?.release();
  }

  /** Forget the transfers so far, those still running too: counting starts again from here. */
  reset(): void {
    this.transfers.length = 0;
  }

  async stop(): Promise<void> {
    this.release();
    this.#server.closeAllConnections();
    for (const s of this.#open.values()) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
    this.#down.close();
    this.#up.close();
  }
}
