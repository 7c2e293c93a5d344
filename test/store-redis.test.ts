import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import { fileDataFromText } from "../core/filedata.js";
import { isStrataError } from "../core/errors.js";
import { RedisStore } from "../stores/redis.js";
import type { StoredItem } from "../stores/store.js";
import { PrivateRedis, serviceUrl } from "./support/servers.js";
import { runEngineSuite } from "./support/store-suite.js";

const url = serviceUrl("STRATA_REDIS_URL");

runEngineSuite({
  name: "RedisStore",
  engine: "redis",
  url,
  open: (target, options = {}) => new RedisStore({ url: target, maxValueSize: options.maxValueSize, commandTimeoutMs: options.timeoutMs }),
  privateServer: () => PrivateRedis.create(),
  durable: false,
});

describe("RedisStore: key layout", () => {
  const client = new Redis(url);
  afterAll(() => client.quit());

  it("keeps a namespace under its own key base and leaves only its version counter (and the store's schema version) once emptied", async () => {
    const prefix = `layout-${randomUUID()}:`;
    const store = new RedisStore({ client, keyPrefix: prefix });
    expect(store.client).toBe(client);
    const ns = ["a"];
    await store.putMany(ns, [
      ["/x/y/z.txt", fileDataFromText("z")],
      ["/x/w.txt", fileDataFromText("w")],
      ["/top.txt", fileDataFromText("t")],
    ]);
    await store.put(["a", "b"], "/x/y/z.txt", fileDataFromText("other"));
    const keys = (await client.keys(`${prefix}*`)).sort();
    expect(keys.every((key) => key.startsWith(`${prefix}{["a"]}:`) || key.startsWith(`${prefix}{["a","b"]}:`) || key === `${prefix}schema`)).toBe(true);
    expect(keys.filter((key) => key.startsWith(`${prefix}{["a"]}:f:`))).toHaveLength(3);
    await store.deleteTree(ns, "/x");
    await store.delete(ns, "/top.txt");
    await store.deleteTree(["a", "b"], "/");
    expect((await client.keys(`${prefix}*`)).sort()).toEqual([`${prefix}schema`, `${prefix}{["a","b"]}:seq`, `${prefix}{["a"]}:seq`]);
    await client.del(`${prefix}schema`, `${prefix}{["a","b"]}:seq`, `${prefix}{["a"]}:seq`);
    // A caller's client stays open when the store closes.
    await store.close();
    expect(await client.ping()).toBe("PONG");
  });

  it("reloads its scripts after the server forgets them", async () => {
    const store = new RedisStore({ client, keyPrefix: `flush-${randomUUID()}:` });
    await store.put(["s"], "/a", fileDataFromText("a"));
    await client.script("FLUSH");
    await store.put(["s"], "/b", fileDataFromText("b"));
    expect((await store.list(["s"])).items.map((item) => item.key)).toEqual(["/a", "/b"]);
    await store.deleteTree(["s"], "/");
  });
});

describe("RedisStore: one search cannot stall a shared server", () => {
  it("splits a grep of 24 files of 8 MB into server calls of bounded work", async () => {
    const prefix = `stall-${randomUUID()}:`;
    const store = new RedisStore({ url, keyPrefix: prefix });
    const other = new Redis(url);
    const ns = ["big"];
    // Measured by the server (SLOWLOG logs each command's own execution time), and as shares of the
    // search's total, so a loaded machine, which slows every call alike, does not change the verdict.
    const [, threshold = "10000"] = (await other.config("GET", "slowlog-log-slower-than")) as string[];
    const [, length = "128"] = (await other.config("GET", "slowlog-max-len")) as string[];
    try {
      const chunk = "abcdefgh".repeat(1024 * 1024);
      for (let i = 0; i < 24; i++) await store.put(ns, `/big/${i}.txt`, fileDataFromText(`${chunk}${i === 9 ? "needle" : ""}`));
      await other.config("SET", "slowlog-max-len", "100000");
      await other.config("SET", "slowlog-log-slower-than", "0");
      await other.slowlog("RESET");
      const found: string[] = [];
      for await (const item of store.search(ns, "needle", "/")) found.push(item.key);
      await other.config("SET", "slowlog-log-slower-than", threshold);
      expect(found).toEqual(["/big/9.txt"]);
      const calls = ((await other.slowlog("GET", 100000)) as [number, number, number, string[]][])
        .filter(([, , , args]) => args[0]?.toLowerCase() === "evalsha" && args.some((arg) => arg.includes(prefix)))
        .map(([, , micros]) => micros);
      // Unbounded (one script call over every key), one call does all the work: about 400 ms for these
      // 192 MB on an idle machine, the whole time Redis answers nobody else. Bounded by bytes, the work
      // is spread over many short calls (about 15 ms each, idle), with other clients served between them.
      const total = calls.reduce((sum, micros) => sum + micros, 0);
      expect(calls.length).toBeGreaterThanOrEqual(8);
      expect(Math.max(...calls)).toBeLessThan(total / 4);
    } finally {
      await other.config("SET", "slowlog-log-slower-than", threshold);
      await other.config("SET", "slowlog-max-len", length);
      await store.deleteTree(ns, "/");
      await store.close();
      await other.quit();
    }
  }, 60_000);
});

