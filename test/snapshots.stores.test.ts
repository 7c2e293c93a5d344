/**
 * Snapshots of stores (MemoryStore, SqliteStore, PostgresStore) and of a
 * StoreBackend over them: restore is exact after any mix of writes, edits,
 * deletes, moves and uploads (property tests, each store), diff names exactly
 * the files that differ, ids survive a restart (SQLite file reopened, a new
 * PostgreSQL pool), writers racing a restore on PostgreSQL (and, on SQLite,
 * a writer in another process) see the old or the restored files, never a mix, snapshots taken while writers commit restore
 * whole batches, a MemoryStore fork is independent, and 1000
 * snapshots of small edits stay within 2x the memory of the largest state.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { StoreBackend } from "../backends/store.js";
import { fileDataFromText, fileDataText } from "../core/filedata.js";
import { MemoryStore } from "../stores/memory.js";
import { PostgresStore } from "../stores/postgres.js";
import { SqliteStore } from "../stores/sqlite.js";
import { namespaceKey, type SnapshotStore, type Store } from "../stores/store.js";
import { serviceUrl } from "./support/servers.js";

const url = serviceUrl("STRATA_POSTGRES_URL");
const dir = mkdtempSync(join(tmpdir(), "strata-snapshot-stores-"));
let files = 0;
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Every file of the backend's namespace as `encoding:text`, for exact comparison. */
async function contents(backend: StoreBackend): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  let after: string | undefined;
  for (;;) {
    const page = await backend.store.list(backend.namespace, { after, limit: 1000 });
    for (const { key } of page.items) {
      const item = await backend.store.get(backend.namespace, key);
      out[key] = `${"encoding" in item!.value ? item!.value.encoding : "v1"}:${fileDataText(item!.value) ?? String(item!.value.content)}`;
    }
    if (!page.next) return out;
    after = page.next;
  }
}

const paths = fc.constantFrom("/a", "/b", "/d/x", "/d/y", "/d/e/z", "/e", "/d");
const text = fc.constantFrom("", "one\n", "two\ntwo\n", "three", "x\ny\nz\n");
const operation = fc.oneof(
  fc.record({ op: fc.constant("write" as const), path: paths, text, overwrite: fc.boolean() }),
  fc.record({ op: fc.constant("edit" as const), path: paths, from: fc.constantFrom("one", "two", "x"), to: text, all: fc.boolean() }),
  fc.record({ op: fc.constant("delete" as const), path: paths }),
  fc.record({ op: fc.constant("move" as const), path: paths, to: paths, overwrite: fc.boolean() }),
  fc.record({ op: fc.constant("upload" as const), path: paths }),
  fc.record({ op: fc.constant("snapshot" as const) }),
  fc.record({ op: fc.constant("restore" as const), pick: fc.nat() }),
);
type Op = typeof operation extends fc.Arbitrary<infer T> ? T : never;
type Taken = Array<[string, Record<string, string>]>;

async function apply(backend: StoreBackend, step: Op, taken: Taken): Promise<void> {
  switch (step.op) {
    case "write": await backend.write(step.path, step.text, { overwrite: step.overwrite }); break;
    case "edit": await backend.edit(step.path, step.from, step.to, { replaceAll: step.all }); break;
    case "delete": await backend.delete(step.path); break;
    case "move": await backend.move(step.path, step.to, { overwrite: step.overwrite }); break;
    case "upload": await backend.uploadFiles([[step.path, Uint8Array.of(0, 255, 1)]]); break;
    case "snapshot": taken.push([await backend.snapshot(), await contents(backend)]); break;
    case "restore":
      if (taken.length > 0) {
        const [id, expected] = taken[step.pick % taken.length]!;
        expect(await backend.restore(id)).toMatchObject({ snapshot: id });
        expect(await contents(backend)).toEqual(expected);
      }
      break;
  }
}

interface Engine {
  name: string;
  open: () => Store & SnapshotStore;
  runs: number;
}

const pgTable = `snap_${randomUUID().replace(/-/g, "").slice(0, 12)}`;
const engines: Engine[] = [
  { name: "MemoryStore", open: () => new MemoryStore(), runs: 200 },
  { name: "SqliteStore", open: () => new SqliteStore({ path: join(dir, `${++files}.db`) }), runs: 100 },
  { name: "PostgresStore", open: () => new PostgresStore({ connectionString: url, table: pgTable, maxConnections: 4 }), runs: 25 },
];

