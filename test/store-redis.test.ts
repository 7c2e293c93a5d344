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
