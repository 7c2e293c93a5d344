/**
 * Behaviour every Store written here shares, run over MemoryStore,
 * SqliteStore (a temp file) and the LangGraph adapter (a real InMemoryStore):
 * namespace isolation, compare-and-set, v1 records, paging, search
 * candidates, bad input and closed stores, through the store and through
 * StoreBackend.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InMemoryStore } from "@langchain/langgraph-checkpoint";
import { StoreBackend as DeepagentsStoreBackend } from "deepagents";
import { afterAll, afterEach, beforeEach, describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { StoreBackend, storeBackendFactory } from "../backends/store.js";
import { isStrataError, type ErrorCode } from "../core/errors.js";
import { fileDataFromBytes, fileDataFromText } from "../core/filedata.js";
import { BackendRuntime } from "../core/protocol.js";
import { toSeedProtocol } from "../core/seed.js";
import type { FileData, FileDataV1, FileDataV2, FileInfo } from "../core/types.js";
import { LangGraphStore } from "../stores/langgraph.js";
import { MemoryStore } from "../stores/memory.js";
import { SqliteStore } from "../stores/sqlite.js";
import { prefixEnd, type Namespace, type Store } from "../stores/store.js";

const dir = mkdtempSync(join(tmpdir(), "strata-store-"));
let databases = 0;
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const engines: ReadonlyArray<{ name: string; create: (maxValueSize?: number) => Store; colonsInNamespaces: boolean }> = [
  { name: "MemoryStore", create: (maxValueSize) => new MemoryStore({ maxValueSize }), colonsInNamespaces: true },
  {
    name: "SqliteStore",
    create: (maxValueSize) => new SqliteStore({ path: join(dir, `${++databases}.db`), maxValueSize }),
    colonsInNamespaces: true,
  },
  // LangGraph itself rejects '.' and ':' in namespace labels.
  { name: "LangGraphStore", create: (maxValueSize) => new LangGraphStore({ store: new InMemoryStore(), maxValueSize }), colonsInNamespaces: false },
];

const text = (content: string) => fileDataFromText(content);
const v1 = (lines: string[]): FileDataV1 => ({ content: lines, created_at: "2024-01-01T00:00:00.000Z", modified_at: "2024-01-02T00:00:00.000Z" });

async function rejection(promise: Promise<unknown>): Promise<ErrorCode | undefined> {
  try {
    await promise;
    return undefined;
  } catch (error) {
    if (isStrataError(error)) return error.code;
    throw error;
  }
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

for (const engine of engines) {
  describe(`${engine.name}`, () => {
    let store: Store;
    beforeEach(() => {
      store = engine.create();
    });
    afterEach(async () => {
      await store.close();
    });

    it("never lets a namespace see a sibling's keys", async () => {
      const siblings: Namespace[] = [["a", "b"], ["ab"], ["a", "b", "c"], ["b"]];
      if (engine.colonsInNamespaces) siblings.push(["a:b"], ['a","b'], ["a/b"]);
      await store.put(["a"], "/own/file.txt", text("mine needle"));
      for (const ns of siblings) {
        await store.put(ns, "/own/other.txt", text("theirs needle"));
        await store.put(ns, "/theirs/file.txt", text("theirs needle"));
      }
      const backend = new StoreBackend({ store, namespace: ["a"] });
      const seed = toSeedProtocol(backend);
      expect(await seed.lsInfo("/")).toEqual([{ path: "/own/", is_dir: true }]);
      expect((await seed.lsInfo("/own")).map((f) => f.path)).toEqual(["/own/file.txt"]);
      expect((await seed.globInfo("**/*.txt")).map((f) => f.path)).toEqual(["/own/file.txt"]);
      expect((await seed.grep("needle")).matches).toEqual([{ path: "/own/file.txt", line: 1, text: "mine needle" }]);
      expect((await store.list(["a"])).items.map((k) => k.key)).toEqual(["/own/file.txt"]);
      expect((await collect(store.search!(["a"], "needle", "/"))).map((i) => i.key)).toEqual(["/own/file.txt"]);
      expect(await store.get(["a"], "/theirs/file.txt")).toBeUndefined();
      expect((await seed.delete("/own")).error).toBeUndefined();
      for (const ns of siblings) expect((await store.list(ns)).items).toHaveLength(2);
      expect(await store.delete(["a"], "/theirs/file.txt")).toBe(false);
      expect(await store.deleteTree(["a"], "/theirs")).toEqual([]);
      for (const ns of siblings) expect((await store.list(ns)).items).toHaveLength(2);
    });

    it("compares and sets: create-only, stale versions, and no version reuse after delete", async () => {
      const ns = ["cas"];
      const first = await store.put(ns, "/f.txt", text("one"), { expectedVersion: null });
      expect(await rejection(store.put(ns, "/f.txt", text("two"), { expectedVersion: null }))).toBe("conflict");
      const second = await store.put(ns, "/f.txt", text("two"), { expectedVersion: first });
      expect(second).toBeGreaterThan(first);
      expect(await rejection(store.put(ns, "/f.txt", text("three"), { expectedVersion: first }))).toBe("conflict");
      expect(await rejection(store.delete(ns, "/f.txt", { expectedVersion: first }))).toBe("conflict");
      expect(await rejection(store.put(ns, "/new.txt", text("x"), { expectedVersion: 1 }))).toBe("conflict");
      expect((await store.get(ns, "/f.txt"))?.value).toMatchObject({ content: "two" });
      expect(await store.delete(ns, "/f.txt", { expectedVersion: second })).toBe(true);
      const recreated = await store.put(ns, "/f.txt", text("again"), { expectedVersion: null });
      expect(recreated).toBeGreaterThan(second);
      const many = await store.putMany(ns, [["/m1", text("1")], ["/m2", text("2")], ["/m1", text("3")]]);
      expect(many[0]).toBeGreaterThan(recreated);
      expect(many[2]).toBeGreaterThan(many[0]!);
      expect(await store.get(ns, "/m1")).toMatchObject({ version: many[2], value: { content: "3" } });
    });

    it("create-only writes race to exactly one winner; concurrent edits all land", async () => {
      const backend = new StoreBackend({ store, namespace: ["race"] });
      const seed = toSeedProtocol(backend);
      const writes = await Promise.all(Array.from({ length: 8 }, (_, i) => seed.write("/new.txt", `writer ${i}`)));
      expect(writes.filter((w) => !w.error)).toHaveLength(1);
      expect(writes.filter((w) => w.code === "already_exists")).toHaveLength(7);

      await seed.write("/shared.txt", Array.from({ length: 12 }, (_, i) => `line ${i}: old`).join("\n"));
      const edits = await Promise.all(Array.from({ length: 12 }, (_, i) => seed.edit("/shared.txt", `line ${i}: old`, `line ${i}: new`)));
      expect(edits.map((e) => e.error)).toEqual(Array(12).fill(undefined));
      const final = await seed.readRaw("/shared.txt");
      expect(final.content).toBe(Array.from({ length: 12 }, (_, i) => `line ${i}: new`).join("\n"));
    });

    it("reads v1 records written by older writers and migrates them on the next write", async () => {
      const ns = ["legacy"];
      const old = v1(["first line", "needle here", "", "last"]);
      await store.put(ns, "/old.txt", old);
      await store.put(ns, "/other.txt", v1(["a", "b"]));
      expect((await store.get(ns, "/old.txt"))?.value).toEqual(old);
      const backend = new StoreBackend({ store, namespace: ns });
      const seed = toSeedProtocol(backend);
      expect(await seed.read("/old.txt")).toBe("     1\tfirst line\n     2\tneedle here\n     3\t\n     4\tlast");
      expect((await seed.grep("needle")).matches).toEqual([{ path: "/old.txt", line: 2, text: "needle here" }]);
      expect(await seed.lsInfo("/old.txt")).toEqual([{ path: "/old.txt", is_dir: false, size: 28, modified_at: old.modified_at }]);
      expect(await seed.readRaw("/old.txt")).toEqual({ ...old, content: "first line\nneedle here\n\nlast", encoding: "utf-8" });

      expect((await seed.edit("/old.txt", "needle here", "needle moved")).occurrences).toBe(1);
      const migrated = (await store.get(ns, "/old.txt"))!.value;
      expect(migrated).toMatchObject({ content: "first line\nneedle moved\n\nlast", encoding: "utf-8", created_at: old.created_at });
      expect(migrated.modified_at > old.modified_at).toBe(true);
      expect((await seed.write("/other.txt", "replaced", { overwrite: true })).error).toBeUndefined();
      expect((await store.get(ns, "/other.txt"))!.value).toMatchObject({ content: "replaced", encoding: "utf-8" });
    });

    it("pages list() in key order, by prefix, resuming after a key", async () => {
      const ns = ["paging"];
      const keys = Array.from({ length: 25 }, (_, i) => `/dir/k${String(i).padStart(2, "0")}`);
      await store.putMany(ns, keys.map((k) => [k, text(k)] as const));
      await store.put(ns, "/dirx", text("not under /dir/"));
      await store.put(ns, "/dir", text("the prefix itself"));
      const seen: string[] = [];
      let after: string | undefined;
      let pages = 0;
      do {
        const page = await store.list(ns, { prefix: "/dir/", limit: 10, after });
        expect(page.items.length).toBeLessThanOrEqual(10);
        seen.push(...page.items.map((k) => k.key));
        after = page.next;
        pages++;
      } while (after !== undefined);
      expect(seen).toEqual(keys);
      expect(pages).toBe(3);
      expect((await store.list(ns, { prefix: "/dir" })).items.map((k) => k.key)).toEqual(["/dir", ...keys, "/dirx"]);
      expect((await store.list(ns, { after: "/dir/k23" })).items.map((k) => k.key)).toEqual(["/dir/k24", "/dirx"]);
      expect((await store.list(ns, { prefix: "/dir/", after: "/a" })).items).toHaveLength(25);
      expect((await store.list(["empty"])).items).toEqual([]);
      const item = (await store.list(ns, { prefix: "/dir/k00" })).items[0]!;
      expect(item).toMatchObject({ key: "/dir/k00", size: 8 });
      expect(typeof item.version).toBe("number");
    });

    it("lists a directory's files and child directories only", async () => {
      const ns = ["tree"];
      await store.putMany(ns, [
        ["/d/a.txt", text("a")],
        ["/d/sub/b.txt", text("bb")],
        ["/d/sub/deeper/c.txt", text("c")],
        ["/d/sub2/x", text("x")],
        ["/d.txt", text("not in d")],
        ["/dz/y", text("not in d")],
      ]);
      const listing = await store.listDirectory(ns, "/d");
      expect(listing.files.map((f) => f.key)).toEqual(["/d/a.txt"]);
      expect([...listing.dirs].sort()).toEqual(["sub", "sub2"]);
      expect([...(await store.listDirectory(ns, "/")).dirs].sort()).toEqual(["d", "dz"]);
      expect(await store.deleteTree(ns, "/d/sub")).toEqual(expect.arrayContaining(["/d/sub/b.txt", "/d/sub/deeper/c.txt"]));
      expect((await store.listDirectory(ns, "/d")).dirs).toEqual(["sub2"]);
      expect(await store.delete(ns, "/d/sub2/x")).toBe(true);
      expect((await store.listDirectory(ns, "/d")).dirs).toEqual([]);
      expect(await store.listDirectory(ns, "/nowhere")).toEqual({ files: [], dirs: [] });
    });

    it("search yields every record containing the substring, never binary ones", async () => {
      const ns = ["search"];
      const corpus: Record<string, string> = {
        "/s/quote.txt": 'say "hi" AND NEAR(x) col:umn -minus ^caret *star',
        "/s/case.txt": "Needle NEEDLE",
        "/s/lower.txt": "needle",
        "/s/unicode.txt": "emoji 🚀 and ünïcødé",
        "/s/short.txt": "ab",
        "/s/crlf.txt": "one\r\ntwo\r\n",
        "/t/outside.txt": "needle",
      };
      for (const [key, content] of Object.entries(corpus)) await store.put(ns, key, text(content));
      await store.put(ns, "/s/bin.dat", fileDataFromBytes(Uint8Array.from([0, 1, 2, 110, 101, 101, 100, 108, 101])));
      await store.put(ns, "/s/v1.txt", v1(["old needle"]));
      for (const pattern of ['"hi"', '"', "AND", "NEAR(x)", "col:umn", "-minus", "^caret", "*star", "needle", "Needle", "🚀", "ünï", "b", "ab", "e", "o\r", "q"]) {
        const found = (await collect(store.search!(ns, pattern, "/s/"))).map((i) => i.key);
        const expected = Object.entries(corpus)
          .filter(([key, content]) => key.startsWith("/s/") && content.includes(pattern))
          .map(([key]) => key);
        if ("old needle".includes(pattern)) expected.push("/s/v1.txt");
        for (const key of expected) expect(found, `pattern ${JSON.stringify(pattern)}`).toContain(key);
        expect(found).not.toContain("/s/bin.dat");
        expect(found).not.toContain("/t/outside.txt");
      }
    });

    it("rejects bad input with typed errors and stores nothing", async () => {
      for (const ns of [[], [""], ["a\0b"], ["ok", ""]] as Namespace[]) {
        expect(await rejection(store.put(ns, "/f", text("x")))).toBe("invalid_argument");
        expect(await rejection(store.get(ns, "/f"))).toBe("invalid_argument");
        expect(() => new StoreBackend({ store, namespace: ns })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
      }
      expect(await rejection(store.put("nope" as unknown as Namespace, "/f", text("x")))).toBe("invalid_argument");
      for (const key of ["/a\0b", "relative", "/a/../b", "/trailing/", "//double", ""]) {
        expect(await rejection(store.put(["ns"], key, text("x"))), key).toBe("invalid_path");
        expect(await rejection(store.get(["ns"], key)), key).toBe("invalid_path");
      }
      expect(await rejection(store.put(["ns"], "/f", { content: 42 } as unknown as FileData))).toBe("invalid_argument");
      expect(await rejection(store.putMany(["ns"], [["/ok", text("fine")], ["/bad\0", text("x")]]))).toBe("invalid_path");
      expect(await rejection(store.putMany(["ns"], [["/ok", text("fine")], ["/bad", { content: "x" } as unknown as FileData]]))).toBe("invalid_argument");
      expect((await store.list(["ns"])).items).toEqual([]);

      const backend = new StoreBackend({ store, namespace: ["ns"], maxFileSize: 10 });

      const seed = toSeedProtocol(backend);
      expect(await seed.write("/a\0b", "x")).toMatchObject({ code: "invalid_path" });
      expect(await seed.write("/big.txt", "x".repeat(11))).toMatchObject({ code: "too_large" });
      expect(await seed.uploadFiles([["/big.bin", new Uint8Array(11)]])).toEqual([{ path: "/big.bin", error: "permission_denied" }]);
      expect((await seed.write("/small.txt", "0123456789")).error).toBeUndefined();
      expect(await seed.edit("/small.txt", "9", "99")).toMatchObject({ code: "too_large" });
      expect((await seed.readRaw("/small.txt")).content).toBe("0123456789");
      expect((await store.list(["ns"])).items.map((k) => k.key)).toEqual(["/small.txt"]);

      const dynamic = toSeedProtocol(new StoreBackend({ store, namespace: () => [""] }));
      expect(await dynamic.write("/f", "x")).toMatchObject({ code: "invalid_argument" });
      expect(await rejection(dynamic.lsInfo("/"))).toBe("invalid_argument");
    });

    it("refuses values over maxValueSize with too_large, storing nothing", async () => {
      const limited = engine.create(8);
      try {
        expect(await rejection(limited.put(["ns"], "/f", text("123456789")))).toBe("too_large");
        expect(await rejection(limited.putMany(["ns"], [["/ok", text("ok")], ["/big", text("123456789")]]))).toBe("too_large");
        expect((await limited.list(["ns"])).items).toEqual([]);
        await limited.put(["ns"], "/f", text("12345678"));
        const backend = new StoreBackend({ store: limited, namespace: ["ns"] });
        const seed = toSeedProtocol(backend);
        expect(await seed.write("/g", "too long for it")).toMatchObject({ code: "too_large" });
        // The store refuses the batch; the backend then answers file by file.
        expect(await seed.uploadFiles([["/h", new Uint8Array(9)], ["/i", new Uint8Array(1)]])).toEqual([
          { path: "/h", error: "permission_denied" },
          { path: "/i", error: null },
        ]);
        expect((await limited.list(["ns"])).items.map((k) => k.key)).toEqual(["/f", "/i"]);
      } finally {
        await limited.close();
      }
    });

    it("fails clearly once closed", async () => {
      const backend = new StoreBackend({ store, namespace: ["closing"] });
      const seed = toSeedProtocol(backend);
      await seed.write("/f.txt", "x");
      await store.close();
      expect(await rejection(store.get(["closing"], "/f.txt"))).toBe("unavailable");
      expect(await rejection(store.put(["closing"], "/f.txt", text("y")))).toBe("unavailable");
      expect(await rejection(store.list(["closing"]))).toBe("unavailable");
      expect(await rejection(collect(store.search!(["closing"], "x", "/")))).toBe("unavailable");
      expect(await seed.write("/g.txt", "y")).toMatchObject({ code: "unavailable", error: "The store is closed" });
      expect(await seed.read("/f.txt")).toBe("Error: The store is closed");
      expect(await rejection(seed.lsInfo("/"))).toBe("unavailable");
    });

    it("resolves the namespace per call from the runtime (per user, per thread)", async () => {
      const factory = storeBackendFactory({ store, namespace: (runtime) => ["users", String(runtime.config.userId)] });
      const alice = toSeedProtocol(factory(new BackendRuntime({}, { userId: "alice" })));
      const bob = toSeedProtocol(factory(new BackendRuntime({}, { userId: "bob" })));
      await alice.write("/notes.md", "alice's");
      await bob.write("/notes.md", "bob's");
      expect((await alice.readRaw("/notes.md")).content).toBe("alice's");
      expect((await bob.readRaw("/notes.md")).content).toBe("bob's");
      expect((await store.get(["users", "alice"], "/notes.md"))?.value).toMatchObject({ content: "alice's" });
      const runtime = new BackendRuntime({ thread: "t1" });
      const perThread = toSeedProtocol(new StoreBackend({ store, runtime, namespace: (rt) => ["threads", rt.getState<string>("thread")] }));
      await perThread.write("/a.txt", "in t1");
      runtime.setState("thread", "t2");
      expect(await perThread.lsInfo("/")).toEqual([]);
    });

    it("uploads a batch like StateBackend does, file by file, in one putMany", async () => {
      const batch: Array<[string, Uint8Array]> = [
        ["/a", new TextEncoder().encode("file a")],
        ["/a/b", new Uint8Array([1])],
        ["/x/y", new Uint8Array([0, 255])],
        ["/x", new Uint8Array([2])],
        ["/x/y", new Uint8Array([3])],
        ["bad\0", new Uint8Array([4])],
        ["/ok/../no", new Uint8Array([5])],
      ];
      const backend = new StoreBackend({ store, namespace: ["upload"] });
      const seed = toSeedProtocol(backend);
      const reference = toSeedProtocol(new StateBackend());
      await seed.write("/existing", "text");
      await reference.write("/existing", "text");
      batch.push(["/existing/child", new Uint8Array([6])]);
      expect(await seed.uploadFiles(batch)).toEqual(await reference.uploadFiles(batch));
      const shape = (infos: FileInfo[]) => infos.map(({ modified_at: _, ...info }) => info);
      expect(shape(await seed.lsInfo("/"))).toEqual(shape(await reference.lsInfo("/")));
      const paths = ["/a", "/x/y", "/a/b", "/x"];
      expect(await seed.downloadFiles(paths)).toEqual(await reference.downloadFiles(paths));
    });

    it("keeps the text of files with NUL bytes but never greps them", async () => {
      const backend = new StoreBackend({ store, namespace: ["nul"] });
      const seed = toSeedProtocol(backend);
      await seed.write("/nul.txt", "needle\0needle");
      // Text holding a NUL is binary, as the contract says: it comes back as the same bytes.
      const raw = (await seed.readRaw("/nul.txt")) as FileDataV2;
      expect(raw.encoding).toBe("base64");
      expect(Buffer.from(raw.content, "base64").toString()).toBe("needle\0needle");
      expect((await seed.grep("needle")).matches).toEqual([]);
    });
  });
}