afterAll(async () => {
  const store = new PostgresStore({ connectionString: url, table: pgTable });
  await store.client.query(`DROP TABLE IF EXISTS ${pgTable}, ${pgTable}_meta, ${pgTable}_history, ${pgTable}_snapshots CASCADE`);
  await store.client.query(`DROP SEQUENCE IF EXISTS ${pgTable}_version`);
  await store.client.query(`DROP FUNCTION IF EXISTS ${pgTable}_history_fn`);
  await store.close();
});

for (const engine of engines) {
  describe(`${engine.name} snapshots`, () => {
    it("restore is exact after any mix of writes, edits, deletes, moves, uploads and restores (property)", async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(operation, { maxLength: 30 }), fc.array(fc.nat(), { maxLength: 6 }), async (steps, picks) => {
          const store = engine.open();
          try {
            const backend = new StoreBackend({ store, namespace: ["snap", randomUUID()] });
            const taken: Taken = [[await backend.snapshot(), {}]];
            for (const step of steps) await apply(backend, step, taken);
            const now = await contents(backend);
            const latest = await backend.snapshot();
            for (const pick of picks) {
              const [id, expected] = taken[pick % taken.length]!;
              expect(await backend.restore(id)).toMatchObject({ snapshot: id });
              expect(await contents(backend)).toEqual(expected);
              // The directory index follows: listings agree with the records.
              expect((await backend.glob("**")).entries!.map((e) => e.path)).toEqual(Object.keys(expected));
            }
            await backend.restore(latest);
            expect(await contents(backend)).toEqual(now);
          } finally {
            await store.close();
          }
        }),
        { numRuns: engine.runs },
      );
    }, 300_000);

    it("diff between any two snapshots (or a snapshot and now) names exactly the files that differ", async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(operation, { maxLength: 25 }), fc.nat(), fc.nat(), async (steps, i, j) => {
          const store = engine.open();
          try {
            const backend = new StoreBackend({ store, namespace: ["snap", randomUUID()] });
            const taken: Taken = [[await backend.snapshot(), {}]];
            for (const step of steps) await apply(backend, step, taken);
            taken.push(["now", await contents(backend)]);
            const [a, before] = taken[i % taken.length]!;
            const [b, after] = taken[j % taken.length]!;
            const answer = await backend.diff(a, b);
            if (answer.error) throw new Error(answer.error.message);
            const expected = [...new Set([...Object.keys(before), ...Object.keys(after)])]
              .filter((p) => before[p] !== after[p])
              .sort()
              .map((path) => ({ path, kind: before[path] === undefined ? "added" : after[path] === undefined ? "deleted" : "modified" }));
            expect(answer.changes.map(({ path, kind }) => ({ path, kind }))).toEqual(expected);
          } finally {
            await store.close();
          }
        }),
        { numRuns: Math.ceil(engine.runs / 2) },
      );
    }, 300_000);

    it("ids belong to their namespace; unknown ids answer invalid_argument; a unified diff per text file", async () => {
      const store = engine.open();
      try {
        const one = new StoreBackend({ store, namespace: ["snap", randomUUID()] });
        const two = new StoreBackend({ store, namespace: ["snap", randomUUID()] });
        await one.write("/a.txt", "one\ntwo\n");
        const s1 = await one.snapshot();
        await one.edit("/a.txt", "two", "TWO");
        expect((await two.restore(s1)).error?.code).toBe("invalid_argument");
        expect((await one.restore("nope")).error?.code).toBe("invalid_argument");
        expect((await one.restore("99999999")).error?.code).toBe("invalid_argument");
        expect((await one.diff("nope")).error?.code).toBe("invalid_argument");
        const { changes } = await one.diff(s1);
        expect(changes).toHaveLength(1);
        expect(changes![0]).toMatchObject({ path: "/a.txt", kind: "modified" });
        expect(changes![0]!.patch).toContain("-two\n+TWO");
      } finally {
        await store.close();
      }
    });
  });
}

