import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { OverlayBackend } from "../backends/overlay.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import type { Backend } from "../core/protocol.js";
import { randomUUID } from "node:crypto";
import { MemoryStore } from "../stores/memory.js";
import { PostgresStore } from "../stores/postgres.js";
import { RedisStore } from "../stores/redis.js";
import { SqliteStore } from "../stores/sqlite.js";
import type { Store } from "../stores/store.js";
import { serviceUrl } from "./support/servers.js";

const repo = path.resolve(import.meta.dirname, "..");
const temps: string[] = [];

afterEach(async () => {
  for (const dir of temps.splice(0)) await fs.rm(dir, { recursive: true, force: true });
});

async function tempDir(prefix: string): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), prefix));
  temps.push(dir);
  return dir;
}

/** A copy of this repository's core/ and tools/: a real source tree. */
async function sourceTree(): Promise<string> {
  const dir = await tempDir("strata-overlay-tree-");
  await fs.cp(path.join(repo, "core"), path.join(dir, "core"), { recursive: true });
  await fs.cp(path.join(repo, "tools"), path.join(dir, "tools"), { recursive: true });
  return dir;
}

/** Every file (bytes) and directory under `root`, by virtual path. */
async function walk(root: string): Promise<{ files: Map<string, Buffer>; dirs: string[] }> {
  const files = new Map<string, Buffer>();
  const dirs: string[] = [];
  const visit = async (dir: string) => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      const virtual = `/${path.relative(root, full).split(path.sep).join("/")}`;
      if (entry.isDirectory()) {
        dirs.push(virtual);
        await visit(full);
      } else files.set(virtual, await fs.readFile(full));
    }
  };
  await visit(root);
  return { files, dirs: dirs.sort() };
}

/** A backend's files and their bytes. */
async function view(backend: Backend): Promise<Map<string, Buffer>> {
  const listed = await backend.glob("**");
  if (listed.error) throw new Error(listed.error.message);
  const paths = listed.entries.map((e) => e.path);
  const got = await backend.downloadFiles(paths);
  if (got.error) throw new Error(got.error.message);
  return new Map(got.files.map((f) => [f.path, Buffer.from(f.content!)]));
}

async function directories(backend: Backend): Promise<string[]> {
  const listed = await backend.glob("**", { includeDirectories: true });
  if (listed.error) throw new Error(listed.error.message);
  return listed.entries.filter((e) => e.is_dir).map((e) => e.path.slice(0, -1)).sort();
}

/** mulberry32: a small seeded generator, so a failing session can be replayed. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Outcome = { ok: true; value?: unknown } | { ok: false; code: string };
const outcome = (result: { error?: { code: string } }, value?: unknown): Outcome => (result.error ? { ok: false, code: result.error.code } : { ok: true, value });

/**
 * Runs `count` random operations on the overlay and on a StateBackend shadow
 * holding the same files, expecting the same answer from both each time.
 */
