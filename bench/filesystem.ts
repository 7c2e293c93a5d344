/**
 * On disk: a generated 50k-file tree (mixed .ts/.md/.txt, nested) searched by
 * Strata's FilesystemBackend, deepagents' FilesystemBackend and the `rg` CLI;
 * and a window of lines read from the middle of a 1 GiB file, in child
 * processes so each backend's peak memory is its own.
 *
 * The data is generated once under the OS temp directory and reused.
 */
import { closeSync, mkdirSync, openSync, writeSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { FilesystemBackend as DeepagentsFilesystemBackend } from "deepagents";
import { FilesystemBackend } from "../backends/filesystem.js";
import { toSeedProtocol } from "../core/seed.js";
import {
  type BenchGroup,
  type CaseResult,
  type ContenderResult,
  type Contender,
  type GroupContext,
  cached,
  checkCounts,
  commandAvailable,
  compare,
  countLines,
  median,
  runCommand,
  runInChild,
} from "./harness.js";
import type { ReadArgs, ReadOutcome } from "./read-big.js";

const NEEDLE = "TODO(strata)";
const GLOB = "**/*.ts";
const EXTENSIONS = ["ts", "md", "txt"] as const;

// ---------------------------------------------------------------- the tree

/** Where file `i` of the tree goes: ten packages, a quarter at package level, some four levels deep. */
function treePath(i: number): string {
  const pkg = `pkg${i % 10}`;
  const nested = i % 4 === 0 ? "" : `/src/mod${Math.floor(i / 10) % 25}${i % 8 === 1 ? `/deep/level${i % 5}` : ""}`;
  return `${pkg}${nested}/file${i}.${EXTENSIONS[i % 3]}`;
}

/** About 1 KB of text in the file's language; one file in 37 mentions the needle, one in 111 twice. */
function treeText(i: number): string {
  const mark = (n: number) => (i % 37 === 0 && (n === 0 || i % 111 === 0) ? `${NEEDLE} ` : "");
  switch (EXTENSIONS[i % 3]) {
    case "ts":
      return [
        `import { helper${i % 50} } from "../util/helper${i % 50}.js";`,
        "",
        `/** Computes the ${i}th value. ${mark(0)}check the bounds */`,
        `export function compute${i}(input: number[]): number {`,
        "  let total = 0;",
        "  for (const value of input) {",
        `    total += helper${i % 50}(value) * ${i};`,
        "  }",
        `  // ${mark(1)}cache this result`,
        "  return total;",
        "}",
        "",
        `export const LABEL_${i} = "module ${i}";`,
        "",
      ].join("\n");
    case "md":
      return [
        `# Module ${i}`,
        "",
        `This page describes module ${i} and how it fits with its neighbours.`,
        `${mark(0)}Write the section on configuration.`,
        "",
        "## Usage",
        "",
        "Call the function with a list of numbers and read the total it returns.",
        `${mark(1)}Add an example with negative numbers.`,
        "",
      ].join("\n");
    default:
      return Array.from(
        { length: 12 },
        (_, n) => `2024-01-${String((n % 28) + 1).padStart(2, "0")} 12:00:${String(n).padStart(2, "0")} worker-${i % 7} ${n === 3 ? mark(0) : n === 9 ? mark(1) : ""}processed batch ${i * 12 + n}`,
      ).join("\n") + "\n";
  }
}

function buildTree(dir: string, count: number): void {
  const made = new Set<string>();
  for (let i = 0; i < count; i++) {
    const path = join(dir, treePath(i));
    const parent = dirname(path);
    if (!made.has(parent)) {
      mkdirSync(parent, { recursive: true });
      made.add(parent);
    }
    const fd = openSync(path, "w");
    writeSync(fd, treeText(i));
    closeSync(fd);
  }
}

/** The directory of a generated tree of `count` files (mixed .ts/.md/.txt, nested), built once. */
export function generatedTree(ctx: GroupContext, count: number): Promise<string> {
  return cached(join(ctx.cacheDir, `tree-${count}-v1`), (dir) => buildTree(dir, count), ctx.log);
}

/** The literal string the generated trees hold in one file in 37. */
export const TREE_NEEDLE = NEEDLE;

// ---------------------------------------------------------------- the big file

/** Line `n` (1-based) of the big file: exactly 99 characters plus the newline, so its content is checkable. */
function bigLine(n: number): string {
  const head = `${String(n).padStart(10, "0")} the quick brown fox jumps over the lazy dog; line ${n} of the big file `;
  return head.padEnd(99, ".");
}

function buildBigFile(path: string, bytes: number): void {
  const fd = openSync(path, "w");
  const lineBytes = 100;
  const total = Math.ceil(bytes / lineBytes);
  const perChunk = 40_000;
  for (let start = 1; start <= total; start += perChunk) {
    let chunk = "";
    for (let n = start; n < Math.min(start + perChunk, total + 1); n++) chunk += bigLine(n) + "\n";
    writeSync(fd, chunk);
  }
  closeSync(fd);
}

// ---------------------------------------------------------------- the group

const READ_MODULE = join(dirname(fileURLToPath(import.meta.url)), "read-big.ts");

export const filesystemGroup: BenchGroup = {
  name: "filesystem",
  title: "On disk",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const fileCount = ctx.quick ? 5_000 : 50_000;
    const label = `${fileCount / 1000}k-file tree`;
    const root = await generatedTree(ctx, fileCount);
    // Every row here has deepagents (the seed shape) among its peers, so Strata is measured through toSeedProtocol.
    const native = new FilesystemBackend({ workspace: root, virtualMode: true });
    const strata = toSeedProtocol(native);
    const deepagents = new DeepagentsFilesystemBackend({ rootDir: root, virtualMode: true });
    const haveRg = await commandAvailable("rg");
    if (!haveRg) ctx.log("rg not found: the ripgrep rows are left out (apt-get install ripgrep)");
    const rg = (args: string[], label: string): Contender => ({
      name: `rg CLI \`rg ${label}\``,
      run: async () => {
        const out = await runCommand("rg", args, root);
        if (out.code !== 0 && out.code !== 1) throw new Error(`rg exited ${out.code}: ${out.stderr.slice(0, 200)}`);
        return countLines(out.stdout);
      },
    });

    const common = { group: this.name, reps: ctx.reps };
    const results: CaseResult[] = [];

    ctx.log(`literal grep over the ${label}`);
    const rgGrepFlags = ["--fixed-strings", "--line-number", "--hidden", "--no-ignore"];
    results.push(
      await compare({
        ...common,
        name: `literal grep over a ${label}`,
        strata: { name: "Strata FilesystemBackend", run: async () => (await strata.grep(NEEDLE, "/")).matches.length },
        peers: [
          ...(haveRg ? [rg([...rgGrepFlags, "--", NEEDLE, "."], `-F -n --hidden --no-ignore`)] : []),
          {
            name: "deepagents FilesystemBackend",
            run: async () => (await deepagents.grep(NEEDLE, "/")).matches?.length ?? -1,
          },
        ],
        target: { kind: "ratio", peer: "rg CLI `rg -F -n --hidden --no-ignore`", min: 1 / 1.1, text: "within 1.1× of rg" },
        notes: [
          "The rg CLI row is spawning rg in the tree's directory and collecting its output. deepagents' FilesystemBackend.grep also " +
            "runs rg (`--json -F`, without --hidden or --no-ignore) and parses its output; the tree has no hidden or ignored files, " +
            "so every contender searches the same files.",
        ],
      }),
    );

    ctx.log(`glob ${GLOB} over the ${label}`);
    results.push(
      await compare({
        ...common,
        name: `glob \`${GLOB}\` over a ${label}`,
        strata: { name: "Strata FilesystemBackend", run: async () => (await strata.globInfo(GLOB, "/")).length },
        peers: [
          { name: "deepagents FilesystemBackend", run: async () => (await deepagents.glob(GLOB, "/")).files?.length ?? -1 },
          ...(haveRg ? [rg(["--files", "--hidden", "--no-ignore", "-g", "*.ts"], `--files --hidden --no-ignore -g '*.ts'`)] : []),
        ],
        target: { kind: "ratio", peer: "deepagents FilesystemBackend", min: 3, text: "≥ 3× faster" },
        notes: ["deepagents' FilesystemBackend.glob runs fast-glob, then stats each match."],
      }),
    );

    if (haveRg) {
      ctx.log(`glob ${GLOB}, paths only, over the ${label}`);
      results.push(
        await compare({
          ...common,
          name: `glob \`${GLOB}\` over a ${label}, paths only (\`sizes: false\`, as the glob tool asks)`,
          strata: { name: "Strata FilesystemBackend", run: async () => (await native.glob(GLOB, { sizes: false })).entries?.length ?? -1 },
          peers: [rg(["--files", "--hidden", "--no-ignore", "-g", "*.ts"], `--files --hidden --no-ignore -g '*.ts'`)],
          target: { kind: "ratio", peer: "rg CLI `rg --files --hidden --no-ignore -g '*.ts'`", min: 1 / 1.5, text: "within 1.5× of rg" },
          notes: [
            "Both list paths from directory entries, with no stat per match. rg walks with a thread per core (2 here); Strata opens each " +
              "directory relative to its parent's descriptor (no symlink followed) and reads entries both on the event loop's thread and on " +
              "the thread pool (up to 32 directories at once), then sorts the answer.",
          ],
        }),
      );
    }

    results.push(await readBigFile(ctx, this.name));
    return results;
  },
};

