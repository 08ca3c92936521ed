// What the end-to-end tests say when a real program is missing: an apt
// package for the system's programs, the project's own script for
// containerd 1.7 (unpacked into .cache/, not installed).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { COMPONENTS, installCommand, missingMessage } from '../support/components.ts';

describe('missing components', () => {
  test('containerd 1.7 is fetched by .ci/containerd-1.7 and looked up in .cache/, not on PATH', () => {
    assert.equal(COMPONENTS['containerd-1.7'].projectPath, '.cache/containerd-1.7/usr/bin/containerd');
    assert.equal(installCommand(['containerd-1.7']), 'bash .ci/containerd-1.7');
    assert.match(missingMessage(['containerd-1.7']), /^missing \.cache\/containerd-1\.7\/usr\/bin\/containerd \(containerd \(Debian trixie.*install with: bash \.ci\/containerd-1\.7$/);
  });

  test('apt packages and the project\'s scripts together, each once', () => {
    assert.equal(installCommand(['containerd', 'runc', 'containerd-1.7', 'htpasswd']), 'sudo apt-get install -y --no-install-recommends containerd runc apache2-utils && bash .ci/containerd-1.7');
    assert.equal(installCommand(['skopeo']), 'sudo apt-get install -y --no-install-recommends skopeo');
  });
});
