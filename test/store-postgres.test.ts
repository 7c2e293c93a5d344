import { randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { fileDataFromText } from "../core/filedata.js";
import { isStrataError } from "../core/errors.js";
import { PostgresStore } from "../stores/postgres.js";
import type { StoredItem } from "../stores/store.js";
import { eventually, PrivatePostgres, serviceUrl } from "./support/servers.js";
import { runEngineSuite } from "./support/store-suite.js";

const url = serviceUrl("STRATA_POSTGRES_URL");

async function collect(items: AsyncIterable<StoredItem>): Promise<StoredItem[]> {
  const all: StoredItem[] = [];
  for await (const item of items) all.push(item);
  return all;
}

runEngineSuite({
  name: "PostgresStore",
  engine: "postgres",
  url,
  open: (target, options = {}) =>
    new PostgresStore({ connectionString: target, maxValueSize: options.maxValueSize, statementTimeoutMs: options.timeoutMs, maxConnections: 3 }),
  privateServer: () => PrivatePostgres.create(),
  durable: true,
  writerUrl: (tag) => `${url}${url.includes("?") ? "&" : "?"}application_name=${tag}`,
  // The writer's transaction has an xid once its first rows are in the table, uncommitted.
  batchInFlight: async (tag) => {
    const watcher = new pg.Client({ connectionString: url });
    await watcher.connect();
    try {
      await eventually(async () => {
        const { rowCount } = await watcher.query("SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL", [tag]);
        if (!rowCount) throw new Error("the writer's batch has not started writing");
      }, 30, 10);
    } finally {
      await watcher.end();
    }
  },
});

describe("PostgresStore: schema and indexes", () => {
  const admin = new pg.Pool({ connectionString: url, max: 2 });
  const tables: string[] = [];
  afterAll(async () => {
    for (const table of tables) {
      await admin.query(`DROP TABLE IF EXISTS strata_schema_test.${table}`);
      await admin.query(`DROP SEQUENCE IF EXISTS strata_schema_test.${table}_version`);
    }
    await admin.end();
  });

  it("creates its schema, table, indexes and sequence on first use, once, however many stores start together", async () => {
    const table = `t_${randomUUID().replace(/-/g, "")}`;
    tables.push(table);
    const stores = Array.from({ length: 4 }, () => new PostgresStore({ connectionString: url, schema: "strata_schema_test", table }));
    try {
      const versions = await Promise.all(stores.map((store, i) => store.put(["s"], `/f${i}`, fileDataFromText(`${i}`))));
      expect(new Set(versions).size).toBe(4);
      const { rows } = await admin.query<{ relname: string }>(
        `SELECT relname FROM pg_class JOIN pg_namespace n ON n.oid = relnamespace WHERE nspname = 'strata_schema_test' AND relname LIKE $1 ORDER BY relname`,
        [`${table}%`],
      );
      expect(rows.map((row) => row.relname)).toEqual([table, `${table}_dir`, `${table}_pkey`, `${table}_trgm`, `${table}_version`]);
      const collations = await admin.query<{ attname: string; collname: string }>(
        `SELECT attname, collname FROM pg_attribute JOIN pg_collation c ON c.oid = attcollation
         WHERE attrelid = $1::regclass AND attname IN ('ns', 'key', 'dir') ORDER BY attname`,
        [`strata_schema_test.${table}`],
      );
      expect(collations.rows.every((row) => row.collname === "C")).toBe(true);
    } finally {
      await Promise.all(stores.map((store) => store.close()));
    }
  });

  it("recreates its table when it is dropped behind the store's back", async () => {
    const table = `t_${randomUUID().replace(/-/g, "")}`;
    tables.push(table);
    const store = new PostgresStore({ connectionString: url, schema: "strata_schema_test", table });
    try {
      await store.put(["s"], "/a", fileDataFromText("a"));
      await admin.query(`DROP TABLE strata_schema_test.${table}`);
      await store.putMany(["s"], [["/b", fileDataFromText("b")]]);
      await store.put(["s"], "/c", fileDataFromText("c"));
      expect((await store.list(["s"])).items.map((item) => item.key)).toEqual(["/b", "/c"]);
    } finally {
      await store.close();
    }
  });

  it("rejects unsafe schema or table names", () => {
    for (const table of ["bad-name", "x; DROP TABLE y", "", "a".repeat(60)]) {
      expect(() => new PostgresStore({ connectionString: url, table })).toThrow(/must match/);
    }
  });

  it("answers search from the trigram index, and list and listDirectory from btree ranges, in a large namespace", async () => {
    const store = new PostgresStore({ connectionString: url });
    const ns = [`plan-${randomUUID()}`];
    const nsKey = JSON.stringify(ns);
    try {
      await store.put(ns, "/seed.txt", fileDataFromText("seed")); // creates the table on a fresh database
      // 30,000 rows in the store's own layout, quicker through SQL than through putMany.
      await admin.query(
        `INSERT INTO strata_files (ns, key, dir, version, encoding, content, original, size, created_at, modified_at)
         SELECT $1, '/d' || (i % 30) || '/f' || i || '.txt', '/d' || (i % 30) || '/', nextval('strata_files_version'), 'utf-8',
                'line ' || i || E'\\nvalue ' || md5(i::text) || E'\\n', NULL, 40, 'x', 'x'
         FROM generate_series(1, 30000) AS i`,
        [nsKey],
      );
      await admin.query("ANALYZE strata_files");
      const needle = (await admin.query<{ md5: string }>("SELECT md5('1234')")).rows[0]!.md5;
      // Whether the planner prefers a sequential scan depends on what else the
      // shared table holds; with it ruled out, the plan shows which index can
      // answer each predicate (a collation or operator-class mismatch would leave none).
      const client = await admin.connect();
      try {
        await client.query("BEGIN");
        await client.query("SET LOCAL enable_seqscan = off");
        const plan = async (sql: string) => JSON.stringify((await client.query(`EXPLAIN (FORMAT JSON) ${sql}`, [nsKey])).rows[0]);
        expect(await plan(`SELECT key FROM strata_files WHERE ns = $1 AND encoding <> 'base64' AND content LIKE '%${needle}%'`)).toContain(
          "strata_files_trgm",
        );
        expect(await plan("SELECT key FROM strata_files WHERE ns = $1 AND key >= '/d1/' AND key < '/d10' ORDER BY key LIMIT 1001")).toContain(
          "strata_files_pkey",
        );
        expect(await plan("SELECT key FROM strata_files WHERE ns = $1 AND dir = '/d1/'")).toContain("strata_files_dir");
      } finally {
        await client.query("ROLLBACK");
        client.release();
      }
      expect((await collect(store.search(ns, needle, "/"))).map((item) => item.key)).toEqual(["/d4/f1234.txt"]);
      expect((await store.listDirectory(ns, "/")).dirs).toHaveLength(30);
      expect((await store.listDirectory(ns, "/d7")).files).toHaveLength(1000);
    } finally {
      await store.deleteTree(ns, "/");
      await store.close();
    }
  });

  it("refuses a key too long for the btree index with invalid_path", async () => {
    const store = new PostgresStore({ connectionString: url });
    try {
      const long = `/${"d/".repeat(1300)}f`;
      const error = await store.put(["long"], long, fileDataFromText("x")).catch((e: unknown) => e);
      expect(isStrataError(error, "invalid_path")).toBe(true);
      const fits = `/${"d/".repeat(1000)}f`;
      await store.put(["long"], fits, fileDataFromText("x"));
      expect((await store.list(["long"], { prefix: "/d/d/" })).items.map((item) => item.key)).toEqual([fits]);
      await store.deleteTree(["long"], "/");
    } finally {
      await store.close();
    }
  });

  it("leaves a caller's pool open when the store closes", async () => {
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    const store = new PostgresStore({ pool });
    await store.get(["pool"], "/x");
    await store.close();
    expect((await pool.query("SELECT 1 AS one")).rows[0]).toEqual({ one: 1 });
    await pool.end();
  });
});

describe("PostgresStore: waiting for a connection is not an outage", () => {
  const big = (i: number) => fileDataFromText(`${String(i).padStart(4, "0")} ${"x".repeat(2 * 1024 * 1024)} needle-${i}\n`);

  it("queues 100 concurrent 2 MB writes and 100 greps on a pool of 2: every one succeeds", async () => {
    const store = new PostgresStore({ connectionString: url, maxConnections: 2 });
    const ns = [`queue-${randomUUID()}`];
    try {
      const writes = await Promise.allSettled(Array.from({ length: 100 }, (_, i) => store.put(ns, `/big/${i}.txt`, big(i))));
      expect(writes.filter((result) => result.status === "rejected")).toEqual([]);
      const greps = await Promise.allSettled(Array.from({ length: 100 }, (_, i) => collect(store.search!(ns, `needle-${i}\n`, "/big/"))));
      expect(greps.filter((result) => result.status === "rejected")).toEqual([]);
      greps.forEach((result, i) => expect((result as PromiseFulfilledResult<StoredItem[]>).value.map((item) => item.key)).toEqual([`/big/${i}.txt`]));
    } finally {
      await store.deleteTree(ns, "/");
      await store.close();
    }
  });

  it("answers busy, not unavailable, when the wait for a connection runs out, and keeps working", async () => {
    const store = new PostgresStore({ connectionString: url, maxConnections: 1, acquireTimeoutMs: 20 });
    const ns = [`busy-${randomUUID()}`];
    try {
      const results = await Promise.allSettled(Array.from({ length: 20 }, (_, i) => store.put(ns, `/f${i}`, big(i))));
      const codes = new Set(results.map((result) => (result.status === "fulfilled" ? "ok" : isStrataError(result.reason) ? result.reason.code : "untyped")));
      expect(codes.has("busy")).toBe(true);
      expect([...codes].every((code) => code === "ok" || code === "busy")).toBe(true);
      const rejected = results.find((result) => result.status === "rejected") as PromiseRejectedResult;
      expect(rejected.reason.message).toMatch(/busy: all 1 connections stayed in use for 20 ms/);
      await store.put(ns, "/after", fileDataFromText("fine"));
      expect(await store.get(ns, "/after")).toBeDefined();
    } finally {
      await store.deleteTree(ns, "/");
      await store.close();
    }
  });

  it("refuses an acquireTimeoutMs no timer can honour", () => {
    for (const acquireTimeoutMs of [0, -1, Number.NaN, Infinity, 2 ** 31]) {
      expect(() => new PostgresStore({ connectionString: url, acquireTimeoutMs })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    }
  });
});
