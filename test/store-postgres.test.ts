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
      await admin.query(
        `DROP TABLE IF EXISTS strata_schema_test.${table}, strata_schema_test.${table}_meta, strata_schema_test.${table}_history, strata_schema_test.${table}_snapshots`,
      );
      await admin.query(`DROP SEQUENCE IF EXISTS strata_schema_test.${table}_version`);
      await admin.query(`DROP FUNCTION IF EXISTS strata_schema_test.${table}_history_fn`);
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
      expect(rows.map((row) => row.relname).sort()).toEqual(
        [
          table,
          `${table}_dir`,
          `${table}_history`,
          `${table}_history_ns_seq`,
          `${table}_history_pkey`,
          `${table}_history_seq_seq`,
          `${table}_meta`,
          `${table}_meta_pkey`,
          `${table}_pkey`,
          `${table}_snapshots`,
          `${table}_snapshots_pkey`,
          `${table}_trgm`,
          `${table}_version`,
        ].sort(),
      );
      const meta = await admin.query(`SELECT name, value FROM strata_schema_test.${table}_meta`);
      expect(meta.rows).toEqual([{ name: "schema_version", value: "2" }]);
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
    expect(store.client).toBe(pool);
    await store.get(["pool"], "/x");
    await store.close();
    expect((await pool.query("SELECT 1 AS one")).rows[0]).toEqual({ one: 1 });
    await pool.end();
  });
});

