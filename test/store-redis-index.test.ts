/**
 * RedisStore's trigram index never loses a match: after any sequence of
 * overwrites, deletes, moves and tree deletes, from one or several writers,
 * and over records written before the index existed, `search` returns exactly
 * what a plain scan of every record finds.
 */
import { randomUUID } from "node:crypto";
import fc from "fast-check";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import { fileDataFromText } from "../core/filedata.js";
import type { FileData } from "../core/types.js";
import { RedisStore } from "../stores/redis.js";
import type { Namespace } from "../stores/store.js";
import { serviceUrl } from "./support/servers.js";

const url = serviceUrl("STRATA_REDIS_URL");
const client = new Redis(url);
const prefix = `index-${randomUUID()}:`;
const stores = [new RedisStore({ url, keyPrefix: prefix }), new RedisStore({ url, keyPrefix: prefix })] as const;

afterAll(async () => {
  await Promise.all(stores.map((store) => store.close()));
  const keys = await client.keys(`${prefix}*`);
  if (keys.length > 0) await client.del(...keys);
  await client.quit();
});

const KEYS = ["/a.txt", "/b.txt", "/d/c.txt", "/d/e.txt", "/d/f/g.txt"];
/** Few letters, so short needles often match, and overwrites share and drop trigrams. */
const text = fc.string({ unit: fc.constantFrom("a", "b", "c", "\n", "é"), maxLength: 24 });
const needle = fc.string({ unit: fc.constantFrom("a", "b", "c", "é"), minLength: 1, maxLength: 5 });

type Op =
  | { kind: "put"; key: string; text: string }
  | { kind: "putMany"; entries: Array<[string, string]> }
  | { kind: "binary"; key: string }
  | { kind: "delete"; key: string }
  | { kind: "deleteTree"; dir: string }
  | { kind: "move"; from: string; to: string }
  /** Forgets the index, as if every record had been written before it existed. */
  | { kind: "forget" };

const key = fc.constantFrom(...KEYS);
const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant("put" as const), key, text }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("putMany" as const), entries: fc.array(fc.tuple(key, text), { minLength: 1, maxLength: 3 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("binary" as const), key }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("delete" as const), key }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("deleteTree" as const), dir: fc.constantFrom("/d", "/d/f", "/") }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("move" as const), from: key, to: key }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("forget" as const) }) },
);

async function apply(store: RedisStore, ns: Namespace, o: Op): Promise<void> {
  switch (o.kind) {
    case "put":
      await store.put(ns, o.key, fileDataFromText(o.text));
      return;
    case "putMany":
      await store.putMany(ns, o.entries.map(([k, t]) => [k, fileDataFromText(t)] as const));
      return;
    case "binary": {
      const binary: FileData = { content: Buffer.from("abcabc").toString("base64"), encoding: "base64", created_at: "", modified_at: "" };
      await store.put(ns, o.key, binary);
      return;
    }
    case "delete":
      await store.delete(ns, o.key);
      return;
    case "deleteTree":
      await store.deleteTree(ns, o.dir);
      return;
    case "move": {
      // As StoreBackend moves a file: write the destination, then delete the source.
      const item = await store.get(ns, o.from);
      if (!item || o.from === o.to) return;
      await store.put(ns, o.to, item.value);
      await store.delete(ns, o.from);
      return;
    }
    case "forget": {
      // The whole index at once, as a lost index would be (listing then deleting from here could leave half of one).
      const base = `${prefix}{${JSON.stringify(ns)}}:`;
      await client.eval(
        `for _, k in ipairs(redis.call("KEYS", ARGV[1] .. "*")) do
           if string.sub(k, 1, #ARGV[2]) == ARGV[2] then
             local rest = string.sub(k, #ARGV[2] + 1)
             if rest == "x" or rest == "xc" or rest == "ti" or rest == "tk" or rest == "tn" or rest == "tf" or rest == "tb" or rest == "tc" or rest == "tq" or string.match(rest, "^t:%d+$") then redis.call("DEL", k) end
           end
         end`,
        0,
        prefix,
        base,
      );
      return;
    }
  }
}

/** What a search must find: every text record under the prefix whose content holds the needle. */
async function scan(store: RedisStore, ns: Namespace, needle: string, under: string): Promise<string[]> {
  const found: string[] = [];
  for (const { key } of (await store.list(ns, { prefix: under })).items) {
    const item = await store.get(ns, key);
    if (item && (item.value as { encoding?: string }).encoding !== "base64" && typeof item.value.content === "string" && item.value.content.includes(needle)) {
      found.push(key);
    }
  }
  return found;
}

async function searched(store: RedisStore, ns: Namespace, needle: string, under: string): Promise<string[]> {
  const found: string[] = [];
  for await (const item of store.search(ns, needle, under)) found.push(item.key);
  return found;
}

