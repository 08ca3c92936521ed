// Docker credential helpers (docker-credential-helpers' protocol), for the
// commands people run, as podman, skopeo and docker run them:
// `docker-credential-<name> get` found on PATH, the registry's host on
// stdin, {"ServerURL", "Username", "Secret"} on stdout; "credentials not
// found" (exit 1) means none; a Username of "<token>" makes the Secret an
// identity token. Bounded like a credential provider plugin
// (../util/bounded-exec.ts): a helper that hangs (a locked keychain waiting
// for a prompt nobody sees) is killed with its process group and is a
// failure of that helper, never a hung command. The agent runs none: the
// kubelet never does.
import type { PullAuth } from '../cri/runtime.ts';
import { runBounded } from '../util/bounded-exec.ts';

export const HELPER_TIMEOUT_MS = 30_000;

export class CredentialHelperError extends Error {
  override name = 'CredentialHelperError';
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The credential `docker-credential-<helper> get` holds for `server`, null when it has none. Throws CredentialHelperError. */
export async function helperGet(helper: string, server: string, opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<PullAuth | null> {
  const program = `docker-credential-${helper}`;
  // The name comes from a config file: a path in it would run something else than a helper on PATH.
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(helper)) throw new CredentialHelperError(`the credential helper name ${JSON.stringify(helper.slice(0, 100))} is not a plain program name`);
  const run = await runBounded(program, ['get'], { input: server, env: opts.env, timeoutMs: opts.timeoutMs ?? HELPER_TIMEOUT_MS, maxStdoutBytes: 1 << 20 });
  const out = run.stdout.toString('utf8');
  if (run.failure?.startsWith('could not be started')) throw new CredentialHelperError(`${program} ${run.failure.includes('ENOENT') ? 'is not on PATH' : run.failure}`);
  if (run.failure) throw new CredentialHelperError(`${program} ${run.failure}`);
  if (run.code !== 0) {
    // docker-credential-helpers' credentials.ErrCredentialsNotFound, printed on stdout.
    if (/credentials not found/i.test(out)) return null;
    // Its stderr and stdout may echo what it was handling: only the status is told.
    throw new CredentialHelperError(`${program} get exited with status ${run.code ?? run.signal}`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(out);
  } catch {
    throw new CredentialHelperError(`${program} get printed something that is not JSON`);
  }
  if (!isObject(doc) || typeof doc.Secret !== 'string' || (doc.Username !== undefined && typeof doc.Username !== 'string')) {
    throw new CredentialHelperError(`${program} get printed JSON without a Username and Secret`);
  }
  if (!doc.Secret) return null;
  if (doc.Username === '<token>') return { identityToken: doc.Secret };
  return { username: (doc.Username as string) || undefined, password: doc.Secret };
}
