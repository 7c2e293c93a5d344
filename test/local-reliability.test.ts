/**
 * Attacks on the promises of the local backends: no acknowledged write lost
 * (concurrent callers, another Strata process, a writer that is not Strata),
 * lock files never seen, quotas, and LocalSandbox's file operations confined
 * exactly as FilesystemBackend's.
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import fs from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import nodePath from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { FilesystemBackend } from "../backends/filesystem.js";
import { isStrataError } from "../core/errors.js";
import { toSeedProtocol } from "../core/seed.js";
import { LocalSandbox } from "../sandboxes/local.js";

const repo = nodePath.resolve(import.meta.dirname, "..");
const tsx = nodePath.join(repo, "node_modules/.bin/tsx");
const lines = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `line ${from + i}\n`).join("");
const lockName = (name: string) => `.strata-lock-${createHash("sha256").update(name).digest("hex").slice(0, 32)}`;

const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0).reverse()) await step();
});
function tempDir(): string {
  const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-reliability-"));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
function backend(options: Partial<ConstructorParameters<typeof FilesystemBackend>[0]> = {}) {
  const rootDir = tempDir();
  return { rootDir, fs: toSeedProtocol(new FilesystemBackend({ workspace: rootDir, fsync: false, ...options })) };
}

describe("FilesystemBackend: no lost update", () => {
  it("20 concurrent edits of different lines of one file all land", async () => {
    const { fs: b } = backend();
    await b.write("/f.txt", lines(0, 20));
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => b.edit("/f.txt", `line ${i}\n`, `edited ${i}\n`)));
    for (const result of results) expect(result.error).toBeUndefined();
    const text = await b.read("/f.txt");
    for (let i = 0; i < 20; i++) expect(text).toContain(`edited ${i}`);
  });

  it("two backends over one root (one process) do not lose each other's edits", async () => {
    const { rootDir, fs: first } = backend();
    const second = toSeedProtocol(new FilesystemBackend({ workspace: rootDir, fsync: false }));
    await first.write("/f.txt", lines(0, 20));
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => (i % 2 ? first : second).edit("/f.txt", `line ${i}\n`, `edited ${i}\n`)),
    );
    for (const result of results) expect(result.error).toBeUndefined();
    const text = readFileSync(nodePath.join(rootDir, "f.txt"), "utf8");
    for (let i = 0; i < 20; i++) expect(text).toContain(`edited ${i}`);
  });

  it("an edit racing an overwrite never puts the old content back", async () => {
    const { fs: b } = backend();
    for (let round = 0; round < 20; round++) {
      await b.write("/f.txt", "old content\n", { overwrite: true });
      const [edit, write] = await Promise.all([b.edit("/f.txt", "old", "edited"), b.write("/f.txt", "replacement\n", { overwrite: true })]);
      expect(write.error).toBeUndefined();
      expect(await b.read("/f.txt")).toBe("     1\treplacement");
      if (edit.error) expect(edit.code).toBe("no_match");
    }
  });

  it("edits from another Strata process on the same disk all land (lock files)", async () => {
    const { rootDir, fs: b } = backend();
    const count = 30;
    await b.write("/shared.txt", lines(0, 2 * count));
    const worker = nodePath.join(rootDir, "..", `${nodePath.basename(rootDir)}-worker.mts`);
    cleanup.push(() => rmSync(worker, { force: true }));
    writeFileSync(
      worker,
      `import { FilesystemBackend } from ${JSON.stringify(nodePath.join(repo, "backends/filesystem.ts"))};
const b = new FilesystemBackend({ workspace: process.argv[2], fsync: false });
const results = await Promise.all(Array.from({ length: ${count} }, (_, i) => b.edit("/shared.txt", \`line \${${count} + i}\\n\`, \`child \${${count} + i}\\n\`)));
const failed = results.filter((r) => r.error !== undefined);
process.stdout.write(JSON.stringify(failed));
`,
    );
    const child = spawn(tsx, [worker, rootDir], { stdio: ["ignore", "pipe", "inherit"] });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("close", resolve));
    // Keep editing while the child runs, so the two really overlap.
    const mine = [];
    for (let i = 0; i < count; i++) {
      mine.push(await b.edit("/shared.txt", `line ${i}\n`, `parent ${i}\n`));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(await exited).toBe(0);
    expect(JSON.parse(output)).toEqual([]);
    for (const result of mine) expect(result.error).toBeUndefined();
    const text = readFileSync(nodePath.join(rootDir, "shared.txt"), "utf8");
    for (let i = 0; i < count; i++) {
      expect(text).toContain(`parent ${i}\n`);
      expect(text).toContain(`child ${count + i}\n`);
    }
    expect(readdirSync(rootDir).filter((name) => name.startsWith(".strata-"))).toEqual([]);
  }, 60_000);

  it("answers conflict when a writer that is not Strata changes the file mid-edit", async () => {
    const { rootDir, fs: b } = backend({ fsync: true });
    // Big enough that writing and syncing the edited copy takes a while.
    const big = `head\n${"x".repeat(48 * 1024 * 1024)}\n`;
    writeFileSync(nodePath.join(rootDir, "f.txt"), big);
    const edit = b.edit("/f.txt", "head", "edited");
    // Once the temp copy exists the edit has read the file: change it behind the edit's back.
    const deadline = Date.now() + 20_000;
    while (!readdirSync(rootDir).some((name) => name.startsWith(".strata-tmp-")) && Date.now() < deadline) {
      await new Promise((resolve) => setImmediate(resolve));
    }
    writeFileSync(nodePath.join(rootDir, "f.txt"), "foreign\n");
    const result = await edit;
    expect(result.code).toBe("conflict");
    expect(result.error).not.toContain(rootDir);
    expect(readFileSync(nodePath.join(rootDir, "f.txt"), "utf8")).toBe("foreign\n");
  }, 60_000);
});

describe("FilesystemBackend: lock files", () => {
  it("are never seen by ls, glob or grep, even while edits run", async () => {
    const { fs: b } = backend();
    await b.write("/d/f.txt", lines(0, 50));
    let running = true;
    const seen = new Set<string>();
    const watcher = (async () => {
      while (running) {
        for (const info of await b.lsInfo("/d")) seen.add(info.path);
        for (const info of await b.globInfo("**", "/")) seen.add(info.path);
        for (const match of (await b.grep("line", "/")).matches) seen.add(match.path);
      }
    })();
    await Promise.all(Array.from({ length: 50 }, (_, i) => b.edit("/d/f.txt", `line ${i}\n`, `edited ${i}\n`)));
    running = false;
    await watcher;
    expect([...seen].filter((path) => path.includes(".strata-"))).toEqual([]);
  });

  it("reserves their names", async () => {
    const { fs: b } = backend();
    expect(await b.write(`/${lockName("x")}`, "x")).toMatchObject({ code: "invalid_path" });
    expect(await b.write("/.strata-tmp-1234", "x")).toMatchObject({ code: "invalid_path" });
  });

  it("hide what lies under a directory with an internal name, as read refuses it (ripgrep and JS search alike)", async () => {
    for (const useRipgrep of [true, false]) {
      const { rootDir, fs: b } = backend({ useRipgrep });
      await fs.mkdir(nodePath.join(rootDir, ".strata-tmp-d"));
      writeFileSync(nodePath.join(rootDir, ".strata-tmp-d", "f.txt"), "needle\n");
      await b.write("/seen.txt", "needle\n");
      expect((await b.globInfo("**", "/")).map((info) => info.path)).toEqual(["/seen.txt"]);
      expect((await b.grep("needle", "/")).matches.map((match) => match.path)).toEqual(["/seen.txt"]);
      expect(await b.read("/.strata-tmp-d/f.txt")).toMatch(/^Error: Invalid path/);
    }
  });

  it("a lock left by a dead process is broken", async () => {
    const { rootDir, fs: b } = backend();
    await b.write("/f.txt", "before\n");
    const dead = spawnSync("true").pid!; // exited: its pid is free
    writeFileSync(nodePath.join(rootDir, lockName("f.txt")), JSON.stringify({ pid: dead, host: hostname(), time: Date.now() }));
    expect((await b.edit("/f.txt", "before", "after")).error).toBeUndefined();
    expect(existsSync(nodePath.join(rootDir, lockName("f.txt")))).toBe(false);
  });

  it("a lock older than the bound is broken, whoever wrote it", async () => {
    const { rootDir, fs: b } = backend();
    await b.write("/f.txt", "before\n");
    writeFileSync(nodePath.join(rootDir, lockName("f.txt")), JSON.stringify({ pid: 1, host: "elsewhere", time: Date.now() - 3_600_000 }));
    expect((await b.write("/f.txt", "after\n", { overwrite: true })).error).toBeUndefined();
  });

  it("a live lock is waited for, then taken", async () => {
    const { rootDir, fs: b } = backend();
    await b.write("/f.txt", "before\n");
    const lock = nodePath.join(rootDir, lockName("f.txt"));
    writeFileSync(lock, JSON.stringify({ pid: process.pid, host: hostname(), time: Date.now() }));
    let settled = false;
    const edit = b.edit("/f.txt", "before", "after").finally(() => (settled = true));
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(settled).toBe(false);
    expect(readFileSync(nodePath.join(rootDir, "f.txt"), "utf8")).toBe("before\n");
    unlinkSync(lock);
    expect((await edit).error).toBeUndefined();
    expect(readFileSync(nodePath.join(rootDir, "f.txt"), "utf8")).toBe("after\n");
  });
});

describe("FilesystemBackend: quota", () => {
  it("refuses writes, edits and uploads beyond it; shrinking and deleting make room", async () => {
    const { fs: b } = backend({ quota: { maxBytes: 10, maxFiles: 2 } });
    expect((await b.write("/a", "12345")).error).toBeUndefined();
    expect(await b.write("/b", "123456")).toMatchObject({ code: "quota_exceeded" });
    expect((await b.write("/b", "12345")).error).toBeUndefined();
    expect(await b.write("/c", "")).toMatchObject({ code: "quota_exceeded" });
    expect(await b.edit("/a", "1", "1x")).toMatchObject({ code: "quota_exceeded" });
    expect((await b.uploadFiles([["/a", new Uint8Array(6)]]))[0]!.error).toBe("permission_denied");
    expect((await b.edit("/a", "12345", "1")).error).toBeUndefined();
    await b.delete("/b");
    expect((await b.write("/c", "123456789")).error).toBeUndefined();
  });

  it("concurrent writers cannot overshoot it together", async () => {
    const { rootDir, fs: b } = backend({ quota: { maxBytes: 100 } });
    const results = await Promise.all(Array.from({ length: 30 }, (_, i) => b.write(`/d${i % 3}/f${i}`, "0123456789")));
    expect(results.filter((r) => r.error === undefined)).toHaveLength(10);
    expect(results.filter((r) => r.code === "quota_exceeded")).toHaveLength(20);
    let total = 0;
    for (const dir of ["d0", "d1", "d2"]) for (const name of readdirSync(nodePath.join(rootDir, dir))) total += readFileSync(nodePath.join(rootDir, dir, name)).length;
    expect(total).toBe(100);
  });

  it("measures again before refusing, so files others removed are not counted", async () => {
    const { rootDir, fs: b } = backend({ quota: { maxFiles: 2 } });
    await b.write("/a", "a");
    await b.write("/b", "b");
    expect(await b.write("/c", "c")).toMatchObject({ code: "quota_exceeded" });
    rmSync(nodePath.join(rootDir, "a"));
    expect((await b.write("/c", "c")).error).toBeUndefined();
  });
});

describe("FilesystemBackend: arguments", () => {
  it("rejects non-array batches and hostile patterns with invalid_argument; echoes requested paths", async () => {
    const { fs: b } = backend();
    for (const bad of ["/x", null, 7, { length: 1 }]) {
      expect(isStrataError(await b.uploadFiles(bad as never).catch((e: unknown) => e), "invalid_argument")).toBe(true);
      expect(isStrataError(await b.downloadFiles(bad as never).catch((e: unknown) => e), "invalid_argument")).toBe(true);
    }
    expect(await b.uploadFiles([["a//b/./c.txt", new Uint8Array([1])]])).toEqual([{ path: "a//b/./c.txt", error: null }]);
    expect((await b.downloadFiles(["a//b/./c.txt"]))[0]!.path).toBe("a//b/./c.txt");
    expect(isStrataError(await b.grep("x".repeat(128 * 1024)).catch((e: unknown) => e), "invalid_argument")).toBe(true);
    expect(isStrataError(await b.grep("a\0b").catch((e: unknown) => e), "invalid_argument")).toBe(true);
  });
});

describe("LocalSandbox file operations are confined like FilesystemBackend's", () => {
  function planted() {
    const outside = tempDir();
    writeFileSync(nodePath.join(outside, "secret.txt"), "host secret\n");
    const sandbox = new LocalSandbox({ workspace: tempDir() });
    cleanup.push(() => sandbox.close());
    symlinkSync(nodePath.join(outside, "secret.txt"), nodePath.join(sandbox.workspace, "link.txt"));
    symlinkSync(outside, nodePath.join(sandbox.workspace, "dirlink"));
    return { outside, sandbox, seed: toSeedProtocol(sandbox) };
  }

  it("never reads, writes, edits, deletes, lists, globs or greps through a symlink to the host", async () => {
    const { outside, seed } = planted();
    expect(await seed.read("/link.txt")).toMatch(/^Error: .*symbolic link/);
    expect(await seed.read("/dirlink/secret.txt")).toMatch(/^Error: .*symbolic link/);
    await expect(seed.readRaw("/link.txt")).rejects.toMatchObject({ code: "permission_denied" });
    expect(await seed.write("/dirlink/planted.txt", "x")).toMatchObject({ code: "permission_denied" });
    expect(await seed.write("/link.txt", "x", { overwrite: true })).toMatchObject({ code: "permission_denied" });
    expect(await seed.edit("/link.txt", "host", "owned")).toMatchObject({ code: "permission_denied" });
    expect(await seed.edit("/dirlink/secret.txt", "host", "owned")).toMatchObject({ code: "permission_denied" });
    expect(await seed.delete("/dirlink/secret.txt")).toMatchObject({ code: "permission_denied" });
    await expect(seed.lsInfo("/dirlink")).resolves.toEqual([expect.objectContaining({ path: "/dirlink", is_dir: false })]);
    expect((await seed.globInfo("**/*.txt")).map((i) => i.path)).toEqual([]);
    expect((await seed.grep("secret")).matches).toEqual([]);
    expect((await seed.grep("host")).matches).toEqual([]);
    expect(readFileSync(nodePath.join(outside, "secret.txt"), "utf8")).toBe("host secret\n");
    expect(existsSync(nodePath.join(outside, "planted.txt"))).toBe(false);
    // Deleting the link removes the link, never what it points to.
    expect((await seed.delete("/link.txt")).error).toBeUndefined();
    expect(existsSync(nodePath.join(outside, "secret.txt"))).toBe(true);
  });

  it("keeps a quota by default and can turn it off", async () => {
    const small = new LocalSandbox({ quota: { maxFiles: 1 } });
    const smallSeed = toSeedProtocol(small);
    cleanup.push(() => small.close());
    expect((await smallSeed.write("/a", "a")).error).toBeUndefined();
    expect(await smallSeed.write("/b", "b")).toMatchObject({ code: "quota_exceeded" });
    const defaulted = new LocalSandbox();
    cleanup.push(() => defaulted.close());
    expect(defaulted.quota).toEqual({ maxBytes: 1024 * 1024 * 1024, maxFiles: 100_000 });
    const unlimited = new LocalSandbox({ quota: false });
    cleanup.push(() => unlimited.close());
    expect(unlimited.quota).toBeUndefined();
  });

  it("20 concurrent edits of one file all land", async () => {
    const sandbox = new LocalSandbox();
    const sandboxSeed = toSeedProtocol(sandbox);
    cleanup.push(() => sandbox.close());
    await sandboxSeed.write("/f.txt", lines(0, 20));
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => sandboxSeed.edit("/f.txt", `line ${i}\n`, `edited ${i}\n`)));
    for (const result of results) expect(result.error).toBeUndefined();
    const text = await fs.readFile(nodePath.join(sandbox.workspace, "f.txt"), "utf8");
    for (let i = 0; i < 20; i++) expect(text).toContain(`edited ${i}`);
  });

  it("grep with a huge or NUL pattern is invalid_argument, never a raw spawn error", async () => {
    const sandbox = new LocalSandbox();
    const sandboxSeed = toSeedProtocol(sandbox);
    cleanup.push(() => sandbox.close());
    await sandboxSeed.write("/f.txt", "x");
    await expect(sandboxSeed.grep("x".repeat(128 * 1024))).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(sandboxSeed.grep("a\0b")).rejects.toMatchObject({ code: "invalid_argument" });
    expect(await sandboxSeed.grepRaw("x".repeat(128 * 1024))).toMatch(/^Error: /);
  });

  it("execute with a NUL in the command or env is invalid_argument", async () => {
    const sandbox = new LocalSandbox();
    const sandboxSeed = toSeedProtocol(sandbox);
    cleanup.push(() => sandbox.close());
    await expect(sandboxSeed.execute("echo a\0b")).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(sandboxSeed.execute("echo", { env: { X: "a\0b" } })).rejects.toMatchObject({ code: "invalid_argument" });
  });
});
