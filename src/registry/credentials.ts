// The credential seam: for an image, every credential to try, in the order
// to try them (the kubelet's keyring order, ./keyring.ts), and what went
// wrong getting them. The puller tries each in turn until a pull succeeds,
// the registry client each until a request is let in; with none, the
// image is fetched anonymously. Sources:
// - the agent: a set's pull secrets, then the node's auth file and the
//   kubelet's credential provider plugins (./node-credentials.ts,
//   src/agent/image-credentials.ts);
// - the commands people run (AuthFiles below), which look where people keep
//   credentials, in the order podman and skopeo use (containers-auth.json(5)),
//   ending with Docker's:
//     --auth-file / REGISTRY_AUTH_FILE (then only that file),
//     $XDG_RUNTIME_DIR/containers/auth.json,
//     $XDG_CONFIG_HOME/containers/auth.json (~/.config/containers/auth.json),
//     $DOCKER_CONFIG/config.json, else ~/.docker/config.json;
//   the first file with a credential for the registry wins. In a file, a
//   credHelpers entry for the registry runs that helper (as podman and
//   skopeo do), else its credsStore runs (as docker does), else the
//   file's own entries count.
// No source puts a secret in `from`, in a failure or in an error.
import os from 'node:os';
import path from 'node:path';
import type { PullAuth } from '../cri/runtime.ts';
import { AuthFile, scrubSecrets } from './auth.ts';
import { CredentialHelperError, helperGet } from './docker-credential-helper.ts';
import { Keyring, type Credential } from './keyring.ts';

export type { Credential } from './keyring.ts';

/** The image a lookup is for: where the request goes, and the image as its set names it. */
export interface ImageRef {
  /** The registry (or mirror) host the request goes to, and the path there. */
  host: string;
  path: string;
  /** The image's own repository (host/path before any mirror) and, for one image, its digest: sources that choose by set (pull secrets) read it. */
  origin?: { repository: string; digest?: string };
}

export interface CredentialFailure {
  /** CredentialProviderFailed (a kubelet plugin), CredentialHelperFailed (a docker credential helper). */
  reason: 'CredentialProviderFailed' | 'CredentialHelperFailed';
  /** What failed, e.g. "credential provider ecr-credential-provider". */
  source: string;
  message: string;
}

export interface ImageCredentials {
  /** In the order to try them; empty: anonymous. */
  candidates: Credential[];
  /** Sources that could not say (a plugin that failed): not fatal, the candidates are what the others gave. */
  failures: CredentialFailure[];
}

export interface CredentialSource {
  credentialsFor(image: ImageRef, signal?: AbortSignal): Promise<ImageCredentials>;
  /** Replace every secret this source knows in `text`. */
  scrub(text: string): string;
}

/** "; credential provider X failed: ..." for sources that could not say, so a refusal names its likely cause. */
export function failuresNote(failures: readonly CredentialFailure[]): string {
  return failures.map((f) => `; ${f.message}`).join('');
}

export const ANONYMOUS: CredentialSource = { credentialsFor: async () => ({ candidates: [], failures: [] }), scrub: (t) => t };

/** The in-memory twin: entries keyed as in a docker config, failures by the image they fail for, and a record of what was asked. */
export class MemoryCredentials implements CredentialSource {
  private readonly keyring = new Keyring();
  private readonly failing: { match: (image: string) => boolean; failure: CredentialFailure }[] = [];
  private readonly secrets: string[] = [];
  readonly asked: ImageRef[] = [];

  add(key: string, auth: PullAuth, from = `memory (${key})`): this {
    this.keyring.add([[key, auth]], () => from);
    for (const s of [auth.password, auth.identityToken, auth.registryToken]) if (s) this.secrets.push(s);
    return this;
  }

  fail(match: (image: string) => boolean, failure: CredentialFailure): this {
    this.failing.push({ match, failure });
    return this;
  }

