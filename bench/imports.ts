/**
 * Import: what a program pays to load the package, in a fresh Node process
 * each time (a warm module cache would hide it). The root entry against the
 * core entry (the contract alone, no Node-side module): the gap is what the
 * root's Node-side modules cost. The root loads no engine package (pg,
 * ioredis, dockerode, ssh2, better-sqlite3 load when their class is first
 * used); the root case checks that, too (a warning if it does), and is held
 * to issue 14's target of 30 ms.
 *
 * The sources are transpiled file by file with esbuild (what tsc emits into
 * dist/, without bundling) into the cache directory, so the figure is that of
 * the built package and not of a TypeScript loader.
 *
 * Each engine's first use is measured too: loading its package after the root
 * import, in a fresh process, as the class does when first constructed.
 */
import { execFile } from "node:child_process";
import { mkdirSync, readdirSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join, posix, relative } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { type Metafile, build } from "esbuild";
import { type BenchGroup, type CaseResult, type GroupContext, formatMs, median } from "./harness.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const PACKAGE = "strata-workspace";
const ENGINES = ["pg", "ioredis", "dockerode", "ssh2", "better-sqlite3"];
/** The root entry's cold import, p50 (issue 14). */
const ROOT_TARGET_MS = 30;

/**
 * Transpiles index.ts and the modules of `dirs` into `out`, next to a link to
 * the project's node_modules: the built package's files (as tsc emits them
 * into dist/), without a TypeScript loader. The default: what the root and
 * core entries import.
 */
export async function transpile(out: string, dirs: readonly string[] = ["core", "backends", "stores", "sandboxes"]): Promise<Metafile> {
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const entryPoints = ["index.ts"];
  for (const dir of dirs) {
    for (const name of readdirSync(join(ROOT, dir))) if (name.endsWith(".ts")) entryPoints.push(join(dir, name));
  }
  const { metafile } = await build({
    entryPoints: entryPoints.map((p) => join(ROOT, p)),
    outdir: out,
    outbase: ROOT,
    format: "esm",
    platform: "node",
    target: "node20",
    logLevel: "error",
    metafile: true,
  });
  writeFileSync(join(out, "package.json"), JSON.stringify({ type: "module", private: true }));
  symlinkSync(realpathSync(join(ROOT, "node_modules")), join(out, "node_modules"));
  return metafile;
}

/** What an entry loads at import: its static imports, followed through the package's own files. */
export interface ImportGraph {
  /** The package's own modules (the entry included) and their bytes as emitted. */
  modules: number;
  bytes: number;
  /** Packages from node_modules, by name (their own files not followed). */
  packages: string[];
  /** Node built-ins (`node:` specifiers). */
  builtins: string[];
}

/**
 * Walks the static imports (not `import()`, which loads on first use) from
 * `entry`, an output path as the metafile names it. The figures put the
 * import time in context: every module costs the loader a resolve, a read and
 * a compile, whatever its size.
 */
export function importGraph(metafile: Metafile, entry: string): ImportGraph {
  const seen = new Set<string>();
  const packages = new Set<string>();
  const builtins = new Set<string>();
  let bytes = 0;
  const visit = (file: string): void => {
    const output = metafile.outputs[file];
    if (seen.has(file) || !output) return;
    seen.add(file);
    bytes += output.bytes;
    for (const { path, kind } of output.imports) {
      if (kind !== "import-statement") continue;
      if (path.startsWith("node:")) builtins.add(path.slice("node:".length));
      else if (path.startsWith(".")) visit(posix.join(posix.dirname(file), path));
      else packages.add(path.startsWith("@") ? path.split("/").slice(0, 2).join("/") : path.split("/")[0]!);
    }
  };
  visit(entry);
  return { modules: seen.size, bytes, packages: [...packages].sort(), builtins: [...builtins].sort() };
}

interface Sample {
  /** From just before `import()` to its resolution, inside the child. */
  importMs: number;
  /** From spawn to exit, seen by this process (Node's own start-up included). */
  processMs: number;
  /** Engine packages in the child's CommonJS registry after the import (all five are CommonJS). */
  engines: string[];
}

const CHILD = `
const t0 = performance.now();
await import(process.argv[1]);
const importMs = performance.now() - t0;
const { createRequire } = await import("node:module");
const files = Object.keys(createRequire(import.meta.url).cache);
const engines = ${JSON.stringify(ENGINES)}.filter((name) => files.some((file) => file.includes("/node_modules/" + name + "/")));
process.stdout.write(JSON.stringify({ importMs, engines }));
`;

/** What loading one engine package costs the first time its class is used, after the root import (as optionalPackage loads it). */
const ENGINE_CHILD = `
const entry = process.argv[1];
await import(entry);
const { createRequire } = await import("node:module");
const require = createRequire(entry);
const t0 = performance.now();
require(process.argv[2]);
process.stdout.write(JSON.stringify({ loadMs: performance.now() - t0 }));
`;

/** The class whose first use loads each engine package. */
const ENGINE_USERS: Record<string, string> = {
  pg: "PostgresStore",
  ioredis: "RedisStore",
  dockerode: "DockerSandbox",
  ssh2: "SshSandbox",
  "better-sqlite3": "SqliteStore",
};

