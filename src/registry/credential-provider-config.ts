// The kubelet's CredentialProviderConfig (--image-credential-provider-config),
// read and validated as Kubernetes 1.32 reads it
// (pkg/credentialprovider/plugin/config.go): one YAML or JSON document of
// kind CredentialProviderConfig, apiVersion kubelet.config.k8s.io/v1
// (v1beta1 and v1alpha1 too), decoded strictly (an unknown or duplicate
// field is an error), then validated: at least one provider; each with a
// name that is no path ('/', spaces, '.' and '..' refused) and unique, a
// known request apiVersion, at least one matchImages entry, each a URL
// that parses, and a defaultCacheDuration of 0 or more. At start the bin
// folder must exist and hold every provider's executable. Anything wrong
// stops the agent with every problem named, as it stops the kubelet.
//
// tokenAttributes (service-account tokens for plugins) came with
// Kubernetes 1.33; 1.32 refuses it as an unknown field. A provider that
// sets it is read, then skipped with a warning naming it: the agent has no
// pod whose token it could pass.
import { access, constants, stat } from 'node:fs/promises';
import path from 'node:path';
import { parseYamlDocuments } from '../api/yaml.ts';
import { readRegularFile, ReadRefusedError } from '../util/regular-file.ts';
import { parseGoDuration } from './go-duration.ts';
import { parseSchemelessUrl } from './keyring.ts';

export { parseGoDuration };

export const CONFIG_KIND = 'CredentialProviderConfig';
/** A config larger than this is refused unread, as is one that is not a regular file. */
export const CREDENTIAL_PROVIDER_CONFIG_MAX_BYTES = 1024 * 1024;
export const CONFIG_API_VERSIONS = ['kubelet.config.k8s.io/v1', 'kubelet.config.k8s.io/v1beta1', 'kubelet.config.k8s.io/v1alpha1'] as const;
export const PROVIDER_API_VERSIONS = ['credentialprovider.kubelet.k8s.io/v1', 'credentialprovider.kubelet.k8s.io/v1beta1', 'credentialprovider.kubelet.k8s.io/v1alpha1'] as const;

export interface CredentialProviderSpec {
  name: string;
  matchImages: string[];
  /** ms; used when a response names no cacheDuration. 0: not cached. */
  defaultCacheDurationMs: number;
  /** The CredentialProviderRequest/Response apiVersion the plugin speaks. */
  apiVersion: string;
  args: string[];
  env: { name: string; value: string }[];
  /** Set: the provider wants service-account tokens (Kubernetes 1.33+) and is skipped. */
  tokenAttributes?: boolean;
}

export class CredentialProviderConfigError extends Error {
  override name = 'CredentialProviderConfigError';
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A strict decoder's complaints, collected rather than thrown one by one. */
class Decoder {
  readonly errors: string[] = [];
  unknownFields(obj: Record<string, unknown>, known: readonly string[], at: string): void {
    for (const k of Object.keys(obj)) if (!known.includes(k)) this.errors.push(`strict decoding error: unknown field "${at}${k}"`);
  }
  string(v: unknown, field: string): string {
    if (v === undefined || v === null) return '';
    if (typeof v !== 'string') this.errors.push(`${field}: must be a string`);
    return typeof v === 'string' ? v : '';
  }
  strings(v: unknown, field: string): string[] {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v) || v.some((s) => typeof s !== 'string')) {
      this.errors.push(`${field}: must be a list of strings`);
      return [];
    }
    return v as string[];
  }
}

