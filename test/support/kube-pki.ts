// Certificates and kubeconfigs for a real kube-apiserver on loopback, made
// with openssl (Debian's `openssl`) in a temporary folder: one CA for
// everything (serving, clients, the ca.crt pods get), the API server's
// serving certificate, a system:masters client for the test and kubectl, the
// kubelet's client certificate (system:node:<name> in group system:nodes, so
// the Node authorizer and NodeRestriction apply to it as on a real node) and
// the service-account key pair that signs the pods' projected tokens.
// EC keys: each takes milliseconds; the API server and kubelet accept them.
import { execFile } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface KubePki {
  dir: string;
  ca: { cert: string; key: string };
  apiserver: { cert: string; key: string };
  admin: { cert: string; key: string };
  kubelet: { cert: string; key: string };
  controllerManager: { cert: string; key: string };
  scheduler: { cert: string; key: string };
  serviceAccount: { key: string; pub: string };
}

async function openssl(args: string[], cwd: string): Promise<void> {
  await run('openssl', args, { cwd });
}

async function ecKey(dir: string, name: string): Promise<string> {
  const file = join(dir, `${name}.key`);
  await openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-out', file], dir);
  return file;
}

async function signed(dir: string, pki: { cert: string; key: string }, name: string, subject: string, ext: string): Promise<{ cert: string; key: string }> {
  const key = await ecKey(dir, name);
  const csr = join(dir, `${name}.csr`);
  const cert = join(dir, `${name}.crt`);
  const extFile = join(dir, `${name}.ext`);
  await writeFile(extFile, ext);
  await openssl(['req', '-new', '-key', key, '-subj', subject, '-out', csr], dir);
  await openssl(['x509', '-req', '-in', csr, '-CA', pki.cert, '-CAkey', pki.key, '-CAcreateserial', '-days', '2', '-out', cert, '-extfile', extFile], dir);
  return { cert, key };
}

/** Makes every key and certificate in `dir`; `nodeName` is the kubelet's identity. */
export async function makeKubePki(dir: string, nodeName: string): Promise<KubePki> {
  const caKey = await ecKey(dir, 'ca');
  const caCert = join(dir, 'ca.crt');
  await openssl(['req', '-x509', '-new', '-key', caKey, '-subj', '/CN=pinset-node-suite-ca', '-days', '2', '-out', caCert, '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir);
  const ca = { cert: caCert, key: caKey };
  const client = 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n';
  const apiserver = await signed(
    dir,
    ca,
    'apiserver',
    '/CN=kube-apiserver',
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n',
  );
  const admin = await signed(dir, ca, 'admin', '/O=system:masters/CN=pinset-node-suite', client);
  const kubelet = await signed(dir, ca, 'kubelet', `/O=system:nodes/CN=system:node:${nodeName}`, client);
  const controllerManager = await signed(dir, ca, 'kube-controller-manager', '/CN=system:kube-controller-manager', client);
  const scheduler = await signed(dir, ca, 'kube-scheduler', '/CN=system:kube-scheduler', client);
  const saKey = join(dir, 'sa.key');
  const saPub = join(dir, 'sa.pub');
  await openssl(['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', saKey], dir);
  await openssl(['pkey', '-in', saKey, '-pubout', '-out', saPub], dir);
  return { dir, ca, apiserver, admin, kubelet, controllerManager, scheduler, serviceAccount: { key: saKey, pub: saPub } };
}

/** A kubeconfig file for `server` with a client certificate. */
export async function writeKubeconfig(file: string, server: string, caCert: string, client: { cert: string; key: string }, user: string): Promise<string> {
  const config = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'node-suite', cluster: { server, 'certificate-authority': caCert } }],
    users: [{ name: user, user: { 'client-certificate': client.cert, 'client-key': client.key } }],
    contexts: [{ name: 'node-suite', context: { cluster: 'node-suite', user } }],
    'current-context': 'node-suite',
  };
  // JSON is YAML: kubectl and the kubelet read it as a kubeconfig.
  await writeFile(file, JSON.stringify(config, null, 2));
  return file;
}