/** Lines 1,000,000..1,000,100 (1-based) of a 1 GiB file, each backend in its own guarded child process. */
async function readBigFile(ctx: GroupContext, group: string): Promise<CaseResult> {
  const bytes = ctx.quick ? 128 * 2 ** 20 : 2 ** 30;
  const size = ctx.quick ? "128 MiB" : "1 GiB";
  const dir = await cached(join(ctx.cacheDir, `big-${bytes}-v1`), (d) => buildBigFile(join(d, "big.txt"), bytes), ctx.log);
  const first = 1_000_000;
  const args: ReadArgs = { root: dir, path: "/big.txt", offset: first - 1, limit: 101, reps: ctx.reps, budgetMs: 15_000 };
  const expected = Array.from({ length: 101 }, (_, i) => `${String(first + i).padStart(6, " ")}\t${bigLine(first + i)}`);
  const limits = { memLimitMB: 4096, timeoutMs: 180_000 };

  const measure = async (name: string, exportName: string): Promise<ContenderResult> => {
    ctx.log(`read of lines 1,000,000..1,000,100 of a ${size} file: ${name} (child process, ${limits.memLimitMB} MB guard)`);
    const outcome = await runInChild<ReadArgs, ReadOutcome>(READ_MODULE, exportName, args, limits);
    const result: ContenderResult = { name, medianMs: NaN, samples: 0 };
    const read = outcome.result;
    if (!read) {
      result.failed = outcome.failed;
      result.extraMB = outcome.polledPeakMB;
      result.note = "RSS is the whole process, polled";
      return result;
    }
    result.extraMB = read.extraMB;
    if (read.error !== undefined) {
      result.failed = read.error.length > 120 ? `${read.error.slice(0, 117)}...` : read.error;
      result.medianMs = read.firstMs;
      result.samples = 1;
      return result;
    }
    const times = read.times.length > 0 ? read.times : [read.firstMs];
    result.medianMs = median(times);
    result.samples = times.length;
    result.count = read.lines?.length;
    const wrong = read.lines?.findIndex((line, i) => line !== expected[i]) ?? -1;
    if (wrong !== -1) result.note = `line ${first + wrong} differs from the file`;
    return result;
  };

  const strata = await measure("Strata FilesystemBackend", "strataRead");
  const deepagents = await measure("deepagents FilesystemBackend", "deepagentsRead");
  const warnings: string[] = [];
  checkCounts(strata, [deepagents], warnings);
  for (const r of [strata, deepagents]) if (r.note?.includes("differs")) warnings.push(`${r.name}: ${r.note}`);
  return {
    group,
    name: `read lines 1,000,000..1,000,100 of a ${size} file (time, peak extra RSS)`,
    strata,
    peers: [deepagents],
    target: { kind: "memory", maxMB: 50, text: "< 50 MB extra memory" },
    warnings,
    notes: [
      "Each backend reads in a child process of its own (killed past 4 GB RSS). Peak extra memory = VmHWM after the first read " +
        "minus VmRSS just before it (the peak is reset through /proc/self/clear_refs); time = median of the later reads, " +
        "or the time to the error for a backend that fails. The file is in the page cache.",
    ],
  };
}