describe("LangGraphStore with deepagents", () => {
  it("reads and edits files the deepagents StoreBackend wrote, and deepagents reads ours", async () => {
    const langgraph = new InMemoryStore();
    const theirs = new DeepagentsStoreBackend({ store: langgraph, namespace: ["team", "filesystem"] });
    await theirs.write("/from-deepagents.md", "# Title\nbody\n");
    const ours = toSeedProtocol(new StoreBackend({ store: new LangGraphStore({ store: langgraph }), namespace: ["team", "filesystem"] }));
    expect(await ours.read("/from-deepagents.md")).toBe("     1\t# Title\n     2\tbody");
    expect((await ours.edit("/from-deepagents.md", "body", "edited body")).error).toBeUndefined();
    expect(await ours.write("/from-strata.md", "hello\nworld")).toMatchObject({ path: "/from-strata.md" });
    expect(await ours.lsInfo("/")).toEqual([
      expect.objectContaining({ path: "/from-deepagents.md", is_dir: false }),
      expect.objectContaining({ path: "/from-strata.md", is_dir: false }),
    ]);
    const read = await theirs.read("/from-strata.md");
    expect(read).toMatchObject({ content: "hello\nworld" });
    expect(await theirs.read("/from-deepagents.md")).toMatchObject({ content: "# Title\nedited body\n" });
  });

  it("reads deepagents' binary records (bytes) as base64", async () => {
    const langgraph = new InMemoryStore();
    const now = new Date().toISOString();
    await langgraph.put(["fs"], "/img.png", { content: new Uint8Array([137, 80, 78, 71, 0]), mimeType: "image/png", created_at: now, modified_at: now });
    const adapter = new LangGraphStore({ store: langgraph });
    expect(adapter.client).toBe(langgraph);
    const ours = toSeedProtocol(new StoreBackend({ store: adapter, namespace: ["fs"] }));
    expect(await ours.downloadFiles(["/img.png"])).toEqual([{ path: "/img.png", content: new Uint8Array([137, 80, 78, 71, 0]), error: null }]);
    expect(await ours.read("/img.png")).toMatch(/^Error: .*binary file \(5 bytes\)/);
  });

  it("maps LangGraph's own namespace rules to invalid_argument", async () => {
    const store = new LangGraphStore({ store: new InMemoryStore() });
    expect(await rejection(store.put(["has.dot"], "/f", text("x")))).toBe("invalid_argument");
  });
});

