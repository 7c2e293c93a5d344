/**
 * The audit wrapper: every native operation recorded (over StateBackend and
 * a bubblewrap sandbox), sinks that throw, reject or hang change no answer,
 * concurrent callers each get their own record and context, and queries by
 * path, glob and time, in memory and in a Store that survives a reopen.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { audited, MemoryAuditLog, StoreAuditLog, type AuditRecord } from "../backends/audit.js";
import { StateBackend } from "../backends/state.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { MemoryStore } from "../stores/memory.js";
import { randomUUID } from "node:crypto";
import { PostgresStore } from "../stores/postgres.js";
import { RedisStore } from "../stores/redis.js";
import { SqliteStore } from "../stores/sqlite.js";
import type { Store } from "../stores/store.js";
import { serviceUrl } from "./support/servers.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const dirs: string[] = [];
afterAll(() => dirs.forEach((dir) => rmSync(dir, { recursive: true, force: true })));

/** Every native file operation once, some failing, in a fixed order. */
async function everyOperation(backend: import("../core/protocol.js").Backend, at = "") {
  const p = (path: string) => `${at}${path}`;
  return [
    await backend.write(p("/a.txt"), "héllo\n"),
    await backend.write(p("/a.txt"), "again"),
    await backend.read(p("/a.txt")),
    await backend.readRaw(p("/a.txt")),
    await backend.edit(p("/a.txt"), "héllo", "hi"),
    await backend.ls(p("/")),
    await backend.stat(p("/a.txt")),
    await backend.grep("hi", { path: p("/") }),
    await backend.glob("*.txt", { path: p("/") }),
    await backend.mkdir(p("/d"), { recursive: true }),
    await backend.copy(p("/a.txt"), p("/d/b.txt")),
    await backend.move(p("/d/b.txt"), p("/d/c.txt")),
    await backend.uploadFiles([[p("/u.bin"), bytes("12345")]]),
    await backend.downloadFiles([p("/u.bin"), p("/missing")]),
    await backend.delete(p("/u.bin")),
    await backend.read(p("/missing")),
  ];
}

const expectedOperations = [
  "write", "write", "read", "readRaw", "edit", "ls", "stat", "grep", "glob", "mkdir", "copy", "move", "uploadFiles", "downloadFiles", "delete", "read",
];