describe("snapshot ids survive a restart", () => {
  it("SqliteStore: close the file, open it again, restore and diff", async () => {
    const path = join(dir, "restart.db");
    const first = new StoreBackend({ store: new SqliteStore({ path }) });
    await first.write("/plan.md", "1. read\n");
    await first.write("/gone.txt", "bye\n");
    const id = await first.snapshot();
    await first.edit("/plan.md", "read", "write");
    await first.delete("/gone.txt");
    await first.write("/new.txt", "hi\n");
    await first.store.close();

    const second = new StoreBackend({ store: new SqliteStore({ path }) });
    expect((await second.diff(id)).changes?.map((c) => [c.path, c.kind])).toEqual([
      ["/gone.txt", "deleted"],
      ["/new.txt", "added"],
      ["/plan.md", "modified"],
    ]);
    expect(await second.restore(id)).toEqual({ snapshot: id, changed: 3 });
    expect(await contents(second)).toEqual({ "/gone.txt": "utf-8:bye\n", "/plan.md": "utf-8:1. read\n" });
    await second.store.close();
  });

  it("PostgresStore: a new pool restores an id taken by another", async () => {
    const namespace = ["snap", randomUUID()];
    const first = new StoreBackend({ store: new PostgresStore({ connectionString: url, table: pgTable }), namespace });
    await first.write("/plan.md", "1. read\n");
    const id = await first.snapshot();
    await first.write("/plan.md", "changed\n", { overwrite: true });
    await first.store.close();
    const second = new StoreBackend({ store: new PostgresStore({ connectionString: url, table: pgTable }), namespace });
    expect(await second.restore(id)).toEqual({ snapshot: id, changed: 1 });
    expect(await contents(second)).toEqual({ "/plan.md": "utf-8:1. read\n" });
    await second.store.close();
  });

  it("SqliteStore: a database written before snapshots existed (layout 1) is migrated, its rows kept", async () => {
    const path = join(dir, "layout1.db");
    const store = new SqliteStore({ path });
    await store.put(["filesystem"], "/old.txt", fileDataFromText("old"));
    // Back to layout 1, as an older Strata left it.
    store.client.exec(
      "DROP TRIGGER strata_history_insert; DROP TRIGGER strata_history_update; DROP TRIGGER strata_history_delete; DROP TABLE strata_history; DROP TABLE strata_snapshots; PRAGMA user_version = 1;",
    );
    await store.close();
    const reopened = new StoreBackend({ store: new SqliteStore({ path }) });
    const id = await reopened.snapshot();
    await reopened.delete("/old.txt");
    expect(await reopened.restore(id)).toMatchObject({ changed: 1 });
    expect(await contents(reopened)).toEqual({ "/old.txt": "utf-8:old" });
    await reopened.store.close();
  });
});

describe("PostgresStore: writers racing restore", () => {
  it("see the old files or the restored ones, never a mix", async () => {
    const store = new PostgresStore({ connectionString: url, table: pgTable, maxConnections: 8 });
    const namespace = ["snap", randomUUID()];
    const backend = new StoreBackend({ store, namespace });
    const keys = Array.from({ length: 40 }, (_, i) => `/f${String(i).padStart(2, "0")}`);
    const ns = JSON.stringify(namespace);
    try {
      await store.putMany(namespace, keys.map((key) => [key, fileDataFromText("old-e\n")] as const));
      const before = await backend.snapshot();
      await store.putMany(namespace, keys.map((key) => [key, fileDataFromText("new-e\n")] as const));
      // One statement sees one committed state: every file alike, before the restore or after it.
      const readAll = async () => {
        const { rows } = await store.client.query<{ content: string }>(`SELECT content FROM ${pgTable} WHERE ns = $1`, [ns]);
        return new Set(rows.map((row) => row.content));
      };
      const calls: Array<Promise<unknown>> = [];
      for (let round = 0; round < 40; round++) {
        calls.push(readAll());
        // An edit lands before the restore (and is undone) or after it (and finds the old text, so it is refused).
        calls.push(backend.edit(keys[round]!, "new-e", "edited"));
        if (round === 20) calls.push(backend.restore(before));
      }
      const answers = await Promise.all(calls);
      for (const seen of answers) {
        if (!(seen instanceof Set)) continue;
        expect([...seen].every((t) => t === "old-e\n" || t === "new-e\n" || t === "edited\n")).toBe(true);
        // "old-e" exists only once restored, and then everywhere.
        if (seen.has("old-e\n")) expect(seen.size).toBe(1);
      }
      expect(await readAll()).toEqual(new Set(["old-e\n"]));

      // Writers of whole batches (the 40 files plus a new file of their own, one transaction each) racing restores.
      // Any state a serial order gives: the 40 files alike; a batch's value with its new file; the restored value with no new file.
      const s2 = await backend.snapshot();
      const check = async () => {
        const { rows } = await store.client.query<{ key: string; content: string }>(`SELECT key, content FROM ${pgTable} WHERE ns = $1`, [ns]);
        const values = new Set(rows.filter((row) => row.key.startsWith("/f")).map((row) => row.content));
        const added = rows.filter((row) => row.key.startsWith("/n")).map((row) => row.key);
        expect(values.size).toBe(1);
        const [value] = values;
        if (value === "old-e\n") expect(added).toEqual([]);
        else expect(added).toContain(`/n${value!.slice(1, -1)}`);
      };
      const mixed: Array<Promise<unknown>> = [];
      for (let round = 0; round < 30; round++) {
        const batch = [...keys, `/n${round}`].map((key) => [key, fileDataFromText(`w${round}\n`)] as const);
        mixed.push(store.putMany(namespace, batch));
        mixed.push(check());
        if (round % 3 === 2) mixed.push(backend.restore(s2).then(check));
      }
      await Promise.all(mixed);
      await check();
    } finally {
      await store.close();
    }
  }, 60_000);
});

