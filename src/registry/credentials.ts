// Where registry credentials come from. The agent reads one file, its
// --auth-file (the kubelet's config.json). The commands for people look
// where people keep them, in the order podman and skopeo use
// (containers-auth.json(5)), ending with Docker's:
//   --auth-file / REGISTRY_AUTH_FILE (then only that file),
//   $XDG_RUNTIME_DIR/containers/auth.json,
//   $XDG_CONFIG_HOME/containers/auth.json (~/.config/containers/auth.json),
//   $DOCKER_CONFIG/config.json, else ~/.docker/config.json.
// The first file with an entry for the registry wins. Credential helpers
// (credsStore, credHelpers) run other programs and are not supported: log
// in with `podman login --authfile` or put the entry in a file.
import os from 'node:os';
import path from 'node:path';
import type { PullAuth } from '../cri/runtime.ts';
import { AuthFile } from './auth.ts';

export interface CredentialSource {
  /** Credentials for an image at host/path, or undefined for anonymous access. */
  authFor(host: string, path: string): PullAuth | undefined;
  /** Replace every known secret in `text`. */
  scrub(text: string): string;
}

export const ANONYMOUS: CredentialSource = { authFor: () => undefined, scrub: (t) => t };

/** Several auth files; the first with an entry for the registry wins. */
export class AuthFiles implements CredentialSource {
  readonly files: AuthFile[];
  constructor(files: AuthFile[]) {
    this.files = files;
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
  authFor(host: string, p: string): PullAuth | undefined {
    for (const f of this.files) {
      const a = f.authFor(host, p);
      if (a) return a;
    }
    return undefined;
  }
  scrub(text: string): string {
    return this.files.reduce((t, f) => f.scrub(t), text);
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

export async function loadAuthFiles(paths: string[]): Promise<{ credentials: AuthFiles; problems: string[] }> {
  const credentials = new AuthFiles(paths.map((p) => new AuthFile(p)));
  const problems = await credentials.refresh();
  return { credentials, problems };
}