describe("audit: what is recorded", () => {
  it("records every native operation on StateBackend: name, paths, sizes, code, time, duration, context", async () => {
    const log = new MemoryAuditLog();
    const backend = audited(new StateBackend(), { log, context: { toolCallId: "call-1" } });
    const before = Date.now();
    const answers = await everyOperation(backend);
    await backend.flush();
    expect(log.records.map((r) => r.operation)).toEqual(expectedOperations);
    expect(log.records.map((r) => r.seq)).toEqual(expectedOperations.map((_, i) => i));
    for (const record of log.records) {
      expect(record.context).toEqual({ toolCallId: "call-1" });
      expect(record.time).toBeGreaterThanOrEqual(before);
      expect(record.durationMs).toBeGreaterThanOrEqual(0);
    }
    const [write, overwrite, read, raw, edit, ls, stat, grep, glob, , copy, move, upload, download, , missing] = log.records as AuditRecord[];
    expect(write).toMatchObject({ paths: ["/a.txt"], bytes: 7, ok: true });
    expect(overwrite).toMatchObject({ ok: false, code: "already_exists" });
    expect(answers[1]!.error?.code).toBe("already_exists");
    expect(read).toMatchObject({ bytes: 6, ok: true });
    expect(raw).toMatchObject({ bytes: 7 });
    expect(edit).toMatchObject({ bytes: 2, count: 1, ok: true });
    expect(ls).toMatchObject({ paths: ["/"], count: 1 });
    expect(stat).toMatchObject({ bytes: 3 });
    expect(grep).toMatchObject({ count: 1 });
    expect(glob).toMatchObject({ count: 1 });
    expect(copy).toMatchObject({ paths: ["/a.txt", "/d/b.txt"], ok: true });
    expect(move).toMatchObject({ paths: ["/d/b.txt", "/d/c.txt"], ok: true });
    expect(upload).toMatchObject({ paths: ["/u.bin"], bytes: 5, count: 1 });
    expect(download).toMatchObject({ paths: ["/u.bin", "/missing"], bytes: 5, count: 2, ok: true });
    expect(missing).toMatchObject({ paths: ["/missing"], ok: false, code: "file_not_found" });
    expect(backend.stats).toMatchObject({ recorded: 16, failed: 0, dropped: 0, backlog: 0, inFlight: 0 });
  });

  it("answers exactly what the wrapped backend answers", async () => {
    const plain = await everyOperation(new StateBackend());
    const wrapped = await everyOperation(audited(new StateBackend(), { log: new MemoryAuditLog() }));
    const strip = (value: unknown) => JSON.parse(JSON.stringify(value, (k, v: unknown) => (k === "modified_at" || k === "created_at" ? "t" : v instanceof Uint8Array ? [...v] : v))) as unknown;
    expect(strip(wrapped)).toEqual(strip(plain));
  });

  it("keeps a hostile argument's toString out of the record and the answer unchanged", async () => {
    const log = new MemoryAuditLog();
    const backend = audited(new StateBackend(), { log });
    const hostile = { toString: 1 } as unknown as string;
    const answer = await backend.read(hostile);
    expect(answer.error?.code).toBe("invalid_path");
    expect(log.records[0]).toMatchObject({ operation: "read", paths: ["[object]"], ok: false, code: "invalid_path" });
  });

  it("records a contract-breaking throw as `thrown` and lets it through", async () => {
    const log = new MemoryAuditLog();
    const broken = new StateBackend();
    broken.ls = () => Promise.reject(new Error("boom"));
    const backend = audited(broken, { log });
    await expect(backend.ls("/")).rejects.toThrow("boom");
    expect(log.records[0]).toMatchObject({ operation: "ls", ok: false, code: "thrown" });
  });

  it("records execute, spawn and its end, files and close on a bubblewrap sandbox", async () => {
    const missing = await BubblewrapSandbox.unavailableReason();
    expect(missing).toBeUndefined();
    const log = new MemoryAuditLog();
    const sandbox = audited(new BubblewrapSandbox(), { log });
    const root = sandbox.root;
    try {
      await everyOperation(sandbox, root);
      const run = await sandbox.execute("printf abc; exit 3");
      expect(run).toMatchObject({ output: "abc", exitCode: 3 });
      const spawned = await sandbox.spawn("cat >/dev/null; exit 2", { cwd: `${root}/d` });
      if (spawned.error) throw new Error(spawned.error.message);
      await spawned.stdin.close();
      await spawned.stdout.cancel();
      await spawned.stderr.cancel();
      expect(await spawned.wait()).toEqual({ exitCode: 2 });
      await spawned.wait();
    } finally {
      await sandbox.close();
    }
    await sandbox.flush();
    expect(log.records.map((r) => r.operation)).toEqual([...expectedOperations, "execute", "spawn", "spawn.exit", "close"]);
    const byOp = (op: string) => log.records.find((r) => r.operation === op)!;
    expect(byOp("execute")).toMatchObject({ command: "printf abc; exit 3", paths: [root], bytes: 3, exitCode: 3, ok: true });
    expect(byOp("spawn")).toMatchObject({ paths: [`${root}/d`], ok: true });
    expect(byOp("spawn.exit")).toMatchObject({ exitCode: 2, ok: true });
    expect(byOp("write")).toMatchObject({ paths: [`${root}/a.txt`], bytes: 7 });
    expect(log.records.find((r) => r.operation === "read" && !r.ok)).toMatchObject({ code: "file_not_found" });
  }, 60_000);
});

