// The PinnedImageSet API (group pinset.dev, version v1alpha1, cluster-scoped)
// and the per-node status annotation. The CRD in deploy/crds/ and the
// validator in ./validate.ts describe the same shape.

export const GROUP = 'pinset.dev';
export const VERSION = 'v1alpha1';
export const API_VERSION = `${GROUP}/${VERSION}`;
export const KIND = 'PinnedImageSet';
export const PLURAL = 'pinnedimagesets';
/** The CustomResourceDefinition that serves PinnedImageSets (deploy/crds/). */
export const CRD_NAME = `${PLURAL}.${GROUP}`;

/** Upper bound on spec.pinnedImages, the same in the CRD and the validator. */
export const MAX_PINNED_IMAGES = 5000;

export type SelectorOperator = 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';

export interface LabelSelectorRequirement {
  key: string;
  operator: SelectorOperator;
  values?: string[];
}

/** metav1.LabelSelector. Absent or empty selects every node. */
export interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: LabelSelectorRequirement[];
}

export interface PinnedImage {
  /** A digest reference: <registry host>/<path>@sha256:<64 lowercase hex>. */
  name: string;
}

/** How a new or changed set reaches the nodes. */
export interface RolloutSpec {
  /**
   * At most this many nodes download this set's images at a time (>= 1);
   * absent means no limit. Enforced with Lease slots (src/rollout/).
   */
  maxConcurrentNodes?: number;
  /**
   * Each image is first fetched by this many nodes (the first wave); the
   * other nodes pull it once one of them holds it, from a cache or peers
   * between the nodes and the registry. Absent: every node pulls at once.
   * See src/rollout/first-wave.ts.
   */
  firstWave?: FirstWaveSpec;
}

export interface FirstWaveSpec {
  /** How many nodes fetch each image first (>= 1, at most MAX_FIRST_WAVE_NODES). */
  nodes: number;
}

/**
 * Upper bound on spec.rollout.firstWave.nodes, the same in the CRD and the
 * validator: every other node watches one record per first-wave node, so
 * the first wave stays small (a cache needs one).
 */
export const MAX_FIRST_WAVE_NODES = 10;

/** A Secret in the agents' namespace (a core/v1 LocalObjectReference). */
export interface PullSecretReference {
  name: string;
}

/** Upper bound on spec.pullSecrets, the same in the CRD and the validator. */
export const MAX_PULL_SECRETS = 64;

export interface PinnedImageSetSpec {
  nodeSelector?: LabelSelector;
  /** Passed as CRI ImageSpec.runtime_handler (KEP-4216). */
  runtimeHandler?: string;
  pinnedImages: PinnedImage[];
  rollout?: RolloutSpec;
  /**
   * Secrets of type kubernetes.io/dockerconfigjson (or kubernetes.io/dockercfg)
   * in the agents' namespace, tried for this set's images before the node's
   * own credentials, as a pod's imagePullSecrets are.
   */
  pullSecrets?: PullSecretReference[];
}

export interface ObjectMeta {
  name: string;
  uid?: string;
  generation?: number;
  resourceVersion?: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** metav1.Condition */
export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  observedGeneration?: number;
  lastTransitionTime: string;
}

export interface DegradedNode {
  name: string;
  reason: string;
  message: string;
}

/** What a set's progress counts: compressed bytes from the registries' manifests, or images where no node reports bytes. */
export type ProgressUnit = 'bytes' | 'images';

/**
 * The set's download across the nodes it selects (src/controller/progress.ts):
 * how much is present of the total, the rate over the last minutes, and when
 * the nodes that progress should be done.
 */
export interface SetProgress {
  unit: ProgressUnit;
  /** Present on the selected nodes, summed (a node that has not reported counts as the others do). */
  present: number;
  total: number;
  /** Growth of `present` per second over the controller's window; absent until it has two observations. */
  rate?: number;
  /** Selected nodes downloading now, and waiting to (for a rollout slot, the first wave, or not started). */
  nodesDownloading: number;
  nodesWaiting: number;
  /** When every selected node that is not degraded should hold the set (RFC 3339); absent when it cannot be told. */
  estimatedCompletionTime?: string;
  /** True when estimatedCompletionTime is the earliest the set can be done, not an estimate: what some nodes will take is not known yet. */
  estimatedCompletionIsLowerBound?: boolean;
  /** One line for people (kubectl's Progress column): "41% of 180.0 MiB, 5.2 MiB/s". */
  summary: string;
}

export interface PinnedImageSetStatus {
  observedGeneration?: number;
  nodes?: { matched: number; ready: number; progressing: number; degraded: number };
  degradedNodes?: DegradedNode[];
  conditions?: Condition[];
  progress?: SetProgress;
}

export interface PinnedImageSet {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  spec: PinnedImageSetSpec;
  status?: PinnedImageSetStatus;
}

/** Where the agent found a set. */
export type SetSource = 'api' | 'static';

// ---------------------------------------------------------------------------
// The node status annotation, written by the agent, read by the controller
// and `pinset status`.

export const STATUS_ANNOTATION = 'pinset.dev/status';
/**
 * The format agents write (the compact one of src/api/node-status.ts).
 * Readers also read version 1, so old and new agents can report side by
 * side during a rolling upgrade.
 */
export const STATUS_FORMAT_VERSION = 2;
export type StatusFormatVersion = 1 | 2;
/**
 * The annotation is never written larger than this (bytes of JSON). Every
 * component that watches Nodes (the scheduler, CNI agents) holds every
 * Node's annotations: 16 KiB on 5000 Nodes is 80 MB in each of them.
 */
export const STATUS_MAX_BYTES = 16 * 1024;
/** A set's message is cut to this many bytes. */
export const STATUS_MAX_MESSAGE_BYTES = 512;
/** lastFailedGenerationError is cut to this many bytes. */
export const STATUS_MAX_ERROR_BYTES = 1024;

