import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import { fileDataFromText } from "../core/filedata.js";
import { RedisStore } from "../stores/redis.js";
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

  it("keeps a namespace under its own key base and leaves only its version counter once emptied", async () => {
    const prefix = `layout-${randomUUID()}:`;
    const store = new RedisStore({ client, keyPrefix: prefix });
    const ns = ["a"];
    await store.putMany(ns, [
      ["/x/y/z.txt", fileDataFromText("z")],
      ["/x/w.txt", fileDataFromText("w")],
      ["/top.txt", fileDataFromText("t")],
    ]);
    await store.put(["a", "b"], "/x/y/z.txt", fileDataFromText("other"));
    const keys = (await client.keys(`${prefix}*`)).sort();
    expect(keys.every((key) => key.startsWith(`${prefix}{["a"]}:`) || key.startsWith(`${prefix}{["a","b"]}:`))).toBe(true);
    expect(keys.filter((key) => key.startsWith(`${prefix}{["a"]}:f:`))).toHaveLength(3);
    await store.deleteTree(ns, "/x");
    await store.delete(ns, "/top.txt");
    await store.deleteTree(["a", "b"], "/");
    expect((await client.keys(`${prefix}*`)).sort()).toEqual([`${prefix}{["a","b"]}:seq`, `${prefix}{["a"]}:seq`]);
    await client.del(`${prefix}{["a","b"]}:seq`, `${prefix}{["a"]}:seq`);
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
  it("keeps another client's PING under 200 ms while grepping 24 files of 8 MB", async () => {
    const store = new RedisStore({ url, keyPrefix: `stall-${randomUUID()}:` });
    const other = new Redis(url);
    const ns = ["big"];
    try {
      const chunk = "abcdefgh".repeat(1024 * 1024);
      for (let i = 0; i < 24; i++) await store.put(ns, `/big/${i}.txt`, fileDataFromText(`${chunk}${i === 9 ? "needle" : ""}`));
      const latencies: number[] = [];
      let searching = true;
      const pinging = (async () => {
        while (searching) {
          const started = performance.now();
          await other.ping();
          latencies.push(performance.now() - started);
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
      })();
      const found: string[] = [];
      for await (const item of store.search(ns, "needle", "/")) found.push(item.key);
      searching = false;
      await pinging;
      expect(found).toEqual(["/big/9.txt"]);
      expect(latencies.length).toBeGreaterThan(2);
      // Unbounded (one script call over every key) a stall grows with the bytes: about 170 ms per 80 MB
      // here, so about 400 ms for these 192 MB; bounded by bytes, about 15 ms. The margin absorbs a
      // loaded machine (this process also parses the results).
      expect(Math.max(...latencies)).toBeLessThan(200);
    } finally {
      await store.deleteTree(ns, "/");
      await store.close();
      await other.quit();
    }
  }, 60_000);
});
