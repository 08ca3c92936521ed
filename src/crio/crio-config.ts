// Reading CRI-O's configuration exactly as CRI-O reads it, so the agent can
// tell ahead of a reload (or a restart) whether CRI-O would refuse it.
//
// CRI-O 1.32 (pkg/config/config.go, reload.go):
// - Reload() decodes crio.conf when os.Stat finds it, then the drop-in folder
//   with UpdateFromPath: filepath.Walk lstat()s every entry, descends into
//   real folders with each folder's names in byte order (sort.Strings), and
//   hands everything else to UpdateFromDropInFile, whatever its name:
//   dotfiles, files without ".conf", symbolic links. os.ReadFile follows a
//   link, so a dangling link (ENOENT), a link loop (ELOOP) or a link to a
//   folder (EISDIR) fails, and any error fails the whole reload: CRI-O logs
//   "Unable to reload configuration" and keeps its old settings, while the
//   systemd reload job still ends "done". At start the same error is fatal.
// - Each file is decoded with BurntSushi/toml onto the typed config struct:
//   TOML syntax errors fail, and so does a value whose type does not fit a
//   key CRI-O declares (a string where a list of strings goes, a float into
//   an integer...). Unknown keys are ignored. CRI_O_DECODED below lists the
//   keys and their Go types, from the `toml:` tags of CRI-O 1.32's config
//   structs (RootConfig, APIConfig, RuntimeConfig, RuntimeHandler,
//   ImageConfig, NetworkConfig, MetricsConfig, TracingConfig, StatsConfig,
//   nri.Config).
// - After decoding, Reload() also refuses a log_level logrus cannot parse
//   and a pause_image that is not an image reference.
// - A slice from a later file replaces the one from an earlier file: the
//   last file that sets crio.image.pinned_images decides the whole list.
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { readRegularFile } from '../util/regular-file.ts';

/** CRI-O 1.32's default pause image (pkg/config DefaultPauseImage), pinned whatever pinned_images says. */
export const DEFAULT_PAUSE_IMAGE = 'registry.k8s.io/pause:3.10';
/**
 * A configuration file larger than this is refused unread, as is anything
 * that is not a regular file (a FIFO would hang CRI-O's reload, and the
 * agent with it). The pin file of 5000 images is about 0.5 MB.
 */
export const CRIO_CONFIG_MAX_BYTES = 16 * 1024 * 1024;

type Scalar = 'string' | 'bool' | 'int' | 'strings' | 'stringMap' | 'duration' | 'table';
interface Table {
  [key: string]: Scalar | Table | { mapOf: Table };
}

const RUNTIME_HANDLER: Table = {
  runtime_config_path: 'string',
  runtime_path: 'string',
  runtime_type: 'string',
  runtime_root: 'string',
  privileged_without_host_devices: 'bool',
  allowed_annotations: 'strings',
  monitor_path: 'string',
  monitor_cgroup: 'string',
  monitor_env: 'strings',
  monitor_exec_cgroup: 'string',
  platform_runtime_paths: 'stringMap',
  runtime_pull_image: 'bool',
  container_min_memory: 'string',
  no_sync_log: 'bool',
  inherit_default_runtime: 'bool',
  default_annotations: 'stringMap',
};