async function session(overlay: OverlayBackend, shadow: StateBackend, count: number, seed: number): Promise<Record<string, number>> {
  const next = random(seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)]!;
  const tally: Record<string, number> = {};
  const filesNow = async () => (await shadow.glob("**")).entries!.map((e) => e.path);
  const dirsOf = (files: string[]) => [...new Set(files.map((f) => f.slice(0, f.lastIndexOf("/")) || "/"))];
  const madeDirs: string[] = [];
  for (let i = 0; i < count; i++) {
    const files = await filesNow();
    const dirs = [...dirsOf(files), ...madeDirs];
    const file = files.length > 0 && next() > 0.05 ? pick(files) : `/missing-${i}.ts`;
    const fresh = `${pick(dirs) === "/" ? "" : pick(dirs)}/new-${i}.txt`;
    const roll = next();
    let kind: string;
    const both = async (run: (b: Backend) => Promise<Outcome>) => {
      const [a, b] = [await run(overlay), await run(shadow)];
      expect(a, `op ${i} (${kind}) on overlay vs shadow`).toEqual(b);
    };
    if (roll < 0.2) {
      kind = "read";
      await both(async (b) => {
        const r = await b.read(file, { offset: 0, limit: 50 });
        return outcome(r, r.error ? undefined : r.content);
      });
    } else if (roll < 0.32) {
      kind = "write";
      const content = `// written by op ${i}\nexport const value${i} = ${Math.floor(next() * 1e6)};\n`;
      await both(async (b) => outcome(await b.write(fresh, content)));
    } else if (roll < 0.42) {
      kind = "overwrite";
      const content = `// replaced by op ${i}\n`.repeat(1 + Math.floor(next() * 5));
      await both(async (b) => outcome(await b.write(file, content, { overwrite: true })));
    } else if (roll < 0.6) {
      kind = "edit";
      const current = await shadow.read(file, { limit: 100000 });
      const lines = current.error || current.encoding !== "utf-8" ? [] : current.content.split("\n").filter((l) => l.trim().length > 3);
      const old = lines.length > 0 ? pick(lines).trim() : "no such text";
      await both(async (b) => {
        const r = await b.edit(file, old, `${old} /* edit ${i} */`, { replaceAll: true });
        return outcome(r, r.error ? undefined : r.occurrences);
      });
    } else if (roll < 0.68) {
      kind = "delete";
      await both(async (b) => outcome(await b.delete(file)));
    } else if (roll < 0.7) {
      kind = "delete-dir";
      const dir = pick(dirsOf(files).filter((d) => d !== "/"));
      if (dir) await both(async (b) => outcome(await b.delete(dir)));
    } else if (roll < 0.77) {
      kind = "move";
      await both(async (b) => outcome(await b.move(file, fresh)));
    } else if (roll < 0.79) {
      kind = "move-dir";
      const dir = pick(dirsOf(files).filter((d) => d !== "/"));
      if (dir) await both(async (b) => outcome(await b.move(dir, `${dir}-moved-${i}`)));
    } else if (roll < 0.85) {
      kind = "copy";
      await both(async (b) => outcome(await b.copy(file, fresh)));
    } else if (roll < 0.89) {
      kind = "upload";
      const bytes = Uint8Array.from({ length: 1 + Math.floor(next() * 300) }, () => Math.floor(next() * 256));
      await both(async (b) => {
        const r = await b.uploadFiles([[fresh.replace(/\.txt$/, ".bin"), bytes]]);
        return r.error ? outcome(r) : r.files[0]!.error ? { ok: false, code: r.files[0]!.error.code } : { ok: true };
      });
    } else if (roll < 0.92) {
      kind = "mkdir";
      const dir = `${pick(dirs) === "/" ? "" : pick(dirs)}/dir-${i}`;
      madeDirs.push(dir);
      await both(async (b) => outcome(await b.mkdir(dir, { recursive: true }), null));
    } else if (roll < 0.96) {
      kind = "grep";
      const pattern = pick(["export", "import", "edit", "replaced", "value", "Result<"]);
      const searchPath = pick(["/", ...dirs.filter((d) => !madeDirs.includes(d))]);
      kind = `grep ${pattern} in ${searchPath}`;
      await both(async (b) => {
        const r = await b.grep(pattern, { path: searchPath, maxCount: 200 });
        return outcome(r, r.error ? undefined : r);
      });
    } else {
      kind = "glob";
      const pattern = pick(["**/*.ts", "*.txt", "core/*", "**/new-*", "tools/**"]);
      await both(async (b) => {
        const r = await b.glob(pattern);
        return outcome(r, r.error ? undefined : r.entries.map((e) => e.path));
      });
    }
    const family = kind.split(" ")[0]!;
    tally[family] = (tally[family] ?? 0) + 1;
  }
  return tally;
}

