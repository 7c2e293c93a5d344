/**
 * SqliteStore on a real file: crash safety under SIGKILL, no lost updates
 * across processes, busy waiting, persistence, the trigram index,
 * listings that read only the directory asked for, and schema versions (a
 * database in the previous layout is migrated on open).
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import { isStrataError } from "../core/errors.js";
import { fileDataFromBytes, fileDataFromText, fileDataText } from "../core/filedata.js";
import { toSeedProtocol } from "../core/seed.js";
import { SqliteStore } from "../stores/sqlite.js";
import type { StoredItem } from "../stores/store.js";
import { crashFileContent, CRASH_BATCH, CRASH_FILES } from "./fixtures/sqlite-crash-content.js";

const dir = mkdtempSync(join(tmpdir(), "strata-sqlite-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let databases = 0;
const freshPath = () => join(dir, `${++databases}.db`);
const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url));

/** Runs a TypeScript fixture in its own Node process (its own SQLite connection). */
function spawnFixture(name: string, args: string[]): ChildProcessWithoutNullStreams {
  return spawn(process.execPath, ["--import", "tsx", fixture(name), ...args], { stdio: ["pipe", "pipe", "pipe"] });
}

function exited(child: ChildProcessWithoutNullStreams): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

function lines(child: ChildProcessWithoutNullStreams, onLine: (line: string) => void): { stderr: () => string } {
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  createInterface({ input: child.stdout }).on("line", onLine);
  return { stderr: () => stderr };
}

/**
 * Runs `script` in one Node process per argument list (each its own SQLite
 * connection). Each prints "ready", then waits for "go" on stdin, sent once
 * all are ready so they start together; every other line is a JSON report.
 */
async function runTogether<T>(script: string, argLists: string[][]): Promise<{ codes: Array<number | null>; reports: T[]; stderr: string }> {
  const children = argLists.map((args) =>
    spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, ...args], { stdio: ["pipe", "pipe", "pipe"] }),
  );
  const reports: T[] = [];
  let ready = 0;
  const outputs = children.map((child) =>
    lines(child, (line) => {
      if (line === "ready") {
        if (++ready === children.length) for (const c of children) c.stdin.end("go\n");
      } else {
        reports.push(JSON.parse(line) as T);
      }
    }),
  );
  const codes = (await Promise.all(children.map(exited))).map((c) => c.code);
  return { codes, reports, stderr: outputs.map((o) => o.stderr()).join("\n") };
}

