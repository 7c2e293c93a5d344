/**
 * The library's JavaScript as the package ships it (issue 14): a cold
 * `import "strata-workspace"` reads and compiles a handful of files instead of
 * one per module (each costs the loader a resolve, a read and a compile,
 * whatever its size: about 0.23 ms of the ~58 ms that ~60 modules took).
 *
 * Why not one esbuild build with every public file as an entry point, as
 * tsup or unbuild do: `exports` maps every file of backends/, stores/ and
 * sandboxes/, and esbuild's splitting gives each set of entry points that
 * reaches a piece of code a chunk of its own: the root loaded 52 files. So
 * the code is grouped by hand, and no module is compiled into two files (a
 * class exists once, so `instanceof` and the error classes hold across
 * entries):
 *
 * - hub `chunks/core.js`: every module of core/ (no Node built-ins).
 * - hub `chunks/portable.js`: the modules the root imports statically that
 *   import no Node built-in, themselves or through what they import
 *   (StateBackend, CompositeBackend, MemoryStore, …): a browser bundle of
 *   `strata-workspace/backends/state` takes no `node:` import.
 * - hub `chunks/node.js`: the root (index.ts) and the other modules it
 *   imports statically. The three hubs are one esbuild build: what two of
 *   them use is a chunk shared between them.
 * - everything else (runtime, tools, mcp, conformance, adapters, and a
 *   backends/stores/sandboxes module the root does not import, such as the
 *   lazily imported sandboxes/bubblewrap-warm.ts): a second build, its
 *   entries at their own paths, where an import of a module of a hub is a
 *   re-export from the hub's file.
 *
 * A hub exports every export of every module in it, renamed `m<i>_<name>`;
 * each public path of the hubs (index.js, core/index.js, backends/x.js, …)
 * is a generated file of re-exports from its hub under the original names.
 * Every output sits in `<out>/` (the root's file) or one directory below it,
 * so an import between the builds is the same relative path from any file.
 *
 * npm packages stay imports (what the package depends on resolves at run
 * time; the engines load on first use, stores/optional-package.ts), but for
 * the two the root needs (INLINED). Declarations come from tsc
 * (emitDeclarationOnly); the CLI is bundled on its own
 * (scripts/bundle-cli.ts).
 *
 *   tsx scripts/build-lib.ts dist        (npm run build runs it)
 */
import { copyFileSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { isBuiltin } from "node:module";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { type BuildOptions, type Metafile, type Plugin, build } from "esbuild";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Directories whose every module is a public path (`exports`: `./backends/*` and so on). */
const WILDCARD_DIRS = ["backends", "stores", "sandboxes"];
/** Public entries of the second build besides the wildcard modules the root leaves out. */
const UPPER_ENTRIES = ["runtime/index.ts", "tools/index.ts", "mcp/index.ts", "conformance/index.ts"];
const UPPER_DIRS = ["adapters"];
/**
 * Packages the root imports statically, compiled into the hubs instead of
 * loaded from node_modules: picomatch is CommonJS in five files and diff's
 * patch module a few ES modules; loading them was a fifth of the root
 * import's instructions once the package's own modules were bundled
 * (valgrind, over an empty process: 155M → 125M). Their licenses are copied
 * to `<out>/licenses/`. Every other package stays an import.
 */
const INLINED = ["picomatch", "diff"];

const COMMON = {
  absWorkingDir: ROOT,
  bundle: true,
  format: "esm",
  platform: "node",
  target: "node20",
  logLevel: "warning",
  metafile: true as const,
  // A bundle turns `class X` into `var X = class _X` where the body names X, and renames one of two same-named
  // functions or classes: their `name` would change (StrataError's errors take theirs from constructor.name).
  keepNames: true,
} satisfies BuildOptions;

type Hub = "core" | "portable" | "node";
const HUBS: readonly Hub[] = ["core", "portable", "node"];

const packageName = (specifier: string): string => specifier.split("/").slice(0, specifier.startsWith("@") ? 2 : 1).join("/");

/** Every package an import, but `inline`. */
function packagesExternal(inline: readonly string[] = []): Plugin {
  return {
    name: "strata-packages",
    setup(b) {
      b.onResolve({ filter: /^[^./]/ }, (args) => (args.path.startsWith("node:") || !inline.includes(packageName(args.path)) ? { path: args.path, external: true } : undefined));
    },
  };
}

/** A module of a hub: its index (for the renamed exports) and its export names. */
interface HubModule {
  hub: Hub;
  index: number;
  exports: string[];
}

/** Source files of `dir` (relative to the project), sorted so the renaming is stable. */
function modulesOf(dir: string): string[] {
  return readdirSync(join(ROOT, dir))
    .filter((name) => name.endsWith(".ts") && !name.endsWith(".d.ts"))
    .sort()
    .map((name) => `${dir}/${name}`);
}

const renamed = (mod: HubModule, name: string): string => `m${mod.index}_${name}`;

/** Statically imported sources from `entry`, following the metafile's inputs (a dynamic `import()` is not followed). */
function staticClosure(metafile: Metafile, entry: string): Set<string> {
  const seen = new Set<string>();
  const visit = (file: string): void => {
    if (seen.has(file) || !metafile.inputs[file]) return;
    seen.add(file);
    for (const { path, kind, external } of metafile.inputs[file].imports) if (kind === "import-statement" && !external) visit(path);
  };
  visit(entry);
  return seen;
}

/**
 * Which module goes to which hub and what it exports: a bundling pass, not
 * written, with every candidate as an entry (the metafile then lists each
 * one's exports, `export *` followed).
 */
async function planHubs(): Promise<Map<string, HubModule>> {
  const core = modulesOf("core");
  const candidates = ["index.ts", ...core, ...WILDCARD_DIRS.flatMap(modulesOf)];
  const { metafile } = await build({ ...COMMON, entryPoints: candidates, outdir: "plan", splitting: true, write: false, logLevel: "error", plugins: [packagesExternal()] });
  const exportsOf = new Map<string, string[]>();
  for (const output of Object.values(metafile.outputs)) if (output.entryPoint) exportsOf.set(output.entryPoint, [...output.exports].sort());
  const reached = staticClosure(metafile, "index.ts");
  const usesNode = (file: string): boolean =>
    [...staticClosure(metafile, file)].some((input) => metafile.inputs[input]!.imports.some(({ path, external }) => external && (path.startsWith("node:") || isBuiltin(path))));
  const plan = new Map<string, HubModule>();
  for (const file of candidates) {
    const hub: Hub | undefined = core.includes(file) ? "core" : !reached.has(file) ? undefined : usesNode(file) ? "node" : "portable";
    if (hub) plan.set(file, { hub, index: plan.size, exports: exportsOf.get(file) ?? [] });
  }
  return plan;
}

/** `export { … } from "<hub>"` under the module's own names: a public path's file, or what the second build imports for it. */
function reexports(mod: HubModule, hubPath: string): string {
  if (mod.exports.length === 0) return "export {};\n";
  return `export { ${mod.exports.map((name) => `${renamed(mod, name)} as ${name}`).join(", ")} } from ${JSON.stringify(hubPath)};\n`;
}

/** The source file a relative import names (the sources import `./x.js` for `./x.ts`), relative to the project. */
function sourceOf(resolveDir: string, specifier: string): string {
  return relative(ROOT, resolve(resolveDir, specifier.replace(/\.js$/, ".ts"))).split("\\").join("/");
}

/** The first build: the two hubs, and the chunks they share. An import of a module outside them (only `import()`) stays one, to that module's own file. */
async function buildHubs(out: string, plan: Map<string, HubModule>): Promise<Metafile> {
  const hubSource = (hub: Hub): string =>
    [...plan.entries()]
      .filter(([, mod]) => mod.hub === hub && mod.exports.length > 0)
      .map(([file, mod]) => `export { ${mod.exports.map((name) => `${name} as ${renamed(mod, name)}`).join(", ")} } from ${JSON.stringify(`./${file}`)};`)
      .join("\n");
  const hubs: Plugin = {
    name: "strata-hubs",
    setup(b) {
      b.onResolve({ filter: /^strata-hub:/ }, (args) => ({ path: args.path.slice("strata-hub:".length), namespace: "strata-hub" }));
      b.onLoad({ filter: /.*/, namespace: "strata-hub" }, (args) => ({ contents: hubSource(args.path as Hub), resolveDir: ROOT, loader: "js" }));
      b.onResolve({ filter: /^\./ }, (args) => {
        if (args.namespace === "strata-hub" || args.importer.includes("/node_modules/")) return undefined;
        const file = sourceOf(args.resolveDir, args.path);
        if (plan.has(file)) return undefined;
        if (args.kind !== "dynamic-import") throw new Error(`${file} is imported statically by a module of the hubs but is not in one`);
        return { path: `../${file.replace(/\.ts$/, ".js")}`, external: true };
      });
    },
  };
  const { metafile } = await build({
    ...COMMON,
    entryPoints: HUBS.map((hub) => ({ in: `strata-hub:${hub}`, out: `chunks/${hub}` })),
    outdir: out,
    splitting: true,
    chunkNames: "chunks/[name]-[hash]",
    sourcemap: true,
    plugins: [hubs, packagesExternal(INLINED)],
  });
  return metafile;
}

/** The public paths of the hubs' modules: the root, the core entry, and each backends/stores/sandboxes module in the node hub. */
function writeFacades(out: string, plan: Map<string, HubModule>): string[] {
  const written: string[] = [];
  for (const [file, mod] of plan) {
    const isPublic = file === "index.ts" || file === "core/index.ts" || WILDCARD_DIRS.some((dir) => file.startsWith(`${dir}/`));
    if (!isPublic) continue;
    const target = join(out, file.replace(/\.ts$/, ".js"));
    const hubFile = relative(dirname(target), join(out, "chunks", `${mod.hub}.js`)).split("\\").join("/");
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, reexports(mod, hubFile.startsWith(".") ? hubFile : `./${hubFile}`));
    written.push(target);
  }
  return written;
}

