import { describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { isStrataError } from "../core/errors.js";
import { fileDataFromText, fileDataText } from "../core/filedata.js";
import { BackendRuntime } from "../core/protocol.js";
import { toSeedProtocol } from "../core/seed.js";
import type { FileData } from "../core/types.js";

const lines = (n: number) => Array.from({ length: n }, (_, i) => `line ${i}`).join("\n") + "\n";

describe("StateBackend: no lost update", () => {
  it("20 concurrent edits of different lines of one file all land", async () => {
    const backend = new StateBackend();
    const seed = toSeedProtocol(backend);
    await seed.write("/f.txt", lines(20));
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => seed.edit("/f.txt", `line ${i}\n`, `edited ${i}\n`)));
    for (const result of results) expect(result.error).toBeUndefined();
    const text = fileDataText(await seed.readRaw("/f.txt"))!;
    for (let i = 0; i < 20; i++) expect(text).toContain(`edited ${i}\n`);
  });

  it("an edit racing an overwrite never puts the old content back", async () => {
    for (let round = 0; round < 20; round++) {
      const backend = new StateBackend();
      const seed = toSeedProtocol(backend);
      await seed.write("/f.txt", "old content\n");
      const [edit, write] = await Promise.all([
        seed.edit("/f.txt", "old", "edited"),
        seed.write("/f.txt", "replacement\n", { overwrite: true }),
      ]);
      expect(write.error).toBeUndefined();
      const text = fileDataText(await seed.readRaw("/f.txt"));
      // Serial orders: edit then overwrite (replacement), or overwrite then a failed edit (replacement).
      expect(text).toBe("replacement\n");
      if (edit.error) expect(edit.code).toBe("no_match");
    }
  });
});

describe("StateBackend: files changed by someone else", () => {
  it("sees keys added, deleted and replaced in place in runtime.state.files", async () => {
    const runtime = new BackendRuntime({ files: {} as Record<string, FileData> });
    const backend = new StateBackend(runtime);
    const seed = toSeedProtocol(backend);
    await seed.write("/a/old.txt", "needle old\n");
    await seed.write("/a/kept.txt", "kept\n");
    expect((await seed.grep("needle")).matches).toHaveLength(1); // builds the search cache

    const files = runtime.state.files;
    delete files["/a/old.txt"];
    files["/a/new.txt"] = fileDataFromText("needle new\n");
    files["/b/c.txt"] = fileDataFromText("needle c\n");

    expect((await seed.lsInfo("/a")).map((i) => i.path)).toEqual(["/a/kept.txt", "/a/new.txt"]);
    expect((await seed.lsInfo("/")).map((i) => i.path)).toEqual(["/a/", "/b/"]);
    expect((await seed.grep("needle")).matches.map((m) => m.path)).toEqual(["/a/new.txt", "/b/c.txt"]);
    expect((await seed.globInfo("**/*.txt")).map((i) => i.path)).toEqual(["/a/kept.txt", "/a/new.txt", "/b/c.txt"]);
    expect(await seed.read("/a/old.txt")).toMatch(/^Error: File '\/a\/old.txt' not found/);
  });

  it("sees runtime.state.files replaced wholesale", async () => {
    const runtime = new BackendRuntime({ files: {} as Record<string, FileData> });
    const backend = new StateBackend(runtime);
    const seed = toSeedProtocol(backend);
    await seed.write("/x.txt", "x");
    runtime.state.files = { "/y.txt": fileDataFromText("y") };
    expect((await seed.lsInfo("/")).map((i) => i.path)).toEqual(["/y.txt"]);
  });

  it("two backends over one runtime see each other's writes", async () => {
    const runtime = new BackendRuntime({ files: {} as Record<string, FileData> });
    const first = toSeedProtocol(new StateBackend(runtime));
    const second = toSeedProtocol(new StateBackend(runtime));
    await first.write("/d/one.txt", "1");
    expect((await second.lsInfo("/d")).map((i) => i.path)).toEqual(["/d/one.txt"]);
    await second.write("/d/two.txt", "2");
    await first.delete("/d/one.txt");
    expect((await second.lsInfo("/d")).map((i) => i.path)).toEqual(["/d/two.txt"]);
    expect((await first.globInfo("**")).map((i) => i.path)).toEqual(["/d/two.txt"]);
  });

  it("accepts the plain { state: { files } } object deepagents passes", async () => {
    const state = { files: { "/seed.txt": fileDataFromText("seed\n") } as Record<string, FileData> };
    const backend = new StateBackend({ state });
    const seed = toSeedProtocol(backend);
    expect(await seed.read("/seed.txt")).toBe("     1\tseed");
    await seed.write("/new.txt", "new");
    expect(Object.keys(state.files).sort()).toEqual(["/new.txt", "/seed.txt"]);
  });

  it("rejects a runtime that is neither", () => {
    expect(() => new StateBackend(42 as never)).toThrow(/BackendRuntime/);
    expect(() => new StateBackend({ runtime: 42 as never })).toThrow(/BackendRuntime/);
  });

  it("takes the runtime as an option, or as the one argument when it has a `state` (the deepagents form)", async () => {
    const runtime = new BackendRuntime({ files: {} as Record<string, FileData> });
    const viaOptions = new StateBackend({ runtime, maxFileSize: 4 });
    expect((await viaOptions.write("/a.txt", "a")).error).toBeUndefined();
    expect((await viaOptions.write("/big.txt", "12345")).error?.code).toBe("too_large");
    expect(Object.keys(runtime.state.files)).toEqual(["/a.txt"]);
    // deepagents passes its whole runtime: { state: { files }, store?, config? }.
    const deepagents = { state: { files: runtime.state.files }, store: undefined, config: { configurable: { thread_id: "t" } } };
    const backend = new StateBackend(deepagents);
    expect(await toSeedProtocol(backend).read("/a.txt")).toBe("     1\ta");
    expect(backend.runtime.state).toBe(deepagents.state);
    expect(() => new StateBackend(null as never)).toThrow(/BackendRuntime/);
  });
});