/** An overlay over a fresh copy of the tree, and a shadow StateBackend holding the same files, with a snapshot of them. */
async function setup(): Promise<{ root: string; overlay: OverlayBackend; shadow: StateBackend; start: string; before: Awaited<ReturnType<typeof walk>> }> {
  const root = await sourceTree();
  const before = await walk(root);
  const overlay = new OverlayBackend({ workspace: root, fsync: false });
  const shadow = new StateBackend();
  const uploaded = await shadow.uploadFiles([...before.files].map(([p, bytes]) => [p, new Uint8Array(bytes)] as const));
  expect(uploaded.error).toBeUndefined();
  return { root, overlay, shadow, start: shadow.snapshot(), before };
}

const summary = (changes: ReadonlyArray<{ path: string; kind: string; patch?: string }>) => changes.map(({ path, kind, patch }) => ({ path, kind, patch }));

describe("OverlayBackend: a session over a real source tree", () => {
  it("1000 mixed operations: diff matches what was done, commit makes the disk the overlay's view byte for byte", async () => {
    const { root, overlay, shadow, start, before } = await setup();
    const tally = await session(overlay, shadow, 1000, 13);
    expect(Object.keys(tally).length).toBeGreaterThanOrEqual(12);

    // The disk is untouched until commit.
    const during = await walk(root);
    expect(during.files).toEqual(before.files);
    expect(during.dirs).toEqual(before.dirs);

    // What the overlay shows is what the shadow holds; its diff is the shadow's diff since the start.
    const shown = await view(overlay);
    expect(shown).toEqual(await view(shadow));
    const diff = await overlay.diff();
    const expected = shadow.diff(start);
    expect(diff.error).toBeUndefined();
    expect(diff.changes!.length).toBeGreaterThan(50);
    expect(summary(diff.changes!)).toEqual(summary(expected.changes!));
    const layer = await overlay.virtualFiles();
    expect(layer.files!.some((f) => f.kind === "deleted")).toBe(true);
    expect(layer.files!.some((f) => f.kind === "file" && f.content !== undefined)).toBe(true);

    const shownDirs = await directories(overlay);
    const committed = await overlay.commit();
    expect(committed.error).toBeUndefined();
    expect(committed.written!.length).toBeGreaterThan(0);
    const after = await walk(root);
    expect(after.files).toEqual(shown);
    expect(after.dirs).toEqual(shownDirs);
    expect((await overlay.virtualFiles()).files).toEqual([]);
    expect((await overlay.diff()).changes).toEqual([]);
    expect(await view(overlay)).toEqual(shown);
  }, 120_000);

  it("the same session, discarded: the disk is unchanged byte for byte and the view is the disk again", async () => {
    const { root, overlay, shadow, before } = await setup();
    await session(overlay, shadow, 1000, 13);
    expect((await overlay.diff()).changes!.length).toBeGreaterThan(50);
    const discarded = await overlay.discard();
    expect(discarded.discarded).toBeGreaterThan(0);
    const after = await walk(root);
    expect(after.files).toEqual(before.files);
    expect(after.dirs).toEqual(before.dirs);
    expect(await view(overlay)).toEqual(before.files);
    expect((await overlay.diff()).changes).toEqual([]);
  }, 120_000);
});

// OVERLAY_SEEDS=4,5,6 replays other sessions (each 400 operations, then commit).
describe("OverlayBackend: shorter sessions, other seeds", () => {
  for (const seed of (process.env.OVERLAY_SEEDS ?? "1,2,3").split(",").filter(Boolean).map(Number)) {
    it(`seed ${seed}`, async () => {
      const { root, overlay, shadow, start } = await setup();
      await session(overlay, shadow, 400, seed);
      const shown = await view(overlay);
      expect(shown).toEqual(await view(shadow));
      expect(summary((await overlay.diff()).changes!)).toEqual(summary(shadow.diff(start).changes!));
      const shownDirs = await directories(overlay);
      expect((await overlay.commit()).error).toBeUndefined();
      const after = await walk(root);
      expect(after.files).toEqual(shown);
      expect(after.dirs).toEqual(shownDirs);
    }, 120_000);
  }
});

