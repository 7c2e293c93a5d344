/**
 * Import: what a program pays to load the package, in a fresh Node process
 * each time (a warm module cache would hide it). The root entry against the
 * core entry (the contract alone, no Node-side module): the gap is what the
 * root's Node-side modules cost. The root loads no engine package (pg,
 * ioredis, dockerode, ssh2, better-sqlite3 load when their class is first
 * used); the root case checks that, too (a warning if it does), and is held
 * to issue 14's target of 30 ms.
 *
 * The package's JavaScript is built as `npm run build` builds it
 * (scripts/build-lib.ts) into the cache directory, so the figure is that of
 * the built package and not of a TypeScript loader.
 *
 * Each engine's first use is measured too: loading its package after the root
 * import, in a fresh process, as the class does when first constructed.
 */
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { type LibraryBuild, buildLibrary } from "../scripts/build-lib.js";
import { type BenchGroup, type CaseResult, type GroupContext, formatMs, median } from "./harness.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const PACKAGE = "strata-workspace";
const ENGINES = ["pg", "ioredis", "dockerode", "ssh2", "better-sqlite3"];
/** The root entry's cold import, p50 (issue 14). */
const ROOT_TARGET_MS = 30;

/**
 * Builds the package's JavaScript into `out` (emptied first) as `npm run
 * build` does into dist/, next to a link to the project's node_modules.
 */
export async function buildPackage(out: string): Promise<LibraryBuild> {
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  const built = await buildLibrary(out);
  writeFileSync(join(out, "package.json"), JSON.stringify({ type: "module", private: true }));
  symlinkSync(realpathSync(join(ROOT, "node_modules")), join(out, "node_modules"));
  return built;
}

/** What an entry loads at import: its static imports, followed through the package's own files. */
export interface ImportGraph {
  /** The package's files (the entry included) and their bytes. */
  files: number;
  bytes: number;
  /** The source modules compiled into those files. */
  sources: number;
  /** Packages from node_modules, by name (their own files not followed). */
  packages: string[];
  /** Node built-ins (`node:` specifiers). */
  builtins: string[];
}

/** A static `import … from "x"`, `export … from "x"` or `import "x"` at the start of a line, as esbuild prints them. */
const STATIC_IMPORT = /^(?:import|export)\s(?:[^;"'`]*?\sfrom\s*)?["']([^"']+)["'];?$/gm;

/**
 * Walks the static imports (not `import()`, which loads on first use) from
 * `entry`, reading the built files as Node would. The figures put the import
 * time in context: every file costs the loader a resolve, a read and a
 * compile, whatever its size.
 */
export function importGraph(built: LibraryBuild, entry: string): ImportGraph {
  const seen = new Set<string>();
  const packages = new Set<string>();
  const builtins = new Set<string>();
  const sources = new Set<string>();
  const inputsOf = new Map(Object.entries(built.metafile.outputs).map(([file, output]) => [resolve(ROOT, file), Object.keys(output.inputs)]));
  let bytes = 0;
  const visit = (file: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    bytes += statSync(file).size;
    for (const input of inputsOf.get(file) ?? []) if (!input.includes("node_modules/") && input.endsWith(".ts")) sources.add(input);
    for (const [, path] of readFileSync(file, "utf8").matchAll(STATIC_IMPORT)) {
      if (path!.startsWith("node:")) builtins.add(path!.slice("node:".length));
      else if (path!.startsWith(".")) visit(resolve(dirname(file), path!));
      else packages.add(path!.startsWith("@") ? path!.split("/").slice(0, 2).join("/") : path!.split("/")[0]!);
    }
  };
  visit(resolve(entry));
  return { files: seen.size, bytes, sources: sources.size, packages: [...packages].sort(), builtins: [...builtins].sort() };
}

interface Sample {
  /** From just before `import()` to its resolution, inside the child. */
  importMs: number;
  /** The child's CPU time (user + system) over the same span: what a busy machine inflates least. */
  cpuMs: number;
  /** From spawn to exit, seen by this process (Node's own start-up included). */
  processMs: number;
  /** Engine packages in the child's CommonJS registry after the import (all five are CommonJS). */
  engines: string[];
}

const CHILD = `
const cpu0 = process.cpuUsage();
const t0 = performance.now();
await import(process.argv[1]);
const importMs = performance.now() - t0;
const cpu = process.cpuUsage(cpu0);
const cpuMs = (cpu.user + cpu.system) / 1000;
const { createRequire } = await import("node:module");
const files = Object.keys(createRequire(import.meta.url).cache);
const engines = ${JSON.stringify(ENGINES)}.filter((name) => files.some((file) => file.includes("/node_modules/" + name + "/")));
process.stdout.write(JSON.stringify({ importMs, cpuMs, engines }));
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
  delete env.NODE_OPTIONS; // no loader (tsx) in the child: it imports the built files as a user would
  return new Promise((resolve, reject) => {
    const started = performance.now();
    execFile(process.execPath, ["--input-type=module", "-e", CHILD, pathToFileURL(entry).href], { cwd, env, timeout: 60_000 }, (error, stdout, stderr) => {
      const processMs = performance.now() - started;
      if (error) return reject(new Error(`import of ${entry} failed: ${stderr.trim().split("\n").slice(-3).join(" | ") || error.message}`));
      const { importMs, cpuMs, engines } = JSON.parse(stdout) as Omit<Sample, "processMs">;
      resolve({ importMs, cpuMs, processMs, engines });
    });
  });
}

export const importGroup: BenchGroup = {
  name: "import",
  title: "Import: cold import of the root and core entries, a fresh process each time",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const out = join(ctx.cacheDir, "import-build");
    const built = await buildPackage(out);
    const entries = [
      { label: `\`${PACKAGE}\` (root entry)`, file: join(out, "index.js") },
      { label: `\`${PACKAGE}/core\``, file: join(out, "core", "index.js") },
    ];
    const graphs = entries.map((entry) => importGraph(built, entry.file));
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
      const cpuMs = median(mine.map((s) => s.cpuMs));
      ctx.log(`${entry.label}: import p50 ${formatMs(median(mine.map((s) => s.importMs)))} (CPU ${formatMs(cpuMs)}), whole process p50 ${formatMs(processMs)}`);
      return {
        group: this.name,
        name: `cold import of ${entry.label}, fresh process`,
        strata: {
          name: entry.label,
          medianMs: median(mine.map((s) => s.importMs)),
          samples: mine.length,
          note:
            `CPU ${formatMs(cpuMs)}; whole process ${formatMs(processMs)}; ${graph.files} files of the package (${Math.round(graph.bytes / 1024)} kB, ${graph.sources} source modules)` +
            `${graph.packages.length > 0 ? `, packages ${graph.packages.join(", ")}` : ""}, ${graph.builtins.length} Node built-ins` +
            `${engines.length > 0 ? `; loaded ${engines.join(", ")}` : ""}`,
        },
        peers: [],
        warnings: [],
        notes: [
          "Time from just before `import()` to its resolution inside a fresh `node -e` (the package's JavaScript as `npm run build` makes it: scripts/build-lib.ts); " +
            "'CPU' is the child's CPU time over that span (p50), which a busy machine inflates less than wall time; 'whole process' is spawn to exit, Node's start-up included.",
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