  async credentialsFor(image: ImageRef): Promise<ImageCredentials> {
    this.asked.push(image);
    const repo = `${image.host}/${image.path}`;
    return { candidates: this.keyring.lookup(repo), failures: this.failing.filter((f) => f.match(repo)).map((f) => ({ ...f.failure })) };
  }

  scrub(text: string): string {
    return scrubSecrets(text, this.secrets);
  }
}

/** Several auth files (the commands' lookup; see the top of this file). */
export class AuthFiles implements CredentialSource {
  readonly files: AuthFile[];
  private readonly helperTimeoutMs: number | undefined;
  private readonly env: NodeJS.ProcessEnv | undefined;
  /** Helper answers per (helper, host): a command asks a registry many times. */
  private readonly helperAnswers = new Map<string, Promise<PullAuth | null>>();
  private readonly helperSecrets: string[] = [];

  constructor(files: AuthFile[], opts: { helperTimeoutMs?: number; env?: NodeJS.ProcessEnv } = {}) {
    this.files = files;
    this.helperTimeoutMs = opts.helperTimeoutMs;
    this.env = opts.env;
  }

  /** Re-read every file that changed; problems (unreadable JSON) are reported, never thrown. */
  async refresh(): Promise<string[]> {
    const problems: string[] = [];
    for (const f of this.files) {
      try {
        await f.refresh();
        if (f.problem) problems.push(f.problem);
      } catch (e) {
        problems.push(`${f.path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).name}`);
      }
    }
    return problems;
  }

  async credentialsFor(image: ImageRef): Promise<ImageCredentials> {
    const failures: CredentialFailure[] = [];
    for (const f of this.files) {
      const named = f.helperFor(image.host);
      if (named) {
        const { helper } = named;
        const source = `credential helper docker-credential-${helper} (named in ${f.path})`;
        try {
          const auth = await this.fromHelper(helper, image.host);
          if (auth) return { candidates: [{ auth, from: source }], failures };
        } catch (e) {
          if (!(e instanceof CredentialHelperError)) throw e;
          failures.push({ reason: 'CredentialHelperFailed', source, message: e.message });
        }
        // credHelpers answers for its registry alone; a credsStore that has nothing leaves the file's own entries.
        if (!named.store) continue;
      }
      const candidates = f.lookup(image.host, image.path);
      if (candidates.length > 0) return { candidates, failures };
    }
    return { candidates: [], failures };
  }

  private fromHelper(helper: string, host: string): Promise<PullAuth | null> {
    const key = `${helper}\n${host}`;
    let answer = this.helperAnswers.get(key);
    if (!answer) {
      answer = helperGet(helper, host, { timeoutMs: this.helperTimeoutMs, env: this.env }).then((a) => {
        for (const s of [a?.password, a?.identityToken]) if (s && s.length >= 3) this.helperSecrets.push(s);
        return a;
      });
      this.helperAnswers.set(key, answer);
    }
    return answer;
  }

  scrub(text: string): string {
    return scrubSecrets(
      this.files.reduce((t, f) => f.scrub(t), text),
      this.helperSecrets,
    );
  }
}

/** The files the commands look in, in order (see the top of this file). */
export function authFilePaths(explicit: string | undefined, env: Record<string, string | undefined> = process.env, home = os.homedir()): string[] {
  const given = explicit || env.REGISTRY_AUTH_FILE;
  if (given) return [given];
  const out: string[] = [];
  if (env.XDG_RUNTIME_DIR) out.push(path.join(env.XDG_RUNTIME_DIR, 'containers', 'auth.json'));
  out.push(path.join(env.XDG_CONFIG_HOME || path.join(home, '.config'), 'containers', 'auth.json'));
  out.push(path.join(env.DOCKER_CONFIG || path.join(home, '.docker'), 'config.json'));
  return out;
}

export async function loadAuthFiles(paths: string[], opts: { helperTimeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<{ credentials: AuthFiles; problems: string[] }> {
  const credentials = new AuthFiles(
    paths.map((p) => new AuthFile(p)),
    opts,
  );
  const problems = await credentials.refresh();
  return { credentials, problems };
}