async function agrees(store: RedisStore, ns: Namespace, needles: string[]): Promise<void> {
  for (const n of needles) {
    for (const under of ["/", "/d/"]) expect(await searched(store, ns, n, under)).toEqual(await scan(store, ns, n, under));
  }
}

describe("RedisStore: the trigram index agrees with a plain scan", () => {
  it("after any sequence of writes, overwrites, deletes, moves and index losses (one writer)", async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { maxLength: 25 }), fc.array(needle, { minLength: 1, maxLength: 4 }), async (ops, needles) => {
        const ns = ["one", String(run++)];
        try {
          for (const o of ops) await apply(stores[0], ns, o);
          await agrees(stores[0], ns, needles);
        } finally {
          await stores[0].deleteTree(ns, "/");
        }
      }),
      { numRuns: 60 },
    );
  }, 120_000);

  it("with two writers on separate connections and a search building the index among them", async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { maxLength: 15 }), fc.array(op, { maxLength: 15 }), fc.array(needle, { minLength: 1, maxLength: 3 }), async (left, right, needles) => {
        const ns = ["two", String(run++)];
        try {
          // Records from before the index, then both writers at once while a third party searches (and so builds).
          await stores[0].putMany(ns, KEYS.map((k, i) => [k, fileDataFromText(`abc${i}\ncab`)] as const));
          await apply(stores[0], ns, { kind: "forget" });
          const searching = (async () => {
            for (const n of needles) await searched(stores[1], ns, n, "/");
          })();
          await Promise.all([
            (async () => {
              for (const o of left) await apply(stores[0], ns, o).catch(() => undefined);
            })(),
            (async () => {
              for (const o of right) await apply(stores[1], ns, o).catch(() => undefined);
            })(),
            searching,
          ]);
          await agrees(stores[1], ns, [...needles, "abc", "cab"]);
        } finally {
          await stores[0].deleteTree(ns, "/");
        }
      }),
      { numRuns: 30 },
    );
  }, 120_000);

  it("keeps matches while a trigram's ids turn from a set into a bitmap and back (over 512 records)", async () => {
    const ns = ["dense"];
    try {
      const entries = Array.from({ length: 530 }, (_, i) => [`/f/${String(i).padStart(3, "0")}.txt`, fileDataFromText(`common ${i % 7 === 0 ? "seventh" : "other"} ${i}\n`)] as const);
      await stores[0].putMany(ns, entries);
      for (const n of ["common", "seventh", "other 52", "n 5"]) expect(await searched(stores[0], ns, n, "/")).toEqual(await scan(stores[0], ns, n, "/"));
      // Down through the threshold (530 -> 500 holders of "common"), with overwrites that drop and regain it.
      for (let i = 0; i < 30; i++) await stores[1].delete(ns, entries[i * 3]![0]);
      for (let i = 1; i < 40; i += 3) await stores[0].put(ns, entries[i]![0], fileDataFromText(`rare ${i}\n`));
      for (const n of ["common", "seventh", "rare", "other 52", "n 5"]) expect(await searched(stores[0], ns, n, "/")).toEqual(await scan(stores[0], ns, n, "/"));
      for (let i = 1; i < 40; i += 3) await stores[1].put(ns, entries[i]![0], entries[i]![1]);
      for (const n of ["common", "seventh", "rare", "other 5"]) expect(await searched(stores[0], ns, n, "/f/")).toEqual(await scan(stores[0], ns, n, "/f/"));
    } finally {
      await stores[0].deleteTree(ns, "/");
    }
  }, 60_000);

  it("finds text too large to index, skips binary records, and leaves no index keys once a namespace is emptied", async () => {
    const ns = ["large"];
    const big = `${"x".repeat(200 * 1024)}needle\n`;
    await stores[0].put(ns, "/big.txt", fileDataFromText(big));
    await stores[0].put(ns, "/small.txt", fileDataFromText("a needle here\n"));
    await stores[0].put(ns, "/bin", { content: Buffer.from("needle").toString("base64"), encoding: "base64", created_at: "", modified_at: "" });
    expect(await searched(stores[0], ns, "needle", "/")).toEqual(["/big.txt", "/small.txt"]);
    expect(await searched(stores[0], ns, "here", "/")).toEqual(["/small.txt"]);
    // The large text shrinks into the index, then grows out of it again.
    await stores[0].put(ns, "/big.txt", fileDataFromText("now small, no match"));
    expect(await searched(stores[0], ns, "needle", "/")).toEqual(["/small.txt"]);
    await stores[0].put(ns, "/big.txt", fileDataFromText(big));
    expect(await searched(stores[0], ns, "needle", "/")).toEqual(["/big.txt", "/small.txt"]);
    await stores[0].deleteTree(ns, "/");
    const base = `${prefix}{${JSON.stringify(ns)}}:`;
    expect((await client.keys(`${prefix}*`)).filter((k) => k.startsWith(base)).map((k) => k.slice(base.length))).toEqual(["seq"]);
  });
});
