/**
 * Stores: 2000 small files written one by one, then read back. On disk,
 * Strata's StoreBackend over SqliteStore (a SQLite file) against agentfs-sdk (a
 * SQLite-compatible database file); in memory, Strata's StoreBackend over
 * MemoryStore against deepagents' StoreBackend over LangGraph's InMemoryStore.
 * Grep over stored files compares the two StoreBackends (deepagents has no
 * on-disk store here, so it keeps its in-memory one).
 *
 * Each case starts from empty stores of its own, so what one case left
 * behind does not slow the next.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { InMemoryStore } from "@langchain/langgraph-checkpoint";
import { AgentFS } from "agentfs-sdk";
import { StoreBackend as DeepagentsStoreBackend } from "deepagents";
import { StoreBackend } from "../backends/store.js";
import { MemoryStore } from "../stores/memory.js";
import { SqliteStore } from "../stores/sqlite.js";
import { type BenchGroup, type CaseResult, type Contender, type GroupContext, compare } from "./harness.js";

const NEEDLE = "needle";

/** About 200 bytes; one file in 50 holds the needle. */
function smallText(i: number): string {
  const todo = i % 50 === 0 ? NEEDLE : "item";
  return `# note ${i}\nwritten by the benchmark\nstatus: open\nTODO: ${todo} ${i}\n${"lorem ipsum dolor sit amet ".repeat(5)}\n`;
}

function smallPath(prefix: string, i: number): string {
  return `${prefix}/d${i % 20}/f${i}.txt`;
}

/** One fresh set of stores, each contender on its own. */
interface Stores {
  sqlite: StoreBackend;
  agentfs: AgentFS;
  memory: StoreBackend;
  deepagents: DeepagentsStoreBackend;
  close(): Promise<void>;
}

let opened = 0;

async function openStores(dir: string): Promise<Stores> {
  const id = opened++;
  const sqliteStore = new SqliteStore({ path: join(dir, `strata-${id}.db`) });
  const agentfs = await AgentFS.open({ path: join(dir, `agentfs-${id}.db`) });
  return {
    sqlite: new StoreBackend({ store: sqliteStore, namespace: ["bench"] }),
    agentfs,
    memory: new StoreBackend({ store: new MemoryStore(), namespace: ["bench"] }),
    deepagents: new DeepagentsStoreBackend({ store: new InMemoryStore(), namespace: ["bench"] }),
    async close() {
      await sqliteStore.close();
      await agentfs.close();
    },
  };
}

/** Writes the same files into the stores, each through its own write path (agentfs-sdk only when it takes part). */
async function fill(stores: Stores, prefix: string, count: number, withAgentfs: boolean): Promise<void> {
  for (let i = 0; i < count; i++) {
    const path = smallPath(prefix, i);
    const text = smallText(i);
    for (const result of [await stores.sqlite.write(path, text), await stores.memory.write(path, text), await stores.deepagents.write(path, text)]) {
      if (result.error) throw new Error(`filling the stores failed: ${result.error}`);
    }
    if (withAgentfs) await stores.agentfs.fs.writeFile(path, text);
  }
}