/** The second build: every other public entry, importing the hubs' modules from the hubs. */
async function buildRest(out: string, plan: Map<string, HubModule>): Promise<Metafile> {
  const wildcard = WILDCARD_DIRS.flatMap(modulesOf).filter((file) => !plan.has(file));
  const entries = [...UPPER_ENTRIES, ...UPPER_DIRS.flatMap(modulesOf), ...wildcard];
  const fromHubs: Plugin = {
    name: "strata-from-hubs",
    setup(b) {
      b.onResolve({ filter: /^\./ }, (args) => {
        if (args.namespace === "strata-from-hub") return { path: args.path, external: true };
        if (args.importer.includes("/node_modules/")) return undefined;
        const file = sourceOf(args.resolveDir, args.path);
        return plan.has(file) ? { path: file, namespace: "strata-from-hub" } : undefined;
      });
      // Every output of this build is one directory below `out`, as the hubs are.
      b.onLoad({ filter: /.*/, namespace: "strata-from-hub" }, (args) => {
        const mod = plan.get(args.path)!;
        return { contents: reexports(mod, `../chunks/${mod.hub}.js`), resolveDir: ROOT, loader: "js" };
      });
    },
  };
  const { metafile } = await build({
    ...COMMON,
    entryPoints: entries,
    outdir: out,
    outbase: ROOT,
    splitting: true,
    chunkNames: "chunks/[name]-[hash]",
    sourcemap: true,
    plugins: [fromHubs, packagesExternal()],
  });
  return metafile;
}

/** What the build wrote: the metafile of its two esbuild builds, and the generated files of re-exports. */
export interface LibraryBuild {
  metafile: Metafile;
  facades: string[];
}

/** Builds the library's JavaScript into `out` (created if missing; files of the same names are replaced). */
export async function buildLibrary(out: string): Promise<LibraryBuild> {
  const plan = await planHubs();
  const hubs = await buildHubs(out, plan);
  const facades = writeFacades(out, plan);
  const rest = await buildRest(out, plan);
  const metafile: Metafile = { inputs: { ...hubs.inputs, ...rest.inputs }, outputs: { ...hubs.outputs, ...rest.outputs } };
  mkdirSync(join(out, "licenses"), { recursive: true });
  for (const name of INLINED) copyFileSync(join(ROOT, "node_modules", name, "LICENSE"), join(out, "licenses", `${name}.txt`));
  // runtime/provider.ts reads its measured figures next to its module: beside whichever output holds it.
  for (const [output, { inputs }] of Object.entries(metafile.outputs)) {
    if (output.endsWith(".js") && "runtime/provider.ts" in inputs) copyFileSync(join(ROOT, "runtime", "cold-start.json"), join(dirname(resolve(ROOT, output)), "cold-start.json"));
  }
  return { metafile, facades };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = process.argv[2];
  if (!out) throw new Error("usage: tsx scripts/build-lib.ts <out dir>");
  await buildLibrary(resolve(out));
}
