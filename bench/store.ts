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
 *
 * At 100k files, ls and grep compare both StoreBackends again; at 1M keys and
 * 1M lines, Strata alone is held to absolute targets on SQLite and PostgreSQL.
 * Those data sets are loaded once and reused: a SQLite file under the cache
 * directory, and a PostgreSQL table (strata_bench) whose namespaces carry a
 * marker key once complete.
 *
 * deepagents answers in the seed shape, so where it is the peer Strata is
 * measured through `toSeedProtocol` (lsInfo, grep, readRaw → FileData, write);
 * against agentfs-sdk (its own API) and alone, Strata is measured through its
 * native API.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { InMemoryStore } from "@langchain/langgraph-checkpoint";
import { AgentFS } from "agentfs-sdk";
import { StoreBackend as DeepagentsStoreBackend } from "deepagents";
import { StoreBackend } from "../backends/store.js";
import { unwrap } from "../core/base.js";
import { fileDataFromText } from "../core/filedata.js";
import { toSeedProtocol } from "../core/seed.js";
import type { FileData } from "../core/types.js";
import { MemoryStore } from "../stores/memory.js";
import { PostgresStore } from "../stores/postgres.js";
import { RedisStore } from "../stores/redis.js";
import { SqliteStore } from "../stores/sqlite.js";
import type { Namespace, Store } from "../stores/store.js";
import { type BenchGroup, type CaseResult, type Contender, type GroupContext, type Target, cached, checkCounts, compare } from "./harness.js";

const NEEDLE = "needle";

/** About 200 bytes; one file in 50 holds the needle. */
function smallText(i: number): string {
  const todo = i % 50 === 0 ? NEEDLE : "item";
  return `# note ${i}\nwritten by the benchmark\nstatus: open\nTODO: ${todo} ${i}\n${"lorem ipsum dolor sit amet ".repeat(5)}\n`;
}

function smallPath(prefix: string, i: number): string {
  return `${prefix}/d${i % 20}/f${i}.txt`;
}

/** A record's text as one string (a legacy record holds a list of lines). */
function textOf(data: FileData): string {
  return typeof data.content === "string" ? data.content : data.content.join("\n");
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
    for (const result of [await stores.sqlite.write(path, text), await stores.memory.write(path, text)]) {
      if (result.error) throw new Error(`filling the stores failed: ${result.error.message}`);
    }
    const deepagents = await stores.deepagents.write(path, text);
    if (deepagents.error) throw new Error(`filling the stores failed: ${deepagents.error}`);
    if (withAgentfs) await stores.agentfs.fs.writeFile(path, text);
  }
}

const TEN_TIMES: Target = { kind: "ratio", peer: "agentfs-sdk", min: 10, text: "≥ 10× faster" };
const DEEPAGENTS = "deepagents StoreBackend + InMemoryStore";
const TWICE_DEEPAGENTS: Target = { kind: "ratio", peer: DEEPAGENTS, min: 2, text: "≥ 2× faster" };

// ---------------------------------------------------------------- large data sets

/** A few lines per file; one file in 97 holds the needle (as in the state group). */
function mediumText(dir: number, file: number): string {
  const todo = file % 97 === 0 ? NEEDLE : "thing";
  return `alpha beta gamma ${dir}-${file}\nthe quick brown fox jumps over the lazy dog\nTODO: ${todo} to look at\nlast line ${dir * 1000 + file}\n`;
}

/** A word no other generated text contains, so the grep index narrows 1M lines to a handful of files. */
const RARE = "quokka";
const LINES_PER_FILE = 100;

/** 100 lines; one file in 2000 holds the rare word on its middle line. */
function longText(file: number): string {
  const lines: string[] = [];
  for (let n = 0; n < LINES_PER_FILE; n++) {
    const word = n === 50 && file % 2000 === 0 ? RARE : "fox";
    lines.push(`line ${n} of file ${file}: the quick brown ${word} jumps over the lazy dog`);
  }
  return `${lines.join("\n")}\n`;
}