describe("SqliteStore", () => {
  it("leaves every file whole or absent when the writer is SIGKILLed mid-way", async () => {
    const path = freshPath();
    const child = spawnFixture("sqlite-crash-writer.ts", [path]);
    const exit = exited(child);
    let written = 0;
    const output = lines(child, (line) => {
      written = Number(line) || written;
      // Kill once a few hundred files are in, while the writer is busy with the next ones.
      if (written >= 300 && !child.killed) child.kill("SIGKILL");
    });
    const { signal } = await exit;
    expect(signal, output.stderr()).toBe("SIGKILL");
    expect(written).toBeGreaterThanOrEqual(300);

    const store = new SqliteStore({ path });
    try {
      expect(store.client.pragma("integrity_check", { simple: true })).toBe("ok");
      const backend = new StoreBackend({ store, namespace: ["crash"] });
      const seed = toSeedProtocol(backend);
      const present = new Set<number>();
      for (let i = 0; i < CRASH_FILES; i++) {
        const file = `/files/${i % 10}/f${i}.txt`;
        const downloaded = (await seed.downloadFiles([file]))[0]!;
        if (downloaded.error === "file_not_found") continue;
        expect(downloaded.error).toBeNull();
        expect(new TextDecoder().decode(downloaded.content!), file).toBe(crashFileContent(i));
        present.add(i);
      }
      // Everything reported written (committed) survived the kill.
      for (let i = 0; i < written; i++) expect(present.has(i), `file ${i}`).toBe(true);
      // A batched upload is one transaction: all of it or none of it.
      for (let batch = 0; batch < CRASH_FILES; batch += CRASH_BATCH * 2) {
        const upload = Array.from({ length: CRASH_BATCH }, (_, k) => present.has(batch + CRASH_BATCH + k));
        expect(new Set(upload).size, `upload batch at ${batch + CRASH_BATCH}`).toBe(1);
      }
      // The directory and text indexes agree with the files.
      const listed = (await Promise.all(Array.from({ length: 10 }, (_, d) => seed.lsInfo(`/files/${d}`)))).flat();
      expect(listed).toHaveLength(present.size);
      expect((await seed.lsInfo("/files")).length).toBe(Math.min(10, present.size));
      const greps = await seed.grep("end 1");
      const expected = [...present].filter((i) => `end ${i}\n`.startsWith("end 1")).length;
      expect(greps.matches).toHaveLength(expected);
      // The store is writable again after the crash.
      expect((await seed.write("/after-crash.txt", "ok")).error).toBeUndefined();
    } finally {
      await store.close();
    }
  });

  it("loses no update when 8 processes edit the same files at once", async () => {
    const path = freshPath();
    const workers = 8;
    const edits = 500;
    const files = ["/shared/a.txt", "/shared/b.txt"];
    const setup = new StoreBackend({ store: new SqliteStore({ path }), namespace: ["edits"] });
    const setupSeed = toSeedProtocol(setup);
    for (const file of files) {
      await setupSeed.write(file, Array.from({ length: workers }, (_, w) => `w${w}=0\n`).join(""));
    }

    // Half the workers give up at the first conflict (so conflicts surface), half retry (so edits land).
    const attempts = (w: number) => (w % 2 === 0 ? "1" : "10");
    const children = Array.from({ length: workers }, (_, w) => spawnFixture("sqlite-edit-worker.ts", [path, String(w), String(edits), attempts(w), ...files]));
    const reports: Array<{ worker: number; applied: Record<string, number>; conflicts: number; failures: string[] }> = [];
    let ready = 0;
    const outputs = children.map((child) =>
      lines(child, (line) => {
        if (line === "ready") {
          if (++ready === workers) for (const c of children) c.stdin.end("go\n");
        } else {
          reports.push(JSON.parse(line));
        }
      }),
    );
    const codes = await Promise.all(children.map(exited));
    expect(codes.map((c) => c.code), outputs.map((o) => o.stderr()).join("\n")).toEqual(Array(workers).fill(0));
    expect(reports).toHaveLength(workers);

    let applied = 0;
    let conflicts = 0;
    for (const file of files) {
      const content = (await setupSeed.readRaw(file)).content;
      for (const report of reports) {
        expect(report.failures).toEqual([]);
        // The worker's line shows exactly the edits it was told succeeded.
        expect(content, `worker ${report.worker} in ${file}`).toContain(`w${report.worker}=${report.applied[file]}\n`);
        applied += report.applied[file]!;
      }
    }
    for (const report of reports) conflicts += report.conflicts;
    expect(applied + conflicts).toBe(workers * edits);
    expect(applied).toBeGreaterThan(0);
    console.info(`lost-update test: ${applied} edits applied, ${conflicts} reported as conflicts, none lost`);
    await setup.store.close();
  });

  it("makes a second connection wait for the write lock, then fail with a timeout, never corrupt", async () => {
    const path = freshPath();
    const holder = new SqliteStore({ path });
    const waiter = new SqliteStore({ path, busyTimeoutMs: 100 });
    await holder.put(["ns"], "/f.txt", fileDataFromText("before"));
    const lock = holder.client;
    lock.exec("BEGIN IMMEDIATE");
    const started = performance.now();
    const error = await waiter.put(["ns"], "/f.txt", fileDataFromText("blocked")).catch((e: unknown) => e);
    expect(performance.now() - started).toBeGreaterThanOrEqual(90);
    expect(isStrataError(error, "timeout")).toBe(true);
    expect((await waiter.get(["ns"], "/f.txt"))?.value).toMatchObject({ content: "before" });
    lock.exec("COMMIT");
    await waiter.put(["ns"], "/f.txt", fileDataFromText("after"));
    expect((await holder.get(["ns"], "/f.txt"))?.value).toMatchObject({ content: "after" });
    await Promise.all([holder.close(), waiter.close()]);
  });

  it("persists across reopening, with versions that keep growing", async () => {
    const path = freshPath();
    const first = new SqliteStore({ path });
    const v1 = { content: ["a", "", 'quote " and \\ backslash'], created_at: "2024-01-01T00:00:00.000Z", modified_at: "2024-01-01T00:00:00.000Z" };
    const version = await first.put(["p"], "/legacy.txt", v1);
    await toSeedProtocol(new StoreBackend({ store: first, namespace: ["p"] })).uploadFiles([["/bin", new Uint8Array([0, 1, 255])]]);
    await first.close();
    const second = new SqliteStore({ path });
    expect(await second.get(["p"], "/legacy.txt")).toEqual({ key: "/legacy.txt", value: v1, version });
    expect(await toSeedProtocol(new StoreBackend({ store: second, namespace: ["p"] })).downloadFiles(["/bin"])).toEqual([
      { path: "/bin", content: new Uint8Array([0, 1, 255]), error: null },
    ]);
    expect(await second.put(["p"], "/new", fileDataFromText("x"))).toBeGreaterThan(version + 1);
    await second.close();
  });

  it("keeps text UTF-8 cannot hold (lone surrogates) exactly, and refuses such paths", async () => {
    const store = new SqliteStore({ path: ":memory:" });
    const backend = new StoreBackend({ store });
    const seed = toSeedProtocol(backend);
    expect((await seed.write("/lone.txt", "a\ud800b\nneedle \udc00")).error).toBeUndefined();
    expect((await seed.readRaw("/lone.txt")).content).toBe("a\ud800b\nneedle \udc00");
    expect((await seed.grep("needle \udc00")).matches).toEqual([{ path: "/lone.txt", line: 2, text: "needle \udc00" }]);
    expect((await seed.grep("needle")).matches).toHaveLength(1);
    expect(await seed.write("/\udc00.txt", "x")).toMatchObject({ code: "invalid_path" });
    expect((await seed.write("/pair.txt", "rocket \ud83d\ude80")).error).toBeUndefined();
    expect((await seed.readRaw("/pair.txt")).content).toBe("rocket 🚀");
    expect((await store.list(["filesystem"])).items.map((k) => k.key)).toEqual(["/lone.txt", "/pair.txt"]);
    await store.close();
  });

  it("keeps the text index in step as a file turns binary, text again, and is deleted", async () => {
    const store = new SqliteStore({ path: ":memory:" });
    // Enough rows that searches take the trigram index rather than a scan.
    await store.putMany(["ns"], Array.from({ length: 5000 }, (_, i) => [`/fill/${i}`, fileDataFromText("filler")] as const));
    const keys = async () => (await collect(store.search(["ns"], "needle", "/"))).map((item) => item.key);
    await store.put(["ns"], "/f", fileDataFromText("a needle"));
    expect(await keys()).toEqual(["/f"]);
    await store.put(["ns"], "/f", fileDataFromBytes(new Uint8Array([0, ...new TextEncoder().encode("needle")])));
    expect(await keys()).toEqual([]);
    await store.put(["ns"], "/f", fileDataFromText("needle again"));
    expect(await keys()).toEqual(["/f"]);
    await store.put(["ns"], "/f", fileDataFromText("changed"));
    expect(await keys()).toEqual([]);
    await store.put(["ns"], "/dir/g", fileDataFromText("needle"));
    expect(await store.deleteTree(["ns"], "/dir")).toEqual(["/dir/g"]);
    expect(await keys()).toEqual([]);
    await store.close();
  });

  it("checks the tree in putFile's own transaction, against what other connections wrote", async () => {
    const path = freshPath();
    const first = new SqliteStore({ path });
    const second = new SqliteStore({ path });
    const ns = ["tree"];
    const code = (promise: Promise<unknown>) =>
      promise.then(
        () => "stored",
        (error: unknown) => (isStrataError(error) ? error.code : "other"),
      );
    try {
      await first.putFile(ns, "/a/b.txt", fileDataFromText("b"), { expectedVersion: null });
      await first.putFile(ns, "/x", fileDataFromText("x"), { expectedVersion: null });
      expect(await code(second.putFile(ns, "/a", fileDataFromText("a")))).toBe("is_directory");
      expect(await code(second.putFile(["empty"], "/", fileDataFromText("root")))).toBe("is_directory");
      expect(await code(second.putFile(ns, "/a/b.txt/c", fileDataFromText("c")))).toBe("not_a_directory");
      expect(await code(second.putFile(ns, "/x/y/z", fileDataFromText("z")))).toBe("not_a_directory");
      expect(await code(second.putFile(ns, "/a/b.txt", fileDataFromText("again"), { expectedVersion: null }))).toBe("conflict");
      for (const key of ["/a", "/a/b.txt/c", "/x/y/z"]) expect(await second.get(ns, key)).toBeUndefined();
      expect((await second.listDirectory(ns, "/")).dirs).toEqual(["a"]);
      expect(await code(second.putFile(ns, "/a/c.txt", fileDataFromText("c"), { expectedVersion: null }))).toBe("stored");
      expect((await first.listDirectory(ns, "/a")).files.map((f) => f.key).sort()).toEqual(["/a/b.txt", "/a/c.txt"]);
      // The backend's create goes through putFile and reports the tree's verdicts as its own errors.
      const backend = new StoreBackend({ store: second, namespace: ns });
      const seed = toSeedProtocol(backend);
      expect((await seed.write("/a", "dir")).error).toMatch(/directory/);
      expect((await seed.write("/x/y", "under a file")).error).toMatch(/not a directory/i);
      expect((await seed.write("/a/b.txt", "exists")).error).toMatch(/exists/);
    } finally {
      await first.close();
      await second.close();
    }
  });

  it("creates the parent directories of its file, as the README's .strata/memories.db needs", async () => {
    const path = join(dir, `parents-${++databases}`, ".strata", "memories.db");
    const store = new SqliteStore({ path });
    await store.put(["ns"], "/f", fileDataFromText("kept"));
    await store.close();
    const again = new SqliteStore({ path });
    expect(fileDataText((await again.get(["ns"], "/f"))!.value)).toBe("kept");
    await again.close();
  });

  it("refuses a missing path (no silent temporary database); an in-memory one is asked for by name", async () => {
    for (const path of [undefined, "", null, 42]) {
      expect(() => new SqliteStore({ path: path as unknown as string })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    }
    expect(() => new SqliteStore(undefined as unknown as { path: string })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    const memory = new SqliteStore({ path: ":memory:" });
    await memory.put(["ns"], "/f", fileDataFromText("x"));
    expect(await memory.get(["ns"], "/f")).toBeDefined();
    await memory.close();
  });

  it("says in words why it cannot open the file, never the host path nor an exception's name", () => {
    const file = join(dir, `plain-${++databases}`);
    writeFileSync(file, "not a directory");
    const cases: Array<[string, RegExp]> = [
      [join(file, "store.db"), /a parent of it is a file/],
      [dir, /cannot be opened|is a directory/],
      [file, /not a SQLite database/],
    ];
    for (const [path, why] of cases) {
      let error: unknown;
      try {
        new SqliteStore({ path });
      } catch (e) {
        error = e;
      }
      expect(isStrataError(error, "unavailable"), path).toBe(true);
      const message = (error as Error).message;
      expect(message).toMatch(why);
      expect(message).not.toContain(dir);
      expect(message).not.toMatch(/TypeError|SqliteError|Error\b/);
    }
  });

  it("greps through the trigram index exactly as StateBackend does", async () => {
    const store = new SqliteStore({ path: freshPath() });
    const backend = new StoreBackend({ store, namespace: ["fts"] });
    const seed = toSeedProtocol(backend);
    const reference = toSeedProtocol(new StateBackend());
    // More files than the store scans directly, so searches take the index.
    const files: Array<[string, string]> = [];
    for (let i = 0; i < 5000; i++) files.push([`/src/m${i % 50}/f${i}.ts`, `export const v${i} = ${i};\n// note ${i % 13}\n`]);
    files.push(
      ["/src/odd/quotes.txt", 'say "hi" AND NEAR(x, y) col:umn -minus ^caret *star\nCase Needle\nneedle\r\n'],
      ["/src/odd/unicode.txt", "emoji 🚀 rocket\nünïcødé text\n文件 name\n"],
      ["/src/odd/nul.txt", "needle\0binary"],
    );
    const encoder = new TextEncoder();
    const upload = files.map(([path, content]) => [path, encoder.encode(content)] as const);
    expect((await seed.uploadFiles(upload)).every((r) => r.error === null)).toBe(true);
    await reference.uploadFiles(upload);
    await seed.uploadFiles([["/src/odd/bin.dat", Uint8Array.from([0xff, 0xfe, 110, 101, 101, 100, 108, 101])]]);
    await reference.uploadFiles([["/src/odd/bin.dat", Uint8Array.from([0xff, 0xfe, 110, 101, 101, 100, 108, 101])]]);
    const patterns = ['"hi"', '"', "AND NEAR(", "col:umn", "-minus", "^caret", "*star", "Needle", "needle", "NEEDLE", "🚀 r", "ünï", "文件", "v4999 ", "note 12", "= 1", "e", "//", ";\n".trim()];
    for (const pattern of patterns) {
      for (const [path, glob] of [[null, null], ["/src", "**/*.txt"], ["/src/m7", null], ["/src/odd/quotes.txt", null]] as const) {
        expect(await seed.grep(pattern, path, glob), `${pattern} in ${path} ${glob}`).toEqual(await reference.grep(pattern, path, glob));
      }
    }
    expect(await seed.grep("note", "/src", "*.ts", { maxCount: 7 })).toEqual(await reference.grep("note", "/src", "*.ts", { maxCount: 7 }));
    const started = performance.now();
    const rare = await seed.grep("v4242 ");
    console.info(`grep 'v4242 ' over 5003 files (10k lines) via the trigram index: ${(performance.now() - started).toFixed(2)} ms`);
    expect(rare.matches).toEqual([{ path: "/src/m42/f4242.ts", line: 1, text: "export const v4242 = 4242;" }]);
    await store.close();
  });

  it("lists a 1k-entry directory among 200k keys without reading the rest", async () => {
    const store = new SqliteStore({ path: freshPath() });
    const backend = new StoreBackend({ store, namespace: ["big"] });
    const seed = toSeedProtocol(backend);
    const built = performance.now();
    // Binary content: ls never looks at it, and skipping the text index keeps the build short.
    const bytes = fileDataFromBytes(new Uint8Array([0, 1, 2]));
    for (let d = 0; d < 200; d++) {
      await store.putMany(["big"], Array.from({ length: 1000 }, (_, f) => [`/big/d${d}/f${f}.bin`, bytes] as const));
    }
    await store.putMany(["big"], Array.from({ length: 10 }, (_, s) => [`/big/d7/sub${s}/x.txt`, fileDataFromText("x")] as const));
    const buildMs = performance.now() - built;

    for (let i = 0; i < 5; i++) await seed.lsInfo("/big/d7");
    const times: number[] = [];
    let listing = await seed.lsInfo("/big/d7");
    for (let i = 0; i < 21; i++) {
      const started = performance.now();
      listing = await seed.lsInfo("/big/d7");
      times.push(performance.now() - started);
    }
    times.sort((a, b) => a - b);
    expect(listing).toHaveLength(1010);
    expect(listing.filter((e) => e.is_dir).map((e) => e.path)).toEqual(Array.from({ length: 10 }, (_, s) => `/big/d7/sub${s}/`));
    expect((await seed.lsInfo("/big")).length).toBe(200);
    const median = times[10]!;
    console.info(`ls of 1010 entries among 200,010 keys: median ${median.toFixed(2)} ms (build ${(buildMs / 1000).toFixed(1)} s)`);
    expect(median).toBeLessThan(50);
    await store.close();
  });

  it("reports write and read throughput of 2000 small files", async () => {
    const store = new SqliteStore({ path: freshPath() });
    const backend = new StoreBackend({ store, namespace: ["throughput"] });
    const seed = toSeedProtocol(backend);
    let started = performance.now();
    for (let i = 0; i < 2000; i++) {
      const result = await seed.write(`/t/d${i % 20}/f${i}.txt`, `file ${i}\n`);
      expect(result.error).toBeUndefined();
    }
    const writeMs = performance.now() - started;
    started = performance.now();
    for (let i = 0; i < 2000; i++) expect(await seed.read(`/t/d${i % 20}/f${i}.txt`)).toBe(`     1\tfile ${i}`);
    const readMs = performance.now() - started;
    started = performance.now();
    const upload = Array.from({ length: 2000 }, (_, i) => [`/u/d${i % 20}/f${i}.txt`, new TextEncoder().encode(`file ${i}\n`)] as const);
    await seed.uploadFiles(upload);
    const uploadMs = performance.now() - started;
    console.info(
      `2000 small files: write ${Math.round(2000 / (writeMs / 1000))}/s, read ${Math.round(2000 / (readMs / 1000))}/s, ` +
        `uploadFiles (one transaction) ${Math.round(2000 / (uploadMs / 1000))}/s`,
    );
    expect((await seed.globInfo("**", "/u")).length).toBe(2000);
    await store.close();
  });
});

/**
 * Version 0: the layout SqliteStore wrote before it recorded a schema
 * version, copied from stores/sqlite.ts as it was then. FROZEN: it stands for
 * databases already on disk; never edit it to follow the code.
 */
const SQLITE_V0_SCHEMA = `
CREATE TABLE IF NOT EXISTS strata_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO strata_meta (name, value) VALUES ('schema', 1), ('version', 0);
CREATE TABLE IF NOT EXISTS strata_namespaces (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS strata_files (
  id INTEGER PRIMARY KEY,
  ns INTEGER NOT NULL,
  key TEXT NOT NULL,
  parent TEXT NOT NULL,
  content TEXT NOT NULL,
  encoding TEXT NOT NULL,
  original TEXT,
  created_at TEXT NOT NULL,
  modified_at TEXT NOT NULL,
  size INTEGER NOT NULL,
  version INTEGER NOT NULL,
  UNIQUE (ns, key)
);
CREATE INDEX IF NOT EXISTS strata_files_parent ON strata_files (ns, parent, key);
CREATE TABLE IF NOT EXISTS strata_dirs (
  ns INTEGER NOT NULL,
  path TEXT NOT NULL,
  parent TEXT NOT NULL,
  files INTEGER NOT NULL,
  PRIMARY KEY (ns, path)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS strata_dirs_parent ON strata_dirs (ns, parent, path);
CREATE VIRTUAL TABLE IF NOT EXISTS strata_text USING fts5(
  content, content='', contentless_delete=1, tokenize='trigram case_sensitive 1'
);
CREATE TRIGGER IF NOT EXISTS strata_files_insert AFTER INSERT ON strata_files WHEN new.encoding <> 'base64' BEGIN
  INSERT INTO strata_text (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS strata_files_delete AFTER DELETE ON strata_files WHEN old.encoding <> 'base64' BEGIN
  DELETE FROM strata_text WHERE rowid = old.id;
END;
CREATE TRIGGER IF NOT EXISTS strata_files_update AFTER UPDATE OF content, encoding ON strata_files BEGIN
  DELETE FROM strata_text WHERE rowid = old.id;
  INSERT INTO strata_text (rowid, content) SELECT new.id, new.content WHERE new.encoding <> 'base64';
END;
`;

/**
 * Rows as the version-0 code stored them (FROZEN with the schema above):
 * namespaces by id, the file rows (text, binary, a v1 list of lines, text
 * holding a NUL kept exactly in `original`), the directory counts and the
 * version counter.
 */
const SQLITE_V0_ROWS = `
INSERT INTO strata_namespaces (id, name) VALUES (1, '["me"]'), (2, '["other"]');
INSERT INTO strata_files (ns, key, parent, content, encoding, original, created_at, modified_at, size, version) VALUES
  (1, '/notes/today.md', '/notes', '# Today' || char(10) || 'needle here' || char(10), 'utf-8', NULL, '2024-05-01T10:00:00.000Z', '2024-05-02T10:00:00.000Z', 20, 1),
  (1, '/notes/deep/x.txt', '/notes/deep', 'deep' || char(10), 'utf-8', NULL, '2024-05-01T10:00:00.000Z', '2024-05-01T10:00:00.000Z', 5, 2),
  (1, '/bin/blob', '/bin', 'AAEC/w==', 'base64', NULL, '2024-05-01T10:00:00.000Z', '2024-05-01T10:00:00.000Z', 4, 3),
  (1, '/legacy.txt', '/', 'a' || char(10) || 'b', 'lines', '["a","b"]', '2023-01-01T00:00:00.000Z', '2023-01-01T00:00:00.000Z', 3, 4),
  (1, '/nul.txt', '/', 'x' || char(65533) || 'y', 'utf-8', '"x\\u0000y"', '2024-05-01T10:00:00.000Z', '2024-05-01T10:00:00.000Z', 3, 5),
  (2, '/notes/today.md', '/notes', 'other' || char(10), 'utf-8', NULL, '2024-05-03T10:00:00.000Z', '2024-05-03T10:00:00.000Z', 6, 6);
INSERT INTO strata_dirs (ns, path, parent, files) VALUES (1, '/notes', '/', 2), (1, '/notes/deep', '/notes', 1), (1, '/bin', '/', 1), (2, '/notes', '/', 1);
UPDATE strata_meta SET value = 6 WHERE name = 'version';
`;

/** What the rows above hold, read back through the store. */
const V0_ITEMS: Array<[string[], StoredItem]> = [
  [["me"], { key: "/notes/today.md", value: { content: "# Today\nneedle here\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-02T10:00:00.000Z" }, version: 1 }],
  [["me"], { key: "/notes/deep/x.txt", value: { content: "deep\n", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 2 }],
  [["me"], { key: "/bin/blob", value: { content: "AAEC/w==", encoding: "base64", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 3 }],
  [["me"], { key: "/legacy.txt", value: { content: ["a", "b"], created_at: "2023-01-01T00:00:00.000Z", modified_at: "2023-01-01T00:00:00.000Z" }, version: 4 }],
  [["me"], { key: "/nul.txt", value: { content: "x\0y", encoding: "utf-8", created_at: "2024-05-01T10:00:00.000Z", modified_at: "2024-05-01T10:00:00.000Z" }, version: 5 }],
  [["other"], { key: "/notes/today.md", value: { content: "other\n", encoding: "utf-8", created_at: "2024-05-03T10:00:00.000Z", modified_at: "2024-05-03T10:00:00.000Z" }, version: 6 }],
];

describe("SqliteStore: schema version and migrations", () => {
  /** A database file in the version-0 layout, holding SQLITE_V0_ROWS. */
  function writeV0(): string {
    const path = freshPath();
    const raw = new Database(path);
    raw.pragma("journal_mode = WAL");
    raw.exec(SQLITE_V0_SCHEMA);
    raw.exec(SQLITE_V0_ROWS);
    raw.close();
    return path;
  }

  /** Reads the file directly, without the store. */
  function inspect<T>(path: string, read: (raw: Database.Database) => T): T {
    const raw = new Database(path, { readonly: true });
    try {
      return read(raw);
    } finally {
      raw.close();
    }
  }
  const userVersion = (path: string) => inspect(path, (raw) => raw.pragma("user_version", { simple: true }));
  const layout = (path: string) => inspect(path, (raw) => raw.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").all());
  const meta = (path: string) => inspect(path, (raw) => raw.prepare("SELECT name, value FROM strata_meta ORDER BY name").all());

  it("records version 3 in a new database", async () => {
    const path = freshPath();
    const store = new SqliteStore({ path });
    await store.close();
    expect(userVersion(path)).toBe(3);
    expect(meta(path)).toEqual([{ name: "version", value: 0 }]);
  });

  it("migrates a version-0 database to version 3 (through 1 and 2), keeping every record readable and writable", async () => {
    const path = writeV0();
    expect(userVersion(path)).toBe(0);
    const store = new SqliteStore({ path });
    try {
      expect(userVersion(path)).toBe(3);
      // The migrated layout is exactly a new database's, and the version counter survived.
      const fresh = freshPath();
      await new SqliteStore({ path: fresh }).close();
      expect(layout(path)).toEqual(layout(fresh));
      expect(meta(path)).toEqual([{ name: "version", value: 6 }]);

      for (const [ns, item] of V0_ITEMS) expect(await store.get(ns, item.key)).toEqual(item);
      expect((await store.list(["me"])).items.map((k) => [k.key, k.version, k.size])).toEqual([
        ["/bin/blob", 3, 4],
        ["/legacy.txt", 4, 3],
        ["/notes/deep/x.txt", 2, 5],
        ["/notes/today.md", 1, 20],
        ["/nul.txt", 5, 3],
      ]);
      const listing = await store.listDirectory(["me"], "/notes");
      expect({ files: listing.files.map((f) => f.key), dirs: listing.dirs }).toEqual({ files: ["/notes/today.md"], dirs: ["deep"] });
      expect((await collect(store.search(["me"], "needle", "/"))).map((item) => item.key)).toEqual(["/notes/today.md"]);

      // Writable: compare-and-set against the old versions, the tree and the directory counts kept up.
      const edited = await store.put(["me"], "/notes/today.md", fileDataFromText("# Today\nedited\n"), { expectedVersion: 1 });
      expect(edited).toBeGreaterThan(6);
      await expect(store.put(["me"], "/legacy.txt", fileDataFromText("stale"), { expectedVersion: 3 })).rejects.toMatchObject({ code: "conflict" });
      await expect(store.putFile(["me"], "/notes", fileDataFromText("dir"))).rejects.toMatchObject({ code: "is_directory" });
      await expect(store.putFile(["me"], "/bin/blob/under", fileDataFromText("x"))).rejects.toMatchObject({ code: "not_a_directory" });
      await store.putFile(["me"], "/notes/deep/y.txt", fileDataFromText("y"), { expectedVersion: null });
      expect(await store.delete(["me"], "/bin/blob", { expectedVersion: 3 })).toBe(true);
      expect((await store.listDirectory(["me"], "/")).dirs).toEqual(["notes"]);
      expect(await store.deleteTree(["me"], "/notes/deep")).toEqual(["/notes/deep/x.txt", "/notes/deep/y.txt"]);
      expect((await store.listDirectory(["me"], "/notes")).dirs).toEqual([]);
      expect((await collect(store.search(["me"], "edited", "/"))).map((item) => item.key)).toEqual(["/notes/today.md"]);
      expect(await store.get(["other"], "/notes/today.md")).toEqual(V0_ITEMS[5]![1]);
    } finally {
      await store.close();
    }
  });

  it("does not migrate again: a current database opens without taking the write lock", async () => {
    const path = writeV0();
    await new SqliteStore({ path }).close();
    const holder = new Database(path);
    holder.exec("BEGIN IMMEDIATE");
    try {
      // With the write lock held elsewhere and no busy wait, only an open that writes nothing succeeds.
      const again = new SqliteStore({ path, busyTimeoutMs: 0 });
      expect(await again.get(["me"], "/legacy.txt")).toEqual(V0_ITEMS[3]![1]);
      await again.close();
      // The same open of a database still to migrate needs the lock, and says so.
      holder.exec("ROLLBACK");
      const old = writeV0();
      const oldHolder = new Database(old);
      oldHolder.exec("BEGIN IMMEDIATE");
      expect(() => new SqliteStore({ path: old, busyTimeoutMs: 0 })).toThrow(expect.objectContaining({ code: "unavailable", message: expect.stringMatching(/locked/) }));
      oldHolder.exec("ROLLBACK");
      oldHolder.close();
      expect(userVersion(old)).toBe(0);
    } finally {
      if (holder.inTransaction) holder.exec("ROLLBACK");
      holder.close();
    }
    expect(userVersion(path)).toBe(3);
  });

  it("refuses a database written by a newer layout with unsupported, naming the versions, and leaves it alone", async () => {
    const path = writeV0();
    await new SqliteStore({ path }).close();
    const raw = new Database(path);
    raw.pragma("user_version = 4");
    raw.close();
    let error: unknown;
    try {
      new SqliteStore({ path });
    } catch (e) {
      error = e;
    }
    expect(isStrataError(error, "unsupported")).toBe(true);
    const message = (error as Error).message;
    expect(message).toMatch(/newer Strata/);
    expect(message).toMatch(/version 4\b/);
    expect(message).toMatch(/up to 3\b/);
    expect(message).not.toContain(dir);
    expect(userVersion(path)).toBe(4);
    expect(inspect(path, (db) => db.prepare("SELECT count(*) AS n FROM strata_files").get())).toEqual({ n: 6 });
  });

  it("lets 4 processes open the same version-0 database at once: all succeed, nothing is lost", async () => {
    const path = writeV0();
    const opener = `
      const { SqliteStore } = await import(process.argv[1]);
      const [path, id] = process.argv.slice(2);
      process.stdout.write("ready\\n");
      process.stdin.once("data", async () => {
        const store = new SqliteStore({ path });
        const version = await store.put(["me"], "/opened/" + id, { content: id, encoding: "utf-8", created_at: "t", modified_at: "t" }, { expectedVersion: null });
        const keys = (await store.list(["me"])).items.map((k) => k.key);
        await store.close();
        process.stdout.write(JSON.stringify({ version, keys }) + "\\n");
        process.exit(0);
      });
    `;
    const module = fileURLToPath(new URL("../stores/sqlite.ts", import.meta.url));
    const { codes, reports, stderr } = await runTogether<{ version: number; keys: string[] }>(
      opener,
      Array.from({ length: 4 }, (_, i) => [module, path, String(i)]),
    );
    expect(codes, stderr).toEqual([0, 0, 0, 0]);
    expect(reports).toHaveLength(4);
    expect(new Set(reports.map((r) => r.version)).size).toBe(4);
    for (const report of reports) expect(report.keys).toEqual(expect.arrayContaining(["/bin/blob", "/legacy.txt", "/notes/deep/x.txt", "/notes/today.md", "/nul.txt"]));
    expect(userVersion(path)).toBe(3);
    const store = new SqliteStore({ path });
    try {
      for (const [ns, item] of V0_ITEMS) expect(await store.get(ns, item.key)).toEqual(item);
      expect((await store.listDirectory(["me"], "/opened")).files.map((f) => f.key).sort()).toEqual(["/opened/0", "/opened/1", "/opened/2", "/opened/3"]);
      expect(reports.every((r) => r.version > 6)).toBe(true);
    } finally {
      await store.close();
    }
  });
});

/** Keys of a search's answers, sorted. */
async function searchKeys(store: SqliteStore, ns: string[], needle: string): Promise<string[]> {
  return (await collect(store.search(ns, needle, "/"))).map((item) => item.key).sort();
}

/** Rows waiting to be indexed, and index hits for a phrase: read directly, to show which path answered. */
const pendingRows = (store: SqliteStore) => store.client.prepare("SELECT count(*) FROM strata_pending").pluck().get() as number;
const indexHits = (store: SqliteStore, text: string) =>
  store.client.prepare("SELECT count(*) FROM strata_text WHERE strata_text MATCH ?").pluck().get(`"${text}"`) as number;

describe("SqliteStore: the trigram index queue", () => {
  it("greps exactly the current text right after each write, overwrite and delete, before and after the queue is indexed", async () => {
    const store = new SqliteStore({ path: freshPath() });
    const ns = ["queue"];
    try {
      // Enough rows that searches take the trigram index; a batch this large leaves the queue indexed.
      await store.putMany(ns, Array.from({ length: 5000 }, (_, i) => [`/fill/${i}`, fileDataFromText(`filler ${i}.`)] as const));
      expect(pendingRows(store)).toBe(0);
      expect(indexHits(store, "filler 4999.")).toBe(1);
      const idOf = (key: string) => store.client.prepare("SELECT id FROM strata_files WHERE key = ?").pluck().get(key) as number;

      // An indexed row deleted, its id taken by a new row: the old text's index entry must not answer for the new row.
      const lastId = idOf("/fill/4999");
      await store.delete(ns, "/fill/4999");
      await store.put(ns, "/reuse", fileDataFromText("delta-four"));
      expect(idOf("/reuse")).toBe(lastId);
      await store.put(ns, "/a", fileDataFromText("alpha-one"));
      expect(await searchKeys(store, ns, "alpha-one")).toEqual(["/a"]);
      expect(indexHits(store, "alpha-one")).toBe(0);
      await store.put(ns, "/a", fileDataFromText("beta-two"));
      await store.put(ns, "/fill/7", fileDataFromText("gamma-three"));
      await store.delete(ns, "/fill/12");
      await store.put(ns, "/fill/20", fileDataFromBytes(new Uint8Array([0xff, ...new TextEncoder().encode("filler 20.")])));
      await store.put(ns, "/dir/g", fileDataFromText("epsilon-five"));
      await store.deleteTree(ns, "/dir");
      expect(pendingRows(store)).toBeGreaterThan(0);
      // The stale entries are still in the index: the answers below come from the queue.
      expect(indexHits(store, "filler 7.")).toBe(1);
      expect(indexHits(store, "filler 4999.")).toBe(1);

      const expectCurrent = async () => {
        const answers: Record<string, string[]> = {
          "alpha-one": [],
          "beta-two": ["/a"],
          "filler 7.": [],
          "gamma-three": ["/fill/7"],
          "filler 12.": [],
          "filler 20.": [],
          "filler 4999.": [],
          "delta-four": ["/reuse"],
          "epsilon-five": [],
          "filler 21.": ["/fill/21"],
        };
        for (const [needle, keys] of Object.entries(answers)) expect(await searchKeys(store, ns, needle), needle).toEqual(keys);
      };
      await expectCurrent();

      // Crossing the queue's limit (256 rows) indexes it in that write's transaction; the answers stay the same.
      await store.putMany(ns, Array.from({ length: 1100 }, (_, i) => [`/more/${i}`, fileDataFromText(`more ${i}.`)] as const));
      expect(pendingRows(store)).toBe(0);
      expect(indexHits(store, "filler 7.")).toBe(0);
      expect(indexHits(store, "gamma-three")).toBe(1);
      expect(indexHits(store, "delta-four")).toBe(1);
      await expectCurrent();
      // One write at a time crosses the limit too.
      for (let i = 0; i < 300; i++) await store.put(ns, `/one/${i}`, fileDataFromText(`one ${i}.`));
      expect(pendingRows(store)).toBeLessThan(256);
      expect(indexHits(store, "one 0.")).toBe(1);
      expect(await searchKeys(store, ns, "one 299.")).toEqual(["/one/299"]);
      expect(await searchKeys(store, ns, "one 3.")).toEqual(["/one/3"]);
      await expectCurrent();
    } finally {
      await store.close();
    }
  });

  it("migrates a version-2 database (index kept by triggers) to version 3, keeping every record and grepping exactly", async () => {
    const path = freshPath();
    const raw = new Database(path);
    raw.pragma("journal_mode = WAL");
    raw.exec(SQLITE_V0_SCHEMA);
    raw.exec("DELETE FROM strata_meta WHERE name = 'schema';");
    raw.exec(SQLITE_V2_HISTORY);
    raw.exec(SQLITE_V0_ROWS);
    // Enough rows that searches take the trigram index, which the version-2 triggers filled.
    raw.exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4100)
      INSERT INTO strata_files (ns, key, parent, content, encoding, original, created_at, modified_at, size, version)
      SELECT 1, '/bulk/' || i, '/bulk', 'bulk row ' || i || '.', 'utf-8', NULL, 't', 't', length('bulk row ' || i || '.'), 6 + i FROM n;
      INSERT INTO strata_dirs (ns, path, parent, files) VALUES (1, '/bulk', '/', 4100);
      UPDATE strata_meta SET value = 4106 WHERE name = 'version';
      INSERT INTO strata_snapshots (ns, seq) VALUES (1, 0);`);
    raw.pragma("user_version = 2");
    raw.close();

    const store = new SqliteStore({ path });
    try {
      const fresh = freshPath();
      await new SqliteStore({ path: fresh }).close();
      const inspect = (db: string) => {
        const reader = new Database(db, { readonly: true });
        try {
          return {
            version: reader.pragma("user_version", { simple: true }),
            layout: reader.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").all(),
          };
        } finally {
          reader.close();
        }
      };
      const migrated = inspect(path);
      expect(migrated.version).toBe(3);
      expect(migrated.layout).toEqual(inspect(fresh).layout);
      expect(pendingRows(store)).toBe(0);

      for (const [ns, item] of V0_ITEMS) expect(await store.get(ns, item.key)).toEqual(item);
      expect(await store.get(["me"], "/bulk/4100")).toMatchObject({ value: { content: "bulk row 4100." }, version: 4106 });
      expect((await store.list(["me"], { limit: 10_000 })).items).toHaveLength(4105);
      expect(await searchKeys(store, ["me"], "needle")).toEqual(["/notes/today.md"]);
      expect(await searchKeys(store, ["me"], "bulk row 4242.")).toEqual([]);
      expect(await searchKeys(store, ["me"], "bulk row 4100.")).toEqual(["/bulk/4100"]);

      // The index from before the migration serves, and writes after it are exact at once.
      await store.put(["me"], "/bulk/4100", fileDataFromText("moved on"));
      await store.delete(["me"], "/notes/today.md");
      expect(await searchKeys(store, ["me"], "bulk row 4100.")).toEqual([]);
      expect(await searchKeys(store, ["me"], "moved on")).toEqual(["/bulk/4100"]);
      expect(await searchKeys(store, ["me"], "needle")).toEqual([]);
      expect(await searchKeys(store, ["me"], "bulk row 4099.")).toEqual(["/bulk/4099"]);
      // The snapshot taken before the migration still restores.
      expect((await store.restore(["me"], "0")).changed).toBe(2);
      expect(await searchKeys(store, ["me"], "needle")).toEqual(["/notes/today.md"]);
      expect(await searchKeys(store, ["me"], "bulk row 4100.")).toEqual(["/bulk/4100"]);
      expect(await searchKeys(store, ["me"], "moved on")).toEqual([]);
    } finally {
      await store.close();
    }
  });

  it("keeps grep exact while two processes write, overwrite and grep the same file at once", async () => {
    const path = freshPath();
    const setup = new SqliteStore({ path });
    await setup.putMany(["shared"], Array.from({ length: 5000 }, (_, i) => [`/fill/${i}`, fileDataFromText(`filler ${i}.`)] as const));
    await setup.close();
    const count = 1500;
    const writer = `
      const { SqliteStore } = await import(process.argv[1]);
      const [path, id, count] = process.argv.slice(2);
      const store = new SqliteStore({ path });
      const ns = ["shared"];
      const text = (content) => ({ content, encoding: "utf-8", created_at: "t", modified_at: "t" });
      const keys = async (needle) => {
        const out = [];
        for await (const item of store.search(ns, needle, "/")) out.push(item.key);
        return out.sort().join(",");
      };
      process.stdout.write("ready\\n");
      process.stdin.once("data", async () => {
        const wrong = [];
        for (let i = 0; i < Number(count); i++) {
          await store.put(ns, "/w" + id + "/" + i, text("mark w" + id + "x" + i + "y"));
          if (i > 0) await store.put(ns, "/w" + id + "/" + (i - 1), text("done w" + id + "x" + (i - 1) + "y"));
          const now = await keys("mark w" + id + "x" + i + "y");
          if (now !== "/w" + id + "/" + i) wrong.push([i, "now", now]);
          if (i > 0) {
            const old = await keys("mark w" + id + "x" + (i - 1) + "y");
            if (old !== "") wrong.push([i, "old", old]);
          }
        }
        await store.close();
        process.stdout.write(JSON.stringify({ wrong: wrong.slice(0, 5) }) + "\\n");
        process.exit(0);
      });
    `;
    const module = fileURLToPath(new URL("../stores/sqlite.ts", import.meta.url));
    const { codes, reports, stderr } = await runTogether<{ wrong: unknown[] }>(
      writer,
      [0, 1].map((id) => [module, path, String(id), String(count)]),
    );
    expect(codes, stderr).toEqual([0, 0]);
    expect(reports).toEqual([{ wrong: [] }, { wrong: [] }]);

    const store = new SqliteStore({ path });
    try {
      for (const id of [0, 1]) {
        expect(await searchKeys(store, ["shared"], `mark w${id}x`)).toEqual([`/w${id}/${count - 1}`]);
        expect(await searchKeys(store, ["shared"], `done w${id}x`)).toHaveLength(count - 1);
        for (const i of [0, 1, 777, count - 2]) expect(await searchKeys(store, ["shared"], `done w${id}x${i}y`)).toEqual([`/w${id}/${i}`]);
      }
      expect(pendingRows(store)).toBeLessThan(256);
    } finally {
      await store.close();
    }
  });
});

/**
 * The snapshot tables of version 2, copied from stores/sqlite.ts as it was
 * then. FROZEN, as SQLITE_V0_SCHEMA: with it and the 0 -> 1 step, a
 * version-2 database as written on disk, the trigram index kept by triggers.
 */
const SQLITE_V2_HISTORY = `
CREATE TABLE IF NOT EXISTS strata_history (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  ns INTEGER NOT NULL,
  key TEXT NOT NULL,
  present INTEGER NOT NULL,
  content TEXT,
  encoding TEXT,
  original TEXT,
  created_at TEXT,
  modified_at TEXT,
  size INTEGER,
  version INTEGER
);
CREATE INDEX IF NOT EXISTS strata_history_seq ON strata_history (ns, seq);
CREATE INDEX IF NOT EXISTS strata_history_key ON strata_history (ns, key, seq);
CREATE TABLE IF NOT EXISTS strata_snapshots (ns INTEGER NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (ns, seq)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS strata_history_insert AFTER INSERT ON strata_files
WHEN EXISTS (SELECT 1 FROM strata_snapshots WHERE ns = new.ns) BEGIN
  INSERT INTO strata_history (ns, key, present) VALUES (new.ns, new.key, 0);
END;
CREATE TRIGGER IF NOT EXISTS strata_history_update AFTER UPDATE ON strata_files
WHEN EXISTS (SELECT 1 FROM strata_snapshots WHERE ns = old.ns) BEGIN
  INSERT INTO strata_history (ns, key, present, content, encoding, original, created_at, modified_at, size, version)
  VALUES (old.ns, old.key, 1, old.content, old.encoding, old.original, old.created_at, old.modified_at, old.size, old.version);
END;
CREATE TRIGGER IF NOT EXISTS strata_history_delete AFTER DELETE ON strata_files
WHEN EXISTS (SELECT 1 FROM strata_snapshots WHERE ns = old.ns) BEGIN
  INSERT INTO strata_history (ns, key, present, content, encoding, original, created_at, modified_at, size, version)
  VALUES (old.ns, old.key, 1, old.content, old.encoding, old.original, old.created_at, old.modified_at, old.size, old.version);
END;
`;