describe("OverlayBackend: commit refuses conflicts, whole", () => {
  it("a file changed on disk behind the layer, and one created where the layer writes, are listed; nothing is applied", async () => {
    const root = await sourceTree();
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.edit("/core/paths.ts", "export", "export /* layer */", { replaceAll: true })).error).toBeUndefined();
    expect((await overlay.write("/core/new.ts", "layer\n")).error).toBeUndefined();
    expect((await overlay.write("/tools/untouched-on-disk.ts", "layer\n")).error).toBeUndefined();
    expect((await overlay.delete("/core/errors.ts")).error).toBeUndefined();

    // Someone else changes the disk meanwhile.
    await fs.appendFile(path.join(root, "core/paths.ts"), "// changed on disk\n");
    await fs.writeFile(path.join(root, "core/new.ts"), "disk\n");
    const before = await walk(root);

    const result = await overlay.commit();
    expect(result.error?.code).toBe("conflict");
    expect(result.error?.message).toContain("/core/paths.ts (modified)");
    expect(result.error?.message).toContain("/core/new.ts (created)");
    expect(result.error?.message).not.toContain(root);
    expect((await overlay.conflicts()).conflicts).toEqual([
      { path: "/core/new.ts", reason: "created" },
      { path: "/core/paths.ts", reason: "modified" },
    ]);
    // Nothing half-applied: not even the paths without a conflict.
    const after = await walk(root);
    expect(after.files).toEqual(before.files);
    expect((await overlay.virtualFiles()).files!.length).toBe(4);

    // Once the caller settles the conflicts (here: by dropping the layer's changes to those paths), commit goes through.
    await fs.writeFile(path.join(root, "core/new.ts"), "layer\n");
    await overlay.discard();
    expect((await overlay.write("/tools/untouched-on-disk.ts", "layer\n")).error).toBeUndefined();
    expect((await overlay.commit()).written).toEqual(["/tools/untouched-on-disk.ts"]);
  });

  it("a file created on disk inside a directory the layer deleted is a conflict, not lost silently", async () => {
    const root = await sourceTree();
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.delete("/tools")).error).toBeUndefined();
    await fs.writeFile(path.join(root, "tools/late.ts"), "late\n");
    const result = await overlay.commit();
    expect(result.error?.code).toBe("conflict");
    expect((await overlay.conflicts()).conflicts).toEqual([{ path: "/tools/late.ts", reason: "created" }]);
    expect(await fs.readFile(path.join(root, "tools/late.ts"), "utf8")).toBe("late\n");
  });

  it("a file touched on disk but holding the same bytes is no conflict (the base is a hash, not only a time)", async () => {
    const root = await sourceTree();
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.edit("/core/lock.ts", "export class", "export /* x */ class")).error).toBeUndefined();
    const file = path.join(root, "core/lock.ts");
    const later = new Date(Date.now() + 60_000);
    await fs.utimes(file, later, later);
    expect((await overlay.commit()).written).toEqual(["/core/lock.ts"]);
    expect(await fs.readFile(file, "utf8")).toContain("export /* x */ class");
  });
});

