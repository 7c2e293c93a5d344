/**
 * What importing the root entry loads (issue 14): a few files of the package,
 * no package at all (no engine package, test/optional-packages.test.ts;
 * picomatch and diff are compiled into the package's files), and none of the costly Node built-ins (node:crypto, node:child_process,
 * node:worker_threads), which load with the first hash or spawn. And what the
 * bundling must not break: one copy of every class across the public paths.
 * The package's JavaScript is built as `npm run build` builds it
 * (scripts/build-lib.ts, as the bench's import group does) and run by plain
 * Node in a fresh process: a TypeScript loader would load some of these
 * itself.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildPackage, importGraph } from "../bench/imports.js";
import type { LibraryBuild } from "../scripts/build-lib.js";
import { browserBundleInputs } from "./support/browser-bundle.js";

const LAZY_BUILTINS = ["crypto", "child_process", "worker_threads"];
const ENGINES = ["pg", "ioredis", "dockerode", "ssh2", "better-sqlite3"];

/**
 * Imports `entries`, says what of the lazy built-ins it loaded, then compiles
 * a glob and diffs two snapshots of a StateBackend, and says what is loaded
 * then. `bare`: as on a Node without process.getBuiltinModule (before 20.16).
 */
const SCRIPT = `
const [entries, bare] = process.argv.slice(1);
if (bare === "bare") delete process.getBuiltinModule;
const { createRequire } = await import("node:module");
const cache = createRequire(import.meta.url).cache;
const loaded = () => ({
  builtins: ${JSON.stringify(LAZY_BUILTINS)}.filter((name) => process.moduleLoadList.includes("NativeModule " + name)),
  engines: ${JSON.stringify(ENGINES)}.filter((name) => Object.keys(cache).some((file) => file.includes("/node_modules/" + name + "/"))),
});
const m = {};
for (const entry of entries.split(" ")) Object.assign(m, await import(entry));
const afterImport = loaded();
const matches = [m.compileGlob("**/*.ts")("/src/a.ts"), m.compileGlob("**/*.ts")("/src/a.js")];
const state = new m.StateBackend();
await state.write("/a.txt", "one\\n");
const id = state.snapshot();
await state.edit("/a.txt", "one", "two");
const answer = state.diff(id);
const patch = answer.error ? { error: answer.error.code } : answer.changes[0].patch.split("\\n").filter((line) => /^[-+][a-z]/.test(line));
console.log(JSON.stringify({ afterImport, matches, patch, afterUse: loaded() }));
`;

function run(entries: string[], cwd: string, bare = false): Promise<unknown> {
  return node(SCRIPT, [entries.map((entry) => pathToFileURL(entry).href).join(" "), bare ? "bare" : ""], cwd);
}

/** Runs `script` in plain Node (no TypeScript loader) and parses the last line it prints. */
function node(script: string, args: string[], cwd: string): Promise<unknown> {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--input-type=module", "-e", script, ...args], { cwd, env, timeout: 60_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`child failed: ${error.message}\n${stderr}`));
      resolve(JSON.parse(stdout.trim().split("\n").at(-1) ?? ""));
    });
  });
}

describe("cold import of the root entry", () => {
  let dir: string;
  let built: LibraryBuild;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "strata-cold-import-"));
    built = await buildPackage(dir);
  });

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("reads a few files, and imports no package and none of the costly built-ins, statically", () => {
    const graph = importGraph(built, join(dir, "index.js"));
    expect(graph.sources).toBeGreaterThan(40); // the walk found the package's modules: an empty answer is not blindness
    expect(graph.files).toBeLessThanOrEqual(5); // the root's file, its hub and the chunks it shares with the core's and the portable hub
    expect(graph.packages).toEqual([]);
    for (const name of LAZY_BUILTINS) expect(graph.builtins).not.toContain(name);
  });

  const used = { matches: [true, false], patch: ["-one", "+two"] };

  it("loads none of the costly built-ins with the import, a glob or a snapshot diff", async () => {
    expect(await run([join(dir, "index.js")], dir)).toEqual({ afterImport: { builtins: [], engines: [] }, ...used, afterUse: { builtins: [], engines: [] } });
  });

  it("globs and diffs on a Node without process.getBuiltinModule too, from the root or from the core and a backend alone", async () => {
    expect(await run([join(dir, "index.js")], dir, true)).toMatchObject(used);
    expect(await run([join(dir, "core", "index.js"), join(dir, "backends", "state.js")], dir, true)).toMatchObject(used);
  });
});