/** A record as the version-0 code laid it out: the fields of its `f:` hash. */
interface V0Record {
  ns: string[];
  key: string;
  version: number;
  content: string;
  encoding: string;
  original: string | null;
  size: number;
  created: string;
  modified: string;
}

/**
 * Writes records in the version-0 layout (before RedisStore recorded a schema
 * version) with raw commands, exactly as that code's PUT script did: the
 * record's hash, its directory's entry, the namespace's sorted set of keys,
 * the file counts of every ancestor directory, and the version counter.
 * FROZEN: it stands for data already in Redis; never edit it to follow the code.
 */
async function writeV0(client: Redis, prefix: string, records: readonly V0Record[]): Promise<void> {
  for (const r of records) {
    const base = `${prefix}{${JSON.stringify(r.ns)}}:`;
    const f = `${base}f:${r.key}`;
    await client.hset(f, "v", r.version, "c", r.content, "e", r.encoding, "ca", r.created, "ma", r.modified, "s", r.size);
    if (r.original !== null) await client.hset(f, "j", r.original);
    const slash = r.key.lastIndexOf("/");
    await client.hset(`${base}d:${r.key.slice(0, slash + 1)}`, r.key.slice(slash + 1), `${r.version} ${r.size} ${r.modified}`);
    await client.zadd(`${base}k`, 0, r.key);
    for (let pos = 0, next = r.key.indexOf("/", 1); next !== -1; pos = next, next = r.key.indexOf("/", next + 1)) {
      await client.hincrby(`${base}c:${r.key.slice(0, pos + 1)}`, r.key.slice(pos + 1, next), 1);
    }
    await client.set(`${base}seq`, r.version);
  }
}

const V0_RECORDS: V0Record[] = [
  { ns: ["me"], key: "/notes/today.md", version: 1, content: "# Today\nneedle here\n", encoding: "utf-8", original: null, size: 20, created: "2024-05-01T10:00:00.000Z", modified: "2024-05-02T10:00:00.000Z" },
  { ns: ["me"], key: "/notes/deep/x.txt", version: 2, content: "deep\n", encoding: "utf-8", original: null, size: 5, created: "2024-05-01T10:00:00.000Z", modified: "2024-05-01T10:00:00.000Z" },
  { ns: ["me"], key: "/bin/blob", version: 3, content: "AAEC/w==", encoding: "base64", original: null, size: 4, created: "2024-05-01T10:00:00.000Z", modified: "2024-05-01T10:00:00.000Z" },
  { ns: ["me"], key: "/legacy.txt", version: 4, content: "a\nb", encoding: "lines", original: '["a","b"]', size: 3, created: "2023-01-01T00:00:00.000Z", modified: "2023-01-01T00:00:00.000Z" },
  { ns: ["me"], key: "/nul.txt", version: 5, content: "x\uFFFDy", encoding: "utf-8", original: '"x\\u0000y"', size: 3, created: "2024-05-01T10:00:00.000Z", modified: "2024-05-01T10:00:00.000Z" },
  { ns: ["other"], key: "/notes/today.md", version: 1, content: "other\n", encoding: "utf-8", original: null, size: 6, created: "2024-05-03T10:00:00.000Z", modified: "2024-05-03T10:00:00.000Z" },
];