/** The keys CRI-O 1.32 decodes under [crio], with their types. */
export const CRI_O_DECODED: Table = {
  root: 'string',
  runroot: 'string',
  imagestore: 'string',
  storage_driver: 'string',
  storage_option: 'strings',
  log_dir: 'string',
  version_file: 'string',
  version_file_persist: 'string',
  clean_shutdown_file: 'string',
  internal_wipe: 'bool',
  internal_repair: 'bool',
  api: {
    grpc_max_send_msg_size: 'int',
    grpc_max_recv_msg_size: 'int',
    listen: 'string',
    stream_address: 'string',
    stream_port: 'string',
    stream_enable_tls: 'bool',
    stream_tls_cert: 'string',
    stream_tls_key: 'string',
    stream_tls_ca: 'string',
    stream_idle_timeout: 'string',
  },
  runtime: {
    no_pivot: 'bool',
    selinux: 'bool',
    log_to_journald: 'bool',
    drop_infra_ctr: 'bool',
    read_only: 'bool',
    conmon_env: 'strings',
    hooks_dir: 'strings',
    default_capabilities: 'strings',
    add_inheritable_capabilities: 'bool',
    default_env: 'strings',
    default_sysctls: 'strings',
    default_ulimits: 'strings',
    allowed_devices: 'strings',
    additional_devices: 'strings',
    cdi_spec_dirs: 'strings',
    device_ownership_from_security_context: 'bool',
    default_runtime: 'string',
    decryption_keys_path: 'string',
    conmon: 'string',
    conmon_cgroup: 'string',
    seccomp_profile: 'string',
    apparmor_profile: 'string',
    blockio_config_file: 'string',
    blockio_reload: 'bool',
    irqbalance_config_file: 'string',
    rdt_config_file: 'string',
    cgroup_manager: 'string',
    default_mounts_file: 'string',
    container_exits_dir: 'string',
    container_attach_socket_dir: 'string',
    bind_mount_prefix: 'string',
    uid_mappings: 'string',
    minimum_mappable_uid: 'int',
    gid_mappings: 'string',
    minimum_mappable_gid: 'int',
    log_level: 'string',
    log_filter: 'string',
    namespaces_dir: 'string',
    pinns_path: 'string',
    enable_criu_support: 'bool',
    runtimes: { mapOf: RUNTIME_HANDLER },
    workloads: 'table',
    pids_limit: 'int',
    log_size_max: 'int',
    ctr_stop_timeout: 'int',
    separate_pull_cgroup: 'string',
    infra_ctr_cpuset: 'string',
    shared_cpuset: 'string',
    absent_mount_sources_to_reject: 'strings',
    enable_pod_events: 'bool',
    irqbalance_config_restore_file: 'string',
    hostnetwork_disable_selinux: 'bool',
    disable_hostport_mapping: 'bool',
    timezone: 'string',
  },
  image: {
    default_transport: 'string',
    global_auth_file: 'string',
    pause_image: 'string',
    pause_image_auth_file: 'string',
    pause_command: 'string',
    pinned_images: 'strings',
    signature_policy: 'string',
    signature_policy_dir: 'string',
    insecure_registries: 'strings',
    image_volumes: 'string',
    big_files_temporary_dir: 'string',
    auto_reload_registries: 'bool',
    pull_progress_timeout: 'duration',
  },
  network: {
    cni_default_network: 'string',
    network_dir: 'string',
    plugin_dir: 'string',
    plugin_dirs: 'strings',
  },
  metrics: {
    enable_metrics: 'bool',
    metrics_collectors: 'strings',
    metrics_host: 'string',
    metrics_port: 'int',
    metrics_socket: 'string',
    metrics_cert: 'string',
    metrics_key: 'string',
  },
  tracing: {
    enable_tracing: 'bool',
    tracing_endpoint: 'string',
    tracing_sampling_rate_per_million: 'int',
  },
  stats: {
    stats_collection_period: 'int',
    collection_period: 'int',
    included_pod_metrics: 'strings',
  },
  nri: {
    enable_nri: 'bool',
    nri_listen: 'string',
    nri_plugin_dir: 'string',
    nri_plugin_config_dir: 'string',
    nri_plugin_registration_timeout: 'duration',
    nri_plugin_request_timeout: 'duration',
    nri_disable_connections: 'bool',
  },
};

// logrus.ParseLevel, which Reload() applies to log_level.
const LOG_LEVELS = new Set(['panic', 'fatal', 'error', 'warn', 'warning', 'info', 'debug', 'trace']);
// Go's time.ParseDuration: one or more decimal numbers with a unit, optionally signed; "0" alone too.
const GO_DURATION = /^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$/;
// An image reference as ParseNormalizedNamed accepts it (lowercase path components, optional tag and digest).
const IMAGE_REFERENCE =
  /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?\/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@[a-z0-9]+:[a-f0-9]{32,})?$/;

