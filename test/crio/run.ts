// `npm run test:crio`: the optional suite on a real CRI-O. Needs
// PINSET_CRIO_BIN (a crio binary, e.g. CRI-O 1.32 from a Fedora/RHEL host or
// built by hand), root, conmon and crun (or runc), docker-registry, and the
// bundle (`npm run build`: mirror-config.crio.ts runs the CLI as shipped). Without
// the variable it says why it skipped and exits 0: `npm test` and CI do not
// need it (Debian 12 packages no CRI-O).
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { realCrioMissing } from '../support/real-crio.ts';
import { missingComponents, missingMessage } from '../support/components.ts';

const why = realCrioMissing(process.env.PINSET_CRIO_BIN) ?? (missingComponents(['docker-registry', 'dbus-daemon']).length ? missingMessage(missingComponents(['docker-registry', 'dbus-daemon'])) : null);
if (why) {
  process.stdout.write(`test:crio skipped: ${why}\n`);
  process.exit(0);
}
const here = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(here).filter((f) => f.endsWith('.crio.ts')).sort().map((f) => join(here, f));
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], { stdio: 'inherit' });
process.exit(r.status ?? 1);
