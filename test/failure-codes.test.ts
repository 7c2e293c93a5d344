/**
 * Every code of the failure table (docs/contract.md, "One way to fail")
 * reaching a caller of the native API in the one shape, provoked the way a
 * user would meet it, on real engines. Nothing here may throw.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import type { ErrorCode } from "../core/errors.js";
import type { Result } from "../core/types.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { MemoryStore } from "../stores/memory.js";
import { PostgresStore } from "../stores/postgres.js";
import { SqliteStore } from "../stores/sqlite.js";
import { requireService } from "./support/runtime-services.js";

const dirs: string[] = [];
const scratch = () => {
  const dir = mkdtempSync(join(tmpdir(), "strata-codes-"));
  dirs.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** The one shape: `{ error: { code, message, path? } }`, nothing else beside it. */
function expectFailure(result: Result<object>, code: ErrorCode, path?: string): void {
  expect(Object.keys(result)).toEqual(["error"]);
  expect(result.error?.code).toBe(code);
  expect(result.error?.message).toBeTypeOf("string");
  expect(result.error?.message.length).toBeGreaterThan(10);
  if (path !== undefined) expect(result.error?.path).toBe(path);
  expect(JSON.parse(JSON.stringify(result))).toEqual(result);
}

describe("every failure code reaches the caller in the one shape", () => {
  const state = () => new StateBackend({ quota: { maxBytes: 100, maxFiles: 5 }, maxFileSize: 50 });

  it("file_not_found, is_directory, not_a_directory, already_exists, invalid_path, invalid_argument", async () => {
    const b = state();
    await b.write("/d/f.txt", "x");
    expectFailure(await b.read("/nope.txt"), "file_not_found", "/nope.txt");
    expectFailure(await b.read("/d"), "is_directory", "/d");
    expectFailure(await b.write("/d/f.txt/under", "x"), "not_a_directory");
    expectFailure(await b.write("/d/f.txt", "x"), "already_exists", "/d/f.txt");
    expectFailure(await b.read("/d/../etc/passwd"), "invalid_path");
    expectFailure(await b.read("/d/f.txt", { offset: 5 }), "invalid_argument", "/d/f.txt");
  });

  it("permission_denied, binary_file, no_match, ambiguous_match", async () => {
    const b = state();
    expectFailure(await b.delete("/"), "permission_denied");
    await b.write("/bin", "\0\x01");
    expectFailure(await b.edit("/bin", "\x01", "x"), "binary_file", "/bin");
    await b.write("/t.txt", "a a");
    expectFailure(await b.edit("/t.txt", "b", "c"), "no_match", "/t.txt");
    expectFailure(await b.edit("/t.txt", "a", "c"), "ambiguous_match", "/t.txt");
  });

  it("too_large and quota_exceeded", async () => {
    const b = state();
    expectFailure(await b.write("/big.txt", "x".repeat(60)), "too_large", "/big.txt");
    for (let i = 0; i < 5; i++) await b.write(`/f${i}`, "x");
    expectFailure(await b.write("/one-too-many", "x"), "quota_exceeded", "/one-too-many");
  });

  it("conflict: concurrent edits with no retries left", async () => {
    const b = new StoreBackend({ store: new MemoryStore(), namespace: ["codes"], editAttempts: 1 });
    const lines = Array.from({ length: 20 }, (_, i) => `<line ${i}>`);
    await b.write("/race.txt", lines.join("\n"));
    const results = await Promise.all(lines.map((line) => b.edit("/race.txt", line, `${line}!`)));
    const conflicts = results.filter((r) => r.error);
    expect(conflicts.length).toBeGreaterThan(0);
    for (const result of conflicts) expectFailure(result, "conflict", "/race.txt");
  });

  it("timeout: a SQLite store whose write lock another connection holds past the busy timeout", async () => {
    const file = join(scratch(), "held.db");
    const store = new SqliteStore({ path: file, busyTimeoutMs: 50 });
    const holder = new Database(file);
    holder.exec("BEGIN IMMEDIATE");
    try {
      expectFailure(await new StoreBackend({ store, namespace: ["codes"] }).write("/a.txt", "x"), "timeout");
    } finally {
      holder.exec("ROLLBACK");
      holder.close();
      store.close();
    }
  });

  it("busy: a PostgreSQL store whose every connection stays taken past acquireTimeoutMs", async () => {
    const url = requireService("STRATA_POSTGRES_URL", "10-postgres.sh");
    const table = `codes_${process.pid}_${Date.now()}`;
    const store = new PostgresStore({ connectionString: url, table, maxConnections: 1, acquireTimeoutMs: 100 });
    const files = new StoreBackend({ store, namespace: ["codes"] });
    await files.write("/ready.txt", "x");
    const locker = new pg.Client({ connectionString: url });
    await locker.connect();
    try {
      await locker.query("BEGIN");
      await locker.query(`LOCK TABLE public.${table} IN ACCESS EXCLUSIVE MODE`);
      const held = files.write("/waits.txt", "x"); // takes the only connection and waits on the lock
      await new Promise((resolve) => setTimeout(resolve, 50));
      expectFailure(await files.read("/ready.txt"), "busy");
      await locker.query("ROLLBACK");
      expect((await held).error).toBeUndefined();
    } finally {
      await locker.query(`DROP TABLE IF EXISTS public.${table} CASCADE`).catch(() => undefined);
      await locker.end();
      await store.close();
    }
  });

  it("unavailable: a closed store", async () => {
    const store = new MemoryStore();
    const files = new StoreBackend({ store, namespace: ["codes"] });
    await store.close();
    expectFailure(await files.read("/a.txt"), "unavailable");
  });

  it("unsupported: a command in a workspace without a sandbox", async () => {
    const composite = new CompositeBackend({ default: new StateBackend(), routes: {} });
    expectFailure(await composite.execute("echo hi"), "unsupported");
  });

  it("aborted and sandbox_closed: a command stopped by its signal, then a closed sandbox", async () => {
    const sandbox = new LocalSandbox();
    const controller = new AbortController();
    const running = sandbox.execute("sleep 30", { signal: controller.signal });
    setTimeout(() => controller.abort(new Error("the user pressed stop")), 100);
    const aborted = await running;
    expectFailure(aborted, "aborted");
    expect(aborted.error?.message).toContain("the user pressed stop");
    await sandbox.close();
    expectFailure(await sandbox.execute("echo hi"), "sandbox_closed");
    expectFailure(await sandbox.read("/a.txt"), "sandbox_closed");
  });

  it("io_error: a disk that is full (a 64 KiB tmpfs)", async () => {
    const root = scratch();
    mkdirSync(join(root, "small"));
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", join(root, "small")]);
    try {
      const disk = new FilesystemBackend({ workspace: join(root, "small") });
      const result = await disk.write("/big.bin", "x".repeat(1024 * 1024));
      expectFailure(result, "io_error", "/big.bin");
      expect(result.error?.message).not.toContain(root);
    } finally {
      execFileSync("umount", [join(root, "small")]);
    }
  });
});