/** `count` entries from `entry(i)`, in batches of `size`, handed to `put` one batch at a time. */
async function inBatches<T>(count: number, size: number, entry: (i: number) => T, put: (batch: T[]) => Promise<unknown>): Promise<void> {
  for (let start = 0; start < count; start += size) {
    const batch: T[] = [];
    for (let i = start; i < Math.min(count, start + size); i++) batch.push(entry(i));
    await put(batch);
  }
}

/** The 1M-key layout: /dir{0..999}/f{0..999}.txt, a line each. */
function keyEntry(i: number): readonly [string, FileData] {
  return [`/dir${Math.floor(i / 1000)}/f${i % 1000}.txt`, fileDataFromText(`f ${i}\n`)];
}

/** The 1M-line layout: /g{0..99}/f{0..99}.txt, 100 lines each. */
function lineEntry(i: number): readonly [string, FileData] {
  return [`/g${Math.floor(i / 100)}/f${i % 100}.txt`, fileDataFromText(longText(i))];
}

/** The PostgreSQL table of the big data sets, apart from the tests' tables. */
const PG_TABLE = "strata_bench";

interface BigSets {
  /** Namespace holding `keys` one-line files. */
  keys: Namespace;
  /** Namespace holding `files` files of 100 lines. */
  lines: Namespace;
}

/** Loads both big data sets into a store, each namespace unless its marker says it is complete; true when it loaded any. */
async function loadBigSets(store: Store, sets: BigSets, keys: number, files: number, log: (m: string) => void, where: string): Promise<boolean> {
  let loaded = false;
  const MARKER = "/.loaded";
  for (const [ns, count, entry, what] of [
    [sets.keys, keys, keyEntry, `${keys} keys`],
    [sets.lines, files, lineEntry, `${files} files × ${LINES_PER_FILE} lines`],
  ] as const) {
    if (await store.get(ns, MARKER)) continue;
    log(`loading ${what} into ${where} (once; reused by later runs)`);
    await inBatches(count, 5000, entry, (batch) => store.putMany(ns, batch));
    await store.put(ns, MARKER, fileDataFromText("complete\n"));
    loaded = true;
  }
  return loaded;
}

/** A result measured without peers, shown against the peer measured in `measured` (same files, same operation). */
function againstPeerOf(result: CaseResult, measured: CaseResult): CaseResult {
  const warnings = [...result.warnings];
  checkCounts(result.strata, measured.peers, warnings);
  return { ...result, peers: measured.peers, target: measured.target, warnings: [...new Set(warnings)] };
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
      const wMemory = toSeedProtocol(w.memory);
      results.push(
        await compare({
          ...writes,
          name: `${count} small writes, SQLite file (new files, one call each)`,
          target: TEN_TIMES,
          notes: [
            "Each engine with its defaults: SqliteStore in WAL mode with synchronous=NORMAL (no fsync per commit; one transaction per write, " +
              "holding the tree checks, the version and the row's entry in the trigram index's queue); agentfs-sdk on its Turso database file, whose writeFile runs " +
              "its statements without a transaction of its own (each commits alone) and calls no fsync (its fsync() asks for synchronous=FULL only when called).",
            "Until layout 3, about 60% of SqliteStore's time here (CPU profile) was the FTS5 trigram index writing a segment at every commit; " +
              "now a write queues the row and the write that fills the queue to 256 rows indexes them all as one segment (grep scans the queued rows). " +
              "The history trigger (no snapshot taken) and statement preparation (prepared once per store) cost next to nothing.",
          ],
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
          target: TWICE_DEEPAGENTS,
          strata: writer("Strata StoreBackend + MemoryStore", async (path, text) => !(await wMemory.write(path, text)).error),
          peers: [writer("deepagents StoreBackend + InMemoryStore", async (path, text) => !(await w.deepagents.write(path, text)).error)],
        }),
      );

      ctx.log(`${count} small reads`);
      const r = await fresh();
      await fill(r, "/read", count, true);
      const rMemory = toSeedProtocol(r.memory);
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
          target: TEN_TIMES,
          strata: reader("Strata StoreBackend + SqliteStore", async (path) => textOf(unwrap(await r.sqlite.readRaw(path)).data)),
          peers: [reader("agentfs-sdk", (path) => r.agentfs.fs.readFile(path, "utf8"))],
        }),
        await compare({
          ...common,
          name: `${count} small reads, in memory (whole file, one call each; ${readAnswer})`,
          target: TWICE_DEEPAGENTS,
          strata: reader("Strata StoreBackend + MemoryStore", async (path) => textOf(await rMemory.readRaw(path))),
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
      const [gSqlite, gMemory] = [toSeedProtocol(g.sqlite), toSeedProtocol(g.memory)];
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
          strata: { name: "Strata StoreBackend + SqliteStore", run: async () => (await gSqlite.grep(NEEDLE, "/grep")).matches.length },
          peers: [deepagentsGrep],
        }),
        await compare({
          ...common,
          name: `literal grep over ${grepFiles / 1000}k stored files, in memory`,
          strata: { name: "Strata StoreBackend + MemoryStore", run: async () => (await gMemory.grep(NEEDLE, "/grep")).matches.length },
          peers: [deepagentsGrep],
        }),
      );
      results.push(...(await hundredThousand(ctx, this.name)));
      results.push(...(await million(ctx, this.name)));
      results.push(...(await redisIndex(ctx, this.name)));
      return results;
    } finally {
      for (const stores of all) await stores.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
};