export const storeGroup: BenchGroup = {
  name: "store",
  title: "Stores",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const count = ctx.quick ? 500 : 2000;
    // deepagents pages through InMemoryStore.search, which costs O(files) per page: O(files²) in all.
    const grepFiles = ctx.quick ? 2000 : 10_000;
    mkdirSync(ctx.cacheDir, { recursive: true });
    const dir = mkdtempSync(join(ctx.cacheDir, "store-"));
    const common = { group: this.name, reps: ctx.reps };
    const results: CaseResult[] = [];
    const all: Stores[] = [];
    const fresh = async () => {
      const stores = await openStores(dir);
      all.push(stores);
      return stores;
    };
    try {
      // Every run writes a fresh set of files, so each write creates one; the store grows run by run, alike for each contender.
      const writer = (name: string, write: (path: string, text: string) => Promise<boolean>): Contender => {
        let run = 0;
        return {
          name,
          run: async () => {
            const prefix = `/write${run++}`;
            let written = 0;
            for (let i = 0; i < count; i++) if (await write(smallPath(prefix, i), smallText(i))) written++;
            return written;
          },
        };
      };
      const writes = { ...common, maxSamples: ctx.reps };
      ctx.log(`${count} small writes, one file each`);
      const w = await fresh();
      results.push(
        await compare({
          ...writes,
          name: `${count} small writes, SQLite file (new files, one call each)`,
          notes: ["Each engine with its defaults: SqliteStore in WAL mode with synchronous=NORMAL; agentfs-sdk on its Turso database file."],
          strata: writer("Strata StoreBackend + SqliteStore", async (path, text) => !(await w.sqlite.write(path, text)).error),
          peers: [
            writer("agentfs-sdk", async (path, text) => {
              await w.agentfs.fs.writeFile(path, text);
              return true;
            }),
          ],
        }),
        await compare({
          ...writes,
          name: `${count} small writes, in memory (new files, one call each)`,
          strata: writer("Strata StoreBackend + MemoryStore", async (path, text) => !(await w.memory.write(path, text)).error),
          peers: [writer("deepagents StoreBackend + InMemoryStore", async (path, text) => !(await w.deepagents.write(path, text)).error)],
        }),
      );

      ctx.log(`${count} small reads`);
      const r = await fresh();
      await fill(r, "/read", count, true);
      const reader = (name: string, read: (path: string) => Promise<string>): Contender => ({
        name,
        run: async () => {
          let chars = 0;
          for (let i = 0; i < count; i++) chars += (await read(smallPath("/read", i))).length;
          return chars;
        },
      });
      const readAnswer = "answer = characters read";
      results.push(
        await compare({
          ...common,
          name: `${count} small reads, SQLite file (whole file, one call each; ${readAnswer})`,
          strata: reader("Strata StoreBackend + SqliteStore", async (path) => (await r.sqlite.readRaw(path)).content),
          peers: [reader("agentfs-sdk", (path) => r.agentfs.fs.readFile(path, "utf8"))],
        }),
        await compare({
          ...common,
          name: `${count} small reads, in memory (whole file, one call each; ${readAnswer})`,
          strata: reader("Strata StoreBackend + MemoryStore", async (path) => (await r.memory.readRaw(path)).content),
          peers: [
            reader("deepagents StoreBackend + InMemoryStore", async (path) => {
              const { data } = await r.deepagents.readRaw(path);
              return typeof data?.content === "string" ? data.content : "";
            }),
          ],
        }),
      );

      ctx.log(`literal grep over ${grepFiles} stored files`);
      const g = await fresh();
      await fill(g, "/grep", grepFiles, false);
      const deepagentsGrep: Contender = {
        name: "deepagents StoreBackend + InMemoryStore",
        run: async () => (await g.deepagents.grep(NEEDLE, "/grep")).matches?.length ?? -1,
      };
      results.push(
        await compare({
          ...common,
          name: `literal grep over ${grepFiles / 1000}k stored files (Strata on SQLite, deepagents in memory)`,
          notes: [
            "deepagents' StoreBackend runs over LangGraph's InMemoryStore (no on-disk LangGraph store is installed), " +
              "which favours it; it pages through store.search, 100 items a page.",
          ],
          strata: { name: "Strata StoreBackend + SqliteStore", run: async () => (await g.sqlite.grep(NEEDLE, "/grep")).matches.length },
          peers: [deepagentsGrep],
        }),
        await compare({
          ...common,
          name: `literal grep over ${grepFiles / 1000}k stored files, in memory`,
          strata: { name: "Strata StoreBackend + MemoryStore", run: async () => (await g.memory.grep(NEEDLE, "/grep")).matches.length },
          peers: [deepagentsGrep],
        }),
      );
      return results;
    } finally {
      for (const stores of all) await stores.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
};
