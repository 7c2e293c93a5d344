/**
 * In memory: 100k small files (/dir{0..99}/f{0..999}.txt). Strata's StateBackend
 * against deepagents' StateBackend and just-bash's in-memory shell, each filled
 * through its own public write path with the same files. deepagents answers
 * in the seed shape, so Strata is measured through `toSeedProtocol` here
 * (lsInfo, grep, globInfo), the same work plus a thin translation.
 */
import { StateBackend as DeepagentsStateBackend } from "deepagents";
import { Bash } from "just-bash";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import { toSeedProtocol } from "../core/seed.js";
import { MemoryStore } from "../stores/memory.js";
import { countLines, type BenchGroup, type CaseResult, type Contender, type ContenderResult, type GroupContext, collectGarbage, compare } from "./harness.js";

const NEEDLE = "needle";
const GLOB = "**/f99*.txt";

/** A few lines per file; one file in 97 holds the needle. */
function fileText(dir: number, file: number): string {
  const todo = file % 97 === 0 ? NEEDLE : "thing";
  return `alpha beta gamma ${dir}-${file}\nthe quick brown fox jumps over the lazy dog\nTODO: ${todo} to look at\nlast line ${dir * 1000 + file}\n`;
}

interface DeepagentsFiles {
  files: Record<string, unknown>;
}

/**
 * deepagents' StateBackend outside an agent graph: the (deprecated but
 * supported) constructor that takes a runtime `{ state: { files } }`. Its
 * zero-argument form reads state through LangGraph's execution context, which
 * only exists inside a running graph node. ls/grep/glob run the same code in
 * both forms; only where the files map comes from differs.
 */
function deepagentsBackend(state: DeepagentsFiles): DeepagentsStateBackend {
  type LegacyCtor = new (runtime: { state: DeepagentsFiles }) => DeepagentsStateBackend;
  return new (DeepagentsStateBackend as unknown as LegacyCtor)({ state });
}

export const stateGroup: BenchGroup = {
  name: "state",
  title: "In memory",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const dirs = ctx.quick ? 10 : 100;
    const perDir = 1000;
    const total = dirs * perDir;
    const label = `${total / 1000}k files`;
    const files: Record<string, string> = {};
    for (let d = 0; d < dirs; d++) for (let f = 0; f < perDir; f++) files[`/dir${d}/f${f}.txt`] = fileText(d, f);

    ctx.log(`filling Strata, deepagents and just-bash with ${label}`);
    const strata = new StateBackend();
    for (const [path, text] of Object.entries(files)) {
      const result = await strata.write(path, text);
      if (result.error) throw new Error(`Strata write failed: ${result.error.message}`);
    }
    const seed = toSeedProtocol(strata);
    const daState: DeepagentsFiles = { files: {} };
    const deepagents = deepagentsBackend(daState);
    for (const [path, text] of Object.entries(files)) {
      // What the LangGraph reducer does with filesUpdate.
      const result = deepagents.write(path, text) as { error?: string; filesUpdate?: Record<string, unknown> };
      if (result.error || !result.filesUpdate) throw new Error(`deepagents write failed: ${result.error}`);
      Object.assign(daState.files, result.filesUpdate);
    }
    const bash = new Bash({ files, cwd: "/" });
    const shell = async (command: string) => {
      const result = await bash.exec(command);
      if (result.exitCode !== 0 && result.exitCode !== 1) throw new Error(`just-bash '${command}' exited ${result.exitCode}: ${result.stderr}`);
      return countLines(result.stdout);
    };

    const common = { group: this.name, reps: ctx.reps };
    const deepagentsPeer = (run: () => number): Contender => ({ name: "deepagents StateBackend", run });
    const justBash = (command: string): Contender => ({ name: `just-bash \`${command}\``, run: () => shell(command) });
    const results: CaseResult[] = [];

    const dir = "/dir7";
    ctx.log(`ls of a directory with ${perDir} entries`);
    results.push(
      await compare({
        ...common,
        name: `ls of a ${perDir}-entry directory (${label})`,
        strata: { name: "Strata StateBackend", run: async () => (await seed.lsInfo(dir)).length },
        peers: [deepagentsPeer(() => deepagents.ls(dir).files?.length ?? -1), justBash(`ls ${dir}`)],
        target: { kind: "ratio", peer: "deepagents StateBackend", min: 100, text: "≥ 100× faster" },
        notes: [
          "deepagents' StateBackend is built with its runtime constructor `{ state: { files } }` (its zero-argument form reads state " +
            "from a running LangGraph node) and filled through its own write(), merging filesUpdate as the LangGraph reducer does; " +
            "ls, grep and glob run the same code in both forms.",
          "just-bash runs the command in its interpreter over its in-memory file system holding the same files; its answer is the output's line count.",
        ],
      }),
    );

    ctx.log(`literal grep over ${label}`);
    results.push(
      await compare({
        ...common,
        name: `literal grep over ${label}`,
        strata: { name: "Strata StateBackend", run: async () => (await seed.grep(NEEDLE, "/")).matches.length },
        peers: [
          deepagentsPeer(() => (deepagents.grep(NEEDLE, "/") as { matches?: unknown[] }).matches?.length ?? -1),
          justBash(`grep -rnF ${NEEDLE} /`),
        ],
        target: { kind: "ratio", peer: "deepagents StateBackend", min: 10, text: "≥ 10× faster" },
      }),
    );

    ctx.log(`glob ${GLOB} over ${label}`);
    results.push(
      await compare({
        ...common,
        name: `glob \`${GLOB}\` over ${label}`,
        strata: { name: "Strata StateBackend", run: async () => (await seed.globInfo(GLOB, "/")).length },
        peers: [
          deepagentsPeer(() => deepagents.glob(GLOB, "/").files?.length ?? -1),
          justBash(`find / -type f -name 'f99*.txt'`),
        ],
        target: { kind: "ratio", peer: "deepagents StateBackend", min: 10, text: "≥ 10× faster" },
      }),
    );
    results.push(...(await memoryCases(ctx, this.name, dirs, perDir)));
    return results;
  },
};

