/**
 * Stores: 2000 small files written one by one, then read back. On disk,
 * Strata's StoreBackend over SqliteStore (a SQLite file) against agentfs-sdk (a
 * SQLite-compatible database file); in memory, Strata's StoreBackend over
 * MemoryStore against deepagents' StoreBackend over LangGraph's InMemoryStore.
 * Grep over stored files compares the two StoreBackends (deepagents has no
 * on-disk store here, so it keeps its in-memory one).
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

export const storeGroup: BenchGroup = {
  name: "store",
  title: "Persistent store",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const count = ctx.quick ? 500 : 2000;
    // deepagents pages through InMemoryStore.search, which costs O(files) per page: O(files²) in all.
    const grepFiles = ctx.quick ? 2000 : 5000;
    mkdirSync(ctx.cacheDir, { recursive: true });
    const dir = mkdtempSync(join(ctx.cacheDir, "store-"));
    const sqlite = new SqliteStore({ path: join(dir, "strata.db") });
    const agentfs = await AgentFS.open({ path: join(dir, "agentfs.db") });
    try {
      const strata = new StoreBackend({ store: sqlite, namespace: ["bench"] });
      const strataMemory = new StoreBackend({ store: new MemoryStore(), namespace: ["bench"] });
      const deepagents = new DeepagentsStoreBackend({ store: new InMemoryStore(), namespace: ["bench"] });
      const common = { group: this.name, reps: ctx.reps };
      const results: CaseResult[] = [];

      // Each run writes a fresh set of files, so every write creates one.
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
      ctx.log(`${count} small writes, one file each`);
      results.push(
        await compare({
          ...common,
          name: `${count} small writes, SQLite file (new files, one call each)`,
          notes: ["Each engine with its defaults: SqliteStore in WAL mode with synchronous=NORMAL; agentfs-sdk on its Turso database file."],
          strata: writer("Strata StoreBackend + SqliteStore", async (path, text) => !(await strata.write(path, text)).error),
          peers: [
            writer("agentfs-sdk", async (path, text) => {
              await agentfs.fs.writeFile(path, text);
              return true;
            }),
          ],
        }),
        await compare({
          ...common,
          name: `${count} small writes, in memory (new files, one call each)`,
          strata: writer("Strata StoreBackend + MemoryStore", async (path, text) => !(await strataMemory.write(path, text)).error),
          peers: [writer("deepagents StoreBackend + InMemoryStore", async (path, text) => !(await deepagents.write(path, text)).error)],
        }),
      );

      // Reads go to files written once by each contender's own write path.
      for (let i = 0; i < count; i++) {
        const path = smallPath("/read", i);
        const text = smallText(i);
        await strata.write(path, text);
        await strataMemory.write(path, text);
        await agentfs.fs.writeFile(path, text);
        await deepagents.write(path, text);
      }
      const reader = (name: string, read: (path: string) => Promise<string>): Contender => ({
        name,
        run: async () => {
          let chars = 0;
          for (let i = 0; i < count; i++) chars += (await read(smallPath("/read", i))).length;
          return chars;
        },
      });
      ctx.log(`${count} small reads`);
      const readAnswer = "answer = characters read";
      results.push(
        await compare({
          ...common,
          name: `${count} small reads, SQLite file (whole file, one call each; ${readAnswer})`,
          strata: reader("Strata StoreBackend + SqliteStore", async (path) => (await strata.readRaw(path)).content),
          peers: [reader("agentfs-sdk", (path) => agentfs.fs.readFile(path, "utf8"))],
        }),
        await compare({
          ...common,
          name: `${count} small reads, in memory (whole file, one call each; ${readAnswer})`,
          strata: reader("Strata StoreBackend + MemoryStore", async (path) => (await strataMemory.readRaw(path)).content),
          peers: [
            reader("deepagents StoreBackend + InMemoryStore", async (path) => {
              const { data } = await deepagents.readRaw(path);
              return typeof data?.content === "string" ? data.content : "";
            }),
          ],
        }),
      );

      ctx.log(`filling both StoreBackends with ${grepFiles} files for grep`);
      const batch: Array<readonly [string, string]> = [];
      for (let i = 0; i < grepFiles; i++) batch.push([smallPath("/grep", i), smallText(i)]);
      const bytes = (text: string) => new TextEncoder().encode(text);
      await strata.uploadFiles(batch.map(([path, text]) => [path, bytes(text)] as const));
      await deepagents.uploadFiles(batch.map(([path, text]) => [path, bytes(text)]));
      ctx.log(`literal grep over ${grepFiles} stored files`);
      results.push(
        await compare({
          ...common,
          name: `literal grep over ${grepFiles / 1000}k stored files (Strata on SQLite, deepagents in memory)`,
          notes: [
            "deepagents' StoreBackend runs over LangGraph's InMemoryStore (no on-disk LangGraph store is installed), " +
              "which favours it; it pages through store.search, 100 items a page.",
          ],
          strata: { name: "Strata StoreBackend + SqliteStore", run: async () => (await strata.grep(NEEDLE, "/grep")).matches.length },
          peers: [
            {
              name: "deepagents StoreBackend + InMemoryStore",
              run: async () => (await deepagents.grep(NEEDLE, "/grep")).matches?.length ?? -1,
            },
          ],
        }),
      );
      return results;
    } finally {
      await sqlite.close();
      await agentfs.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
};