describe("SqliteStore: a writer in another process racing restore", () => {
  it("every state seen is one a serial order gives: a whole batch, or the restored files without any batch's new file", async () => {
    const path = join(dir, `race-${++files}.db`);
    const store = new SqliteStore({ path });
    const namespace = ["snap", randomUUID()];
    const keys = Array.from({ length: 40 }, (_, i) => `/f${String(i).padStart(2, "0")}`);
    // Enough batches for many restores to land between them (each round waits on the other's locks: on a slow machine a
    // round took 250 ms, and 200 of them passed the test's time limit).
    const rounds = 60;
    try {
      await store.putMany(namespace, keys.map((key) => [key, fileDataFromText("old\n")] as const));
      const before = await store.snapshot(namespace);
      // One statement reads one committed state of the file (WAL: a reader sees the last commit before it began).
      const rows = store.client.prepare(
        "SELECT f.key AS key, f.content AS content FROM strata_files f JOIN strata_namespaces n ON n.id = f.ns WHERE n.name = ?",
      );
      const check = () => {
        const seen = rows.all(namespaceKey(namespace)) as Array<{ key: string; content: string }>;
        const values = new Set(seen.filter((row) => row.key.startsWith("/f")).map((row) => row.content));
        const added = seen.filter((row) => row.key.startsWith("/n")).map((row) => row.key);
        expect(values.size).toBe(1);
        const [value] = values;
        expect(seen.filter((row) => row.key.startsWith("/f"))).toHaveLength(keys.length);
        // The restore removes every key the snapshot did not have, the batches' own keys included.
        if (value === "old\n") expect(added).toEqual([]);
        else expect(added).toContain(`/n${value!.slice(1, -1)}`);
        return value;
      };
      const writer = spawn(
        process.execPath,
        ["--import", "tsx", fileURLToPath(new URL("./fixtures/sqlite-batch-writer.ts", import.meta.url)), path, JSON.stringify(namespace), String(rounds), ...keys],
        { stdio: ["pipe", "pipe", "pipe"] },
      );
      let stderr = "";
      writer.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      let wrote = -1;
      let finished = false;
      const lines = createInterface({ input: writer.stdout });
      const ready = new Promise<void>((resolve) => lines.on("line", (line) => (line === "ready" ? resolve() : line === "done" ? (finished = true) : (wrote = Number(line.slice(6))))));
      const exit = new Promise<number | null>((resolve) => writer.once("exit", resolve));
      await ready;
      writer.stdin.end("go\n");
      // Restores while the other process commits batches: each restore waits for a batch under way, or makes it wait.
      let restoredDuring = 0;
      while (!finished) {
        check();
        await store.restore(namespace, before);
        if (wrote >= 0 && !finished) restoredDuring++;
        // Right after a restore nothing of a batch is left unless a whole batch committed since.
        check();
        await new Promise((resolve) => setTimeout(resolve, 2));
      }
      expect(await exit, stderr).toBe(0);
      expect(wrote).toBe(rounds - 1);
      // The race was run, not avoided: restores landed between the writer's batches.
      expect(restoredDuring).toBeGreaterThan(10);
      // The last batch, whole, or a restore after it.
      expect(["old\n", `w${rounds - 1}\n`]).toContain(check());
      await store.restore(namespace, before);
      expect(check()).toBe("old\n");
    } finally {
      await store.close();
    }
  }, 120_000);
});