function isTable(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

function tomlType(v: unknown): string {
  if (typeof v === 'bigint') return 'integer';
  if (typeof v === 'number') return 'float';
  if (typeof v === 'string') return 'string';
  if (typeof v === 'boolean') return 'bool';
  if (Array.isArray(v)) return 'array';
  if (v instanceof Date) return 'datetime';
  return 'table';
}

const GO_TYPE: Record<Scalar, string> = {
  string: 'string',
  bool: 'bool',
  int: 'int64',
  strings: '[]string',
  stringMap: 'map[string]string',
  duration: 'time.Duration',
  table: 'struct',
};

function fits(type: Scalar, v: unknown): boolean {
  switch (type) {
    case 'string':
      return typeof v === 'string';
    case 'bool':
      return typeof v === 'boolean';
    case 'int':
      return typeof v === 'bigint';
    case 'strings':
      return Array.isArray(v) && v.every((x) => typeof x === 'string');
    case 'stringMap':
      return isTable(v) && Object.values(v).every((x) => typeof x === 'string');
    case 'duration':
      // BurntSushi decodes a time.Duration from an integer (nanoseconds) or a Go duration string.
      return typeof v === 'bigint' || (typeof v === 'string' && GO_DURATION.test(v));
    case 'table':
      return isTable(v);
  }
}

function checkTable(schema: Table, value: Record<string, unknown>, at: string): void {
  for (const [key, v] of Object.entries(value)) {
    const want = schema[key];
    if (want === undefined) continue; // unknown keys are ignored
    const where = `${at}.${key}`;
    if (typeof want === 'string') {
      if (!fits(want, v)) {
        const detail = want === 'duration' && typeof v === 'string' ? `invalid duration ${JSON.stringify(v)}` : `incompatible types: TOML value has type ${tomlType(v)}; destination has type ${GO_TYPE[want]}`;
        throw new Error(`toml: key ${where}: ${detail}`);
      }
    } else if ('mapOf' in want) {
      if (!isTable(v)) throw new Error(`toml: key ${where}: incompatible types: TOML value has type ${tomlType(v)}; destination has type map`);
      for (const [name, entry] of Object.entries(v)) {
        if (!isTable(entry)) throw new Error(`toml: key ${where}.${name}: incompatible types: TOML value has type ${tomlType(entry)}; destination has type struct`);
        checkTable(want.mapOf as Table, entry, `${where}.${name}`);
      }
    } else {
      if (!isTable(v)) throw new Error(`toml: key ${where}: incompatible types: TOML value has type ${tomlType(v)}; destination has type struct`);
      checkTable(want, v, where);
    }
  }
}

/** What one file sets that the agent cares about. */
export interface DecodedConfig {
  pinnedImages?: string[];
  pauseImage?: string;
  logLevel?: string;
}

/** Decodes one configuration file as CRI-O would; throws with CRI-O's kind of message when CRI-O would refuse it. */
export function decodeCrioConfig(text: string): DecodedConfig {
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text, { integersAsBigInt: true }) as Record<string, unknown>;
  } catch (e) {
    // smol-toml's message says where; its first line is enough for a status.
    throw new Error(`toml: ${(e as Error).message.split('\n')[0]}`);
  }
  const crio = doc.crio;
  if (crio === undefined) return {};
  if (!isTable(crio)) throw new Error(`toml: key crio: incompatible types: TOML value has type ${tomlType(crio)}; destination has type struct`);
  checkTable(CRI_O_DECODED, crio, 'crio');
  const image = crio.image as Record<string, unknown> | undefined;
  const runtime = crio.runtime as Record<string, unknown> | undefined;
  const out: DecodedConfig = {};
  if (image?.pinned_images !== undefined) out.pinnedImages = image.pinned_images as string[];
  if (image?.pause_image !== undefined) out.pauseImage = image.pause_image as string;
  if (runtime?.log_level !== undefined) out.logLevel = runtime.log_level as string;
  return out;
}

/** One file CRI-O reads, in CRI-O's order. */
export interface ConfigFile {
  /** Absolute path. */
  path: string;
  /** Path relative to the drop-in folder ("/"-separated), or the absolute path for crio.conf. */
  file: string;
  /** Raw content (absent when unreadable). */
  content?: string;
  decoded?: DecodedConfig;
}

