import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import type Database from "better-sqlite3";
import { errors, StrataError } from "../core/errors.js";
import { checkQuota, validateQuota, type Quota, type Usage } from "../core/limits.js";
import { ancestorsOf, baseName, parentOf } from "../core/paths.js";
import { describeFileChanges, type FileChange, type KeyChange, type Restored, type SnapshotPoint } from "../core/snapshots.js";
import type { FileData } from "../core/types.js";
import {
  checkEngineKey,
  DEFAULT_MAX_VALUE_SIZE,
  DEFAULT_PAGE,
  fromEngineRecord,
  MAX_PAGE,
  searchableNeedle,
  toEngineRecord,
  treePrefix,
  type EngineRecord,
} from "./records.js";
import {
  checkBatchConsistent,
  checkBatchQuota,
  namespaceKey,
  newerLayout,
  prefixEnd,
  storeClosed,
  unknownSnapshot,
  versionConflict,
  versionMatches,
  type DirectoryListing,
  type ListOptions,
  type ListPage,
  type Namespace,
  type PutOptions,
  type SnapshotStore,
  type Store,
  type StoredItem,
  type StoredKey,
  type StoreQuotaOptions,
} from "./store.js";
import { optionalPackage } from "./optional-package.js";

/** better-sqlite3 (a dependency), loaded by the first SqliteStore: importing the package does not load its native addon. */
const sqlite = optionalPackage<typeof Database>("better-sqlite3", "SqliteStore");

export interface SqliteStoreOptions extends StoreQuotaOptions {
  /**
   * Database file, created if missing, with its parent directories; or
   * `":memory:"` for a database that lives only as long as the store.
   */
  path: string;
  /** How long a writer waits for another connection's transaction, in ms (default 5000). */
  busyTimeoutMs?: number;
  /**
   * `NORMAL` (default) survives a process crash; `FULL` also survives power
   * loss, at the cost of an fsync per transaction.
   */
  synchronous?: "NORMAL" | "FULL";
  /** Largest value, in bytes, a put accepts (default 64 MiB); larger ones fail with `too_large`. */
  maxValueSize?: number;
}

/** Below this many characters the trigram index cannot answer; candidates come from a scan. */
const TRIGRAM = 3;
/** A search scope with fewer rows than this is scanned directly: cheaper than a common pattern's index hits. */
const SMALL_SCOPE = 4096;
/** Candidate rows read per query while searching. */
const SEARCH_CHUNK = 256;
/** Queued rows at which a write re-indexes the queue: one FTS5 segment per this many changes rather than one per write. */
const PENDING_LIMIT = 256;

/**
 * The whole schema, as a new database gets it (the current layout; see
 * MIGRATIONS). A file is a row keyed by (namespace id, path) with its
 * parent directory indexed, so a listing reads only that directory's rows.
 * `strata_dirs` counts the files under each directory (maintained on put and
 * delete), so child directories come from an index too, never from a scan of
 * the subtree. Text is indexed by an FTS5 trigram table for grep, kept up
 * to date in batches (TEXT_QUEUE); binary (base64) rows are not indexed.
 * Records are laid out as in records.ts (shared with PostgreSQL and Redis):
 * `content` is the searchable text, `original` the exact content as JSON
 * when UTF-8 cannot hold it (and a v1 record's lines).
 */
const SCHEMA = `
CREATE TABLE IF NOT EXISTS strata_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO strata_meta (name, value) VALUES ('version', 0);
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
`;

/**
 * The trigram index is brought up to date in batches: FTS5 writes a segment
 * at every commit that touched it, which was most of a small write's cost.
 * A change to a file row only queues the row's id in `strata_pending` (same
 * transaction, a trigger); a write that leaves PENDING_LIMIT or more queued
 * re-indexes them all in its own transaction (see indexPending). So a queued
 * id's index entry may be missing or stale (old text, or a deleted row whose
 * id a new row took), and an id not queued has an exact entry: search takes
 * index candidates only for ids not queued, and scans the queued rows.
 */