describe("audit: a sink that fails or hangs changes nothing", () => {
  it("a throwing sink: same answers, records kept in the backlog and counted, flushed once the sink recovers", async () => {
    let down = true;
    const taken: AuditRecord[] = [];
    const sink = {
      append(record: AuditRecord) {
        if (down) throw new Error("sink down");
        taken.push(record);
      },
    };
    const backend = audited(new StateBackend(), { log: sink });
    expect(await backend.write("/a", "x")).toMatchObject({ path: "/a" });
    expect(await backend.read("/a")).toMatchObject({ content: "x" });
    expect(backend.stats).toMatchObject({ recorded: 0, failed: 2, backlog: 2, dropped: 0 });
    down = false;
    await backend.flush();
    expect(taken.map((r) => r.operation)).toEqual(["write", "read"]);
    expect(backend.stats).toMatchObject({ recorded: 2, failed: 2, backlog: 0 });
  });

  it("a rejecting sink: the backlog keeps the newest maxBacklog records and counts the dropped", async () => {
    const backend = audited(new StateBackend(), { log: { append: () => Promise.reject(new Error("no")) }, maxBacklog: 3 });
    for (let i = 0; i < 5; i++) await backend.write(`/f${i}`, "x");
    await backend.flush();
    // flush offered the 3 kept records once more; they failed again (counted) and stay, none lost.
    expect(backend.stats).toMatchObject({ recorded: 0, failed: 5 + 3, dropped: 2, backlog: 3, inFlight: 0 });
    expect((await backend.ls("/")).entries).toHaveLength(5);
  });

  it("a sink that never answers does not delay an operation", async () => {
    const backend = audited(new StateBackend(), { log: { append: () => new Promise<void>(() => {}) } });
    const started = performance.now();
    for (let i = 0; i < 100; i++) await backend.write(`/f${i}`, "x");
    expect(performance.now() - started).toBeLessThan(1000);
    expect(backend.stats).toMatchObject({ inFlight: 100, recorded: 0 });
    expect((await backend.read("/f99")).content).toBe("x");
  });

  it("a slow sink: records arrive after the answers, all of them", async () => {
    const log = new MemoryAuditLog();
    const slow = { append: (r: AuditRecord) => new Promise<void>((resolve) => setTimeout(() => resolve(log.append(r)), 20)) };
    const backend = audited(new StateBackend(), { log: slow });
    await backend.write("/a", "x");
    expect(log.records).toHaveLength(0);
    await backend.flush();
    expect(log.records).toHaveLength(1);
  });
});

describe("audit: concurrent callers", () => {
  it("200 concurrent calls from 20 contexts: one record each, unique seq, the caller's own context", async () => {
    const log = new MemoryAuditLog();
    const base = audited(new StateBackend(), { log });
    await Promise.all(
      Array.from({ length: 200 }, (_, i) => {
        const view = base.withContext({ toolCallId: `call-${i % 20}` });
        return i % 2 ? view.write(`/c${i % 20}/f${i}`, "x") : view.read(`/c${i % 20}/f${i - 1}`);
      }),
    );
    await base.flush();
    expect(log.records).toHaveLength(200);
    expect(new Set(log.records.map((r) => r.seq)).size).toBe(200);
    for (const record of log.records) expect(record.paths[0]!.startsWith(`/c${String(record.context!.toolCallId).slice(5)}/`)).toBe(true);
    expect(await log.query({ context: { toolCallId: "call-3" } })).toHaveLength(10);
  });
});

