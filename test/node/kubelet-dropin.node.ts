// pinset's kubelet drop-in (`pinset kubelet-allowlist`) given to real
// kubelets of each version the suite has: PINSET_KUBELET_BIN, and the
// kubelets named in PINSET_MORE_KUBELET_BINS (":"-separated, e.g. 1.33 and
// 1.34 ones: they run no node, only this check). Each kubelet starts with a
// --config file and a --config-dir holding the drop-in, with the feature
// gate KubeletEnsureSecretPulledImages as its version leaves it, turned on,
// and turned off in a drop-in before pinset's. It has no kubeconfig, so once
// it has read and validated its configuration it stops at once ("no client
// provided"), before it touches the host. The gate is also given on its
// command line (--feature-gates), which wins over the files' gate at
// validation. What it did is held to what pinset says of the same files
// and command line:
// - `pinset kubelet-allowlist --node` prints the drop-in for that kubelet
//   version (with --kubelet-gate-on when the gate is on) exactly when the
//   kubelet takes it, and the kubelet takes the form printed for its
//   version (exact entries from 1.36, "/*" entries before);
// - the agent's reading of the files (src/agent/kubelet-config.ts) is
//   Invalid exactly when the kubelet refuses them;
// - each of a few allowlist entries is taken or refused by a kubelet whose
//   gate is on exactly as pinset's rules for its version say
//   (allowlistEntryProblem: normalized names only up to 1.35, any name
//   reference.Parse takes from 1.36).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { readKubeletVerification } from '../../src/agent/kubelet-config.ts';
import { allowlistEntryProblem, allowlistMatching, gateDefault } from '../../src/api/kubelet-verification.ts';
import { kubeletVersionProblem, run as kubeletAllowlist } from '../../src/cli/kubelet-allowlist.ts';
import { runCli } from '../support/cli-run.ts';
import { realNodeMissing } from '../support/real-node.ts';

const execFileAsync = promisify(execFile);
const found = realNodeMissing();
const kubelets = 'why' in found ? [] : [found.bins.kubelet, ...(process.env.PINSET_MORE_KUBELET_BINS ?? '').split(':').filter(Boolean)];
const skip = 'why' in found ? found.why : undefined;

const HEAD = 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n';
const SET = `apiVersion: pinset.dev/v1alpha1
kind: PinnedImageSet
metadata: {name: offline}
spec:
  pinnedImages:
    - name: registry.test/kep/p1@sha256:${'1'.repeat(64)}
    - name: registry.test/kep/p2@sha256:${'2'.repeat(64)}
`;
/** The gate as the kubelet's version leaves it, turned on or off in a drop-in, or on its command line (over a drop-in turning it off, or alone). */
type Gate = 'default' | 'on' | 'off' | 'flag-on-over-file-off' | 'flag-off';
const GATES: Gate[] = ['default', 'on', 'off', 'flag-on-over-file-off', 'flag-off'];
const fileGate = (g: Gate): boolean | undefined => (g === 'on' ? true : g === 'off' || g === 'flag-on-over-file-off' ? false : undefined);
const flagGate = (g: Gate): boolean | undefined => (g === 'flag-on-over-file-off' ? true : g === 'flag-off' ? false : undefined);

let dir: string;
const seen: string[] = [];