/** The backend being measured, reachable from the module while measured so no GC can take it early. */
const measured = new Set<object>();

/** Live JS heap after a full GC, in bytes. */
function heapBytes(): number {
  collectGarbage();
  collectGarbage();
  return process.memoryUsage().heapUsed;
}

/**
 * The heap a backend holds for `total` files, per file: the heap after a full
 * GC with the backend filled (and searched once, so every cache it keeps is
 * built) minus the heap before. Each backend gets texts of its own, built
 * anew, so no two share a string.
 */
async function bytesPerFile(name: string, total: number, build: () => Promise<object>): Promise<{ result: ContenderResult; bytes: number }> {
  const before = heapBytes();
  const held = await build();
  measured.add(held);
  const bytes = (heapBytes() - before) / total;
  measured.delete(held);
  return { result: { name, medianMs: Number.NaN, samples: 1, count: total, note: `${Math.round(bytes)} B per file held` }, bytes };
}

/** Memory beside time: bytes per file held at 100k files, Strata's in-memory backends against deepagents' StateBackend. */
async function memoryCases(ctx: GroupContext, group: string, dirs: number, perDir: number): Promise<CaseResult[]> {
  const total = dirs * perDir;
  const label = `${total / 1000}k files`;
  ctx.log(`memory held for ${label}`);
  const each = async (write: (path: string, text: string) => unknown) => {
    for (let d = 0; d < dirs; d++) for (let f = 0; f < perDir; f++) await write(`/dir${d}/f${f}.txt`, fileText(d, f));
  };
  const deepagents = await bytesPerFile("deepagents StateBackend", total, async () => {
    const state: DeepagentsFiles = { files: {} };
    const backend = deepagentsBackend(state);
    await each((path, text) => Object.assign(state.files, (backend.write(path, text) as { filesUpdate?: Record<string, unknown> }).filesUpdate));
    backend.grep(NEEDLE, "/");
    backend.glob(GLOB, "/");
    backend.ls("/dir7");
    return [backend, state];
  });
  const searched = async (backend: StateBackend | StoreBackend) => {
    await each((path, text) => backend.write(path, text));
    const seed = toSeedProtocol(backend);
    await seed.grep(NEEDLE, "/");
    await seed.globInfo(GLOB, "/");
    await seed.lsInfo("/dir7");
    return backend;
  };
  const contenders: Array<[string, () => StateBackend | StoreBackend]> = [
    ["Strata StateBackend", () => new StateBackend()],
    ["Strata StoreBackend + MemoryStore", () => new StoreBackend({ store: new MemoryStore(), namespace: ["bench"] })],
  ];
  const results: CaseResult[] = [];
  for (const [name, make] of contenders) {
    const strata = await bytesPerFile(name, total, () => searched(make()));
    results.push({
      group,
      name: `memory held for ${label}: ${name.replace("Strata ", "")} (JS heap per file after a full GC)`,
      strata: strata.result,
      peers: [deepagents.result],
      target: { kind: "check", met: strata.bytes <= deepagents.bytes, text: "≤ deepagents StateBackend's bytes per file" },
      warnings: [],
      notes: [
        "Heap after a full GC with the backend filled through its own write() and searched once (grep, glob, ls: every cache it keeps is built), " +
          "minus the heap before, divided by the files; each backend holds texts of its own. The texts themselves (about 130 characters each) are counted for all.",
      ],
    });
  }
  return results;
}
