// Which pin backend serves this node (`--pin-backend`, default auto): the
// runtime says what it is through CRI Version (name and version), and the
// choice is logged once, and again only if the runtime changes.
// - auto: CRI-O -> its drop-in; containerd from 1.6.25, 1.7.10 and 2.x ->
//   its image labels; an older containerd or another runtime -> pre-load
//   only, the node status naming what would pin (RuntimeCannotPin). Until
//   the runtime first answers, CRI-O's drop-in is kept when its folder is
//   there (pins written while CRI-O is down apply at its start).
// - crio, containerd: that backend whatever the runtime says (containerd's
//   still needs a version that honours its label); none: pre-load only.
import type { Logger } from 'pino';
import type { RuntimeInfo } from '../cri/runtime.ts';
import type { PinBackend, PinBackendName } from '../pins/backend.ts';
import { PreloadOnly } from '../pins/preload-only.ts';

export type PinBackendFlag = 'auto' | PinBackendName;
export const PIN_BACKEND_FLAGS: readonly PinBackendFlag[] = ['auto', 'crio', 'containerd', 'none'];

export interface PinBackendMakers {
  /** Absent when CRI-O's drop-in folder cannot be used on this node. */
  crio?: () => PinBackend;
  containerd?: {
    /** Whether this containerd version reports the label as `pinned`, and if not, what would. */
    canPin(version: string): { ok: true } | { ok: false; why: string };
    make(): PinBackend;
  };
}

type Decision = { backend: 'crio' | 'containerd' } | { backend: 'none'; why?: string; quiet?: boolean };

function runtimeLabel(info: RuntimeInfo): string {
  return `${info.runtimeName} ${info.runtimeVersion}`.trim();
}

/** The backend `flag` asks for on a runtime that answered `info` (undefined: not yet). Pure. */
export function decidePinBackend(flag: PinBackendFlag, info: RuntimeInfo | undefined, makers: Pick<PinBackendMakers, 'crio'> & { containerd?: Pick<NonNullable<PinBackendMakers['containerd']>, 'canPin'> }): Decision {
  const name = (info?.runtimeName ?? '').toLowerCase();
  const containerd = (): Decision => {
    if (!makers.containerd) return { backend: 'none', why: 'containerd pins need its Images service on the CRI socket, which this agent was not set up to use' };
    if (!info) return { backend: 'containerd' };
    const can = makers.containerd.canPin(info.runtimeVersion);
    return can.ok ? { backend: 'containerd' } : { backend: 'none', why: can.why };
  };
  switch (flag) {
    case 'none':
      return { backend: 'none' };
    case 'crio':
      return makers.crio ? { backend: 'crio' } : { backend: 'none', why: "CRI-O's drop-in folder cannot be used on this node" };
    case 'containerd':
      return containerd();
    case 'auto':
      if (!info) return makers.crio ? { backend: 'crio' } : { backend: 'none', quiet: true };
      if (name === 'cri-o') return makers.crio ? { backend: 'crio' } : { backend: 'none', why: `the runtime is ${runtimeLabel(info)}, but its drop-in folder cannot be used on this node` };
      if (name === 'containerd') return containerd();
      return { backend: 'none', why: `the runtime ${runtimeLabel(info)} has no pin backend in pinset (CRI-O and containerd have)` };
  }
}

export class PinChoice {
  private readonly flag: PinBackendFlag;
  private readonly makers: PinBackendMakers;
  private readonly log: Logger;
  private current: PinBackend | undefined;
  private key: string | undefined;

  constructor(flag: PinBackendFlag, makers: PinBackendMakers, log: Logger) {
    this.flag = flag;
    this.makers = makers;
    this.log = log;
  }

  /** The backend for the runtime as last seen; the same object for as long as the decision holds. */
  for(info: RuntimeInfo | undefined): PinBackend {
    const d = decidePinBackend(this.flag, info, this.makers);
    const key = JSON.stringify(d);
    if (this.current && key === this.key) return this.current;
    this.current?.close();
    this.key = key;
    const runtime = info ? runtimeLabel(info) : undefined;
    if (d.backend === 'none') this.current = new PreloadOnly({ logger: this.log, why: d.why, quiet: d.quiet, runtime });
    else this.current = d.backend === 'crio' ? this.makers.crio!() : this.makers.containerd!.make();
    if (d.backend !== 'none' || !d.quiet) this.log.info({ backend: this.current.name, flag: this.flag, runtime }, 'pin backend chosen');
    return this.current;
  }

  close(): void {
    this.current?.close();
  }
}
