// Presence by name on a real containerd: an image counts as in place only
// when the runtime holds it under the set's own reference. containerd 1.6
// records both the tag and the digest reference when it pulls by tag, so a
// set naming that digest needs no pull; an index pulled by its index digest
// is held under that digest only, so a set naming the platform manifest gets
// a PullImage, which downloads no layer. containerd 1.6 reports no pins: with
// CRI-O's drop-in as the pin backend (--pin-backend crio) the agent says so
// once and does not wait for reloads.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import { requireComponents, missingComponents, type ComponentName } from '../support/components.ts';
import { Containerd, CriClient } from '../support/containerd.ts';
import { CountingProxy } from '../support/counting-proxy.ts';
import { buildImage, layerOf, nodePlatform, pushBlob, pushManifest, pushMultiArch } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { runAgentOnce } from '../support/agent-process.ts';

const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry'];

describe('presence by name on containerd', () => {
  let registry: Registry;
  let proxy: CountingProxy;
  let containerd: Containerd;
  let cri: CriClient;
  let work: string;
  let ready = false;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return;
    registry = await Registry.start();
    proxy = await CountingProxy.start(registry.url);
    containerd = await Containerd.start({ mirrors: { 'registry.test': `http://${proxy.hostPort}` } });
    cri = new CriClient(containerd.endpoint);
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-names-'));
    ready = true;
  });
  after(async () => {
    cri?.close();
    await containerd?.stop();
    await proxy?.stop();
    await registry?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  async function once(name: string, refs: string[]) {
    const dir = path.join(work, name);
    await mkdir(path.join(dir, 'sets.d'), { recursive: true });
    await mkdir(path.join(dir, 'crio.conf.d'), { recursive: true });
    const set = { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((r) => ({ name: r })) } };
    await writeFile(path.join(dir, 'sets.d', 'set.yaml'), dumpYaml(set));
    return runAgentOnce([
      '--node-name', 'e2e-node',
      '--static-dir', path.join(dir, 'sets.d'),
      '--cri-endpoint', containerd.endpoint,
      '--crio-dropin-dir', path.join(dir, 'crio.conf.d'),
      '--state-dir', path.join(dir, 'state'),
      '--reload', 'none',
      '--pin-backend', 'crio',
      '--auth-file', path.join(dir, 'none.json'),
    ]);
  }

  test('pulled by tag, wanted by digest: containerd holds both names, no pull', async (t) => {
    if (!ready && !requireComponents(t, NEEDS)) return;
    const image = buildImage([layerOf([{ name: 'f.txt', data: Buffer.from(`tagged ${Date.now()}\n`) }])], nodePlatform(), 'names/tagged');
    for (const b of [...image.layers, image.config]) await pushBlob(registry, 'names/tagged', b);
    await pushManifest(registry, 'names/tagged', image.manifest, 'v1');
    const digestRef = `registry.test/names/tagged@${image.manifest.digest}`;
    await cri.pullImage('registry.test/names/tagged:v1');
    const listed = (await cri.listImages()).find((i) => i.repoTags.includes('registry.test/names/tagged:v1'));
    assert.ok(listed?.repoDigests.includes(digestRef), 'containerd 1.6 records the digest reference of a tag pull');
    const r = await once('tagged', [digestRef]);
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /"msg":"pulling image"/, 'no pull');
    assert.match(r.stderr, /the runtime reports no pins/);
  });

  test('an index pulled by its index digest, wanted by its platform digest: one PullImage, no layer downloaded', async (t) => {
    if (!ready && !requireComponents(t, NEEDS)) return;
    const pushed = await pushMultiArch(registry, 'names/multi');
    const platform = `registry.test/names/multi@${pushed.platforms[`linux/${nodePlatform().architecture}`]!.manifestDigest}`;
    await cri.pullImage(pushed.ref);
    assert.equal(await cri.imageStatus(platform), null, 'containerd does not hold it under the platform digest');
    const layers = proxy.layerGets();
    const r = await once('multi', [platform]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /"msg":"pulled image"/);
    assert.equal(proxy.layerGets(), layers, 'no layer downloaded');
    assert.ok(await cri.imageStatus(platform), 'now held under the platform digest');
  });
});
