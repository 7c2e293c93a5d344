/**
 * strata-workspace/conformance (stores) — the suite every Store runs, directly and
 * through a StoreBackend:
 *
 *   runStoreConformance({ name: "my store", create: (options) => new MyStore({ ...options }), destroy: (s) => s.close() });
 *
 * `create` may return a new store or a shared one (every test works in
 * namespaces of its own); it must honour `options.quota`. `destroy` runs
 * after each test, also on a store the test closed.
 * What it proves: compare-and-set; namespaces never see each other; a path
 * is never both a file and a directory, whatever writers race; create-only
 * writes have one winner; no acknowledged edit is lost; quotas hold under
 * concurrent writers; a closed store refuses every operation clearly.
 */
import { toSeedProtocol } from "../core/seed.js";
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { StoreBackend } from "../backends/store.js";
import { isStrataError, type ErrorCode } from "../core/errors.js";
import { fileDataFromText, fileDataText } from "../core/filedata.js";
import type { Quota } from "../core/limits.js";
import type { FileData } from "../core/types.js";
import type { Namespace, Store, StoredItem } from "../stores/store.js";

export interface StoreTarget<S extends Store = Store> {
  name: string;
  create: (options?: { quota?: Quota }) => Promise<S> | S;
  destroy?: (store: S) => Promise<void> | void;
  /** Rounds of the file/directory race (default 50). */
  raceRounds?: number;
}

const text = (content: string): FileData => fileDataFromText(content);

/** The code a store call fails with, or "ok". Shared with the engine suites in test/support. */
export async function codeOf(promise: Promise<unknown>): Promise<ErrorCode | "ok"> {
  try {
    await promise;
    return "ok";
  } catch (error) {
    if (isStrataError(error)) return error.code;
    throw error;
  }
}

export async function collect(items: AsyncIterable<StoredItem>): Promise<StoredItem[]> {
  const all: StoredItem[] = [];
  for await (const item of items) all.push(item);
  return all;
}

export async function allKeys(store: Store, ns: Namespace, prefix?: string): Promise<string[]> {
  const keys: string[] = [];
  let after: string | undefined;
  do {
    const page = await store.list(ns, { prefix, after, limit: 100 });
    keys.push(...page.items.map((item) => item.key));
    after = page.next;
  } while (after !== undefined);
  return keys;
}