/** A file CRI-O would refuse, and why (CRI-O refuses the whole reload, and a start). */
export interface ConfigRejection {
  path: string;
  error: string;
}

export interface CrioConfigRead {
  files: ConfigFile[];
  rejected: ConfigRejection[];
  /** crio.image.pinned_images as CRI-O would load it (the last file setting it), null when no file does. */
  pinnedImages: string[] | null;
  /** The pause image CRI-O would pin (crio.image.pause_image, or the default). */
  pauseImage: string;
}

function errText(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  // Node's fs messages carry the path and the code already ("ENOENT: no such file or directory, open '...'").
  return (err?.message ?? String(e)).split('\n')[0]!.slice(0, 500);
}

/** Byte order of names, as Go's sort.Strings orders them. */
function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/**
 * Every file CRI-O reads (crio.conf first, then the drop-ins in
 * filepath.Walk order) and every one it would refuse. Unlike CRI-O, which
 * stops at the first error, all problems are collected, so a person can fix
 * them in one go.
 */
export async function readCrioConfig(mainConfig: string, dropInDir: string): Promise<CrioConfigRead> {
  const out: CrioConfigRead = { files: [], rejected: [], pinnedImages: null, pauseImage: DEFAULT_PAUSE_IMAGE };
  const read = async (full: string, file: string) => {
    const f: ConfigFile = { path: full, file };
    out.files.push(f);
    try {
      f.content = await readRegularFile(full, { maxBytes: CRIO_CONFIG_MAX_BYTES });
    } catch (e) {
      out.rejected.push({ path: full, error: errText(e) });
      return;
    }
    try {
      f.decoded = decodeCrioConfig(f.content);
    } catch (e) {
      out.rejected.push({ path: full, error: `unable to decode configuration ${full}: ${errText(e)}` });
    }
  };

  // Reload(): `if _, err := os.Stat(path); !os.IsNotExist(err)`: only a missing file (or a dangling link to one) is skipped.
  const exists = async (p: string) => fsp.stat(p).then(() => true, (e: NodeJS.ErrnoException) => e.code !== 'ENOENT' && e.code !== 'ENOTDIR');
  if (await exists(mainConfig)) await read(mainConfig, mainConfig);

  if (await exists(dropInDir)) {
    const walk = async (full: string, rel: string): Promise<void> => {
      let st;
      try {
        st = await fsp.lstat(full);
      } catch (e) {
        out.rejected.push({ path: full, error: errText(e) });
        return;
      }
      if (!st.isDirectory()) return read(full, rel || path.basename(full));
      let names: string[];
      try {
        names = await fsp.readdir(full);
      } catch (e) {
        out.rejected.push({ path: full, error: errText(e) });
        return;
      }
      for (const name of names.sort(byteOrder)) await walk(path.join(full, name), rel ? `${rel}/${name}` : name);
    };
    // filepath.Walk lstat()s the root too: a drop-in folder that is itself a link is read as one file (and fails).
    await walk(dropInDir, '');
  }

  let logLevelFrom: ConfigFile | undefined;
  let pauseFrom: ConfigFile | undefined;
  for (const f of out.files) {
    if (f.decoded?.pinnedImages !== undefined) out.pinnedImages = f.decoded.pinnedImages;
    if (f.decoded?.pauseImage !== undefined) {
      out.pauseImage = f.decoded.pauseImage;
      pauseFrom = f;
    }
    if (f.decoded?.logLevel !== undefined) logLevelFrom = f;
  }
  // Checks Reload() makes on the decoded result (ReloadLogLevel, ReloadPauseImage).
  if (logLevelFrom && !LOG_LEVELS.has(logLevelFrom.decoded!.logLevel!.toLowerCase())) {
    out.rejected.push({ path: logLevelFrom.path, error: `not a valid logrus Level: ${JSON.stringify(logLevelFrom.decoded!.logLevel)} (crio.runtime.log_level)` });
  }
  if (pauseFrom && !IMAGE_REFERENCE.test(out.pauseImage)) {
    out.rejected.push({ path: pauseFrom.path, error: `invalid pause image ${JSON.stringify(out.pauseImage)} (crio.image.pause_image)` });
  }
  return out;
}
