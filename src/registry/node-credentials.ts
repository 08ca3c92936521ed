// The node's credentials, as the kubelet 1.32 holds them: one keyring of
// the auth file's entries (its ".dockercfg" provider) and of the answers of
// every credential provider plugin whose matchImages match the image, the
// plugins ordered by name as the kubelet orders its registered providers
// (credentialprovider.NewDockerKeyring sorts them by name; ".dockercfg"
// sorts first). The keyring then orders candidates by key, the most
// specific first; among entries of one key, the auth file's come before
// the plugins'. A plugin that fails gives nothing and is reported as a
// failure beside the candidates: the pull goes on with the others, as the
// kubelet's does.
import type { AuthFile } from './auth.ts';
import type { CredentialFailure, CredentialSource, ImageCredentials, ImageRef } from './credentials.ts';
import { CredentialProviderError, type ExecCredentialProvider } from './credential-provider.ts';
import { Keyring } from './keyring.ts';

/** The name the kubelet registers its config.json provider under: it sorts among the plugins' names. */
const AUTH_FILE_PROVIDER = '.dockercfg';

export class NodeCredentials implements CredentialSource {
  readonly authFile: AuthFile | null;
  readonly providers: readonly ExecCredentialProvider[];

  constructor(authFile: AuthFile | null, providers: readonly ExecCredentialProvider[] = []) {
    this.authFile = authFile;
    this.providers = [...providers].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  async credentialsFor(image: ImageRef): Promise<ImageCredentials> {
    const repo = `${image.host}/${image.path}`;
    const asked = this.providers.filter((p) => p.matches(repo));
    if (asked.length === 0) return { candidates: this.authFile?.lookup(image.host, image.path) ?? [], failures: [] };
    const answers = await Promise.all(asked.map((p) => p.provide(repo).then((entries) => ({ p, entries }), (error: unknown) => ({ p, error }))));
    const keyring = new Keyring();
    const failures: CredentialFailure[] = [];
    let fileAdded = false;
    const addFile = () => {
      if (this.authFile && !fileAdded) keyring.add(this.authFile.entries(), (key) => `the auth file ${this.authFile!.path} (entry ${key})`);
      fileAdded = true;
    };
    for (const a of answers) {
      if (a.p.name > AUTH_FILE_PROVIDER) addFile();
      if ('entries' in a) {
        keyring.add(a.entries, () => `credential provider ${a.p.name}`);
        continue;
      }
      const message = a.error instanceof CredentialProviderError ? a.error.message : `credential provider ${a.p.name} failed for ${repo}: ${(a.error as Error)?.message ?? String(a.error)}`;
      failures.push({ reason: 'CredentialProviderFailed', source: `credential provider ${a.p.name}`, message: this.scrub(message) });
    }
    addFile();
    return { candidates: keyring.lookup(repo), failures };
  }

  scrub(text: string): string {
    let out = this.authFile ? this.authFile.scrub(text) : text;
    for (const p of this.providers) for (const s of p.secrets) out = out.split(s).join('[redacted]');
    return out;
  }
}