describe("PostgresStore: waiting for a connection is not an outage", () => {
  const big = (i: number) => fileDataFromText(`${String(i).padStart(4, "0")} ${"x".repeat(2 * 1024 * 1024)} needle-${i}\n`);

  it("queues 100 concurrent 2 MB writes and 100 greps on a pool of 2: every one succeeds", async () => {
    // What is tested is that a queued caller waits rather than fails; the wait's bound (acquireTimeoutMs,
    // 30 s by default, tested below) is set out of reach, as a loaded test machine can take longer than that.
    const store = new PostgresStore({ connectionString: url, maxConnections: 2, acquireTimeoutMs: 300_000 });
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
  }, 300_000);

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

/**
 * Version 0: the layout PostgresStore created before it recorded a schema
 * version, copied from stores/postgres.ts as it was then. FROZEN: it stands
 * for tables already in use; never edit it to follow the code.
 */
async function createV0Layout(db: pg.Pool, schema: string, table: string): Promise<void> {
  const name = (suffix: string) => `${pg.escapeIdentifier(schema)}.${pg.escapeIdentifier(`${table}${suffix}`)}`;
  await db.query(`CREATE SCHEMA IF NOT EXISTS ${pg.escapeIdentifier(schema)}`);
  await db.query(`CREATE TABLE IF NOT EXISTS ${name("")} (
    ns text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    dir text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    encoding text NOT NULL,
    content text NOT NULL,
    original text,
    size bigint NOT NULL,
    created_at text NOT NULL,
    modified_at text NOT NULL,
    PRIMARY KEY (ns, key))`);
  await db.query(`CREATE INDEX IF NOT EXISTS ${pg.escapeIdentifier(`${table}_dir`)} ON ${name("")} (ns, dir)`);
  await db.query(`CREATE SEQUENCE IF NOT EXISTS ${name("_version")}`);
  await db.query("CREATE EXTENSION IF NOT EXISTS pg_trgm");
  await db.query(`CREATE INDEX IF NOT EXISTS ${pg.escapeIdentifier(`${table}_trgm`)} ON ${name("")} USING gin (content gin_trgm_ops) WHERE encoding <> 'base64'`);
  // Rows as the version-0 code stored them (FROZEN with the layout): text, binary, a v1 list of
  // lines, text holding a NUL kept exactly in `original`; versions drawn from the sequence.
  const rows: Array<[string, string, string, string, string, string | null, number, string, string]> = [
    ['["me"]', "/notes/today.md", "/notes/", "utf-8", "# Today\nneedle here\n", null, 20, "2024-05-01T10:00:00.000Z", "2024-05-02T10:00:00.000Z"],
    ['["me"]', "/notes/deep/x.txt", "/notes/deep/", "utf-8", "deep\n", null, 5, "2024-05-01T10:00:00.000Z", "2024-05-01T10:00:00.000Z"],
    ['["me"]', "/bin/blob", "/bin/", "base64", "AAEC/w==", null, 4, "2024-05-01T10:00:00.000Z", "2024-05-01T10:00:00.000Z"],
    ['["me"]', "/legacy.txt", "/", "lines", "a\nb", '["a","b"]', 3, "2023-01-01T00:00:00.000Z", "2023-01-01T00:00:00.000Z"],
    ['["me"]', "/nul.txt", "/", "utf-8", "x\uFFFDy", '"x\\u0000y"', 3, "2024-05-01T10:00:00.000Z", "2024-05-01T10:00:00.000Z"],
    ['["other"]', "/notes/today.md", "/notes/", "utf-8", "other\n", null, 6, "2024-05-03T10:00:00.000Z", "2024-05-03T10:00:00.000Z"],
  ];
  for (const row of rows) {
    await db.query(
      `INSERT INTO ${name("")} (ns, key, dir, version, encoding, content, original, size, created_at, modified_at)
       VALUES ($1, $2, $3, nextval('${name("_version")}'::regclass), $4, $5, $6, $7, $8, $9)`,
      row,
    );
  }
}

/** What the rows above hold, read back through the store. */
const V0_ITEMS: Array<[string[], StoredItem]> = [
  [["me"], { key: "/notes/today.md", value: { content: "# Today\nneedle here\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-02T10:00:00.000Z" }, version: 1 }],
  [["me"], { key: "/notes/deep/x.txt", value: { content: "deep\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 2 }],
  [["me"], { key: "/bin/blob", value: { content: "AAEC/w==", encoding: "base64", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 3 }],
  [["me"], { key: "/legacy.txt", value: { content: ["a", "b"], created_at: "2023-01-01T00:00:00.000Z", modified_at: "2023-01-01T00:00:00.000Z" }, version: 4 }],
  [["me"], { key: "/nul.txt", value: { content: "x\0y", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 5 }],
  [["other"], { key: "/notes/today.md", value: { content: "other\n", encoding: "utf-8", created_at: "2024-05-03T10:00:00.000Z", modified_at: "2024-05-03T10:00:00.000Z" }, version: 6 }],
];

describe("PostgresStore: schema version and migrations", () => {
  const schema = "strata_schema_test";
  const admin = new pg.Pool({ connectionString: url, max: 3 });
  const tables: string[] = [];
  const newTable = () => {
    const table = `v_${randomUUID().replace(/-/g, "")}`;
    tables.push(table);
    return table;
  };
  const open = (table: string, options: { statementTimeoutMs?: number } = {}) => new PostgresStore({ connectionString: url, schema, table, maxConnections: 2, ...options });
  const recorded = async (table: string) =>
    (await admin.query<{ value: string }>(`SELECT value FROM ${schema}.${table}_meta WHERE name = 'schema_version'`)).rows.map((row) => Number(row.value));
  /** The store's relations and index definitions, with its table name factored out, to compare layouts. */
  const layout = async (table: string) => {
    const relations = await admin.query<{ relname: string }>(
      `SELECT relname FROM pg_class JOIN pg_namespace n ON n.oid = relnamespace WHERE nspname = $1 AND relname LIKE $2`,
      [schema, `${table}%`],
    );
    const indexes = await admin.query<{ indexdef: string }>(`SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename IN ($2, $3)`, [
      schema,
      table,
      `${table}_meta`,
    ]);
    return {
      relations: relations.rows.map((row) => row.relname.replace(table, "T")).sort(),
      indexes: indexes.rows.map((row) => row.indexdef.replaceAll(table, "T")).sort(),
    };
  };
  /** Holds the advisory lock a store takes to create or migrate the table, until released. */
  const holdLayoutLock = async (table: string) => {
    const client = await admin.connect();
    await client.query("SELECT pg_advisory_lock(hashtext($1))", [`strata:${schema}.${table}`]);
    return async () => {
      await client.query("SELECT pg_advisory_unlock(hashtext($1))", [`strata:${schema}.${table}`]);
      client.release();
    };
  };
  afterAll(async () => {
    for (const table of tables) {
      await admin.query(`DROP TABLE IF EXISTS ${schema}.${table}, ${schema}.${table}_meta, ${schema}.${table}_history, ${schema}.${table}_snapshots`);
      await admin.query(`DROP SEQUENCE IF EXISTS ${schema}.${table}_version`);
      await admin.query(`DROP FUNCTION IF EXISTS ${schema}.${table}_history_fn`);
    }
    await admin.end();
  });

  it("migrates a version-0 table to version 2 (through 1), keeping every record readable and writable", async () => {
    const table = newTable();
    await createV0Layout(admin, schema, table);
    const fresh = newTable();
    const store = open(table);
    const other = open(fresh);
    try {
      for (const [ns, item] of V0_ITEMS) expect(await store.get(ns, item.key)).toEqual(item);
      expect(await recorded(table)).toEqual([2]);
      // The migrated layout is exactly a new table's.
      await other.get(["x"], "/x");
      expect(await layout(table)).toEqual(await layout(fresh));

      expect((await store.list(["me"])).items.map((k) => [k.key, k.version, k.size])).toEqual([
        ["/bin/blob", 3, 4],
        ["/legacy.txt", 4, 3],
        ["/notes/deep/x.txt", 2, 5],
        ["/notes/today.md", 1, 20],
        ["/nul.txt", 5, 3],
      ]);
      const listing = await store.listDirectory(["me"], "/notes");
      expect({ files: listing.files.map((f) => f.key), dirs: listing.dirs }).toEqual({ files: ["/notes/today.md"], dirs: ["deep"] });
      expect((await collect(store.search(["me"], "needle", "/"))).map((item) => item.key)).toEqual(["/notes/today.md"]);

      // Writable: compare-and-set against the old versions, the tree checked, versions still from the sequence.
      const edited = await store.put(["me"], "/notes/today.md", fileDataFromText("# Today\nedited\n"), { expectedVersion: 1 });
      expect(edited).toBeGreaterThan(6);
      await expect(store.put(["me"], "/legacy.txt", fileDataFromText("stale"), { expectedVersion: 3 })).rejects.toMatchObject({ code: "conflict" });
      await expect(store.putFile(["me"], "/notes", fileDataFromText("dir"))).rejects.toMatchObject({ code: "is_directory" });
      await expect(store.putFile(["me"], "/bin/blob/under", fileDataFromText("x"))).rejects.toMatchObject({ code: "not_a_directory" });
      expect(await store.putFiles(["me"], [["/notes/deep/y.txt", fileDataFromText("y")]])).toEqual([edited + 1]);
      expect(await store.delete(["me"], "/bin/blob", { expectedVersion: 3 })).toBe(true);
      expect((await store.listDirectory(["me"], "/")).dirs).toEqual(["notes"]);
      expect(await store.deleteTree(["me"], "/notes/deep")).toEqual(["/notes/deep/x.txt", "/notes/deep/y.txt"]);
      expect((await collect(store.search(["me"], "edited", "/"))).map((item) => item.key)).toEqual(["/notes/today.md"]);
      expect(await store.get(["other"], "/notes/today.md")).toEqual(V0_ITEMS[5]![1]);
    } finally {
      await Promise.all([store.close(), other.close()]);
    }
  });

  it("does not migrate again: a current table opens without waiting for the layout lock", async () => {
    const table = newTable();
    await createV0Layout(admin, schema, table);
    const first = open(table);
    await first.get(["me"], "/legacy.txt");
    await first.close();
    const release = await holdLayoutLock(table);
    try {
      // A store that tried to create or migrate would wait for the lock until its statement timeout.
      const again = open(table, { statementTimeoutMs: 1500 });
      try {
        expect(await again.get(["me"], "/legacy.txt")).toEqual(V0_ITEMS[3]![1]);
        expect(await again.put(["me"], "/new", fileDataFromText("n"))).toBeGreaterThan(6);
      } finally {
        await again.close();
      }
      // The same open of a table still in the old layout does wait, and gives up with a timeout.
      const old = newTable();
      await createV0Layout(admin, schema, old);
      const releaseOld = await holdLayoutLock(old);
      const waiting = open(old, { statementTimeoutMs: 1500 });
      try {
        await expect(waiting.get(["me"], "/legacy.txt")).rejects.toMatchObject({ code: "timeout" });
      } finally {
        await waiting.close();
        await releaseOld();
      }
    } finally {
      await release();
    }
    expect(await recorded(table)).toEqual([2]);
  });

  it("refuses a table written by a newer layout with unsupported, naming the versions, and leaves it alone", async () => {
    const table = newTable();
    await createV0Layout(admin, schema, table);
    const first = open(table);
    await first.get(["me"], "/legacy.txt");
    await first.close();
    await admin.query(`UPDATE ${schema}.${table}_meta SET value = 3 WHERE name = 'schema_version'`);
    const store = open(table);
    try {
      for (const attempt of [store.get(["me"], "/legacy.txt"), store.put(["me"], "/x", fileDataFromText("x"))]) {
        const error = await attempt.catch((e: unknown) => e);
        expect(isStrataError(error, "unsupported")).toBe(true);
        expect((error as Error).message).toMatch(/newer Strata.*version 3\b.*up to 2\b/);
      }
    } finally {
      await store.close();
    }
    expect(await recorded(table)).toEqual([3]);
    expect((await admin.query(`SELECT key FROM ${schema}.${table} ORDER BY ns, key`)).rowCount).toBe(6);
  });

  it("lets 4 stores open the same version-0 table at once: all succeed, nothing is lost", async () => {
    const table = newTable();
    await createV0Layout(admin, schema, table);
    const stores = Array.from({ length: 4 }, () => open(table));
    try {
      const versions = await Promise.all(stores.map((store, i) => store.put(["me"], `/opened/${i}`, fileDataFromText(`${i}`), { expectedVersion: null })));
      expect(new Set(versions).size).toBe(4);
      expect(versions.every((version) => version > 6)).toBe(true);
      expect(await recorded(table)).toEqual([2]);
      for (const [ns, item] of V0_ITEMS) expect(await stores[3]!.get(ns, item.key)).toEqual(item);
      expect((await stores[0]!.listDirectory(["me"], "/opened")).files.map((f) => f.key).sort()).toEqual(["/opened/0", "/opened/1", "/opened/2", "/opened/3"]);
    } finally {
      await Promise.all(stores.map((store) => store.close()));
    }
  });
});
