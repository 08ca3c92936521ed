// `pinset size FILE...`: per image and in total, the download size
// (compressed layers and config, for the platform) and the disk the agent
// would estimate for it (download x --disk-estimate-factor), each distinct
// layer counted once in the total. Takes what `pinset resolve` takes: sets
// or plain lists, by tag or digest.
// Exit status: 0 every size known, 1 an image could not be sized, 2 usage error.
import { RegistryError } from '../registry/client.ts';
import { formatPlatform, hostPlatform, ManifestError, parsePlatform, type Platform } from '../registry/manifest.ts';
import { formatImageName, parseImageName, type ImageName } from '../registry/names.ts';
import { DEFAULT_DISK_ESTIMATE_FACTOR, distinctBytes, formatBytes, imageCost, PlatformNotFoundError, type ImageCost } from '../registry/size.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import { readInputs } from './image-input.ts';
import { mapLimit } from '../util/limit.ts';
import { REGISTRY_FLAGS, registryClientFrom } from './registry-options.ts';
import type { CommandIO } from './resolve.ts';


export const SIZE_FLAGS: readonly FlagSpec[] = [
  { name: 'output', short: 'o', type: 'string', choices: ['table', 'yaml', 'json'], default: 'table', help: 'output format' },
  { name: 'platform', env: 'PINSET_PLATFORM', type: 'string', help: 'os/arch[/variant] whose image of a multi-arch index is sized (default: this machine\'s)' },
  { name: 'disk-estimate-factor', env: 'PINSET_DISK_ESTIMATE_FACTOR', type: 'number', default: DEFAULT_DISK_ESTIMATE_FACTOR, help: 'estimated disk = download size x this (the agent\'s factor)' },
  ...REGISTRY_FLAGS,
];

const USAGE = 'pinset size [flags] FILE...';
const SUMMARY =
  'Prints, per image and in total, the download size (compressed layers and config) and the disk\n' +
  'the agent would estimate (download x --disk-estimate-factor); a layer shared by several images\n' +
  'counts once in the total. Exit status: 0 every size known, 1 an image could not be sized, 2 usage error.';

export interface SizeRow {
  image: string;
  digest: string;
  platform?: string;
  platformDigest?: string;
  layers: number;
  downloadBytes: number;
  estimatedDiskBytes: number;
}

export interface SizeReport {
  platform: string;
  diskEstimateFactor: number;
  images: SizeRow[];
  total: { images: number; distinctLayers: number; downloadBytes: number; estimatedDiskBytes: number };
}

export function sizeReport(rows: { image: string; cost: ImageCost }[], platform: Platform, factor: number): SizeReport {
  const d = distinctBytes(rows.map((r) => r.cost));
  return {
    platform: formatPlatform(platform),
    diskEstimateFactor: factor,
    images: rows.map(({ image, cost }) => ({
      image,
      digest: cost.digest,
      ...(cost.platform ? { platform: cost.platform, platformDigest: cost.platformDigest } : {}),
      layers: cost.layers.length,
      downloadBytes: cost.downloadBytes,
      estimatedDiskBytes: Math.ceil(cost.downloadBytes * factor),
    })),
    total: { images: rows.length, distinctLayers: d.layers, downloadBytes: d.bytes, estimatedDiskBytes: Math.ceil(d.bytes * factor) },
  };
}

export function renderSizeTable(r: SizeReport): string {
  const head = ['IMAGE', 'LAYERS', 'DOWNLOAD', `DISK (x${r.diskEstimateFactor})`];
  const body = r.images.map((i) => [i.image, String(i.layers), formatBytes(i.downloadBytes), formatBytes(i.estimatedDiskBytes)]);
  const total = [`TOTAL: ${r.total.images} image(s), ${r.total.distinctLayers} distinct layer(s), ${r.platform}`, '', formatBytes(r.total.downloadBytes), formatBytes(r.total.estimatedDiskBytes)];
  const rows = [head, ...body, total];
  const widths = head.map((_, c) => Math.max(...rows.map((row) => row[c]!.length)));
  const line = (row: string[]) => row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('   ').trimEnd();
  return rows.map(line).join('\n') + '\n';
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = SIZE_FLAGS;

export async function run(argv: string[], io: CommandIO = { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const { values, positional } = parseFlags(SIZE_FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, SIZE_FLAGS));
    return 0;
  }
  let platform: Platform;
  try {
    platform = values.platform ? parsePlatform(values.platform as string) : hostPlatform();
  } catch (e) {
    throw new UsageError(`--platform: ${(e as Error).message}`);
  }
  const factor = values['disk-estimate-factor'] as number;
  if (!(factor >= 1)) throw new UsageError('--disk-estimate-factor must be at least 1');
  const inputs = await readInputs(positional, io.stdin, USAGE);
  const problems = [...inputs.problems];
  const names = new Map<string, { name: ImageName; where: string[] }>();
  for (const set of inputs.sets) {
    for (const img of set.images) {
      const r = parseImageName(img.name);
      if (!r.ok) {
        problems.push(`${img.where}: ${r.error}`);
        continue;
      }
      const key = formatImageName(r.value);
      const entry = names.get(key) ?? { name: r.value, where: [] };
      entry.where.push(img.where);
      names.set(key, entry);
    }
  }
  const client = await registryClientFrom(values, 'size', io.stderr);
  const costs: { image: string; cost: ImageCost }[] = [];
  try {
    const list = [...names];
    const results = await mapLimit(list, values.parallel as number, async ([key, { name, where }]) => {
      try {
        return { image: key, cost: await imageCost(client, name, platform) };
      } catch (e) {
        if (e instanceof RegistryError) problems.push(`${where[0]}: ${e.message}`);
        else if (e instanceof PlatformNotFoundError || e instanceof ManifestError) problems.push(`${where[0]}: ${key}: ${e.message}`);
        else throw e;
        return null;
      }
    });
    for (const r of results) if (r) costs.push(r);
  } finally {
    await client.close();
  }
  if (problems.length > 0) {
    for (const p of problems) io.stderr.write(`pinset size: ${p}\n`);
    io.stderr.write(`pinset size: ${problems.length} image(s) or document(s) could not be sized; the total below leaves them out\n`);
  }
  const report = sizeReport(costs, platform, factor);
  const format = values.output as string;
  if (format === 'json') io.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
  else if (format === 'yaml') io.stdout.write((await import('yaml')).stringify(report, { lineWidth: 0 }));
  else io.stdout.write(renderSizeTable(report));
  return problems.length > 0 ? 1 : 0;
}