/** ls and grep at 100k files: Strata's StoreBackend (SQLite, memory) against deepagents' over InMemoryStore. */
async function hundredThousand(ctx: GroupContext, group: string): Promise<CaseResult[]> {
  const dirs = ctx.quick ? 10 : 100;
  const total = dirs * 1000;
  const label = `${total / 1000}k files`;
  const entry = (i: number) => [`/dir${Math.floor(i / 1000)}/f${i % 1000}.txt`, mediumText(Math.floor(i / 1000), i % 1000)] as const;
  const ns = ["bench"];

  const dbDir = await cached(join(ctx.cacheDir, `store-${total}`), async (dir) => {
    const store = new SqliteStore({ path: join(dir, "strata.db") });
    await inBatches(total, 5000, entry, (batch) => store.putMany(ns, batch.map(([path, text]) => [path, fileDataFromText(text)] as const)));
    await store.close();
  }, ctx.log);
  const sqliteStore = new SqliteStore({ path: join(dbDir, "strata.db") });
  const sqliteBackend = new StoreBackend({ store: sqliteStore, namespace: ns });
  // Every row here is shown against deepagents (the seed shape): Strata through toSeedProtocol.
  const sqlite = toSeedProtocol(sqliteBackend);
  ctx.log(`filling a MemoryStore and deepagents' InMemoryStore with ${label}`);
  const memoryBackend = new StoreBackend({ store: new MemoryStore(), namespace: ns });
  const memory = toSeedProtocol(memoryBackend);
  const encoder = new TextEncoder();
  await inBatches(total, 5000, entry, (batch) => memoryBackend.store.putMany(ns, batch.map(([path, text]) => [path, fileDataFromText(text)] as const)));
  const deepagents = new DeepagentsStoreBackend({ store: new InMemoryStore(), namespace: ns });
  await inBatches(total, 1000, entry, async (batch) => {
    for (const response of await deepagents.uploadFiles(batch.map(([path, text]) => [path, encoder.encode(text)]))) {
      if (response.error) throw new Error(`deepagents upload failed: ${response.error}`);
    }
  });

  // deepagents pages through InMemoryStore.search (100 a page, each page copying the whole namespace): about 2 minutes per call at 100k
  // files, so it is timed once (a call that long needs no warm-up) and that figure is shown against both Strata stores.
  const common = { group, reps: ctx.reps, minSamples: 1 };
  const notes = [
    "deepagents' StoreBackend is filled through its own uploadFiles() (the records its write() makes), Strata's through putMany batches. " +
      "deepagents pages through InMemoryStore.search, 100 items a page, each page filtering and copying the whole namespace, " +
      "so one call takes minutes at 100k files: it is timed once and that figure is shown against both Strata stores.",
  ];
  const dir = "/dir7";
  const results: CaseResult[] = [];
  try {
    ctx.log(`ls of a 1k-entry directory among ${label}`);
    const ls = await compare({
      ...common,
      name: `ls of a 1k-entry directory among ${label}, StoreBackend over SQLite`,
      notes,
      strata: { name: "Strata StoreBackend + SqliteStore", run: async () => (await sqlite.lsInfo(dir)).length },
      peers: [{ name: DEEPAGENTS, run: async () => (await deepagents.ls(dir)).files?.length ?? -1 }],
      target: { kind: "ratio", peer: DEEPAGENTS, min: 100, text: "≥ 100× faster" },
    });
    const lsMemory = await compare({
      ...common,
      name: `ls of a 1k-entry directory among ${label}, StoreBackend in memory`,
      strata: { name: "Strata StoreBackend + MemoryStore", run: async () => (await memory.lsInfo(dir)).length },
      peers: [],
    });
    ctx.log(`literal grep over ${label}`);
    const grep = await compare({
      ...common,
      name: `literal grep over ${label}, StoreBackend over SQLite`,
      strata: { name: "Strata StoreBackend + SqliteStore", run: async () => (await sqlite.grep(NEEDLE, "/")).matches.length },
      peers: [{ name: DEEPAGENTS, run: async () => (await deepagents.grep(NEEDLE, "/")).matches?.length ?? -1 }],
      target: { kind: "ratio", peer: DEEPAGENTS, min: 10, text: "≥ 10× faster" },
    });
    const grepMemory = await compare({
      ...common,
      name: `literal grep over ${label}, StoreBackend in memory`,
      strata: { name: "Strata StoreBackend + MemoryStore", run: async () => (await memory.grep(NEEDLE, "/")).matches.length },
      peers: [],
    });
    results.push(ls, againstPeerOf(lsMemory, ls), grep, againstPeerOf(grepMemory, grep));
  } finally {
    await sqliteStore.close();
  }
  return results;
}