describe("StateBackend: text holding NUL", () => {
  it("is stored and reported as binary, as on disk", async () => {
    const backend = new StateBackend();
    const seed = toSeedProtocol(backend);
    await seed.write("/nul.bin", "a\0b");
    const data = await seed.readRaw("/nul.bin");
    expect(data).toHaveProperty("encoding", "base64");
    expect(await seed.read("/nul.bin")).toMatch(/binary file \(3 bytes\)/);
    expect((await seed.edit("/nul.bin", "a", "c")).code).toBe("binary_file");
    const [download] = await seed.downloadFiles(["/nul.bin"]);
    expect([...download!.content!]).toEqual([97, 0, 98]);
  });
});

describe("StateBackend: quota", () => {
  it("refuses writes, edits and uploads beyond it and allows shrinking", async () => {
    const backend = new StateBackend({ quota: { maxBytes: 10, maxFiles: 2 } });
    const seed = toSeedProtocol(backend);
    expect((await seed.write("/a", "12345")).error).toBeUndefined();
    expect((await seed.write("/b", "123456")).code).toBe("quota_exceeded");
    expect((await seed.write("/b", "12345")).error).toBeUndefined();
    expect((await seed.write("/c", "")).code).toBe("quota_exceeded"); // a third file
    expect((await seed.edit("/a", "1", "1x")).code).toBe("quota_exceeded");
    expect((await seed.uploadFiles([["/a", new Uint8Array(6)]]))[0]!.error).toBe("permission_denied");
    expect((await seed.edit("/a", "12345", "1")).error).toBeUndefined(); // shrinking is always allowed
    expect(fileDataText(await seed.readRaw("/b"))).toBe("12345");
    await seed.delete("/b");
    expect((await seed.write("/c", "123456789")).error).toBeUndefined();
  });

  it("counts files changed by someone else", async () => {
    const runtime = new BackendRuntime({ files: {} as Record<string, FileData> });
    const backend = new StateBackend({ runtime, quota: { maxFiles: 2 } });
    const seed = toSeedProtocol(backend);
    await seed.write("/a", "a");
    runtime.state.files["/b"] = fileDataFromText("b");
    expect((await seed.write("/c", "c")).code).toBe("quota_exceeded");
  });

  it("rejects a malformed quota", () => {
    expect(() => new StateBackend({ quota: { maxBytes: -1 } })).toThrow(/quota.maxBytes/);
  });
});

describe("StateBackend: batches", () => {
  it("rejects a non-array with invalid_argument and echoes requested paths", async () => {
    const backend = new StateBackend();
    const seed = toSeedProtocol(backend);
    for (const bad of ["/x", null, 5, { length: 1 }]) {
      const upload = await seed.uploadFiles(bad as never).catch((e: unknown) => e);
      expect(isStrataError(upload, "invalid_argument")).toBe(true);
      const download = await seed.downloadFiles(bad as never).catch((e: unknown) => e);
      expect(isStrataError(download, "invalid_argument")).toBe(true);
    }
    const [up] = await seed.uploadFiles([["a//b/./c.txt", new Uint8Array([1])]]);
    expect(up).toEqual({ path: "a//b/./c.txt", error: null });
    const [down] = await seed.downloadFiles(["a//b/./c.txt"]);
    expect(down!.path).toBe("a//b/./c.txt");
  });
});
