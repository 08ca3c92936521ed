// Which of the node's pin backends serves it now. What each runtime gets is
// decided in one place, the agent's composition root
// (src/agent/boot/pin-kit.ts: from the node's profile, --pin-backend and
// each CRI Version answer); this keeps the backend made for a decision for
// as long as the decision holds, closes it when the decision changes, logs
// each choice once, and passes a backend's wake-ups (a step waiting to
// retry may run now) to whoever subscribed: the agent, which reconciles.
import type { Logger } from 'pino';
import type { RuntimeInfo } from '../cri/runtime.ts';
import type { PinBackend, PinBackendName } from './backend.ts';
import { PreloadOnly } from './preload-only.ts';

/** `--pin-backend`: auto (from what the runtime says it is), or one backend whatever it says. */
export type PinBackendFlag = 'auto' | PinBackendName;
export const PIN_BACKEND_FLAGS: readonly PinBackendFlag[] = ['auto', 'crio', 'containerd', 'none'];

/** A backend that pins, or pre-loading only (with why, unless the operator chose it; `quiet` until the runtime has said what it is). */
export type PinDecision = { backend: 'crio' | 'containerd' } | { backend: 'none'; why?: string; quiet?: boolean };

/** A backend's step waiting to retry may run now: `why` is the reconcile's trigger. */
export type Wake = (why: string) => void;

export interface PinChoiceOptions {
  /** The decision for the runtime as it last answered CRI Version (undefined: not yet). Pure. */
  decide(info: RuntimeInfo | undefined): PinDecision;
  /** The backend of a decision that pins; `wake` is how it asks for a reconcile. */
  make(backend: 'crio' | 'containerd', wake: Wake): PinBackend;
  /** --pin-backend as the node's profile narrowed it, for the log line. */
  flag: string;
  logger: Logger;
}

/** "cri-o 1.32.13": what the runtime says it is, for messages. */
export function runtimeLabel(info: RuntimeInfo): string {
  return `${info.runtimeName} ${info.runtimeVersion}`.trim();
}

export class PinChoice {
  private readonly o: PinChoiceOptions;
  private readonly listeners: Wake[] = [];
  private current: PinBackend | undefined;
  private key: string | undefined;

  constructor(o: PinChoiceOptions) {
    this.o = o;
  }

  /** Subscribe to the backends' wake-ups. */
  onWake(listener: Wake): void {
    this.listeners.push(listener);
  }

  /** The backend for the runtime as last seen; the same object for as long as the decision holds. */
  for(info: RuntimeInfo | undefined): PinBackend {
    const d = this.o.decide(info);
    const key = JSON.stringify(d);
    if (this.current && key === this.key) return this.current;
    this.current?.close();
    this.key = key;
    const runtime = info ? runtimeLabel(info) : undefined;
    const log = this.o.logger;
    if (d.backend === 'none') this.current = new PreloadOnly({ logger: log, why: d.why, quiet: d.quiet, runtime });
    else this.current = this.o.make(d.backend, (why) => this.listeners.forEach((l) => l(why)));
    if (d.backend !== 'none' || !d.quiet) log.info({ backend: this.current.name, flag: this.o.flag, runtime }, 'pin backend chosen');
    return this.current;
  }

  close(): void {
    this.current?.close();
  }
}