export function runStoreConformance<S extends Store>(target: StoreTarget<S>): void {
  const rounds = target.raceRounds ?? 50;
  /** Runs `test` with a store of its own and cleans up every namespace it used. */
  const withStore = async (test: (store: S, fresh: () => Namespace) => Promise<void>, options?: { quota?: Quota }) => {
    const store = await target.create(options);
    const used: Namespace[] = [];
    const fresh = () => {
      const ns = [`conformance-${randomUUID()}`];
      used.push(ns);
      return ns;
    };
    try {
      await test(store, fresh);
    } finally {
      for (const ns of used) await store.deleteTree(ns, "/").catch(() => undefined);
      await target.destroy?.(store);
    }
  };

  describe(`store conformance: ${target.name}`, () => {
    describe("compare-and-set", () => {
      it("creates only when absent, updates only at the expected version, and never reuses a version", () =>
        withStore(async (store, fresh) => {
          const ns = fresh();
          const v1 = await store.put(ns, "/f.txt", text("one"), { expectedVersion: null });
          expect(await codeOf(store.put(ns, "/f.txt", text("again"), { expectedVersion: null }))).toBe("conflict");
          const v2 = await store.put(ns, "/f.txt", text("two"), { expectedVersion: v1 });
          expect(v2).toBeGreaterThan(v1);
          expect(await codeOf(store.put(ns, "/f.txt", text("stale"), { expectedVersion: v1 }))).toBe("conflict");
          expect(await codeOf(store.put(ns, "/missing.txt", text("x"), { expectedVersion: v2 }))).toBe("conflict");
          expect(await store.get(ns, "/missing.txt")).toBeUndefined();
          const current = await store.get(ns, "/f.txt");
          expect(current?.version).toBe(v2);
          expect(fileDataText(current!.value)).toBe("two");

          expect(await codeOf(store.delete(ns, "/f.txt", { expectedVersion: v1 }))).toBe("conflict");
          expect(await codeOf(store.delete(ns, "/f.txt", { expectedVersion: null }))).toBe("conflict");
          expect(await store.delete(ns, "/f.txt", { expectedVersion: v2 })).toBe(true);
          expect(await store.delete(ns, "/f.txt")).toBe(false);
          expect(await store.delete(ns, "/f.txt", { expectedVersion: null })).toBe(false);
          expect(await codeOf(store.delete(ns, "/f.txt", { expectedVersion: v2 }))).toBe("conflict");

          const v3 = await store.put(ns, "/f.txt", text("three"));
          expect(v3).toBeGreaterThan(v2);
          expect(await store.put(ns, "/f.txt", text("four"))).toBeGreaterThan(v3);
        }));
    });

    describe("namespaces", () => {
      it("never shows one namespace's keys in a sibling's (['a'] vs ['a','b'] vs ['ab'])", () =>
        withStore(async (store) => {
          const root = `conformance-${randomUUID()}`;
          const spaces: Namespace[] = [[root, "a"], [root, "a", "b"], [root, "ab"], [`${root}a`], [root]];
          try {
            for (const [i, ns] of spaces.entries()) await store.put(ns, `/only${i}/file.txt`, text(`needle ${i}`));
            for (const [i, ns] of spaces.entries()) {
              expect(await allKeys(store, ns)).toEqual([`/only${i}/file.txt`]);
              expect((await store.listDirectory(ns, "/")).dirs).toEqual([`only${i}`]);
              if (store.search) expect((await collect(store.search(ns, "needle", "/"))).map((item) => item.key)).toEqual([`/only${i}/file.txt`]);
            }
          } finally {
            for (const ns of spaces) await store.deleteTree(ns, "/");
          }
        }));
    });

    describe("a path is never both a file and a directory", () => {
      const neverBoth = async (store: Store, ns: Namespace) => {
        const file = await store.get(ns, "/a");
        const under = await store.get(ns, "/a/b");
        expect(file !== undefined && under !== undefined, "both /a and /a/b exist").toBe(false);
        expect(file !== undefined || under !== undefined, "neither write landed").toBe(true);
      };

      it(`through StoreBackend: ${rounds} rounds of concurrent write('/a') and write('/a/b')`, () =>
        withStore(async (store, fresh) => {
          for (let round = 0; round < rounds; round++) {
            const ns = fresh();
            const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
            const [a, ab] = await Promise.all([backend.write("/a", "file"), backend.write("/a/b", "under")]);
            expect([a.error, ab.error].filter((error) => error === undefined)).toHaveLength(1);
            expect([a.code, ab.code].filter(Boolean)[0]).toMatch(/^(is_directory|not_a_directory)$/);
            await neverBoth(store, ns);
          }
        }));

      it(`through StoreBackend: ${rounds} rounds of concurrent uploads of '/a' and '/a/b'`, () =>
        withStore(async (store, fresh) => {
          for (let round = 0; round < rounds; round++) {
            const ns = fresh();
            const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
            const [a, ab] = await Promise.all([backend.uploadFiles([["/a", new Uint8Array([1])]]), backend.uploadFiles([["/a/b", new Uint8Array([2])]])]);
            expect([a[0]!.error, ab[0]!.error].filter((error) => error === null)).toHaveLength(1);
            await neverBoth(store, ns);
          }
        }));

      it(`through the Store API: ${rounds} rounds of concurrent putFile('/a') and putFile('/a/b')`, () =>
        withStore(async (store, fresh) => {
          if (!store.putFile) return;
          for (let round = 0; round < rounds; round++) {
            const ns = fresh();
            const codes = await Promise.all([codeOf(store.putFile(ns, "/a", text("file"))), codeOf(store.putFile(ns, "/a/b", text("under")))]);
            expect(codes.filter((code) => code === "ok")).toHaveLength(1);
            expect(codes.filter((code) => code !== "ok")[0]).toMatch(/^(is_directory|not_a_directory)$/);
            await neverBoth(store, ns);
          }
        }));

      it("putFile and putFiles refuse a file over a directory or under a file, and a batch that is not a tree, storing nothing", () =>
        withStore(async (store, fresh) => {
          const ns = fresh();
          await store.put(ns, "/d/f", text("f"));
          if (store.putFile) {
            expect(await codeOf(store.putFile(ns, "/d", text("x")))).toBe("is_directory");
            expect(await codeOf(store.putFile(ns, "/d/f/g", text("x")))).toBe("not_a_directory");
            expect(await codeOf(store.putFile(ns, "/", text("x")))).toBe("is_directory");
          }
          if (store.putFiles) {
            expect(await codeOf(store.putFiles(ns, [["/ok", text("ok")], ["/d", text("x")]]))).toBe("is_directory");
            expect(await codeOf(store.putFiles(ns, [["/ok", text("ok")], ["/ok/under", text("x")]]))).toBe("not_a_directory");
            expect(await store.putFiles(ns, [["/e/1", text("1")], ["/e/2", text("2")]])).toHaveLength(2);
          }
          expect(await allKeys(store, ns)).toEqual(store.putFiles ? ["/d/f", "/e/1", "/e/2"] : ["/d/f"]);
        }));
    });

    describe("concurrent writers", () => {
      it("gives a create-only write exactly one winner among 10", () =>
        withStore(async (store, fresh) => {
          const ns = fresh();
          const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
          const results = await Promise.all(Array.from({ length: 10 }, (_, i) => backend.write("/once.txt", `writer ${i}`)));
          const winners = results.flatMap((result, i) => (result.error === undefined ? [i] : []));
          expect(winners).toHaveLength(1);
          expect(results.filter((result) => result.error !== undefined).every((result) => result.code === "already_exists")).toBe(true);
          expect(fileDataText((await store.get(ns, "/once.txt"))!.value)).toBe(`writer ${winners[0]}`);
          const codes = await Promise.all(Array.from({ length: 10 }, (_, i) => codeOf(store.put(ns, "/cas.txt", text(String(i)), { expectedVersion: null }))));
          expect(codes.filter((code) => code === "ok")).toHaveLength(1);
          expect(codes.filter((code) => code !== "ok").every((code) => code === "conflict")).toBe(true);
        }));

      it("loses no acknowledged edit: 20 concurrent edits of different lines, and an edit racing an overwrite", () =>
        withStore(async (store, fresh) => {
          const ns = fresh();
          const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns, editAttempts: 100 }));
          const lines = Array.from({ length: 20 }, (_, i) => `<${i}>`);
          expect((await backend.write("/f.txt", lines.join("\n"))).error).toBeUndefined();
          const results = await Promise.all(lines.map((line) => backend.edit("/f.txt", line, `${line} edited`)));
          const final = fileDataText((await store.get(ns, "/f.txt"))!.value)!.split("\n");
          results.forEach((result, i) => {
            if (result.error === undefined) expect(final[i]).toBe(`<${i}> edited`);
            else expect(result.code).toBe("conflict");
          });
          expect(results.filter((result) => result.error === undefined).length).toBeGreaterThan(0);

          // The overwrite is acknowledged, so it must survive: an edit that read the old text and stored after it would lose it.
          for (let round = 0; round < 10; round++) {
            await backend.write("/race.txt", "old", { overwrite: true });
            const [, overwritten] = await Promise.all([backend.edit("/race.txt", "old", "edited"), backend.write("/race.txt", "new", { overwrite: true })]);
            expect(overwritten.error).toBeUndefined();
            expect(fileDataText((await store.get(ns, "/race.txt"))!.value)).toBe("new");
          }
        }));
    });

    describe("quota", () => {
      it("refuses writes past maxFiles and maxBytes with quota_exceeded, always allows shrinking and deleting", () =>
        withStore(
          async (store, fresh) => {
            const ns = fresh();
            await store.put(ns, "/a", text("12345"));
            await store.put(ns, "/b", text("12345"));
            expect(await codeOf(store.put(ns, "/c", text("1")))).toBe("quota_exceeded");
            expect(await codeOf(store.put(ns, "/a", text("123456789012")))).toBe("quota_exceeded");
            expect(await codeOf(store.putMany(ns, [["/a", text("1")], ["/c", text("1")]]))).toBe("quota_exceeded");
            await store.put(ns, "/a", text("1"));
            expect(await allKeys(store, ns)).toEqual(["/a", "/b"]);
            const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
            expect(await backend.write("/c", "x")).toMatchObject({ code: "quota_exceeded" });
            expect(await store.delete(ns, "/b")).toBe(true);
            await store.put(ns, "/c", text("123456789"));
            // Another namespace has a quota of its own.
            const other = fresh();
            await store.put(other, "/a", text("12345"));
            await store.put(other, "/b", text("12345"));
          },
          { quota: { maxFiles: 2, maxBytes: 10 } },
        ));

      it("holds under 20 concurrent writers: never more files than the quota", () =>
        withStore(
          async (store, fresh) => {
            const ns = fresh();
            const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
            const results = await Promise.all(Array.from({ length: 20 }, (_, i) => backend.write(`/f${i}`, "x")));
            expect(results.filter((result) => result.error === undefined)).toHaveLength(5);
            expect(results.filter((result) => result.error !== undefined).every((result) => result.code === "quota_exceeded")).toBe(true);
            expect(await allKeys(store, ns)).toHaveLength(5);
          },
          { quota: { maxFiles: 5 } },
        ));

      it("rejects a quota that is not a count of bytes or files", async () => {
        for (const quota of [{ maxBytes: -1 }, { maxFiles: 1.5 }, { maxBytes: Number.NaN }]) {
          await expect(Promise.resolve().then(() => target.create({ quota }))).rejects.toMatchObject({ code: "invalid_argument" });
        }
      });
    });

    describe("closed", () => {
      it("refuses every operation after close with unavailable 'The store is closed', and StoreBackend answers in its usual shapes", async () => {
        const store = await target.create();
        const ns = [`conformance-${randomUUID()}`];
        const backend = toSeedProtocol(new StoreBackend({ store, namespace: ns }));
        await backend.write("/f.txt", "x");
        await store.deleteTree(ns, "/");
        await store.close();
        try {
          const attempts: Array<[string, Promise<unknown>]> = [
            ["get", store.get(ns, "/f.txt")],
            ["put", store.put(ns, "/g", text("y"))],
            ["putMany", store.putMany(ns, [["/g", text("y")]])],
            ["delete", store.delete(ns, "/f.txt")],
            ["deleteTree", store.deleteTree(ns, "/")],
            ["list", store.list(ns)],
            ["listDirectory", store.listDirectory(ns, "/")],
          ];
          if (store.putFile) attempts.push(["putFile", store.putFile(ns, "/g", text("y"))]);
          if (store.putFiles) attempts.push(["putFiles", store.putFiles(ns, [["/g", text("y")]])]);
          if (store.search) attempts.push(["search", collect(store.search(ns, "x", "/"))]);
          for (const [name, attempt] of attempts) {
            await expect(attempt, name).rejects.toMatchObject({ name: "StrataError", code: "unavailable", message: "The store is closed" });
          }
          expect(await backend.write("/g.txt", "y")).toMatchObject({ code: "unavailable", error: "The store is closed" });
          expect(await backend.edit("/f.txt", "x", "y")).toMatchObject({ code: "unavailable" });
          expect(await backend.read("/f.txt")).toBe("Error: The store is closed");
          await expect(backend.lsInfo("/")).rejects.toMatchObject({ code: "unavailable" });
          expect(await backend.uploadFiles([["/u", new Uint8Array([1])]])).toHaveLength(1);
          await store.close();
        } finally {
          await target.destroy?.(store);
        }
      });
    });
  });
}
