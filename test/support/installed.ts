// pinset's objects on the in-process API server as `kubectl apply -k
// deploy/` installs them: each with the label deploy/base/kustomization.yaml
// adds (the manifests' files, as src/cli/manifests.ts reads them, lack it),
// the CRD (already served by the server) labelled the same way.
import { CRD_NAME } from '../../src/api/types.ts';
import { PINSET_LABEL, PINSET_LABEL_VALUE, type ManifestObject } from '../../src/cli/manifests.ts';
import type { ApiServer, KubeObject } from './apiserver.ts';

/** An object with pinset's label added. */
export function labelled(doc: KubeObject): KubeObject {
  return { ...doc, metadata: { ...doc.metadata, labels: { ...doc.metadata.labels, [PINSET_LABEL]: PINSET_LABEL_VALUE } } };
}

/** Creates every object of `manifests` but the CRD, labelled, and labels the CRD the server already has. */
export function installManifests(api: ApiServer, manifests: readonly ManifestObject[]): void {
  for (const o of manifests) if (o.kind !== 'CustomResourceDefinition') api.create(labelled(o.doc as KubeObject));
  api.patch('customresourcedefinitions', CRD_NAME, { metadata: { labels: { [PINSET_LABEL]: PINSET_LABEL_VALUE } } });
}