const TEXT_QUEUE = `
CREATE TABLE IF NOT EXISTS strata_pending (id INTEGER PRIMARY KEY);
CREATE TRIGGER IF NOT EXISTS strata_files_insert AFTER INSERT ON strata_files WHEN new.encoding <> 'base64' BEGIN
  INSERT OR IGNORE INTO strata_pending (id) VALUES (new.id);
END;
CREATE TRIGGER IF NOT EXISTS strata_files_delete AFTER DELETE ON strata_files WHEN old.encoding <> 'base64' BEGIN
  INSERT OR IGNORE INTO strata_pending (id) VALUES (old.id);
END;
CREATE TRIGGER IF NOT EXISTS strata_files_update AFTER UPDATE OF content, encoding ON strata_files BEGIN
  INSERT OR IGNORE INTO strata_pending (id) VALUES (old.id);
END;
`;

/**
 * Snapshots as versioned rows: from a namespace's first snapshot on, every
 * change to one of its files writes, in the same transaction (a trigger), the
 * row as it was before into `strata_history`, under an ever-growing `seq`
 * (AUTOINCREMENT: never reused). A snapshot is the last `seq` at the time,
 * recorded in `strata_snapshots`; the value a key had at snapshot S is the
 * before-image of its first change after S, or its current row when it has
 * not changed since. Namespaces that never took a snapshot pay one index
 * probe per write and keep no history.
 */