export type SetPhase = 'Progressing' | 'Ready' | 'Degraded';

export interface SetImageCounts {
  /** References this set asks for on this node (valid ones). */
  wanted: number;
  /** Of those, present in the runtime. */
  present: number;
  /** Of those, in the pin file (and reported pinned by the runtime where it reports). */
  pinned: number;
  /** Of those, whose last pull failed. */
  failed: number;
  /** References rejected by validation (not pinned, not pulled). */
  invalid: number;
}

export interface NodeSetStatus {
  name: string;
  uid?: string;
  source: SetSource;
  desiredGeneration: number;
  /** The generation this node last completed (Ready); 0 if never. */
  currentGeneration: number;
  lastFailedGeneration?: number;
  /** At most STATUS_MAX_ERROR_BYTES. */
  lastFailedGenerationError?: string;
  images: SetImageCounts;
  /**
   * Estimated disk for this set's images still to download on this node
   * (distinct compressed layers and configs x the disk estimate factor);
   * absent when nothing is left to download or no size is known.
   */
  estimatedBytes?: number;
  /**
   * Compressed bytes of this set's images on this node (the distinct layers
   * and configs their manifests name, for the node's platform): `total` of
   * them all, `present` of those the runtime holds (and, where the runtime
   * tells, of those arriving). Absent when the sizes are not known.
   */
  bytes?: { present: number; total: number };
  /** Bytes of this set arriving per second on this node over the last minutes; absent when it is not downloading. */
  rate?: number;
  /**
   * Bytes of this set arriving per second while a pull of it ran, over the
   * same minutes: how fast this node pulls, the time it waited between
   * pulls (for a rollout slot, for the first wave's next image) left out;
   * absent when it is not downloading or no pull ran in that time.
   */
  pullRate?: number;
  /** True when this node's runtime pulls every image of the set through a mirror (a registry it asks before the image's own), as its registry configuration says. */
  mirrored?: boolean;
  phase: SetPhase;
  /** CamelCase, e.g. AllImagesPinned, Pulling, ImageNotFound, PinsOverridden. */
  reason: string;
  message?: string;
}

/** A node's report, in memory: the same whichever format version it was read from. */
export interface NodeStatus {
  /** The format it was read from; what an agent writes is STATUS_FORMAT_VERSION. */
  version: StatusFormatVersion;
  /** The Node's name: version 1 carries it; version 2 leaves it out (the annotation is on that Node). */
  node?: string;
  /** Base name of the agent's drop-in in the CRI-O drop-in folder. */
  pinFile: string;
  /** When the content last changed (RFC 3339). */
  updatedAt: string;
  sets: NodeSetStatus[];
  /**
   * Why the runtime's image filesystem could not be measured, so pulls are
   * not held back by the high watermark; absent when it was measured.
   */
  imageFilesystemError?: string;
  /**
   * Why this node's runtime cannot pin (naming the versions that can): its
   * images are pre-loaded only, whatever its sets say. Absent where pins
   * work, and where pre-loading alone was chosen (--pin-backend none).
   */
  cannotPin?: string;
  /**
   * How many pins pinset's own configuration holds on this node (CRI-O: the
   * references in its drop-in, carried-over ones included; containerd: the
   * images carrying its label); 0 when it holds none, which is what
   * `pinset uninstall` waits for. Absent: not known (an older agent, or the
   * runtime's labels could not be read yet).
   */
  pins?: number;
  /**
   * Why pins that no set asks for are kept (an incomplete observation: the
   * API not listed, the CRD missing or being deleted, the node's labels
   * unknown), at most STATUS_MAX_MESSAGE_BYTES; absent when none is kept.
   */
  pinsKept?: string;
  /**
   * What the kubelet's credential verification (KEP-2535) does to this
   * node's pinned images when the registry is out of reach, as far as the
   * agent can tell from the kubelet's configuration files; absent from an
   * agent not asked to read them (or older than this field).
   */
  kubeletVerification?: KubeletVerificationStatus;
  /** True when sets were left out to keep the annotation under STATUS_MAX_BYTES. */
  truncated?: boolean;
  /** What the agent found on its node (or was told by flags): absent from agents before it. */
  runtime?: NodeRuntime;
}

/**
 * The node's runtime as the agent sees it (src/agent/boot/node-profile.ts):
 * what answered CRI Version, the pin backend in use, and the host paths the
 * agent uses. `problem`: why no runtime could be settled on (none answered,
 * or two did); nothing is pinned then.
 */
export interface NodeRuntime {
  /** CRI Version's runtime_name and runtime_version. */
  name?: string;
  version?: string;
  /** crio, containerd, k3s or rke2, when detected. */
  layout?: string;
  /** 'detected' or 'flags' (--cri-endpoint given). */
  source: string;
  /** The backend that pins: crio, containerd or none (pre-load only). */
  pinBackend: string;
  socket: string;
  imageFs?: string[];
  dropInDir?: string;
  hostsDir?: string;
  lock: string;
  problem?: string;
}

/** The node status's `kubeletVerification`. */
export interface KubeletVerificationStatus {
  /** One of the four policies; "Off" (no verification), "Invalid" (the kubelet refuses its files) or "Unknown". */
  policy: string;
  /** The file the policy comes from, "the kubelet's default", or why the policy is Invalid or Unknown. */
  source: string;
  /**
   * The sets (the first few by name, a static one as "name (static)") with
   * pinned images the policy verifies: their pods need the registry unless
   * their credentials match the kubelet's own record of a pull. Absent: none.
   */
  refuses?: string[];
  /** How many more sets than `refuses` names; absent when none. */
  refusesMore?: number;
}
