// A private CA for a registry on loopback, made with openssl (Debian's
// `openssl`) in a folder: the CA, a serving certificate it signed for
// 127.0.0.1 and localhost, and a client certificate it signed (for a
// registry that asks clients for one). EC P-256 keys: milliseconds each.
import { execFile } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { findBinary } from './components.ts';

const run = promisify(execFile);

export interface PrivateCa {
  /** The CA's certificate (PEM file): what a client must trust. */
  ca: string;
  server: { cert: string; key: string };
  client: { cert: string; key: string };
}

export async function makePrivateCa(dir: string, name = 'pinset-test'): Promise<PrivateCa> {
  const openssl = findBinary('openssl');
  if (!openssl) throw new Error('openssl is not installed (apt-get install openssl)');
  const file = (f: string) => path.join(dir, `${name}-${f}`);
  const key = async (f: string) => {
    await run(openssl, ['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-out', file(f)]);
    return file(f);
  };
  const caKey = await key('ca.key');
  await run(openssl, ['req', '-x509', '-new', '-key', caKey, '-subj', `/CN=${name} private CA`, '-days', '2', '-out', file('ca.crt'), '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  const signed = async (role: string, subject: string, ext: string) => {
    const k = await key(`${role}.key`);
    await writeFile(file(`${role}.ext`), ext);
    await run(openssl, ['req', '-new', '-key', k, '-subj', subject, '-out', file(`${role}.csr`)]);
    await run(openssl, ['x509', '-req', '-in', file(`${role}.csr`), '-CA', file('ca.crt'), '-CAkey', caKey, '-CAcreateserial', '-days', '2', '-out', file(`${role}.crt`), '-extfile', file(`${role}.ext`)]);
    return { cert: file(`${role}.crt`), key: k };
  };
  const server = await signed('server', '/CN=registry', 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n');
  const client = await signed('client', '/CN=puller', 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n');
  return { ca: file('ca.crt'), server, client };
}