const HISTORY = `
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

/**
 * The layout steps: MIGRATIONS[n] takes a database written in layout n to
 * layout n + 1, so the current layout is version MIGRATIONS.length, recorded
 * in `PRAGMA user_version`. Version 0 is the layout from before versions were
 * recorded (user_version never set). A change of layout edits SCHEMA and
 * appends one step here; the steps run in order, in one `BEGIN IMMEDIATE`
 * transaction with the new user_version, and must keep every record.
 */
const MIGRATIONS: readonly string[] = [
  // 0 -> 1: the version moves to user_version; strata_meta's 'schema' row, written but never read, goes.
  "DELETE FROM strata_meta WHERE name = 'schema';",
  // 1 -> 2: snapshots (history of changed rows, recorded snapshots); existing rows are untouched.
  HISTORY,
  // 2 -> 3: the trigram index is updated in batches; it is exact for every row now, so the queue starts empty.
  "DROP TRIGGER IF EXISTS strata_files_insert; DROP TRIGGER IF EXISTS strata_files_delete; DROP TRIGGER IF EXISTS strata_files_update;" +
    TEXT_QUEUE,
];

/** The layout this code writes and reads. */
const SCHEMA_VERSION = MIGRATIONS.length;

const ITEM_COLUMNS = "id, key, content, encoding, original, size, created_at, modified_at, version";
const KEY_COLUMNS = "key, version, size, modified_at";
/** Rows whose key lies in [@lo, @hi), resuming after @after when paging. */
const IN_RANGE = "ns = @ns AND key >= max(@lo, @from) AND key < @hi";

/** Every statement the store runs. */
const SQL = {
  namespaceId: "SELECT id FROM strata_namespaces WHERE name = ?",
  createNamespace: "INSERT OR IGNORE INTO strata_namespaces (name) VALUES (?)",
  /** Reserves `?` versions; returns the last one. */
  reserveVersions: "UPDATE strata_meta SET value = value + ? WHERE name = 'version' RETURNING value",
  get: `SELECT ${ITEM_COLUMNS} FROM strata_files WHERE ns = ? AND key = ?`,
  getByIds: `SELECT ${ITEM_COLUMNS} FROM strata_files WHERE id IN (SELECT value FROM json_each(?))`,
  current: "SELECT id, version, size FROM strata_files WHERE ns = ? AND key = ?",
  usage: "SELECT coalesce(sum(size), 0) AS bytes, count(*) AS files FROM strata_files WHERE ns = ?",
  isKey: "SELECT 1 FROM strata_files WHERE ns = ? AND key = ?",
  isDir: "SELECT 1 FROM strata_dirs WHERE ns = ? AND path = ?",
  insert: `INSERT INTO strata_files (ns, key, parent, content, encoding, original, created_at, modified_at, size, version)
    VALUES (@ns, @key, @parent, @content, @encoding, @original, @created_at, @modified_at, @size, @version)`,
  update: `UPDATE strata_files SET content = @content, encoding = @encoding, original = @original, created_at = @created_at,
    modified_at = @modified_at, size = @size, version = @version WHERE id = @id`,
  deleteById: "DELETE FROM strata_files WHERE id = ?",
  treeKeys: `SELECT key FROM strata_files WHERE ${IN_RANGE}`,
  deleteTree: `DELETE FROM strata_files WHERE ${IN_RANGE}`,
  list: `SELECT ${KEY_COLUMNS} FROM strata_files WHERE ${IN_RANGE} ORDER BY key LIMIT @limit`,
  filesIn: `SELECT ${KEY_COLUMNS} FROM strata_files WHERE ns = ? AND parent = ?`,
  dirsIn: "SELECT path FROM strata_dirs WHERE ns = ? AND parent = ?",
  addToDir: `INSERT INTO strata_dirs (ns, path, parent, files) VALUES (?, ?, ?, ?)
    ON CONFLICT (ns, path) DO UPDATE SET files = files + excluded.files`,
  removeFromDir: "UPDATE strata_dirs SET files = files - ? WHERE ns = ? AND path = ?",
  dropEmptyDir: "DELETE FROM strata_dirs WHERE ns = ? AND path = ? AND files <= 0",
  dropDirTree: "DELETE FROM strata_dirs WHERE ns = @ns AND (path = @dir OR (path >= @lo AND path < @hi))",
  // CROSS JOIN makes the trigram index the outer loop; otherwise the planner may walk the key range and probe FTS per row.
  // One statement, so the index and the queue are read at one point in time, whatever other connections merge meanwhile.
  searchIndexed: `SELECT f.id FROM strata_text t CROSS JOIN strata_files f ON f.id = t.rowid
      WHERE strata_text MATCH @phrase AND f.ns = @ns AND f.key >= @lo AND f.key < @hi
        AND f.id NOT IN (SELECT id FROM strata_pending)
    UNION ALL
    SELECT f.id FROM strata_pending p CROSS JOIN strata_files f ON f.id = p.id
      WHERE f.ns = @ns AND f.key >= @lo AND f.key < @hi AND f.encoding <> 'base64' AND instr(f.content, @substring) > 0`,
  pendingCount: "SELECT count(*) FROM strata_pending",
  pendingIds: "SELECT id FROM strata_pending",
  unindex: "DELETE FROM strata_text WHERE rowid = ?",
  indexPending: `INSERT INTO strata_text (rowid, content)
    SELECT f.id, f.content FROM strata_pending p CROSS JOIN strata_files f ON f.id = p.id WHERE f.encoding <> 'base64'`,
  clearPending: "DELETE FROM strata_pending",
  scopeSize: "SELECT count(*) FROM (SELECT 1 FROM strata_files WHERE ns = @ns AND key >= @lo AND key < @hi LIMIT @cap)",
  searchScan: `SELECT id FROM strata_files
    WHERE ns = @ns AND key >= @lo AND key < @hi AND encoding <> 'base64' AND instr(content, @substring) > 0`,
  textIn: "SELECT id FROM strata_files WHERE ns = @ns AND key >= @lo AND key < @hi AND encoding <> 'base64'",
  lastSeq: "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'strata_history'), 0)",
  recordSnapshot: "INSERT OR IGNORE INTO strata_snapshots (ns, seq) VALUES (?, ?)",
  isSnapshot: "SELECT 1 FROM strata_snapshots WHERE ns = ? AND seq = ?",
  // SQLite takes the bare columns of a min() aggregate from the row holding the minimum: each key's first change after @seq.
  firstChanges: `SELECT key, min(seq) AS seq, present, content, encoding, original, created_at, modified_at, size, version
    FROM strata_history WHERE ns = @ns AND seq > @seq GROUP BY key`,
} as const;

type Statements = { [K in keyof typeof SQL]: Database.Statement };

interface ItemRow extends EngineRecord {
  id: number;
  key: string;
  version: number;
}

/**
 * The embedded default store: one SQLite file in WAL mode. Separate
 * connections (and processes) share it safely: every compare-and-set runs in
 * a `BEGIN IMMEDIATE` transaction, and a busy timeout makes writers wait for
 * each other rather than fail.
 */
export class SqliteStore implements Store, SnapshotStore {
  /** The better-sqlite3 Database underneath: the escape hatch to the engine. */
  readonly client: Database.Database;
  private readonly sql: Statements;
  private readonly namespaceIds = new Map<string, number>();
  private readonly maxValueSize: number;
  private readonly quota: Quota | undefined;

  constructor(options: SqliteStoreOptions) {
    const path: unknown = options?.path;
    // better-sqlite3 opens a temporary database for "" (and undefined): writes
    // that vanish on close must be asked for by name, never fallen into.
    if (typeof path !== "string" || path === "") {
      throw errors.invalidArgument('SqliteStore needs a path: a database file, or ":memory:" for a database that is not kept');
    }
    if (path.includes("\0")) throw errors.invalidArgument("the SQLite store path must not contain NUL");
    this.maxValueSize = options.maxValueSize ?? DEFAULT_MAX_VALUE_SIZE;
    this.quota = validateQuota(options.quota);
    const Driver = sqlite();
    if (path !== ":memory:" && !path.startsWith("file:")) createParent(path);
    let db: Database.Database | undefined;
    try {
      db = new Driver(path);
      db.pragma(`busy_timeout = ${Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000))}`);
      db.pragma("journal_mode = WAL");
      db.pragma(`synchronous = ${options.synchronous === "FULL" ? "FULL" : "NORMAL"}`);
      openLayout(db);
      this.sql = Object.fromEntries(Object.entries(SQL).map(([name, text]) => [name, db!.prepare(text)])) as Statements;
      this.client = db;
    } catch (error) {
      if (db?.open) db.close();
      if (error instanceof StrataError) throw error;
      // The driver's messages may carry the host path; ours never do.
      throw new StrataError("unavailable", `Cannot open the SQLite store: ${openFailure(error)}`, { cause: error });
    }
  }


  async get(namespace: Namespace, key: string): Promise<StoredItem | undefined> {
    return this.run(() => {
      checkEngineKey(key);
      const ns = this.namespaceId(namespace, false);
      const row = ns === undefined ? undefined : (this.sql.get.get(ns, key) as ItemRow | undefined);
      return row && toItem(row);
    });
  }

  put(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putChecked(namespace, key, value, options, false);
  }

  /** `put` with the tree checks inside its transaction, so no concurrent writer can slip a file or directory in between. */
  putFile(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putChecked(namespace, key, value, options, true);
  }

  private async putChecked(namespace: Namespace, key: string, value: FileData, options: PutOptions, checkTree: boolean): Promise<number> {
    return this.run(() => {
      const record = this.record(key, value);
      const ns = this.namespaceId(namespace, true);
      return this.client
        .transaction(() => {
          if (this.quota) {
            const row = this.sql.current.get(ns, key) as { size: number } | undefined;
            checkQuota(this.quota, this.usage(ns), { bytes: record.size - (row?.size ?? 0), files: row ? 0 : 1 }, key);
          }
          const added = new Map<string, number>();
          const version = this.putOne(ns, key, record, options.expectedVersion, this.reserveVersions(1), added, checkTree);
          this.addToDirs(ns, added);
          this.indexPending();
          return version;
        })
        .immediate();
    });
  }

  putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, false);
  }

  /** `putMany` with every entry's tree check in the batch's transaction. */
  putFiles(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, true);
  }

  private async putBatch(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, checkTree: boolean): Promise<number[]> {
    return this.run(() => {
      const records = entries.map(([key, value]) => this.record(key, value));
      if (checkTree) checkBatchConsistent(entries.map(([key]) => key));
      const ns = this.namespaceId(namespace, true);
      return this.client
        .transaction(() => {
          if (this.quota) {
            const sizes = entries.map(([key], i) => [key, records[i]!.size] as const);
            checkBatchQuota(this.quota, this.usage(ns), sizes, (key) => (this.sql.current.get(ns, key) as { size: number } | undefined)?.size);
          }
          const first = this.reserveVersions(entries.length) - entries.length + 1;
          const added = new Map<string, number>();
          const versions = entries.map(([key], i) => this.putOne(ns, key, records[i]!, undefined, first + i, added, checkTree));
          this.addToDirs(ns, added);
          this.indexPending();
          return versions;
        })
        .immediate();
    });
  }

  /** What a namespace holds, read inside the write's transaction (only when a quota is set: it reads every row's size). */
  private usage(ns: number): Usage {
    return this.sql.usage.get(ns) as Usage;
  }

  async delete(namespace: Namespace, key: string, options: PutOptions = {}): Promise<boolean> {
    return this.run(() => {
      checkEngineKey(key);
      return this.client
        .transaction(() => {
          const ns = this.namespaceId(namespace, false);
          const row = ns === undefined ? undefined : (this.sql.current.get(ns, key) as { id: number; version: number } | undefined);
          if (!versionMatches(options.expectedVersion, row?.version)) throw versionConflict(key, options.expectedVersion ?? null, row?.version);
          if (!row || ns === undefined) return false;
          this.sql.deleteById.run(row.id);
          this.removeFromDirs(ns, key, 1);
          this.indexPending();
          return true;
        })
        .immediate();
    });
  }

  async deleteTree(namespace: Namespace, dir: string): Promise<string[]> {
    return this.run(() => {
      checkEngineKey(dir);
      return this.client
        .transaction(() => {
          const ns = this.namespaceId(namespace, false);
          if (ns === undefined) return [];
          const range = { ns, ...treeRange(dir), from: "" };
          const keys = this.sql.treeKeys.pluck().all(range) as string[];
          if (keys.length === 0) return keys;
          this.sql.deleteTree.run(range);
          this.sql.dropDirTree.run({ ns, dir, lo: range.lo, hi: range.hi });
          this.removeFromDirs(ns, dir, keys.length);
          this.indexPending();
          return keys;
        })
        .immediate();
    });
  }

  async list(namespace: Namespace, options: ListOptions = {}): Promise<ListPage> {
    return this.run(() => {
      const ns = this.namespaceId(namespace, false);
      const lo = options.prefix || "/";
      const hi = prefixEnd(lo);
      if (ns === undefined || hi === undefined) return { items: [] };
      const limit = Math.min(Math.max(1, Math.floor(options.limit ?? DEFAULT_PAGE)), MAX_PAGE);
      // The smallest string after `after` is `after + "\0"`, so one inclusive bound serves both cases.
      const from = options.after === undefined ? "" : `${options.after}\0`;
      const items = this.sql.list.all({ ns, lo, hi, from, limit: limit + 1 }) as StoredKey[];
      if (items.length <= limit) return { items };
      items.length = limit;
      return { items, next: items[limit - 1]!.key };
    });
  }

  async listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing> {
    return this.run(() => {
      checkEngineKey(dir);
      const ns = this.namespaceId(namespace, false);
      if (ns === undefined) return { files: [], dirs: [] };
      const files = this.sql.filesIn.all(ns, dir) as StoredKey[];
      const dirs = (this.sql.dirsIn.pluck().all(ns, dir) as string[]).map(baseName);
      return { files, dirs };
    });
  }

  /**
   * Candidates from the trigram index (patterns of 3+ characters over a
   * large scope) plus the queued rows that hold the pattern, else from a scan
   * of the prefix with `instr`. Ids are collected first and rows read
   * in chunks, so no statement stays open while the caller awaits.
   */
  async *search(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem> {
    const ids = this.run(() => {
      const ns = this.namespaceId(namespace, false);
      const lo = prefix || "/";
      const hi = prefixEnd(lo);
      if (ns === undefined || hi === undefined || substring === "") return [];
      const needle = searchableNeedle(substring);
      if (needle === undefined) return this.sql.textIn.pluck().all({ ns, lo, hi }) as number[];
      const small = (this.sql.scopeSize.pluck().get({ ns, lo, hi, cap: SMALL_SCOPE }) as number) < SMALL_SCOPE;
      if (!small && [...needle].length >= TRIGRAM) {
        const phrase = `"${needle.replace(/"/g, '""')}"`;
        return this.sql.searchIndexed.pluck().all({ ns, lo, hi, phrase, substring: needle }) as number[];
      }
      return this.sql.searchScan.pluck().all({ ns, lo, hi, substring: needle }) as number[];
    });
    for (let i = 0; i < ids.length; i += SEARCH_CHUNK) {
      const chunk = JSON.stringify(ids.slice(i, i + SEARCH_CHUNK));
      const rows = this.run(() => this.sql.getByIds.all(chunk) as ItemRow[]);
      for (const row of rows) yield toItem(row);
    }
  }

  /**
   * The namespace as it is now: the last history `seq`, recorded so the id
   * survives a restart. O(1), one small transaction. The id is that number
   * (as text), so a snapshot taken with nothing changed anywhere since the
   * last one is the same id.
   */
  async snapshot(namespace: Namespace): Promise<string> {
    return this.run(() => {
      const ns = this.namespaceId(namespace, true);
      return this.client
        .transaction(() => {
          const seq = this.sql.lastSeq.pluck().get() as number;
          this.sql.recordSnapshot.run(ns, seq);
          return String(seq);
        })
        .immediate();
    });
  }

  /**
   * Puts the namespace back as it was at snapshot `id`, in one `BEGIN
   * IMMEDIATE` transaction: other connections' writers wait for it and see
   * the files wholly before or wholly after. Costs O(keys changed since the
   * snapshot). The restored rows get new versions (a compare-and-set based on
   * a read from before the restore fails, as after any write), and the
   * restore is itself recorded, so later snapshots stay valid.
   */
  async restore(namespace: Namespace, id: string): Promise<Restored> {
    return this.run(() =>
      this.client
        .transaction(() => {
          const ns = this.namespaceId(namespace, false);
          const seq = this.snapshotSeq(ns, id);
          const rows = this.sql.firstChanges.all({ ns, seq }) as HistoryRow[];
          let changed = 0;
          // Removals first, so a file never lands where a directory still stands.
          for (const row of rows) {
            if (row.present) continue;
            const current = this.sql.current.get(ns, row.key) as { id: number } | undefined;
            if (!current) continue;
            this.sql.deleteById.run(current.id);
            this.removeFromDirs(ns!, row.key, 1);
            changed++;
          }
          const puts = rows.filter((row) => row.present && (this.sql.current.get(ns, row.key) as { version: number } | undefined)?.version !== row.version);
          if (puts.length > 0) {
            const first = this.reserveVersions(puts.length) - puts.length + 1;
            const added = new Map<string, number>();
            puts.forEach((row, i) => this.putOne(ns!, row.key, historyRecord(row), undefined, first + i, added));
            this.addToDirs(ns!, added);
            changed += puts.length;
          }
          this.indexPending();
          return { snapshot: id, changed };
        })
        .immediate(),
    );
  }

  /** Files that differ between snapshot `from` and `to` (default: now); reads only the keys changed since the earlier one. */
  async diff(namespace: Namespace, from: string, to: SnapshotPoint = "now"): Promise<FileChange[]> {
    const changes = this.run(() =>
      this.client.transaction(() => {
        const ns = this.namespaceId(namespace, false);
        const a = from === "now" ? Infinity : this.snapshotSeq(ns, from);
        const b = to === "now" ? Infinity : this.snapshotSeq(ns, to);
        const valueAt = new Map<string, FileData | undefined>();
        const at = (seq: number): Map<string, FileData | undefined> => {
          const values = new Map<string, FileData | undefined>();
          if (seq === Infinity) return values;
          for (const row of this.sql.firstChanges.all({ ns, seq }) as HistoryRow[]) values.set(row.key, row.present ? fromEngineRecord(historyRecord(row)) : undefined);
          return values;
        };
        const early = at(Math.min(a, b));
        const late = at(Math.max(a, b));
        for (const key of early.keys()) {
          if (late.has(key)) valueAt.set(key, late.get(key));
          else {
            const row = this.sql.get.get(ns, key) as ItemRow | undefined;
            valueAt.set(key, row && fromEngineRecord(row));
          }
        }
        const out = new Map<string, KeyChange<FileData>>();
        for (const [key, value] of early) {
          const other = valueAt.get(key);
          out.set(key, a <= b ? { before: value, after: other } : { before: other, after: value });
        }
        return out;
      })(),
    );
    return describeFileChanges(changes);
  }

  /** The history `seq` of snapshot `id` of namespace `ns`; `invalid_argument` for an id the namespace never gave. */
  private snapshotSeq(ns: number | undefined, id: unknown): number {
    const seq = typeof id === "string" && /^(0|[1-9][0-9]{0,15})$/.test(id) ? Number(id) : undefined;
    if (ns === undefined || seq === undefined || !this.sql.isSnapshot.get(ns, seq)) throw unknownSnapshot(id);
    return seq;
  }

  async close(): Promise<void> {
    if (this.client.open) this.client.close();
  }

  /** Runs one operation: refuses once closed, and turns driver errors into StrataErrors. */
  private run<T>(operation: () => T): T {
    if (!this.client.open) throw storeClosed();
    try {
      return operation();
    } catch (error) {
      throw toStrataError(error);
    }
  }

  /**
   * Stores one record under a version reserved by the caller, inside the
   * caller's transaction. A new key's directories are counted into `added`,
   * so a batch updates each directory once.
   */
  private putOne(
    ns: number,
    key: string,
    record: EngineRecord,
    expected: number | null | undefined,
    version: number,
    added: Map<string, number>,
    asFile = false,
  ): number {
    const row = this.sql.current.get(ns, key) as { id: number; version: number } | undefined;
    if (!versionMatches(expected, row?.version)) throw versionConflict(key, expected ?? null, row?.version);
    if (asFile) this.checkTree(ns, key);
    const columns = { ...record, version };
    if (row) {
      this.sql.update.run({ ...columns, id: row.id });
    } else {
      this.sql.insert.run({ ...columns, ns, key, parent: parentOf(key) });
      for (const dir of ancestorsOf(key)) if (dir !== "/") added.set(dir, (added.get(dir) ?? 0) + 1);
    }
    return version;
  }

  /**
   * Refuses a file where the tree has a directory (the root, or a key with a
   * `strata_dirs` row: every directory holding files has one) or where an
   * ancestor is a file.
   */
  private checkTree(ns: number, key: string): void {
    if (key === "/" || this.sql.isDir.get(ns, key)) throw errors.isDirectory(key);
    for (const dir of ancestorsOf(key)) {
      if (dir !== "/" && this.sql.isKey.get(ns, dir)) throw errors.notADirectory(key);
    }
  }

  /** Validates a key and value and lays the value out as columns. */
  private record(key: string, value: FileData): EngineRecord {
    return toEngineRecord(checkEngineKey(key), value, this.maxValueSize);
  }

  /**
   * Inside a write's transaction: once PENDING_LIMIT rows are queued,
   * replaces each queued id's index entry with its row's current text (none
   * for a deleted or binary row) and empties the queue, as one FTS5 segment.
   */
  private indexPending(): void {
    if ((this.sql.pendingCount.pluck().get() as number) < PENDING_LIMIT) return;
    for (const id of this.sql.pendingIds.pluck().all() as number[]) this.sql.unindex.run(id);
    this.sql.indexPending.run();
    this.sql.clearPending.run();
  }

  /** Versions only grow, across every namespace, so a deleted and recreated key never repeats one. */
  private reserveVersions(count: number): number {
    return this.sql.reserveVersions.pluck().get(count) as number;
  }

  private addToDirs(ns: number, added: Map<string, number>): void {
    for (const [dir, count] of added) this.sql.addToDir.run(ns, dir, parentOf(dir), count);
  }

  /** Takes `count` files away from every directory above `path`, dropping directories left empty. */
  private removeFromDirs(ns: number, path: string, count: number): void {
    for (const dir of ancestorsOf(path)) {
      if (dir === "/") continue;
      this.sql.removeFromDir.run(count, ns, dir);
      this.sql.dropEmptyDir.run(ns, dir);
    }
  }

  /**
   * The namespace's row id, cached (rows are never deleted, so ids never
   * change). Created in its own statement, outside any write transaction, so
   * a rolled-back write cannot leave a cached id that was never committed.
   */
  private namespaceId(namespace: Namespace, create: true): number;
  private namespaceId(namespace: Namespace, create: boolean): number | undefined;
  private namespaceId(namespace: Namespace, create: boolean): number | undefined {
    const name = namespaceKey(namespace);
    const cached = this.namespaceIds.get(name);
    if (cached !== undefined) return cached;
    if (create) this.sql.createNamespace.run(name);
    const id = this.sql.namespaceId.pluck().get(name) as number | undefined;
    if (id !== undefined) this.namespaceIds.set(name, id);
    return id;
  }
}