describe("audit: queries", () => {
  async function fill(log: MemoryAuditLog | StoreAuditLog) {
    const records: AuditRecord[] = [
      { seq: 0, operation: "write", paths: ["/src/a.ts"], ok: true, time: 1000, durationMs: 1 },
      { seq: 1, operation: "read", paths: ["/src/lib/b.ts"], ok: true, time: 2000, durationMs: 1 },
      { seq: 2, operation: "move", paths: ["/docs/x.md", "/src/x.md"], ok: true, time: 3000, durationMs: 1 },
      { seq: 3, operation: "delete", paths: ["/srcs/c.ts"], ok: false, code: "file_not_found", time: 4000, durationMs: 1, context: { toolCallId: "t" } },
      { seq: 4, operation: "execute", paths: ["/"], command: "ls", ok: true, time: 5000, durationMs: 1 },
    ];
    for (const record of records) await log.append(record);
  }
  const seqs = (records: AuditRecord[]) => records.map((r) => r.seq);

  for (const [name, make] of [
    ["memory", () => new MemoryAuditLog()],
    ["MemoryStore", () => new StoreAuditLog(new MemoryStore())],
  ] as const) {
    it(`${name}: by directory, exact path, glob, time window, operation, context`, async () => {
      const log = make();
      await fill(log);
      expect(seqs(await log.query())).toEqual([0, 1, 2, 3, 4]);
      expect(seqs(await log.query({ path: "/src" }))).toEqual([0, 1, 2]);
      expect(seqs(await log.query({ path: "/src/" }))).toEqual([0, 1, 2]);
      expect(seqs(await log.query({ path: "/src/lib/b.ts" }))).toEqual([1]);
      expect(seqs(await log.query({ glob: "**/*.ts" }))).toEqual([0, 1, 3]);
      expect(seqs(await log.query({ glob: "/src/*.md" }))).toEqual([2]);
      expect(seqs(await log.query({ from: 2000, to: 4000 }))).toEqual([1, 2]);
      expect(seqs(await log.query({ from: new Date(4000) }))).toEqual([3, 4]);
      expect(seqs(await log.query({ to: 1000 }))).toEqual([]);
      expect(seqs(await log.query({ path: "/src", from: 1500 }))).toEqual([1, 2]);
      expect(seqs(await log.query({ operation: "delete", context: { toolCallId: "t" } }))).toEqual([3]);
    });
  }

  it("a SQLite-backed log survives a reopen and pages through many records", async () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-audit-"));
    dirs.push(dir);
    const path = join(dir, "audit.db");
    const first = new SqliteStore({ path });
    const backend = audited(new StateBackend(), { log: new StoreAuditLog(first, ["audit", "run-1"]), context: { run: 1 } });
    const started = Date.now();
    for (let i = 0; i < 1200; i++) await backend.write(`/d${i % 3}/f${i}`, "x");
    await backend.flush();
    await first.close();
    const reopened = new StoreAuditLog(new SqliteStore({ path }), ["audit", "run-1"]);
    const all = await reopened.query();
    expect(all).toHaveLength(1200);
    expect(seqs(all)).toEqual(Array.from({ length: 1200 }, (_, i) => i));
    expect(await reopened.query({ path: "/d1" })).toHaveLength(400);
    expect(await reopened.query({ from: started - 1, to: Date.now() + 1, glob: "/d2/*" })).toHaveLength(400);
    expect(await reopened.query({ from: Date.now() + 1000 })).toHaveLength(0);
    await reopened.store.close();
  }, 60_000);

  for (const [name, open] of [
    ["PostgreSQL", () => new PostgresStore({ connectionString: serviceUrl("STRATA_POSTGRES_URL") })],
    ["Redis", () => new RedisStore({ url: serviceUrl("STRATA_REDIS_URL") })],
  ] as Array<[string, () => Store]>) {
    it(`a ${name}-backed log: two writers on one namespace, read back from a new connection`, async () => {
      const namespace = ["audit-test", randomUUID()];
      const stores = [open(), open()];
      const wrappers = stores.map((store, i) => audited(new StateBackend(), { log: new StoreAuditLog(store, namespace), context: { writer: i } }));
      await Promise.all(wrappers.flatMap((w, i) => Array.from({ length: 100 }, (_, n) => w.write(`/w${i}/f${n}`, "x"))));
      await Promise.all(wrappers.map((w) => w.flush()));
      expect(wrappers.map((w) => w.stats)).toEqual([0, 1].map(() => ({ recorded: 100, failed: 0, dropped: 0, backlog: 0, inFlight: 0 })));
      const reader = open();
      try {
        const log = new StoreAuditLog(reader, namespace);
        expect(await log.query()).toHaveLength(200);
        expect(await log.query({ path: "/w1" })).toHaveLength(100);
        expect((await log.query({ context: { writer: 0 } })).every((r) => r.paths[0]!.startsWith("/w0/"))).toBe(true);
      } finally {
        await reader.deleteTree(namespace, "/");
        await Promise.all([...stores, reader].map((store) => store.close()));
      }
    }, 60_000);
  }
});