/** Strata alone at 1M keys and 1M lines, on SQLite and PostgreSQL, against absolute targets. */
async function million(ctx: GroupContext, group: string): Promise<CaseResult[]> {
  const keys = ctx.quick ? 100_000 : 1_000_000;
  const files = keys / LINES_PER_FILE;
  const keysLabel = keys >= 1e6 ? `${keys / 1e6}M keys` : `${keys / 1000}k keys`;
  const linesLabel = keys >= 1e6 ? `${keys / 1e6}M lines` : `${keys / 1000}k lines`;
  const sets: BigSets = { keys: ["bench", `keys-${keys}`], lines: ["bench", `lines-${files}`] };
  const engines: Array<{ name: string; store: Store }> = [];
  // No `cached` here: the marker keys inside the database say what is loaded, as they do in PostgreSQL.
  const dbDir = join(ctx.cacheDir, `store-big-${keys}`);
  mkdirSync(dbDir, { recursive: true });
  engines.push({ name: "SQLite", store: new SqliteStore({ path: join(dbDir, "strata.db") }) });
  const url = process.env.STRATA_POSTGRES_URL;
  if (url) engines.push({ name: "PostgreSQL", store: new PostgresStore({ connectionString: url, table: PG_TABLE }) });
  else ctx.log("STRATA_POSTGRES_URL is not set (source .services/env): PostgreSQL rows left out");

  const results: CaseResult[] = [];
  try {
    for (const { name, store } of engines) {
      const t0 = performance.now();
      if (await loadBigSets(store, sets, keys, files, ctx.log, name)) {
        // What autovacuum does soon after a bulk load: planner statistics and the visibility map. Measured before it, the
        // first run after loading would time a planner that has never seen the table (ls took 178 ms instead of 3 ms).
        if (store instanceof PostgresStore) await store.client.query(`VACUUM ANALYZE ${PG_TABLE}`);
        ctx.log(`loaded in ${Math.round((performance.now() - t0) / 1000)} s`);
      }
      const inKeys = new StoreBackend({ store, namespace: sets.keys });
      const inLines = new StoreBackend({ store, namespace: sets.lines });
      ctx.log(`${name}: ls among ${keysLabel}, grep over ${linesLabel}`);
      results.push(
        await compare({
          group,
          reps: ctx.reps,
          name: `ls of a 1k-entry directory among ${keysLabel}, StoreBackend over ${name}`,
          strata: { name: `Strata StoreBackend + ${name === "SQLite" ? "SqliteStore" : "PostgresStore"}`, run: async () => unwrap(await inKeys.ls("/dir7")).entries.length },
          peers: [],
          target: { kind: "absolute", maxMs: 5, text: "< 5 ms" },
        }),
        await compare({
          group,
          reps: ctx.reps,
          name: `literal grep over ${linesLabel} (${files / 1000}k files × ${LINES_PER_FILE} lines, ${Math.ceil(files / 2000)} hold the word), StoreBackend over ${name}`,
          notes: [
            `The grep data sits in its own namespace beside the ${keysLabel} (same table, same text index), and is loaded once: ` +
              "a SQLite file in the benchmark cache, a PostgreSQL table strata_bench whose namespaces carry a marker key once complete.",
          ],
          strata: { name: `Strata StoreBackend + ${name === "SQLite" ? "SqliteStore" : "PostgresStore"}`, run: async () => unwrap(await inLines.grep(RARE, { path: "/" })).matches.length },
          peers: [],
          target: { kind: "absolute", maxMs: 50, text: "< 50 ms" },
        }),
      );
    }
  } finally {
    for (const { store } of engines) await store.close();
  }
  return results;
}