/**
 * Brings the database to the current layout: a database without Strata's
 * tables gets SCHEMA, an older layout is migrated, a newer one is refused
 * (`unsupported`). A database already current is only read, without taking
 * the write lock; otherwise the version is read again under `BEGIN
 * IMMEDIATE`, so of several connections opening an old database at once one
 * migrates and the others, waiting their turn, find it done.
 */
function openLayout(db: Database.Database): void {
  const recorded = () => db.pragma("user_version", { simple: true }) as number;
  const seen = recorded();
  if (seen === SCHEMA_VERSION) return;
  if (seen > SCHEMA_VERSION || seen < 0) throw newerLayout("SQLite", seen, SCHEMA_VERSION);
  db.transaction(() => {
    const version = recorded();
    if (version > SCHEMA_VERSION || version < 0) throw newerLayout("SQLite", version, SCHEMA_VERSION);
    if (version === SCHEMA_VERSION) return;
    const fresh = version === 0 && db.prepare("SELECT 1 FROM sqlite_master WHERE name = 'strata_files'").get() === undefined;
    db.exec(fresh ? SCHEMA + HISTORY + TEXT_QUEUE : MIGRATIONS.slice(version).join("\n"));
    db.pragma(`user_version = ${SCHEMA_VERSION}`);
  }).immediate();
}