describe("prefixEnd", () => {
  it("bounds every string with the prefix, in code-point order", () => {
    expect(prefixEnd("/a/")).toBe("/a0");
    expect(prefixEnd("/")).toBe("0");
    expect(prefixEnd("a\uffff")).toBe("a\u{10000}");
    expect(prefixEnd("a\u{10ffff}")).toBe("b");
    expect(prefixEnd("\ud7ff")).toBe("\ue000");
    expect(prefixEnd("\u{10ffff}")).toBeUndefined();
  });
});

describe("StoreBackend's in-process fast path (MemoryStore)", () => {
  it("answers a plain create and read exactly as the generic route does", async () => {
    const store = new MemoryStore();
    const fast = new StoreBackend({ store, namespace: ["fast"] });
    // A namespace function turns the fast path off: the same calls go the generic route.
    const generic = new StoreBackend({ store, namespace: () => ["generic"] });
    for (const backend of [fast, generic]) {
      expect(await backend.write("notes//a.txt", "one")).toEqual({ path: "/notes/a.txt", filesUpdate: null });
      const read = await backend.readRaw("/notes/a.txt");
      expect(read).toMatchObject({ path: "/notes/a.txt", data: { content: "one", encoding: "utf-8" } });
      expect((await backend.write("/notes/a.txt", "two")).error?.code).toBe("already_exists");
      expect((await backend.write("/notes", "x")).error?.code).toBe("is_directory");
      expect((await backend.write("/notes/a.txt/b", "x")).error?.code).toBe("not_a_directory");
      expect((await backend.write("/.strata-tmp-x", "x")).error?.code).toBe("invalid_path");
      expect((await backend.readRaw("/notes")).error?.code).toBe("is_directory");
      expect((await backend.readRaw("/missing")).error?.code).toBe("file_not_found");
      expect((await backend.write("/notes/a.txt", "three", { overwrite: true })).error).toBeUndefined();
      // What a caller holds is a copy: changing it changes nothing stored.
      const held = await backend.readRaw("/notes/a.txt");
      if (held.error) throw new Error(held.error.message);
      (held.data as FileDataV2).content = "changed";
      expect(await backend.readRaw("/notes/a.txt")).toMatchObject({ data: { content: "three" } });
      // A path that is not normal is answered at its normal form, whichever route takes it.
      for (const path of ["/notes//a.txt", "notes/a.txt", "/notes/./a.txt", "/notes/a.txt/"]) {
        expect(await backend.readRaw(path)).toMatchObject({ path: "/notes/a.txt", data: { content: "three" } });
        expect(await toSeedProtocol(backend).readRaw(path)).toMatchObject({ content: "three" });
      }
      expect((await backend.readRaw("/notes/../a.txt")).error?.code).toBe("invalid_path");
    }
  });

  it("keeps putFile's tree check after unchecked puts made a path a file and a directory at once", async () => {
    for (const order of [["/a", "/a/b/y"], ["/a/b/y", "/a"]]) {
      const store = new MemoryStore();
      const ns = ["mixed"];
      for (const key of order) await store.put(ns, key, text(key));
      expect(() => store.putFileSync(ns, "/a/b/z", text("z"))).toThrow(expect.objectContaining({ code: "not_a_directory" }));
      await expect(store.putFile(ns, "/a/c", text("c"))).rejects.toMatchObject({ code: "not_a_directory" });
    }
    const store = new MemoryStore();
    const ns = ["plain"];
    await store.putFile(ns, "/d/e/f", text("f"));
    expect(() => store.putFileSync(ns, "/d/e/f/g", text("g"))).toThrow(expect.objectContaining({ code: "not_a_directory" }));
    expect(() => store.putFileSync(ns, "/d/e", text("e"))).toThrow(expect.objectContaining({ code: "is_directory" }));
    store.putFileSync(ns, "/d/e/h", text("h"));
    expect(store.getSync(ns, "/d/e/h")?.value.content).toBe("h");
  });

  it("the seed adapter's write honours a subclass's own write", async () => {
    const seen: string[] = [];
    class Logged extends StoreBackend {
      override write(path: unknown, content: unknown, options?: unknown) {
        seen.push(String(path));
        return super.write(path, content, options);
      }
    }
    const backend = new Logged({ store: new MemoryStore(), namespace: ["logged"] });
    expect(await toSeedProtocol(backend).write("/x.txt", "x")).toEqual({ path: "/x.txt", filesUpdate: null });
    expect(seen).toEqual(["/x.txt"]);
    expect(await toSeedProtocol(new StoreBackend({ store: new MemoryStore() })).write("y.txt", "y")).toEqual({ path: "/y.txt", filesUpdate: null });
  });

  it("copies a record in and out whatever its shape: extra fields, their order, nested values", async () => {
    const store = new MemoryStore();
    const ns = ["shapes"];
    const stamps = { created_at: "2024-01-01T00:00:00.000Z", modified_at: "2024-01-02T00:00:00.000Z" };
    const plain: FileDataV2 = { content: "a", encoding: "utf-8", ...stamps };
    const reordered = { encoding: "utf-8", content: "b", ...stamps } as FileDataV2;
    const extra = { content: "c", encoding: "utf-8", ...stamps, mimeType: "text/plain" } as FileDataV2;
    const nested = { content: "d", encoding: "utf-8", ...stamps, meta: { tag: "x" } } as unknown as FileDataV2;
    const legacy: FileDataV1 = { content: ["e", "f"], ...stamps };
    const records: Array<[string, FileData]> = [["/plain", plain], ["/reordered", reordered], ["/extra", extra], ["/nested", nested], ["/legacy", legacy]];
    for (const [key, value] of records) store.putFileSync(ns, key, value);
    for (const [key, value] of records) {
      const got = store.getSync(ns, key)!.value;
      expect(got).toEqual(value);
      expect(Object.keys(got)).toEqual(Object.keys(value));
      expect(got).not.toBe(value);
      // Changing what was put or what was got changes nothing stored.
      (got as { content: unknown }).content = "changed";
      expect((await store.get(ns, key))!.value).toEqual(value);
    }
    (plain as { content: string }).content = "changed";
    (nested as unknown as { meta: { tag: string } }).meta.tag = "changed";
    expect(store.getSync(ns, "/plain")!.value.content).toBe("a");
    expect((store.getSync(ns, "/nested")!.value as unknown as { meta: { tag: string } }).meta.tag).toBe("x");
    // A key the store does not hold is still checked.
    expect(() => store.getSync(ns, "/a//b")).toThrow(expect.objectContaining({ code: "invalid_path" }));
    expect(store.getSync(ns, "/missing")).toBeUndefined();
  });

  it("keeps a write's size limit and the store's quota", async () => {
    const backend = new StoreBackend({ store: new MemoryStore({ quota: { maxFiles: 1 } }), namespace: ["q"], maxFileSize: 4 });
    expect((await backend.write("/big", "12345")).error?.code).toBe("too_large");
    expect((await backend.write("/a", "1")).error).toBeUndefined();
    expect((await backend.write("/b", "1")).error?.code).toBe("quota_exceeded");
  });

  it("lists keys in order after writes in any order, deletes and rewrites", async () => {
    const store = new MemoryStore();
    const ns = ["order"];
    const keys = Array.from({ length: 300 }, (_, i) => `/d${(i * 7919) % 13}/f${(i * 104729) % 300}`);
    for (const key of keys) await store.put(ns, key, text(key));
    await store.list(ns, { limit: 1 }); // merges the keys added so far
    for (const key of keys.slice(0, 100)) await store.delete(ns, key);
    for (const key of keys.slice(50, 80)) await store.put(ns, key, text("again"));
    await store.put(ns, "/a", text("first"));
    const expected = [...new Set([...keys.slice(50, 80), ...keys.slice(100), "/a"])].sort();
    const listed: string[] = [];
    let after: string | undefined;
    do {
      const page = await store.list(ns, { after, limit: 37 });
      listed.push(...page.items.map((item) => item.key));
      after = page.next;
    } while (after !== undefined);
    expect(listed).toEqual(expected);
    expect((await store.deleteTree(ns, "/d3")).sort()).toEqual(expected.filter((key) => key.startsWith("/d3/")));
  });
});
