// The Node side of reporting: the status annotation (JSON merge patch of
// that one annotation, nothing else) and Events on the Node.
import { CoreV1Api, PatchStrategy, setHeaderOptions, type KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { encodeNodeStatus } from '../api/node-status.ts';
import { STATUS_ANNOTATION, type NodeStatus } from '../api/types.ts';
import type { StatusSink } from './status-reporter.ts';

/** Every write the agent makes carries this field manager (the Node's managedFields name it). */
export const AGENT_FIELD_MANAGER = 'pinset-agent';

export class NodeAnnotationSink implements StatusSink {
  private readonly core: CoreV1Api;
  private readonly nodeName: string;
  constructor(kc: KubeConfig, nodeName: string) {
    this.core = kc.makeApiClient(CoreV1Api);
    this.nodeName = nodeName;
  }
  async write(status: NodeStatus): Promise<void> {
    // RFC 7386 merge patch: touches only this annotation, needs no
    // resourceVersion, and cannot conflict with the kubelet's own writes.
    const body = { metadata: { annotations: { [STATUS_ANNOTATION]: encodeNodeStatus(status) } } };
    await this.core.patchNode({ name: this.nodeName, body, fieldManager: AGENT_FIELD_MANAGER }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
  }
}

/** The reasons of the Events the agent records on its Node (docs/reference.md lists them; a test holds the two together). */
export const EVENT_REASONS = ['SetReady', 'PullFailed', 'ReloadFailed', 'ReloadNotApplied', 'CrioConfigRejected', 'PinsOverridden', 'ImageRemoved', 'WaitingForNodeLock'] as const;
export type EventReason = (typeof EVENT_REASONS)[number];

export interface EventRecorder {
  record(type: 'Normal' | 'Warning', reason: EventReason, message: string, key?: string): void;
}

/**
 * Events on this Node (namespace "default", where the kubelet puts node
 * events too), de-duplicated: the same reason and key within `windowMs`
 * bumps the existing Event's count instead of creating another, and not
 * more than once a minute, so a retry loop is not an Event storm.
 */
export class NodeEventRecorder implements EventRecorder {
  private readonly core: CoreV1Api;
  private readonly nodeName: string;
  private readonly nodeUid: () => string | undefined;
  private readonly log: Logger;
  private readonly seen = new Map<string, { name: string; count: number; first: string; lastSentAt: number; pendingCount: number }>();
  private readonly now: () => number;
  private readonly windowMs: number;
  private readonly component = 'pinset-agent';

  constructor(kc: KubeConfig, nodeName: string, nodeUid: () => string | undefined, log: Logger, opts: { now?: () => number; windowMs?: number } = {}) {
    this.core = kc.makeApiClient(CoreV1Api);
    this.nodeName = nodeName;
    this.nodeUid = nodeUid;
    this.log = log;
    this.now = opts.now ?? Date.now;
    this.windowMs = opts.windowMs ?? 60_000;
  }

  record(type: 'Normal' | 'Warning', reason: EventReason, message: string, key = ''): void {
    void this.send(type, reason, message, key).catch((e: Error) => this.log.debug({ err: e.message?.slice(0, 200), reason }, 'event not recorded'));
  }

  private async send(type: 'Normal' | 'Warning', reason: EventReason, message: string, key: string): Promise<void> {
    const id = `${reason}\n${key}`;
    const now = this.now();
    const ts = new Date(now).toISOString();
    const prev = this.seen.get(id);
    if (prev) {
      prev.pendingCount++;
      if (now - prev.lastSentAt < this.windowMs) return;
      prev.count += prev.pendingCount;
      prev.pendingCount = 0;
      prev.lastSentAt = now;
      const body = { count: prev.count, lastTimestamp: ts, message };
      try {
        await this.core.patchNamespacedEvent({ name: prev.name, namespace: 'default', body, fieldManager: AGENT_FIELD_MANAGER }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
        return;
      } catch {
        this.seen.delete(id); // the Event expired or was deleted: create a new one
      }
    }
    const name = `${this.nodeName}.pinset.${now.toString(16)}${Math.floor(Math.random() * 0xffff).toString(16)}`;
    this.seen.set(id, { name, count: 1, first: ts, lastSentAt: now, pendingCount: 0 });
    await this.core.createNamespacedEvent({
      namespace: 'default',
      fieldManager: AGENT_FIELD_MANAGER,
      body: {
        metadata: { name, namespace: 'default' },
        involvedObject: { kind: 'Node', apiVersion: 'v1', name: this.nodeName, uid: this.nodeUid() ?? this.nodeName },
        reason,
        message,
        type,
        count: 1,
        firstTimestamp: new Date(now),
        lastTimestamp: new Date(now),
        source: { component: this.component, host: this.nodeName },
        reportingComponent: this.component,
        reportingInstance: this.nodeName,
      },
    });
  }
}