/** Key range of everything strictly under `dir`. */
function treeRange(dir: string): { lo: string; hi: string } {
  const lo = treePrefix(dir);
  return { lo, hi: prefixEnd(lo)! };
}

/** A key's row before one change (`present` 0: the key did not exist). */
interface HistoryRow extends EngineRecord {
  key: string;
  seq: number;
  present: number;
  version: number;
}

function historyRecord(row: HistoryRow): EngineRecord {
  return {
    content: row.content,
    encoding: row.encoding,
    original: row.original,
    size: row.size,
    created_at: row.created_at,
    modified_at: row.modified_at,
  };
}

function toItem(row: ItemRow): StoredItem {
  return { key: row.key, value: fromEngineRecord(row), version: row.version };
}

/** Creates the directories a database file goes in (`.strata/` of the README), as `mkdir -p` does. */
function createParent(path: string): void {
  try {
    mkdirSync(dirname(path), { recursive: true });
  } catch (error) {
    // Opening reports why, in words; the driver would only say it cannot open the file.
    throw new StrataError("unavailable", `Cannot open the SQLite store: ${openFailure(error)}`, { cause: error });
  }
}

/** Why a database could not be opened, in words, without the driver's text (which may name host paths). */
function openFailure(error: unknown): string {
  const code = (error as { code?: unknown })?.code;
  switch (code) {
    case "ENOENT":
      return "its directory does not exist";
    case "EACCES":
    case "EPERM":
    case "SQLITE_PERM":
    case "SQLITE_READONLY":
      return "permission denied";
    case "ENOTDIR":
    case "EEXIST":
      return "a parent of it is a file, not a directory";
    case "EROFS":
      return "the file system is read-only";
    case "ENOSPC":
    case "SQLITE_FULL":
      return "the disk is full";
    case "EISDIR":
      return "it is a directory";
    case "SQLITE_NOTADB":
    case "SQLITE_CORRUPT":
      return "the file is not a SQLite database, or it is corrupt";
    case "SQLITE_BUSY":
      return "another connection holds it locked";
    case "SQLITE_CANTOPEN":
      return "the file cannot be opened (its directory is missing, or it is not readable and writable)";
    default:
      return typeof code === "string" ? `the database could not be opened (${code})` : "the database could not be opened";
  }
}

/** Maps driver errors to typed ones; the driver's text is kept only as the cause. */
function toStrataError(error: unknown): unknown {
  if (error instanceof StrataError || !(error instanceof sqlite().SqliteError)) return error;
  const code = error.code;
  if (code.startsWith("SQLITE_BUSY") || code.startsWith("SQLITE_LOCKED")) {
    return new StrataError("timeout", "The SQLite store is busy: another connection held its write lock past the busy timeout", { cause: error });
  }
  if (code === "SQLITE_TOOBIG") return new StrataError("too_large", "The value is larger than SQLite accepts", { cause: error });
  if (code.startsWith("SQLITE_READONLY")) return new StrataError("permission_denied", "The SQLite store is read-only", { cause: error });
  return new StrataError("io_error", `SQLite error (${code})`, { cause: error });
}