describe("OverlayBackend: layer semantics", () => {
  it("a deleted directory made again is empty (the disk's tree stays hidden) and commit replaces it", async () => {
    const root = await sourceTree();
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.delete("/tools")).error).toBeUndefined();
    expect((await overlay.stat("/tools/index.ts")).error?.code).toBe("file_not_found");
    expect((await overlay.mkdir("/tools")).error).toBeUndefined();
    expect((await overlay.ls("/tools")).entries).toEqual([]);
    expect((await overlay.grep("export", { path: "/tools" })).matches).toEqual([]);
    expect((await overlay.write("/tools/only.ts", "only\n")).error).toBeUndefined();
    expect((await overlay.glob("**", { path: "/tools" })).entries!.map((e) => e.path)).toEqual(["/tools/only.ts"]);
    expect((await overlay.virtualFiles()).files).toEqual([
      { path: "/tools", kind: "directory" },
      { path: "/tools/only.ts", kind: "file", size: 5, content: "only\n" },
    ]);
    const diff = await overlay.diff();
    expect(diff.changes!.filter((c) => c.kind === "deleted").length).toBeGreaterThan(3);
    expect(diff.changes!.find((c) => c.path === "/tools/only.ts")?.kind).toBe("added");
    expect((await overlay.commit()).error).toBeUndefined();
    expect(await fs.readdir(path.join(root, "tools"))).toEqual(["only.ts"]);
  });

  it("a file over a disk directory, and a directory over a disk file, commit as the view shows them", async () => {
    const root = await tempDir("strata-overlay-swap-");
    await fs.mkdir(path.join(root, "a"));
    await fs.writeFile(path.join(root, "a/inner.txt"), "inner");
    await fs.writeFile(path.join(root, "b"), "b file");
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.delete("/a")).error).toBeUndefined();
    expect((await overlay.write("/a", "now a file")).error).toBeUndefined();
    expect((await overlay.delete("/b")).error).toBeUndefined();
    expect((await overlay.write("/b/c.txt", "under b")).error).toBeUndefined();
    expect((await overlay.read("/a")).content).toBe("now a file");
    expect((await overlay.stat("/a/inner.txt")).error?.code).toBe("file_not_found");
    expect((await overlay.ls("/")).entries!.map((e) => e.path)).toEqual(["/a", "/b/"]);
    expect((await overlay.commit()).error).toBeUndefined();
    expect(await fs.readFile(path.join(root, "a"), "utf8")).toBe("now a file");
    expect(await fs.readFile(path.join(root, "b/c.txt"), "utf8")).toBe("under b");
  });

  it("the layer is not confused with FilesystemBackend's virtualMode, and secrets stay denied by default", async () => {
    const root = await tempDir("strata-overlay-secrets-");
    const overlay = new OverlayBackend({ workspace: root });
    expect((await overlay.write("/.env", "KEY=1")).error?.code).toBe("permission_denied");
    expect((await overlay.write("/x/.strata-tmp-1", "no")).error?.code).toBe("invalid_path");
    expect("virtualMode" in overlay).toBe(false);
  });
});

describe("OverlayBackend: a layer kept in SQLite survives a restart", () => {
  it("reopened with the same store and namespace, the layer is back: view, virtual files, diff and commit", async () => {
    const root = await sourceTree();
    const dbDir = await tempDir("strata-overlay-db-");
    const file = path.join(dbDir, "overlay.db");
    const namespace = ["overlay", "session-1"];
    const firstStore = new SqliteStore({ path: file });
    const first = new OverlayBackend({ workspace: root, store: firstStore, namespace });
    expect((await first.edit("/core/paths.ts", "export", "export /* kept */", { replaceAll: true })).error).toBeUndefined();
    expect((await first.write("/notes/plan.md", "# plan\n")).error).toBeUndefined();
    expect((await first.delete("/tools")).error).toBeUndefined();
    expect((await first.move("/core/lock.ts", "/core/mutex.ts")).error).toBeUndefined();
    expect((await first.uploadFiles([["/bin.dat", Uint8Array.of(0, 1, 2, 255)]])).error).toBeUndefined();
    const layer = await first.virtualFiles();
    const diff = await first.diff();
    const shown = await view(first);
    await firstStore.close();

    const store = new SqliteStore({ path: file });
    const second = new OverlayBackend({ workspace: root, store, namespace });
    expect(await second.virtualFiles()).toEqual(layer);
    expect(await second.diff()).toEqual(diff);
    expect(await view(second)).toEqual(shown);
    // Another namespace in the same store is another layer.
    const other = new OverlayBackend({ workspace: root, store, namespace: ["overlay", "session-2"] });
    expect((await other.virtualFiles()).files).toEqual([]);

    expect((await second.commit()).error).toBeUndefined();
    expect((await walk(root)).files).toEqual(shown);
    expect((await store.list(namespace)).items).toEqual([]);
    await store.close();
  });
});