/** What the records above hold, read back through the store. */
const V0_ITEMS: Array<[string[], StoredItem]> = [
  [["me"], { key: "/notes/today.md", value: { content: "# Today\nneedle here\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-02T10:00:00.000Z" }, version: 1 }],
  [["me"], { key: "/notes/deep/x.txt", value: { content: "deep\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 2 }],
  [["me"], { key: "/bin/blob", value: { content: "AAEC/w==", encoding: "base64", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 3 }],
  [["me"], { key: "/legacy.txt", value: { content: ["a", "b"], created_at: "2023-01-01T00:00:00.000Z", modified_at: "2023-01-01T00:00:00.000Z" }, version: 4 }],
  [["me"], { key: "/nul.txt", value: { content: "x\0y", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 5 }],
  [["other"], { key: "/notes/today.md", value: { content: "other\n", encoding: "utf-8", created_at: "2024-05-03T10:00:00.000Z", modified_at: "2024-05-03T10:00:00.000Z" }, version: 1 }],
];

describe("RedisStore: schema version and migrations", () => {
  const client = new Redis(url);
  const prefixes: string[] = [];
  const oldPrefix = async () => {
    const prefix = `v0-${randomUUID()}:`;
    prefixes.push(prefix);
    await writeV0(client, prefix, V0_RECORDS);
    return prefix;
  };
  afterAll(async () => {
    for (const prefix of prefixes) {
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
    }
    await client.quit();
  });
  async function collect(items: AsyncIterable<StoredItem>): Promise<string[]> {
    const keys: string[] = [];
    for await (const item of items) keys.push(item.key);
    return keys;
  }

  it("records the current version (2) under a new prefix on first use", async () => {
    const prefix = `v-new-${randomUUID()}:`;
    prefixes.push(prefix);
    const store = new RedisStore({ client, keyPrefix: prefix });
    expect(await store.get(["s"], "/a")).toBeUndefined();
    expect(await client.get(`${prefix}schema`)).toBe("2");
    await store.close();
  });

  it("migrates version-0 keys to the current version (2), keeping every record readable and writable", async () => {
    const prefix = await oldPrefix();
    const before = (await client.keys(`${prefix}*`)).sort();
    expect(await client.get(`${prefix}schema`)).toBeNull();
    const store = new RedisStore({ client, keyPrefix: prefix });
    try {
      for (const [ns, item] of V0_ITEMS) expect(await store.get(ns, item.key)).toEqual(item);
      expect(await client.get(`${prefix}schema`)).toBe("2");
      // Versions 1 and 2 add the version key and change nothing else (version 2's trigram index is built by the first search).
      expect((await client.keys(`${prefix}*`)).sort()).toEqual([...before, `${prefix}schema`].sort());

      expect((await store.list(["me"])).items.map((k) => [k.key, k.version, k.size])).toEqual([
        ["/bin/blob", 3, 4],
        ["/legacy.txt", 4, 3],
        ["/notes/deep/x.txt", 2, 5],
        ["/notes/today.md", 1, 20],
        ["/nul.txt", 5, 3],
      ]);
      const listing = await store.listDirectory(["me"], "/notes");
      expect({ files: listing.files.map((f) => [f.key, f.version, f.size]), dirs: listing.dirs }).toEqual({ files: [["/notes/today.md", 1, 20]], dirs: ["deep"] });
      expect(await collect(store.search(["me"], "needle", "/"))).toEqual(["/notes/today.md"]);

      // Writable: compare-and-set against the old versions, the tree checked, versions continuing the counter.
      expect(await store.put(["me"], "/notes/today.md", fileDataFromText("# Today\nedited\n"), { expectedVersion: 1 })).toBe(6);
      await expect(store.put(["me"], "/legacy.txt", fileDataFromText("stale"), { expectedVersion: 3 })).rejects.toMatchObject({ code: "conflict" });
      await expect(store.putFile(["me"], "/notes", fileDataFromText("dir"))).rejects.toMatchObject({ code: "is_directory" });
      await expect(store.putFile(["me"], "/bin/blob/under", fileDataFromText("x"))).rejects.toMatchObject({ code: "not_a_directory" });
      expect(await store.putFiles(["me"], [["/notes/deep/y.txt", fileDataFromText("y")]])).toEqual([7]);
      expect(await store.delete(["me"], "/bin/blob", { expectedVersion: 3 })).toBe(true);
      expect((await store.listDirectory(["me"], "/")).dirs).toEqual(["notes"]);
      expect(await store.deleteTree(["me"], "/notes/deep")).toEqual(["/notes/deep/x.txt", "/notes/deep/y.txt"]);
      expect((await store.listDirectory(["me"], "/notes")).dirs).toEqual([]);
      expect(await collect(store.search(["me"], "edited", "/"))).toEqual(["/notes/today.md"]);
      expect(await store.get(["other"], "/notes/today.md")).toEqual(V0_ITEMS[5]![1]);
    } finally {
      await store.close();
    }
  });

  it("does not migrate again: opening a current prefix writes nothing", async () => {
    const prefix = await oldPrefix();
    const first = new RedisStore({ client, keyPrefix: prefix });
    await first.get(["me"], "/legacy.txt");
    // A transaction watching the version key fails if anything wrote it in between.
    const opensWithoutWriting = async (keyPrefix: string) => {
      const watcher = new Redis(url);
      try {
        await watcher.watch(`${keyPrefix}schema`);
        const store = new RedisStore({ url, keyPrefix });
        expect(await store.get(["me"], "/legacy.txt")).toEqual(V0_ITEMS[3]![1]);
        await store.close();
        return (await watcher.multi().get(`${keyPrefix}schema`).exec()) !== null;
      } finally {
        await watcher.quit();
      }
    };
    expect(await opensWithoutWriting(prefix)).toBe(true);
    // The same open of keys still in the old layout does write the version.
    expect(await opensWithoutWriting(await oldPrefix())).toBe(false);
    expect(await client.get(`${prefix}schema`)).toBe("2");
  });

  it("refuses keys written by a newer layout with unsupported, naming the versions, and leaves them alone", async () => {
    const prefix = await oldPrefix();
    for (const [recorded, named] of [["3", /version 3\b/], ["banana", /version "banana"/]] as const) {
      await client.set(`${prefix}schema`, recorded);
      const store = new RedisStore({ client, keyPrefix: prefix });
      for (const attempt of [store.get(["me"], "/legacy.txt"), store.put(["me"], "/x", fileDataFromText("x")), store.list(["me"])]) {
        const error = await attempt.catch((e: unknown) => e);
        expect(isStrataError(error, "unsupported")).toBe(true);
        expect((error as Error).message).toMatch(/newer Strata/);
        expect((error as Error).message).toMatch(named);
        expect((error as Error).message).toMatch(/up to 2\b/);
      }
      await store.close();
      expect(await client.get(`${prefix}schema`)).toBe(recorded);
    }
    expect(await client.exists(`${prefix}{["me"]}:f:/x`)).toBe(0);
    expect(await client.zrange(`${prefix}{["me"]}:k`, "0", "-1")).toHaveLength(5);
  });

  it("lets 4 stores open the same version-0 keys at once: all succeed, nothing is lost", async () => {
    const prefix = await oldPrefix();
    const stores = Array.from({ length: 4 }, () => new RedisStore({ url, keyPrefix: prefix }));
    try {
      const versions = await Promise.all(stores.map((store, i) => store.put(["me"], `/opened/${i}`, fileDataFromText(`${i}`), { expectedVersion: null })));
      expect(versions.sort()).toEqual([6, 7, 8, 9]);
      expect(await client.get(`${prefix}schema`)).toBe("2");
      for (const [ns, item] of V0_ITEMS) expect(await stores[3]!.get(ns, item.key)).toEqual(item);
      expect((await stores[0]!.listDirectory(["me"], "/opened")).files.map((f) => f.key).sort()).toEqual(["/opened/0", "/opened/1", "/opened/2", "/opened/3"]);
    } finally {
      await Promise.all(stores.map((store) => store.close()));
    }
  });
});
