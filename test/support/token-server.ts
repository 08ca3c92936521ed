// A token service for distribution's `auth: token` (the protocol Docker Hub,
// Quay and Harbor speak: https://distribution.github.io/distribution/spec/auth/token/),
// on 127.0.0.1, for the registry client's bearer-token tests.
//
// distribution 2.8 (registry/auth/token/token.go) accepts a JWT whose
// header carries the signing certificate in `x5c` when that certificate
// chains to one in `rootcertbundle`; a self-signed certificate listed there
// is its own root. It checks `iss` against the configured issuer, `aud`
// against the service, `exp`/`nbf`, and that `access` grants the action on
// the repository. The key and certificate are made with Debian's openssl
// (ES256, P-256), so the test needs no package to build X.509.
import { execFile } from 'node:child_process';
import { randomUUID, sign, X509Certificate, createPrivateKey, type KeyObject } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { findBinary } from './components.ts';

const run = promisify(execFile);

export interface TokenRequest {
  user: string | null;
  service: string | null;
  scope: string | null;
  granted: boolean;
}

export interface TokenServerOptions {
  /** user -> password. */
  users: Record<string, string>;
  /** Who may pull which repository; default: any known user, any repository. Anonymous requests get no access unless allowed here. */
  allow?: (user: string | null, repository: string) => boolean;
  /** Token lifetime in seconds (expires_in). Default 300. */
  ttlSeconds?: number;
}

const b64url = (b: Buffer | string) => Buffer.from(b).toString('base64url');

/** A self-signed P-256 certificate and its key, made with openssl. Returns the file paths. */
export async function makeCertificate(dir: string, commonName: string, altNames: string[] = []): Promise<{ cert: string; key: string }> {
  const openssl = findBinary('openssl');
  if (!openssl) throw new Error('openssl is not installed (apt-get install openssl)');
  const cert = path.join(dir, `${commonName}.crt`);
  const key = path.join(dir, `${commonName}.key`);
  const args = ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', `/CN=${commonName}`];
  if (altNames.length) args.push('-addext', `subjectAltName=${altNames.join(',')}`);
  await run(openssl, args);
  return { cert, key };
}

export class TokenServer {
  readonly service = 'pinset-test-registry';
  readonly issuer = 'pinset-test-token-issuer';
  readonly requests: TokenRequest[] = [];
  readonly dir: string;
  readonly certFile: string;
  private readonly server: http.Server;
  private readonly key: KeyObject;
  private readonly x5c: string;
  private readonly opts: TokenServerOptions;

  private constructor(dir: string, certFile: string, key: KeyObject, certDer: Buffer, opts: TokenServerOptions) {
    this.dir = dir;
    this.certFile = certFile;
    this.key = key;
    this.x5c = certDer.toString('base64');
    this.opts = opts;
    this.server = http.createServer((req, res) => this.handle(req, res));
  }

  static async start(opts: TokenServerOptions): Promise<TokenServer> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-token-'));
    try {
      const { cert, key } = await makeCertificate(dir, 'token-signer');
      const pem = await readFile(cert, 'utf8');
      const server = new TokenServer(dir, cert, createPrivateKey(await readFile(key, 'utf8')), new X509Certificate(pem).raw, opts);
      await new Promise<void>((resolve, reject) => {
        server.server.once('error', reject);
        server.server.listen(0, '127.0.0.1', resolve);
      });
      return server;
    } catch (e) {
      await rm(dir, { recursive: true, force: true });
      throw e;
    }
  }

  get realm(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/token`;
  }

  /** What the registry's config needs. */
  registryConfig() {
    return { realm: this.realm, service: this.service, issuer: this.issuer, rootCertBundle: this.certFile };
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://localhost');
    if (url.pathname !== '/token' || req.method !== 'GET') {
      res.writeHead(404).end();
      return;
    }
    let user: string | null = null;
    const header = req.headers.authorization ?? '';
    if (header.startsWith('Basic ')) {
      const decoded = Buffer.from(header.slice(6), 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      const name = decoded.slice(0, colon);
      if (colon < 0 || this.opts.users[name] !== decoded.slice(colon + 1)) {
        this.requests.push({ user: name, service: url.searchParams.get('service'), scope: url.searchParams.get('scope'), granted: false });
        res.writeHead(401, { 'content-type': 'application/json' }).end(JSON.stringify({ details: 'incorrect username or password' }));
        return;
      }
      user = name;
    }
    const scope = url.searchParams.get('scope');
    const access: { type: string; name: string; actions: string[] }[] = [];
    const allow = this.opts.allow ?? ((u: string | null) => u !== null);
    // scope = repository:<name>:<actions>; the name may itself hold no colon (a port is not part of it).
    const m = scope ? /^repository:([^:]+):([\w,]+)$/.exec(scope) : null;
    if (m && allow(user, m[1]!)) access.push({ type: 'repository', name: m[1]!, actions: m[2]!.split(',').filter((a) => a === 'pull') });
    this.requests.push({ user, service: url.searchParams.get('service'), scope, granted: access.length > 0 });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: this.sign(user ?? '', access), expires_in: this.opts.ttlSeconds ?? 300, issued_at: new Date().toISOString() }));
  }

  /** A token that may push and pull these repositories, for the test's own uploads. */
  adminToken(repositories: string[]): string {
    return this.sign('admin', repositories.map((name) => ({ type: 'repository', name, actions: ['pull', 'push'] })));
  }

  private sign(subject: string, access: { type: string; name: string; actions: string[] }[]): string {
    const now = Math.floor(Date.now() / 1000);
    const ttl = this.opts.ttlSeconds ?? 300;
    const header64 = b64url(JSON.stringify({ typ: 'JWT', alg: 'ES256', x5c: [this.x5c] }));
    const claims = b64url(JSON.stringify({ iss: this.issuer, sub: subject, aud: this.service, exp: now + ttl, nbf: now - 5, iat: now, jti: randomUUID(), access }));
    const signature = sign('sha256', Buffer.from(`${header64}.${claims}`), { key: this.key, dsaEncoding: 'ieee-p1363' });
    return `${header64}.${claims}.${b64url(signature)}`;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await rm(this.dir, { recursive: true, force: true });
  }
}