describe("OverlayBackend: its store closed under it", () => {
  it.each([
    ["SQLite", (dir: string) => new SqliteStore({ path: path.join(dir, "overlay.db") })],
    ["memory", () => new MemoryStore()],
  ] as const)("%s: every change is refused as unavailable, commit and discard included, the disk and the layer untouched", async (_, open) => {
    const root = await tempDir("strata-overlay-closed-");
    await fs.writeFile(path.join(root, "a.txt"), "disk\n");
    const store = open(await tempDir("strata-overlay-closed-db-"));
    const overlay = new OverlayBackend({ workspace: root, store });
    expect((await overlay.write("/b.txt", "layer\n")).error).toBeUndefined();
    expect((await overlay.edit("/a.txt", "disk", "edited")).error).toBeUndefined();
    const layer = await overlay.virtualFiles();
    const disk = await walk(root);
    await store.close();

    const refused = [
      await overlay.write("/c.txt", "x"),
      await overlay.edit("/b.txt", "layer", "again"),
      await overlay.delete("/a.txt"),
      await overlay.mkdir("/d"),
      await overlay.move("/b.txt", "/e.txt"),
      // Commit would write the disk and then fail to drop the layer; discard would forget a layer the store keeps.
      await overlay.commit(),
      await overlay.discard(),
    ];
    for (const answer of refused) {
      expect(answer.error?.code).toBe("unavailable");
      expect(answer.error?.message).not.toContain(root);
    }
    // An upload answers per file.
    expect((await overlay.uploadFiles([["/f.bin", Uint8Array.of(0, 1)]])).files?.[0]?.error?.code).toBe("unavailable");
    expect(await walk(root)).toEqual(disk);
    // The backend still answers from what it holds, and it is what the store kept.
    expect(await overlay.virtualFiles()).toEqual(layer);
    expect((await overlay.read("/a.txt")).content).toBe("edited");
  });
});

describe("OverlayBackend: a layer in any Store, found again by a new backend (a new process's, for the servers)", () => {
  const memory = new MemoryStore();
  // A MemoryStore lives as long as its object: the second backend shares it instead of reopening.
  const engines: Array<[string, () => Store, boolean]> = [
    ["MemoryStore", () => memory, false],
    ["PostgresStore", () => new PostgresStore({ connectionString: serviceUrl("STRATA_POSTGRES_URL"), maxConnections: 2 }), true],
    ["RedisStore", () => new RedisStore({ url: serviceUrl("STRATA_REDIS_URL") }), true],
  ];
  for (const [name, open, reopen] of engines) {
    it(name, async () => {
      const root = await sourceTree();
      const namespace = ["overlay-test", randomUUID()];
      const firstStore = open();
      const first = new OverlayBackend({ workspace: root, store: firstStore, namespace });
      expect((await first.write("/core/paths.ts", "replaced\n", { overwrite: true })).error).toBeUndefined();
      expect((await first.delete("/tools")).error).toBeUndefined();
      expect((await first.mkdir("/empty")).error).toBeUndefined();
      const layer = await first.virtualFiles();
      if (reopen) await firstStore.close();

      const store = open();
      const second = new OverlayBackend({ workspace: root, store, namespace });
      expect(await second.virtualFiles()).toEqual(layer);
      expect((await second.read("/core/paths.ts")).content).toBe("replaced");
      expect((await second.ls("/")).entries!.map((e) => e.path)).toEqual(["/core/", "/empty/"]);
      await fs.writeFile(path.join(root, "core/paths.ts"), "changed behind the layer\n");
      expect((await second.commit()).error?.code).toBe("conflict");
      expect((await second.discard()).discarded).toBe(3);
      expect((await store.list(namespace)).items).toEqual([]);
      if (reopen) await store.close();
    });
  }
});