/** The providers of a CredentialProviderConfig document; throws CredentialProviderConfigError listing every problem. */
export function parseCredentialProviderConfig(text: string, file: string): CredentialProviderSpec[] {
  const docs = parseYamlDocuments(text);
  const fail = (problems: string[]) => new CredentialProviderConfigError(`credential provider config ${file}: ${problems.join('; ')}`);
  if (docs.length !== 1) throw fail([docs.length === 0 ? 'the file is empty' : 'one document expected, found several']);
  const d = docs[0]!;
  if ('error' in d) throw fail([d.error]);
  const doc = d.value;
  if (!isObject(doc)) throw fail(['not an object']);
  if (doc.kind !== CONFIG_KIND) throw fail([`kind: must be ${CONFIG_KIND}, not ${JSON.stringify(doc.kind)}`]);
  if (!(CONFIG_API_VERSIONS as readonly unknown[]).includes(doc.apiVersion)) throw fail([`apiVersion: must be one of ${CONFIG_API_VERSIONS.join(', ')}, not ${JSON.stringify(doc.apiVersion)}`]);
  const dec = new Decoder();
  dec.unknownFields(doc, ['apiVersion', 'kind', 'providers'], '');
  const list = doc.providers ?? [];
  if (!Array.isArray(list)) throw fail(['providers: must be a list']);
  const providers: CredentialProviderSpec[] = [];
  const seen = new Set<string>();
  if (list.length === 0) dec.errors.push('providers: Required value: at least 1 item in plugins is required');
  list.forEach((p: unknown, i: number) => {
    const at = `providers[${i}]`;
    if (!isObject(p)) {
      dec.errors.push(`${at}: must be an object`);
      return;
    }
    dec.unknownFields(p, ['name', 'matchImages', 'defaultCacheDuration', 'apiVersion', 'args', 'env', 'tokenAttributes'], `${at}.`);
    const name = dec.string(p.name, `${at}.name`);
    const apiVersion = dec.string(p.apiVersion, `${at}.apiVersion`);
    const matchImages = dec.strings(p.matchImages, `${at}.matchImages`);
    const args = dec.strings(p.args, `${at}.args`);
    const env: { name: string; value: string }[] = [];
    if (p.env !== undefined && p.env !== null) {
      if (!Array.isArray(p.env)) dec.errors.push(`${at}.env: must be a list of {name, value}`);
      else
        p.env.forEach((e: unknown, j: number) => {
          if (!isObject(e)) return void dec.errors.push(`${at}.env[${j}]: must be an object`);
          dec.unknownFields(e, ['name', 'value'], `${at}.env[${j}].`);
          env.push({ name: dec.string(e.name, `${at}.env[${j}].name`), value: dec.string(e.value, `${at}.env[${j}].value`) });
        });
    }
    const named = `${at}.name ${JSON.stringify(name)}`;
    if (name === '') dec.errors.push(`${at}.name: Required value`);
    if (name.includes('/')) dec.errors.push(`${named}: provider name cannot contain '/'`);
    if (name.includes(' ')) dec.errors.push(`${named}: provider name cannot contain spaces`);
    if (name === '.' || name === '..') dec.errors.push(`${named}: provider name cannot be '${name}'`);
    if (seen.has(name)) dec.errors.push(`${named}: Duplicate value`);
    seen.add(name);
    if (apiVersion === '') dec.errors.push(`${at}.apiVersion: Required value: apiVersion is required`);
    else if (!(PROVIDER_API_VERSIONS as readonly string[]).includes(apiVersion)) {
      dec.errors.push(`${at}.apiVersion: Unsupported value: ${JSON.stringify(apiVersion)}: supported values: ${PROVIDER_API_VERSIONS.join(', ')}`);
    }
    if (matchImages.length === 0) dec.errors.push(`${at}.matchImages: Required value: at least 1 item in matchImages is required`);
    for (const m of matchImages) {
      try {
        parseSchemelessUrl(m);
      } catch (e) {
        dec.errors.push(`${at}.matchImages: Invalid value: ${JSON.stringify(m)}: match image is invalid: ${(e as Error).message}`);
      }
    }
    let defaultCacheDurationMs = 0;
    if (p.defaultCacheDuration === undefined || p.defaultCacheDuration === null) {
      dec.errors.push(`${at}.defaultCacheDuration: Required value: defaultCacheDuration is required`);
    } else if (typeof p.defaultCacheDuration !== 'string') {
      dec.errors.push(`${at}.defaultCacheDuration: must be a duration string such as "12h"`);
    } else {
      try {
        defaultCacheDurationMs = parseGoDuration(p.defaultCacheDuration);
        if (defaultCacheDurationMs < 0) dec.errors.push(`${at}.defaultCacheDuration: Invalid value: ${JSON.stringify(p.defaultCacheDuration)}: defaultCacheDuration must be greater than or equal to 0`);
      } catch (e) {
        dec.errors.push(`${at}.defaultCacheDuration: ${(e as Error).message}`);
      }
    }
    const tokenAttributes = p.tokenAttributes !== undefined && p.tokenAttributes !== null;
    providers.push({ name, matchImages, defaultCacheDurationMs, apiVersion, args, env, ...(tokenAttributes ? { tokenAttributes } : {}) });
  });
  if (dec.errors.length > 0) throw fail(dec.errors);
  return providers;
}

/**
 * Reads the config file and checks the bin folder, as the kubelet does at
 * start (RegisterCredentialProviderPlugins): the folder must exist, and
 * each provider's executable `<bin-dir>/<name>` must be there.
 */
export async function loadCredentialProviderConfig(file: string, binDir: string): Promise<CredentialProviderSpec[]> {
  let text: string;
  try {
    text = await readRegularFile(file, { maxBytes: CREDENTIAL_PROVIDER_CONFIG_MAX_BYTES });
  } catch (e) {
    throw new CredentialProviderConfigError(`credential provider config ${file} cannot be read: ${e instanceof ReadRefusedError ? e.message : ((e as NodeJS.ErrnoException).code ?? (e as Error).message)}`);
  }
  const providers = parseCredentialProviderConfig(text, file);
  const dir = await stat(binDir).catch((e: NodeJS.ErrnoException) => e);
  if (dir instanceof Error) throw new CredentialProviderConfigError(`credential provider bin folder ${binDir} ${dir.code === 'ENOENT' ? 'does not exist' : `cannot be read: ${dir.code}`}`);
  if (!dir.isDirectory()) throw new CredentialProviderConfigError(`credential provider bin folder ${binDir} is not a folder`);
  const missing: string[] = [];
  for (const p of providers) {
    if (p.tokenAttributes) continue;
    const bin = path.join(binDir, p.name);
    const st = await stat(bin).catch(() => null);
    const executable = st?.isFile() && (await access(bin, constants.X_OK).then(() => true, () => false));
    if (!executable) missing.push(`plugin binary executable ${bin} did not exist${st ? ' as an executable file' : ''}`);
  }
  if (missing.length > 0) throw new CredentialProviderConfigError(`credential provider config ${file}: ${missing.join('; ')}`);
  return providers;
}