/** Bytes Redis holds (MEMORY USAGE) for a namespace's keys, split into the trigram index and the rest. */
async function redisMemory(store: RedisStore, base: string): Promise<{ index: number; rest: number }> {
  const sizes = { index: 0, rest: 0 };
  // SCAN takes a glob, and a namespace's base holds brackets: escape them.
  const match = `${base.replace(/[[\]*?\\]/g, (c) => `\\${c}`)}*`;
  let cursor = "0";
  do {
    const [next, keys] = await store.client.scan(cursor, "MATCH", match, "COUNT", 1000);
    cursor = next;
    for (const key of keys) {
      const bytes = Number(await store.client.memory("USAGE", key)) || 0;
      if (/^(x|ti|tk|tn|tf|tb|tc|t:\d+)$/.test(key.slice(base.length))) sizes.index += bytes;
      else sizes.rest += bytes;
    }
  } while (cursor !== "0");
  return sizes;
}

/** Removes a namespace's trigram index, leaving it as a namespace written before the index existed (its writes then skip the index). */
async function forgetRedisIndex(store: RedisStore, base: string): Promise<void> {
  const match = `${base.replace(/[[\]*?\\]/g, (c) => `\\${c}`)}*`;
  let cursor = "0";
  do {
    const [next, keys] = await store.client.scan(cursor, "MATCH", match, "COUNT", 1000);
    cursor = next;
    const index = keys.filter((key) => /^(x|ti|tk|tn|tf|tb|tc|t:\d+)$/.test(key.slice(base.length)));
    if (index.length > 0) await store.client.del(...index);
  } while (cursor !== "0");
}

/**
 * RedisStore's trigram index: grep over 1M lines against the < 50 ms target,
 * and what the index costs: 2000 small writes into an indexed namespace
 * against a namespace without it, the one-time build over records written
 * before it, and the memory it holds beside the records'.
 */