describe("PostgresStore: snapshots taken while writers run", () => {
  it("each is one committed state: restoring it gives every batch whole or not at all", async () => {
    const store = new PostgresStore({ connectionString: url, table: pgTable, maxConnections: 8 });
    const namespace = ["snap", randomUUID()];
    // Two disjoint sets of keys, written side by side: one set's batch may commit while the other's is under way.
    const sets = ["/p", "/q"].map((dir) => Array.from({ length: 200 }, (_, i) => `${dir}/${String(i).padStart(3, "0")}`));
    const ns = JSON.stringify(namespace);
    try {
      for (const keys of sets) await store.putMany(namespace, keys.map((key) => [key, fileDataFromText("w-start")] as const));
      await store.snapshot(namespace);
      const ids: Array<Promise<string>> = [];
      const writes: Array<Promise<unknown>> = [];
      for (let round = 0; round < 20; round++) {
        for (const keys of sets) writes.push(store.putMany(namespace, keys.map((key) => [key, fileDataFromText(`w${round}`)] as const)));
        ids.push(store.snapshot(namespace));
      }
      await Promise.all(writes);
      for (const id of await Promise.all(ids)) {
        await store.restore(namespace, id);
        for (const dir of ["/p/", "/q/"]) {
          const { rows } = await store.client.query<{ content: string }>(`SELECT content FROM ${pgTable} WHERE ns = $1 AND key LIKE $2`, [ns, `${dir}%`]);
          expect(rows).toHaveLength(200);
          expect(new Set(rows.map((row) => row.content)).size, `snapshot ${id}, ${dir}`).toBe(1);
        }
      }
    } finally {
      await store.close();
    }
  }, 60_000);
});

describe("MemoryStore fork", () => {
  it("an independent store sharing the records; StoreBackend forks with it", async () => {
    const parent = new StoreBackend({ store: new MemoryStore() });
    await parent.write("/a", "a");
    await parent.write("/d/b", "b");
    const child = parent.fork();
    await child.write("/a", "child", { overwrite: true });
    await child.delete("/d");
    await parent.write("/p", "p");
    expect(await contents(parent)).toEqual({ "/a": "utf-8:a", "/d/b": "utf-8:b", "/p": "utf-8:p" });
    expect(await contents(child)).toEqual({ "/a": "utf-8:child" });
    expect((await child.ls("/")).entries?.map((e) => e.path)).toEqual(["/a"]);
    expect(() => new StoreBackend({ store: new SqliteStore({ path: ":memory:" }) }).fork()).toThrow(/cannot fork/);
  });

  it("a store without snapshots: snapshot rejects, restore and diff answer unsupported", async () => {
    const plain: Store = new MemoryStore();
    const bare = new StoreBackend({ store: { ...bind(plain) } });
    await expect(bare.snapshot()).rejects.toMatchObject({ code: "unsupported" });
    expect((await bare.restore("0")).error?.code).toBe("unsupported");
    expect((await bare.diff("0")).error?.code).toBe("unsupported");
  });
});

/** The Store methods of `store`, bound, without its snapshot methods. */
function bind(store: Store): Store {
  return {
    get: store.get.bind(store),
    put: store.put.bind(store),
    putMany: store.putMany.bind(store),
    delete: store.delete.bind(store),
    deleteTree: store.deleteTree.bind(store),
    list: store.list.bind(store),
    listDirectory: store.listDirectory.bind(store),
    close: store.close.bind(store),
  };
}

describe("MemoryStore snapshots: memory", () => {
  it("1000 snapshots with small edits stay within 2x the memory of the largest state", async () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const heap = () => {
      for (let i = 0; i < 3; i++) gc();
      return process.memoryUsage().heapUsed;
    };
    const empty = heap();
    const backend = new StoreBackend({ store: new MemoryStore() });
    const count = 4000;
    for (let i = 0; i < count; i++) await backend.write(`/src/m${i % 40}/f${i}.ts`, `// file ${i}\n${`const v${i} = ${i};\n`.repeat(60)}`);
    const state = heap() - empty;
    const ids: string[] = [];
    for (let n = 0; n < 1000; n++) {
      const i = (n * 7919) % count;
      await backend.edit(`/src/m${i % 40}/f${i}.ts`, `// file ${i}`, `// file ${i} edited ${n}`);
      ids.push(await backend.snapshot());
    }
    const total = heap() - empty;
    console.log(`MemoryStore: state ${(state / 2 ** 20).toFixed(1)} MiB, with 1000 snapshots ${(total / 2 ** 20).toFixed(1)} MiB (${(total / state).toFixed(2)}x)`);
    expect(total).toBeLessThan(2 * state);
    expect(await backend.restore(ids[0]!)).toMatchObject({ snapshot: ids[0] });
    expect((await backend.diff(ids[0]!, ids[999]!)).changes!.length).toBeGreaterThan(500);
  }, 120_000);
});