/** What a kubelet did with its files: "taken" (it went past its configuration) or "refused" with its words. */
async function startWith(kubelet: string, root: string, gate?: boolean): Promise<{ verdict: 'taken' | 'refused'; said: string }> {
  const child = spawn(
    kubelet,
    [
      `--config=${join(root, 'config.yaml')}`,
      `--config-dir=${join(root, 'conf.d')}`,
      `--root-dir=${join(root, 'kubelet')}`,
      `--cert-dir=${join(root, 'pki')}`,
      `--container-runtime-endpoint=unix://${join(root, 'none.sock')}`,
      ...(gate === undefined ? [] : [`--feature-gates=KubeletEnsureSecretPulledImages=${gate}`]),
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  child.stdout.on('data', (c) => (out += c));
  child.stderr.on('data', (c) => (out += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  await new Promise((done) => child.on('close', done));
  clearTimeout(timer);
  const failed = /"command failed" err="([^\n]*)"/.exec(out)?.[1] ?? '';
  if (/failed to validate kubelet configuration|failed to load kubelet config/.test(failed)) return { verdict: 'refused', said: failed };
  assert.match(out, /"Kubelet version"/, `the kubelet went past its configuration, or said why not: ${failed || out.slice(-600)}`);
  return { verdict: 'taken', said: failed };
}

describe("pinset's kubelet drop-in on real kubelets of each version: taken, or refused exactly where pinset says so", { skip }, () => {
  before(async () => {
    dir = await mkdtemp(join(os.tmpdir(), 'pinset-node-dropin-'));
    await writeFile(join(dir, 'set.yaml'), SET);
  });
  after(async () => {
    process.stdout.write(`\nkubelet drop-in by version: ${seen.join('; ')}\n`);
    await rm(dir, { recursive: true, force: true });
  });

  // Entries whose fate differs between 1.35 (normalized names only) and 1.36 (any name reference.Parse takes), and some every version refuses.
  const ENTRIES = ['registry.test/kep/p1', 'registry.test/kep/*', 'ubuntu', 'docker.io/nginx', 'a'.repeat(64), 'registry.test:5000', 'test.io/Test/image', 'image.repo/*/x', `registry.test/kep/p1@sha256:${'1'.repeat(64)}`];

  for (const kubelet of kubelets) {
    test(`${kubelet}: each allowlist entry taken or refused as pinset's rules for its version say`, async (t) => {
      const version = /Kubernetes (v\S+)/.exec((await execFileAsync(kubelet, ['--version'])).stdout)?.[1];
      assert.ok(version, 'kubelet --version');
      if (!gateDefault(version).on) return t.skip(`${version}: the gate is off by default, and every entry is refused with it`);
      const verdicts: string[] = [];
      for (const [i, entry] of ENTRIES.entries()) {
        const root = join(dir, `${version}-entry-${i}`);
        await mkdir(join(root, 'conf.d'), { recursive: true });
        await writeFile(join(root, 'config.yaml'), `${HEAD}failSwapOn: false\nfailCgroupV1: false\ncgroupDriver: cgroupfs\n`);
        await writeFile(join(root, 'conf.d', '50-entry.conf'), `${HEAD}imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: [${JSON.stringify(entry)}]\n`);
        const kubeletDid = await startWith(kubelet, root);
        const pinsetSays = allowlistEntryProblem(entry, allowlistMatching(version));
        verdicts.push(`${entry.length > 30 ? `${entry.slice(0, 27)}...` : entry}: ${kubeletDid.verdict}`);
        assert.equal(kubeletDid.verdict, pinsetSays ? 'refused' : 'taken', `${version} ${JSON.stringify(entry)}: the kubelet ${kubeletDid.verdict === 'refused' ? `refused it (${kubeletDid.said.slice(0, 200)})` : 'took it'}, pinset says ${pinsetSays ?? 'it is taken'}`);
      }
      seen.push(`${version} entries: ${verdicts.join(', ')}`);
    });

    test(`${kubelet}: with the gate as its version leaves it, turned on, turned off`, async (t) => {
      assert.ok(existsSync(kubelet), `${kubelet} exists`);
      const version = /Kubernetes (v\S+)/.exec((await execFileAsync(kubelet, ['--version'])).stdout)?.[1];
      assert.ok(version, 'kubelet --version');
      // Before 1.33 the gate does not exist, and a kubelet given it does not start whatever pinset writes: only its default.
      for (const gate of gateDefault(version).known ? GATES : (['default'] as Gate[])) {
        const root = join(dir, `${version}-${gate}`);
        await mkdir(join(root, 'conf.d'), { recursive: true });
        // failCgroupV1: 1.35 will not start on a cgroup v1 host without it (1.31 and later know the field).
        await writeFile(join(root, 'config.yaml'), `${HEAD}failSwapOn: false\nfailCgroupV1: false\ncgroupDriver: cgroupfs\n`);
        if (fileGate(gate) !== undefined) await writeFile(join(root, 'conf.d', '40-gate.conf'), `${HEAD}featureGates:\n  KubeletEnsureSecretPulledImages: ${fileGate(gate)}\n`);

        // The drop-in for this version (from 1.36 exact entries, "/*" before); before 1.33 the command prints none, so the "/*" form.
        const printed = await runCli(kubeletAllowlist, [...(gateDefault(version).known ? ['--kubelet-version', version, '--kubelet-gate-on'] : []), join(dir, 'set.yaml')]);
        assert.equal(printed.code, 0, printed.stderr);
        await writeFile(join(root, 'conf.d', '50-pinset.conf'), printed.stdout);
        const kubeletDid = await startWith(kubelet, root, flagGate(gate));

        // The command line's gate wins over the files' at validation (kubeletConfigFlagPrecedence).
        const gateOn: boolean = flagGate(gate) ?? fileGate(gate) ?? gateDefault(version).on;
        const cliSays = kubeletVersionProblem('this-node', version, gate === 'on');
        const flagGates: Record<string, boolean> = flagGate(gate) === undefined ? {} : { KubeletEnsureSecretPulledImages: flagGate(gate)! };
        const agentSays = readKubeletVerification({ configFile: join(root, 'config.yaml'), configDir: join(root, 'conf.d'), featureGates: flagGates }, version);
        seen.push(`${version} gate ${gate}: ${kubeletDid.verdict}${kubeletDid.verdict === 'refused' ? ` (${kubeletDid.said.slice(0, 120)})` : ''}, agent ${agentSays.policy}`);
        t.diagnostic(`${version}, gate ${gate}: the kubelet ${kubeletDid.verdict === 'taken' ? 'took' : 'refused'} the drop-in; the agent reads ${agentSays.policy} (${agentSays.source}); kubelet-allowlist --node${gate === 'on' ? ' --kubelet-gate-on' : ''}: ${cliSays ?? 'prints it'}`);

        // A kubelet that knows the gate refuses the fields exactly when the gate is off; before 1.33 it ignores them.
        const knowsGate: boolean = gateDefault(version).known;
        assert.equal(kubeletDid.verdict, knowsGate && !gateOn ? 'refused' : 'taken', `${version} gate ${gate}`);
        if (kubeletDid.verdict === 'refused') assert.match(kubeletDid.said, /must not be set if KubeletEnsureSecretPulledImages feature gate is not enabled/);
        // The agent's reading: Invalid exactly when refused; the drop-in's policy where the gate is on; Off where it is off or unknown to the kubelet.
        assert.equal(agentSays.policy, kubeletDid.verdict === 'refused' ? 'Invalid' : gateOn && knowsGate ? 'NeverVerifyAllowlistedImages' : 'Off', `the agent on ${version} gate ${gate}`);
        // The command prints for a node of this version (gate on: told so) exactly when the kubelet would take it and needs it.
        if (gate === 'default' || gate === 'on') assert.equal(cliSays === undefined, knowsGate && gateOn, `kubelet-allowlist --node on ${version} gate ${gate}: ${cliSays}`);
      }
    });
  }
});