export async function redisIndex(ctx: GroupContext, group: string): Promise<CaseResult[]> {
  const url = process.env.STRATA_REDIS_URL;
  if (!url) {
    ctx.log("STRATA_REDIS_URL is not set (source .services/env): Redis rows left out");
    return [];
  }
  const files = ctx.quick ? 1000 : 10_000;
  const linesLabel = `${(files * LINES_PER_FILE) / 1e6}M lines`;
  const store = new RedisStore({ url, keyPrefix: "strata-bench:" });
  const base = (ns: Namespace) => `strata-bench:{${JSON.stringify(ns)}}:`;
  const results: CaseResult[] = [];
  try {
    const lines: Namespace = ["bench", `lines-${files}`];
    if (!(await store.get(lines, "/.loaded"))) {
      ctx.log(`loading ${files} files × ${LINES_PER_FILE} lines into Redis (once, while the server keeps them)`);
      await inBatches(files, 500, lineEntry, (batch) => store.putMany(lines, batch));
      await store.put(lines, "/.loaded", fileDataFromText("complete\n"));
    }
    // The one-time build, as a namespace written before the index gets on its first search.
    const older: Namespace = ["bench", `lines-${files}-older`];
    await store.deleteTree(older, "/");
    await inBatches(files, 500, lineEntry, (batch) => store.putMany(older, batch));
    await forgetRedisIndex(store, base(older));
    const t0 = performance.now();
    for await (const item of store.search(older, RARE, "/")) void item;
    const buildMs = performance.now() - t0;
    await store.deleteTree(older, "/");
    const memory = await redisMemory(store, base(lines));
    const mib = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
    const backend = new StoreBackend({ store, namespace: lines });
    results.push(
      await compare({
        group,
        reps: ctx.reps,
        name: `literal grep over ${linesLabel} (${files / 1000}k files × ${LINES_PER_FILE} lines, ${Math.ceil(files / 2000)} hold the word), StoreBackend over Redis`,
        notes: [
          `Trigram index: ${mib(memory.index)} beside ${mib(memory.rest)} of records (MEMORY USAGE of the namespace's keys). ` +
            `Built for records written before it, on the first search: ${Math.round(buildMs)} ms for ${files} files.`,
        ],
        strata: { name: "Strata StoreBackend + RedisStore", run: async () => unwrap(await backend.grep(RARE, { path: "/" })).matches.length },
        peers: [],
        target: { kind: "absolute", maxMs: 50, text: "< 50 ms" },
      }),
    );
    // Small writes, each to a new key, into a namespace that keeps the index and into one that does not.
    const count = ctx.quick ? 500 : 2000;
    const indexed: Namespace = ["bench", "writes-indexed"];
    const plain: Namespace = ["bench", "writes-plain"];
    for (const ns of [indexed, plain]) await store.deleteTree(ns, "/");
    await store.put(plain, "/seed", fileDataFromText("seed\n"));
    await forgetRedisIndex(store, base(plain));
    const writer = (ns: Namespace): (() => Promise<number>) => {
      let run = 0;
      return async () => {
        const dir = `/w${run++}`;
        for (let i = 0; i < count; i++) await store.put(ns, `${dir}/f${i}.txt`, fileDataFromText(`small file ${i} of run ${run}: hello world\n`));
        return count;
      };
    };
    const writes = await compare({
      group,
      reps: ctx.reps,
      name: `${count} small writes into Redis, trigram index kept vs not`,
      notes: ["The peer is the same RedisStore writing into a namespace from before the index (its writes skip it): the ratio is the index's cost on writes."],
      strata: { name: "RedisStore, index kept", run: writer(indexed) },
      peers: [{ name: "RedisStore, no index", run: writer(plain) }],
      maxSamples: 5,
    });
    const writeMemory = await redisMemory(store, base(indexed));
    results.push({ ...writes, notes: [...(writes.notes ?? []), `After the runs: index ${mib(writeMemory.index)} beside ${mib(writeMemory.rest)} of records.`] });
    for (const ns of [indexed, plain]) await store.deleteTree(ns, "/");
  } finally {
    await store.close();
  }
  return results;
}