/**
 * Imports the root, the core and every other public path of the built package
 * in one process, and says which names two of them export as different
 * objects: a class compiled into two files would be two classes, and
 * `instanceof` or an error check would fail across entries.
 */
const SAME_OBJECTS = `
const [base, ...paths] = process.argv.slice(1);
const root = await import(base + "/index.js");
const core = await import(base + "/core/index.js");
const runtime = await import(base + "/runtime/index.js");
const differ = [];
const renamed = [];
let compared = 0;
for (const path of paths) {
  const m = await import(base + "/" + path);
  for (const [name, value] of Object.entries(m)) {
    // A class the bundler renamed (two modules' classes of one name) would change its errors' name (StrataError takes constructor.name).
    if (typeof value === "function" && Function.prototype.toString.call(value).startsWith("class") && value.name !== name) renamed.push(path + " " + name + " is " + value.name);
    for (const [entry, other] of [["root", root], ["core", core]]) {
      if (!(name in other)) continue;
      compared++;
      if (other[name] !== value) differ.push(path + " " + name + " (" + entry + ")");
    }
  }
}
const runtimeErrorIsStrataError = runtime.RuntimeError.prototype instanceof core.StrataError;
// runtime/provider.ts reads runtime/cold-start.json next to its module: the build puts a copy beside the file it landed in.
const coldStart = typeof new runtime.LocalProvider("local").capabilities().coldStart;
console.log(JSON.stringify({ differ, renamed, compared, runtimeErrorIsStrataError, coldStart }));
`;

describe("the built package", () => {
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "strata-built-"));
    await buildPackage(dir);
  });

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("has one copy of each class: every public path exports the root's and the core's objects", async () => {
    const wildcard = ["backends", "stores", "sandboxes", "adapters"].flatMap((sub) =>
      readdirSync(join(dir, sub))
        .filter((name) => name.endsWith(".js"))
        .map((name) => `${sub}/${name}`),
    );
    const paths = ["index.js", "core/index.js", "runtime/index.js", "tools/index.js", "mcp/index.js", ...wildcard];
    expect(wildcard.length).toBeGreaterThan(40);
    const result = (await node(SAME_OBJECTS, [pathToFileURL(dir).href, ...paths], dir)) as { differ: string[]; renamed: string[]; compared: number; runtimeErrorIsStrataError: boolean; coldStart: string };
    // The one name two modules use for different functions (a file's window of lines, and the read limits' check).
    expect(result.differ).toEqual(["backends/filesystem-text.js readWindow (root)", "backends/filesystem-text.js readWindow (core)"]);
    expect(result.renamed).toEqual([]);
    expect(result.compared).toBeGreaterThan(200); // names were compared: an empty list is not blindness
    expect(result.runtimeErrorIsStrataError).toBe(true); // across the two builds: runtime's errors extend the core's class
    expect(result.coldStart).toBe("object"); // a measured figure, not "not measured"
  });

  it("keeps the providers' registration in the one file package.json's sideEffects names, so a bundler keeps it", () => {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { sideEffects: string[] };
    expect(pkg.sideEffects).toEqual(["./dist/runtime/index.js"]);
    const calls = (file: string) => (readFileSync(join(dir, file), "utf8").match(/registerBuiltinProviders\(providers\)/g) ?? []).length;
    expect(calls("runtime/index.js")).toBe(1);
    const chunks = readdirSync(join(dir, "chunks")).filter((name) => name.endsWith(".js"));
    expect(chunks.map((name) => calls(`chunks/${name}`)).reduce((a, b) => a + b, 0)).toBe(0);
  });

  it("bundles the core and the in-memory backends for a browser with no Node built-ins (test/core.test.ts does it from the sources)", async () => {
    const inputs = await browserBundleInputs(dir, ["core/index.js", "backends/state.js", "backends/composite.js", "stores/memory.js"], "js");
    expect(inputs.some((input) => input.includes("/chunks/portable.js"))).toBe(true);
  });
});
