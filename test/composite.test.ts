import { describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { StateBackend } from "../backends/state.js";
import { toSeedProtocol } from "../core/seed.js";
import type { DeleteResult } from "../core/types.js";

const bytes = (text: string) => new TextEncoder().encode(text);

/** A real StateBackend that counts how often its batch methods are called. */
class CountingBackend extends StateBackend {
  uploads = 0;
  downloads = 0;
  override async uploadFiles(files: unknown, options?: unknown) {
    this.uploads++;
    return super.uploadFiles(files, options);
  }
  override async downloadFiles(paths: unknown, options?: unknown) {
    this.downloads++;
    return super.downloadFiles(paths, options);
  }
}

function workspace() {
  const root = new CountingBackend();
  const mem = new CountingBackend();
  const deep = new CountingBackend();
  const composite = new CompositeBackend({ default: root, routes: { "/mem/": mem, "/mem/deep": deep } });
  return { root, mem, deep, composite, seed: toSeedProtocol(composite) };
}

describe("CompositeBackend routing", () => {
  it("matches prefixes at segment boundaries: /mem never captures /memo", async () => {
    const { root, mem, seed } = workspace();
    await seed.write("/memo.txt", "default");
    await seed.write("/mem/note.txt", "routed");
    expect(Object.keys(root.files)).toEqual(["/memo.txt"]);
    expect(Object.keys(mem.files)).toEqual(["/note.txt"]);
  });

  it("lets the longest prefix win", async () => {
    const { mem, deep, seed } = workspace();
    await seed.write("/mem/deep/x.txt", "deep");
    await seed.write("/mem/deeper/y.txt", "mem");
    expect(Object.keys(deep.files)).toEqual(["/x.txt"]);
    expect(Object.keys(mem.files)).toEqual(["/deeper/y.txt"]);
  });

  it("shows routes in listings and translates paths back", async () => {
    const { seed } = workspace();
    await seed.write("/top.txt", "t");
    expect((await seed.lsInfo("/")).map((i) => i.path)).toEqual(["/mem/", "/top.txt"]);
    expect((await seed.lsInfo("/mem")).map((i) => i.path)).toEqual(["/mem/deep/"]);
    await seed.write("/mem/deep/a/b.txt", "b");
    expect((await seed.lsInfo("/mem/deep")).map((i) => i.path)).toEqual(["/mem/deep/a/"]);
    expect((await seed.globInfo("**/*.txt")).map((i) => i.path)).toEqual(["/mem/deep/a/b.txt", "/top.txt"]);
  });

  it("searches the default backend from the caller's path when a glob's literal prefix narrows the search (fast-check seed -488134160)", async () => {
    const composite = new CompositeBackend({ default: new StateBackend(), routes: { "/a/b": new StateBackend() } });
    const seed = toSeedProtocol(composite);
    await seed.write("/a/a", "needle");
    expect((await seed.globInfo("a/*", "/")).map((i) => i.path)).toEqual(["/a/a"]);
    expect((await seed.grep("needle", "/", "a/*")).matches.map((m) => m.path)).toEqual(["/a/a"]);
  });

  it("never shows a routed backend's inner paths in errors or updates", async () => {
    const { seed } = workspace();
    const written = await seed.write("/mem/deep/f.txt", "x");
    expect(written.path).toBe("/mem/deep/f.txt");
    expect(Object.keys(written.filesUpdate ?? {})).toEqual(["/mem/deep/f.txt"]);
    const again = await seed.write("/mem/deep/f.txt", "y");
    expect(again.error).toContain("'/mem/deep/f.txt'");
    expect(await seed.read("/mem/missing.txt")).toBe("Error: File '/mem/missing.txt' not found");
    await expect(seed.readRaw("/mem/deep/nope")).rejects.toThrow("'/mem/deep/nope'");
  });

  it("fans grep out to every backend under the search path with one global maxCount", async () => {
    const { seed } = workspace();
    await seed.write("/a.txt", "hit\nhit\n");
    await seed.write("/mem/b.txt", "hit\nhit\n");
    await seed.write("/mem/deep/c.txt", "hit\nhit\n");
    const all = await seed.grep("hit");
    expect(all.matches.map((m) => `${m.path}:${m.line}`)).toEqual([
      "/a.txt:1", "/a.txt:2", "/mem/b.txt:1", "/mem/b.txt:2", "/mem/deep/c.txt:1", "/mem/deep/c.txt:2",
    ]);
    const capped = await seed.grep("hit", "/", null, { maxCount: 3 });
    expect(capped).toEqual({ matches: all.matches.slice(0, 3), truncated: true });
    expect((await seed.grep("hit", "/mem")).matches).toHaveLength(4);
    expect((await seed.grep("hit", "/", "mem/deep/*.txt")).matches.map((m) => m.path)).toEqual(["/mem/deep/c.txt", "/mem/deep/c.txt"]);
  });

  it("batches upload and download into one call per backend and keeps input order", async () => {
    const { root, mem, deep, seed } = workspace();
    const files = ["/1.txt", "/mem/2.txt", "/mem/deep/3.txt", "/4.txt", "/mem/5.txt", "/mem/deep/6.txt"];
    const uploaded = await seed.uploadFiles(files.map((p) => [p, bytes(p)] as const));
    expect(uploaded.map((r) => r.path)).toEqual(files);
    expect(uploaded.every((r) => r.error === null)).toBe(true);
    expect([root.uploads, mem.uploads, deep.uploads]).toEqual([1, 1, 1]);
    const reversed = [...files].reverse();
    const downloaded = await seed.downloadFiles(reversed);
    expect(downloaded.map((d) => new TextDecoder().decode(d.content!))).toEqual(reversed);
    expect([root.downloads, mem.downloads, deep.downloads]).toEqual([1, 1, 1]);
  });

  it("treats mount points and their ancestors as directories", async () => {
    const { seed } = workspace();
    expect((await seed.write("/mem", "x")).code).toBe("is_directory");
    expect(await seed.uploadFiles([["/mem/deep", bytes("x")]])).toEqual([{ path: "/mem/deep", error: "is_directory" }]);
  });

  it("refuses execute clearly when the default backend is not a sandbox", async () => {
    const { seed } = workspace();
    await expect(seed.execute("ls")).rejects.toMatchObject({ code: "unsupported" });
  });

  it("rejects a route at '/'", () => {
    expect(() => new CompositeBackend({ default: new StateBackend(), routes: { "/": new StateBackend() } })).toThrow(/route cannot be '\/'/);
  });
});

describe("CompositeBackend across mount points", () => {
  function mounted() {
    const root = new StateBackend();
    const memories = new StateBackend();
    const composite = new CompositeBackend({ default: root, routes: { "/workspace/memories": memories } });
    return { root, memories, composite, seed: toSeedProtocol(composite) };
  }

  it("grep with maxCount does not spend the cap on matches a route hides", async () => {
    const { root, seed } = mounted();
    // The default backend holds shadowed files under the mount point (written before the route existed).
    for (let i = 0; i < 5; i++) await root.write(`/workspace/memories/shadow${i}.txt`, "needle");
    await seed.write("/workspace/real.txt", "needle");
    const result = await seed.grep("needle", "/", null, { maxCount: 3 });
    expect(result.matches.map((m) => m.path)).toEqual(["/workspace/real.txt"]);
    expect(result.truncated).toBe(false);
    const capped = await seed.grep("needle", "/", null, { maxCount: 1 });
    expect(capped).toEqual({ matches: [{ path: "/workspace/real.txt", line: 1, text: "needle" }], truncated: false });
  });

  it("deleting a directory holding a mount point removes everything under it, across routes", async () => {
    const { root, memories, seed } = mounted();
    await seed.write("/workspace/a.txt", "a");
    await seed.write("/workspace/memories/m.txt", "m");
    await seed.write("/workspace/memories/sub/n.txt", "n");
    await seed.write("/other.txt", "o");
    const result = await seed.delete("/workspace");
    expect(result.error).toBeUndefined();
    expect(Object.keys(result.filesUpdate ?? {}).sort()).toEqual(["/workspace/a.txt", "/workspace/memories/m.txt", "/workspace/memories/sub/n.txt"]);
    expect(Object.keys(root.files)).toEqual(["/other.txt"]);
    expect(Object.keys(memories.files)).toEqual([]);
    expect((await seed.globInfo("**")).map((i) => i.path)).toEqual(["/other.txt"]);
  });

  it("deleting a directory that exists only as a mount point's parent succeeds and clears the route", async () => {
    const { memories, seed } = mounted();
    await seed.write("/workspace/memories/m.txt", "m");
    expect((await seed.delete("/workspace")).error).toBeUndefined();
    expect(Object.keys(memories.files)).toEqual([]);
  });

  it("deleting a mount point itself deletes that route's contents, not refused as '/'", async () => {
    const { root, memories, seed } = mounted();
    await seed.write("/workspace/keep.txt", "k");
    await seed.write("/workspace/memories/m.txt", "m");
    await seed.write("/workspace/memories/d/x.txt", "x");
    const result = await seed.delete("/workspace/memories");
    expect(result.error).toBeUndefined();
    expect(Object.keys(memories.files)).toEqual([]);
    expect(Object.keys(root.files)).toEqual(["/workspace/keep.txt"]);
    expect(await seed.delete("/")).toMatchObject({ code: "permission_denied" });
  });

  it("a failure after part of a delete says what was already removed", async () => {
    const root = new StateBackend();
    const failing = new (class extends StateBackend {
      protected override async doDelete(path: string): Promise<DeleteResult> {
        return { error: `Permission denied: '${path}'`, code: "permission_denied" as const };
      }
    })();
    await failing.write("/f.txt", "f");
    const composite = new CompositeBackend({ default: root, routes: { "/w/ro": failing } });
    const seed = toSeedProtocol(composite);
    await seed.write("/w/a.txt", "a");
    const result = await seed.delete("/w");
    expect(result.code).toBe("permission_denied");
    expect(result.error).toContain("'/w/ro/f.txt'");
    expect(result.error).toContain("already removed: '/w'");
  });

  it("echoes upload and download paths exactly as requested", async () => {
    const { seed } = mounted();
    const [up] = await seed.uploadFiles([["workspace//memories/./u.txt", bytes("u")]]);
    expect(up).toEqual({ path: "workspace//memories/./u.txt", error: null });
    const [down] = await seed.downloadFiles(["workspace//memories/./u.txt"]);
    expect(down!.path).toBe("workspace//memories/./u.txt");
    expect(down!.error).toBeNull();
  });
});

describe("composite glob with includeDirectories", () => {
  it("answers mount points and the directories above them, even while empty, once each", async () => {
    const composite = new CompositeBackend({ default: new StateBackend(), routes: { "/a/mem": new StateBackend(), "/b": new StateBackend() } });
    await composite.write("/a/x.txt", "x");
    await composite.write("/b/in/y.txt", "y");
    const all = await composite.glob("**", { includeDirectories: true });
    expect(all.entries?.map((e) => e.path)).toEqual(["/a/", "/a/mem/", "/a/x.txt", "/b/", "/b/in/", "/b/in/y.txt"]);
    const named = await composite.glob("mem", { path: "/a", includeDirectories: true });
    expect(named.entries).toEqual([{ path: "/a/mem/", is_dir: true }]);
    expect((await composite.glob("**", { path: "/b" })).entries?.map((e) => e.path)).toEqual(["/b/in/y.txt"]);
  });
});