function engineLoadOnce(entry: string, name: string, cwd: string): Promise<number> {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--input-type=module", "-e", ENGINE_CHILD, pathToFileURL(entry).href, name], { cwd, env, timeout: 60_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`loading ${name} failed: ${stderr.trim().split("\n").slice(-3).join(" | ") || error.message}`));
      resolve((JSON.parse(stdout) as { loadMs: number }).loadMs);
    });
  });
}

function importOnce(entry: string, cwd: string): Promise<Sample> {
  const env = { ...process.env };
  delete env.NODE_OPTIONS; // no loader (tsx) in the child: it imports the transpiled files as a user would
  return new Promise((resolve, reject) => {
    const started = performance.now();
    execFile(process.execPath, ["--input-type=module", "-e", CHILD, pathToFileURL(entry).href], { cwd, env, timeout: 60_000 }, (error, stdout, stderr) => {
      const processMs = performance.now() - started;
      if (error) return reject(new Error(`import of ${entry} failed: ${stderr.trim().split("\n").slice(-3).join(" | ") || error.message}`));
      const { importMs, engines } = JSON.parse(stdout) as Omit<Sample, "processMs">;
      resolve({ importMs, processMs, engines });
    });
  });
}

export const importGroup: BenchGroup = {
  name: "import",
  title: "Import: cold import of the root and core entries, a fresh process each time",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const out = join(ctx.cacheDir, "import-build");
    const metafile = await transpile(out);
    const entries = [
      { label: `\`${PACKAGE}\` (root entry)`, file: join(out, "index.js") },
      { label: `\`${PACKAGE}/core\``, file: join(out, "core", "index.js") },
    ];
    // The metafile names outputs relative to the working directory, with `/`.
    const graphs = entries.map((entry) => importGraph(metafile, relative(process.cwd(), entry.file).split("\\").join("/")));
    const runs = ctx.quick ? 5 : ctx.reps * 3;
    const samples: Sample[][] = entries.map(() => []);
    // One warm-up each (the page cache), then runs taking turns so noise falls on both alike.
    for (const entry of entries) await importOnce(entry.file, out);
    for (let round = 0; round < runs; round++) {
      const order = round % 2 === 0 ? [0, 1] : [1, 0];
      for (const i of order) samples[i]!.push(await importOnce(entries[i]!.file, out));
    }
    const results = entries.map((entry, i): CaseResult => {
      const mine = samples[i]!;
      const processMs = median(mine.map((s) => s.processMs));
      const graph = graphs[i]!;
      const engines = [...new Set(mine.flatMap((s) => s.engines))];
      ctx.log(`${entry.label}: import p50 ${formatMs(median(mine.map((s) => s.importMs)))}, whole process p50 ${formatMs(processMs)}`);
      return {
        group: this.name,
        name: `cold import of ${entry.label}, fresh process`,
        strata: {
          name: entry.label,
          medianMs: median(mine.map((s) => s.importMs)),
          samples: mine.length,
          note:
            `whole process ${formatMs(processMs)}; ${graph.modules} modules of the package (${Math.round(graph.bytes / 1024)} kB)` +
            `${graph.packages.length > 0 ? `, packages ${graph.packages.join(", ")}` : ""}, ${graph.builtins.length} Node built-ins` +
            `${engines.length > 0 ? `; loaded ${engines.join(", ")}` : ""}`,
        },
        peers: [],
        warnings: [],
        notes: [
          "Time from just before `import()` to its resolution inside a fresh `node -e` (files transpiled by esbuild as tsc emits them, no bundling); " +
            "'whole process' is spawn to exit, Node's start-up included.",
        ],
      };
    });
    const rootEngines = [...new Set(samples[0]!.flatMap((s) => s.engines))];
    // Issue 14's target for the root entry; loading an engine package there would be a regression, so it is a warning in every run.
    results[0]!.target = { kind: "absolute", maxMs: ROOT_TARGET_MS, text: `< ${ROOT_TARGET_MS} ms` };
    if (rootEngines.length > 0) results[0]!.warnings.push(`the root import loaded ${rootEngines.join(", ")}: it must load no engine package (${ENGINES.join(", ")})`);
    // Each engine's first use: what its class adds on top of the root import, a fresh process per sample.
    const engineRuns = ctx.quick ? 3 : ctx.reps;
    for (const name of ENGINES) {
      const times: number[] = [];
      const user = ENGINE_USERS[name]!;
      let failed: string | undefined;
      try {
        for (let i = 0; i < engineRuns; i++) times.push(await engineLoadOnce(entries[0]!.file, name, out));
        ctx.log(`${user} first use (loads ${name}): p50 ${formatMs(median(times))}`);
      } catch (error) {
        failed = error instanceof Error ? error.message : String(error); // an optional package not installed here
      }
      results.push({
        group: this.name,
        name: `first use of ${user} after the root import (loads ${name}), fresh process`,
        strata: { name: user, medianMs: failed ? Number.NaN : median(times), samples: times.length, failed },
        peers: [],
        warnings: [],
        notes: ["Time to load the engine package the way the class does on its first use (a synchronous require), after the root import, in a fresh process."],
      });
    }
    return results;
  },
};
