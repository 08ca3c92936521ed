// The secrets a registry client knows of, removed from every message it
// keeps (./client.ts scrub()): besides the credential source's own
// (passwords, identity and registry tokens), the bearer tokens token
// services issued to the client, and the values of the headers a source's
// hosts.toml adds (an Authorization header written there is a credential
// too). A registry or a proxy that echoes a request's headers in an error
// body is then harmless.
import type { CredentialSource } from './credentials.ts';
import type { PullSource } from './pull-source.ts';
import { MIN_SCRUBBED_LENGTH, scrubSecrets } from './auth.ts';

/** How many issued bearer tokens are remembered: far more than a client holds live at once (one per registry, scope and credential). */
const ISSUED_TOKENS_KEPT = 1024;

/** A header value, and its credential without the scheme ("Bearer xyz" → "xyz"), each long enough not to be a common word. */
export function secretsOfHeaders(values: readonly string[]): string[] {
  const out = new Set<string>();
  for (const v of values) {
    out.add(v);
    const m = /^[A-Za-z][A-Za-z0-9-]*\s+(\S.*)$/.exec(v);
    if (m) out.add(m[1]!);
  }
  return [...out].filter((s) => s.length >= MIN_SCRUBBED_LENGTH);
}

/** Every secret a registry client knows of, for its messages. */
export class Scrubber {
  readonly #credentials: CredentialSource;
  /** The latest ISSUED_TOKENS_KEPT tokens, oldest first. */
  readonly #tokens = new Set<string>();

  constructor(credentials: CredentialSource) {
    this.#credentials = credentials;
  }

  /** A bearer token a token service issued. */
  addToken(token: string): void {
    this.#tokens.delete(token);
    this.#tokens.add(token);
    if (this.#tokens.size > ISSUED_TOKENS_KEPT) this.#tokens.delete(this.#tokens.values().next().value!);
  }

  /** `text` without the credential source's secrets, any issued token, or any header value of `src`'s hosts.toml. */
  scrub(text: string, src?: PullSource): string {
    const headerValues = Object.values(src?.connection?.header ?? {}).flat();
    return scrubSecrets(this.#credentials.scrub(text), [...this.#tokens, ...secretsOfHeaders(headerValues)]);
  }
}