describe("OverlayBackend: operation by operation like a FilesystemBackend on a copy of the disk", () => {
  const POOL = ["/a", "/a/b", "/a/b/c.txt", "/a/e.txt", "/d.txt", "/f", "/f/g.txt", "/f/h", "/f/h/i.txt", "/j.txt"];
  const fixture = { "a/b/c.txt": "c\n", "a/e.txt": "e one\ne two\n", "d.txt": "d\n", "f/h/i.txt": "i\n" };
  const shape = (entries: ReadonlyArray<{ path: string; is_dir?: boolean; size?: number }>) => entries.map((e) => `${e.path}${e.is_dir ? "" : `:${e.size ?? "?"}`}`);

  // OVERLAY_DIFF_SEEDS=201,202 replays others.
  for (const seed of (process.env.OVERLAY_DIFF_SEEDS ?? "101,102,103,104").split(",").filter(Boolean).map(Number)) {
    it(`seed ${seed}: 300 operations with directories, whiteouts and opaque directories; every answer and listing the same`, async () => {
      const lower = await tempDir("strata-overlay-diff-a-");
      const mirror = await tempDir("strata-overlay-diff-b-");
      for (const dir of [lower, mirror]) {
        for (const [name, content] of Object.entries(fixture)) {
          await fs.mkdir(path.dirname(path.join(dir, name)), { recursive: true });
          await fs.writeFile(path.join(dir, name), content);
        }
        await fs.mkdir(path.join(dir, "empty"));
      }
      const overlay = new OverlayBackend({ workspace: lower, permissions: false, fsync: false });
      const plain = new FilesystemBackend({ workspace: mirror, permissions: false, fsync: false });
      const next = random(seed);
      const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)]!;
      for (let i = 0; i < 300; i++) {
        const p = pick(POOL);
        const q = pick(POOL);
        const flag = next() < 0.5;
        const roll = next();
        const old = pick(["c", "e", "one", "w"]);
        const needle = pick(["w", "x", "e"]);
        const ops: Array<[string, (b: Backend) => Promise<unknown>]> = [
          ["write", async (b) => outcome(await b.write(p, `w${i}\n`, { overwrite: flag }))],
          ["edit", async (b) => outcome(await b.edit(p, old, `x${i}`, { replaceAll: true }))],
          ["delete", async (b) => outcome(await b.delete(p))],
          ["mkdir", async (b) => outcome(await b.mkdir(p, { recursive: flag }))],
          ["move", async (b) => outcome(await b.move(p, q, { overwrite: flag }))],
          ["copy", async (b) => outcome(await b.copy(p, q, { overwrite: flag }))],
          ["ls", async (b) => { const r = await b.ls(p); return outcome(r, r.error ? undefined : shape(r.entries)); }],
          ["stat", async (b) => { const r = await b.stat(p); return outcome(r, r.error ? undefined : shape([r])); }],
          ["read", async (b) => { const r = await b.read(p); return outcome(r, r.error ? undefined : r.content); }],
          ["glob", async (b) => { const r = await b.glob("**", { includeDirectories: true }); return outcome(r, r.error ? undefined : shape(r.entries)); }],
          ["grep", async (b) => { const r = await b.grep(needle, { path: flag ? "/" : p }); return outcome(r, r.error ? undefined : r.matches); }],
        ];
        const [kind, run] = ops[Math.floor(roll * ops.length)]!;
        const a = await run(overlay);
        // FilesystemBackend's move of a missing source makes the target's parents before it fails (a side
        // effect of a failed call the overlay does not copy): the answer is compared, the plain move skipped.
        const missingSource = kind === "move" && (a as Outcome).ok === false && (a as { code: string }).code === "file_not_found" && (await plain.stat(p)).error;
        const b = missingSource ? a : await run(plain);
        expect(a, `op ${i}: ${kind} ${p} ${q} ${flag}`).toEqual(b);
      }
      // And the layer, committed, leaves the disk as the plain backend's.
      expect((await overlay.commit()).error).toBeUndefined();
      const [left, right] = [await walk(lower), await walk(mirror)];
      expect(left.files).toEqual(right.files);
      expect(left.dirs).toEqual(right.dirs);
    }, 120_000);
  }
});
