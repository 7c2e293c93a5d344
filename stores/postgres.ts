import type * as Pg from "pg";
import type { Pool, PoolClient, QueryResult, QueryResultRow } from "pg";
import { errors, StrataError } from "../core/errors.js";
import { encodeText } from "../core/filedata.js";
import { checkQuota, validateQuota, type Quota, type Usage } from "../core/limits.js";
import { ancestorsOf } from "../core/paths.js";
import { describeFileChanges, type FileChange, type KeyChange, type Restored, type SnapshotPoint } from "../core/snapshots.js";
import type { FileData } from "../core/types.js";
import {
  checkEngineKey,
  DEFAULT_MAX_VALUE_SIZE,
  fromEngineRecord,
  pageSize,
  searchableNeedle,
  splitKey,
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

/** The pg package, loaded by the first PostgresStore (an optional peer dependency). */
const pg = optionalPackage<typeof Pg>("pg", "PostgresStore");

export interface PostgresStoreOptions extends StoreQuotaOptions {
  /** `postgres://user@host:port/db`; the store opens (and closes) a pool of its own. */
  connectionString?: string;
  /** A pool owned by the caller; `close()` leaves it open. */
  pool?: Pool;
  /** Schema of the table, created when missing (default `public`). */
  schema?: string;
  /** Table name (default `strata_files`); its indexes and sequence are named after it. */
  table?: string;
  /** Largest value in bytes (default 64 MiB); larger puts fail with `too_large`. */
  maxValueSize?: number;
  /** Longest a statement may run, server side (default 30 s); the client gives up 5 s later. */
  statementTimeoutMs?: number;
  /** Longest to wait for the server to accept a new connection (default 5 s); past it the store reports `unavailable`. */
  connectTimeoutMs?: number;
  /**
   * Longest an operation waits for a free connection when all of them are in
   * use (default 30 s). Waiting is normal under load; past this the operation
   * fails with `busy`, never `unavailable`.
   */
  acquireTimeoutMs?: number;
  /** Connections in the store's own pool (default 10); with a caller's pool, its `max`. */
  maxConnections?: number;
}

/** PostgreSQL cannot index a btree entry over ~2700 bytes; namespace plus key stay under this. */
const MAX_INDEXED_BYTES = 2400;
/** Rows per INSERT in putMany, and bytes of content per INSERT, to bound statement size. */
const BATCH_ROWS = 500;
const BATCH_BYTES = 8 * 1024 * 1024;
/** Candidates fetched per round trip while searching. */
const SEARCH_BATCH = 100;

/** Plain identifiers only, short enough that the derived index and sequence names fit in 63 bytes. */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,47}$/;

interface KeyRow {
  key: string;
  version: string;
  size: string;
  modified_at: string;
}

interface ItemRow {
  key: string;
  version: string;
  encoding: EngineRecord["encoding"];
  content: string;
  original: string | null;
  size: string;
  created_at: string;
  modified_at: string;
}

/**
 * Files in one PostgreSQL table, created on first use. Each row is one file:
 * its namespace and key (both `COLLATE "C"`, so key order is byte order, which
 * is code-point order: the same as JavaScript's for every character below
 * U+E000), its directory (`dir`, with the trailing `/`), and a version from a
 * sequence, so a version is never reused even after a delete.
 *
 * Work happens in the server: `list` and `deleteTree` are key-range scans of
 * the primary key; `listDirectory` reads the directory's files through the
 * `(ns, dir)` index and finds its subdirectories by a loose index scan over
 * the same index (one probe per subdirectory, never the subtree's files);
 * `search` narrows candidates with a pg_trgm GIN index on the text. Every
 * compare-and-set is one conditional statement; `putMany` is one transaction.
 */
export class PostgresStore implements Store, SnapshotStore {
  /** The pg Pool underneath (the store's own, or the one given as `pool`): the escape hatch to the engine. */
  readonly client: Pool;
  private readonly ownsPool: boolean;
  private readonly table: string;
  private readonly sequence: string;
  /** The SQL that draws the next version (identifiers are validated, so inlining is safe). */
  private readonly nextVersion: string;
  private readonly maxValueSize: number;
  private schemaReady: Promise<void> | undefined;
  private closed = false;
  private readonly quota: Quota | undefined;
  /** Operations holding or waiting for one of the pool's connections. */
  private readonly gate: Gate;

  constructor(private readonly options: PostgresStoreOptions) {
    const schema = options.schema ?? "public";
    const table = options.table ?? "strata_files";
    for (const name of [schema, table]) {
      if (!IDENTIFIER.test(name)) throw errors.invalidArgument(`PostgreSQL schema and table names must match ${IDENTIFIER.source}`);
    }
    this.table = `${pg().escapeIdentifier(schema)}.${pg().escapeIdentifier(table)}`;
    this.sequence = `${pg().escapeIdentifier(schema)}.${pg().escapeIdentifier(`${table}_version`)}`;
    this.nextVersion = `nextval('${this.sequence.replace(/'/g, "''")}'::regclass)`;
    this.maxValueSize = options.maxValueSize ?? DEFAULT_MAX_VALUE_SIZE;
    this.quota = validateQuota(options.quota);
    const acquireTimeoutMs = options.acquireTimeoutMs ?? 30_000;
    if (!Number.isFinite(acquireTimeoutMs) || acquireTimeoutMs <= 0 || acquireTimeoutMs > 0x7fffffff) {
      throw errors.invalidArgument(`acquireTimeoutMs must be a positive number of milliseconds up to ${0x7fffffff}, got ${acquireTimeoutMs}`);
    }
    const size = options.pool ? ((options.pool as unknown as { options?: { max?: number } }).options?.max ?? 10) : (options.maxConnections ?? 10);
    this.gate = new Gate(Math.max(1, size), acquireTimeoutMs);
    if (options.pool) {
      this.client = options.pool;
      this.ownsPool = false;
    } else {
      if (!options.connectionString) throw errors.invalidArgument("PostgresStore needs a connectionString or a pool");
      const statementTimeout = options.statementTimeoutMs ?? 30_000;
      this.client = new (pg().Pool)({
        connectionString: options.connectionString,
        max: options.maxConnections ?? 10,
        connectionTimeoutMillis: options.connectTimeoutMs ?? 5_000,
        statement_timeout: statementTimeout,
        // A server that stops answering (not merely refusing) would otherwise hang the caller.
        query_timeout: statementTimeout + 5_000,
        idle_in_transaction_session_timeout: statementTimeout + 10_000,
        idleTimeoutMillis: 10_000,
        keepAlive: true,
      });
      this.ownsPool = true;
      // An idle connection dropped by a server restart is reported here; the pool
      // discards it and the next query connects afresh.
      this.client.on("error", () => {});
    }
  }


  async get(namespace: Namespace, key: string): Promise<StoredItem | undefined> {
    const ns = namespaceKey(namespace);
    checkEngineKey(key);
    const { rows } = await this.query<ItemRow>(`SELECT ${ITEM_COLUMNS} FROM ${this.table} WHERE ns = $1 AND key = $2`, [ns, key]);
    return rows[0] && toItem(rows[0]);
  }

  async put(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    // With a quota, the usage read and the write must not interleave with another writer's.
    if (this.quota) return this.putLocked(namespace, key, value, options, false);
    const ns = namespaceKey(namespace);
    const record = toEngineRecord(this.checkKey(ns, key), value, this.maxValueSize);
    const { sql, params } = this.putStatement(ns, key, record, options.expectedVersion);
    const { rows } = await this.query<{ version: string }>(sql, params);
    if (rows[0]) return Number(rows[0].version);
    throw versionConflict(key, options.expectedVersion ?? null, (await this.get(namespace, key))?.version);
  }

  /**
   * `put` with the tree checked in its transaction. Every tree-checked or
   * quota-checked write of a namespace first takes one advisory lock of that
   * namespace, so two writers cannot both see `/a` free and store `/a` and
   * `/a/b`: the second one waits, then sees the first one's row.
   */
  putFile(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putLocked(namespace, key, value, options, true);
  }

  /** `putMany` with every entry's tree check under the namespace's lock, in the batch's transaction. */
  putFiles(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, true);
  }

  private async putLocked(namespace: Namespace, key: string, value: FileData, options: PutOptions, asFile: boolean): Promise<number> {
    const ns = namespaceKey(namespace);
    const record = toEngineRecord(this.checkKey(ns, key), value, this.maxValueSize);
    const expected = options.expectedVersion;
    return this.transaction(async (client) => {
      await this.lockNamespace(client, ns);
      const { rows: found } = await client.query<{ version: string; size: string }>(`SELECT version, size FROM ${this.table} WHERE ns = $1 AND key = $2`, [ns, key]);
      const current = found[0] ? { version: Number(found[0].version), size: Number(found[0].size) } : undefined;
      if (!versionMatches(expected, current?.version)) throw versionConflict(key, expected ?? null, current?.version);
      if (asFile) await this.checkTree(client, ns, [key]);
      if (this.quota) checkQuota(this.quota, await this.usage(client, ns), { bytes: record.size - (current?.size ?? 0), files: current ? 0 : 1 }, key);
      const { sql, params } = this.putStatement(ns, key, record, expected);
      const { rows } = await client.query<{ version: string }>(sql, params);
      if (!rows[0]) throw versionConflict(key, expected ?? null, current?.version);
      return Number(rows[0].version);
    });
  }

  /** The one statement that stores a record, conditional on `expected` as `put` documents. */
  private putStatement(ns: string, key: string, record: EngineRecord, expected: number | null | undefined): { sql: string; params: unknown[] } {
    const { dir } = splitKey(key);
    const fields = [ns, key, dir, record.encoding, record.content, record.original, record.size, record.created_at, record.modified_at];
    let sql: string;
    if (expected === undefined) {
      sql = `${this.insertRow(`VALUES ($1, $2, $3, ${this.nextVersion}, $4, $5, $6, $7, $8, $9)`)} ON CONFLICT (ns, key) DO UPDATE SET ${UPSERT} RETURNING version`;
    } else if (expected === null) {
      sql = `${this.insertRow(`VALUES ($1, $2, $3, ${this.nextVersion}, $4, $5, $6, $7, $8, $9)`)} ON CONFLICT (ns, key) DO NOTHING RETURNING version`;
    } else {
      // dir = $3 always holds (dir derives from key); it only gives $3 a use.
      sql = `UPDATE ${this.table} SET version = ${this.nextVersion}, encoding = $4, content = $5, original = $6, size = $7, created_at = $8,
             modified_at = $9 WHERE ns = $1 AND key = $2 AND dir = $3 AND version = $10 RETURNING version`;
    }
    return { sql, params: typeof expected === "number" ? [...fields, expected] : fields };
  }

  /** Serialises the namespace's tree- and quota-checked writes until the transaction ends. */
  private async lockNamespace(client: PoolClient, ns: string): Promise<void> {
    await client.query("SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))", [this.table, ns]);
  }

  /** `is_directory` when keys exist under a key, `not_a_directory` when an ancestor is a key. */
  private async checkTree(client: PoolClient, ns: string, keys: readonly string[]): Promise<void> {
    for (const key of keys) {
      const range = keyRange(`${key}/`);
      const ancestors = ancestorsOf(key).filter((dir) => dir !== "/");
      const { rows } = await client.query<{ under: boolean; above: boolean }>(
        `SELECT EXISTS (SELECT 1 FROM ${this.table} WHERE ns = $1 AND key >= $2 AND key < $3) AS under,
                EXISTS (SELECT 1 FROM ${this.table} WHERE ns = $1 AND key = ANY($4::text[])) AS above`,
        [ns, range.start, range.end, ancestors],
      );
      if (key === "/" || rows[0]?.under) throw errors.isDirectory(key);
      if (rows[0]?.above) throw errors.notADirectory(key);
    }
  }

  /** What a namespace holds, read inside a write's transaction (only when a quota is set: it reads every row's size). */
  private async usage(client: PoolClient, ns: string): Promise<Usage> {
    const { rows } = await client.query<{ bytes: string; files: string }>(
      `SELECT coalesce(sum(size), 0) AS bytes, count(*) AS files FROM ${this.table} WHERE ns = $1`,
      [ns],
    );
    return { bytes: Number(rows[0]!.bytes), files: Number(rows[0]!.files) };
  }

  putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, false);
  }

  private async putBatch(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, asFiles: boolean): Promise<number[]> {
    const ns = namespaceKey(namespace);
    // The last value for a key wins, as if the puts ran in order; sorting by key
    // makes concurrent putMany calls lock rows in one order, so they never deadlock.
    const latest = new Map<string, EngineRecord>();
    for (const [key, value] of entries) latest.set(key, toEngineRecord(this.checkKey(ns, key), value, this.maxValueSize));
    const keys = [...latest.keys()].sort(byCodePoint);
    if (asFiles) checkBatchConsistent(keys);
    const versions = new Map<string, number>();
    if (keys.length > 0) {
      await this.transaction(async (client) => {
        if (asFiles || this.quota) await this.lockNamespace(client, ns);
        if (asFiles) await this.checkTree(client, ns, keys);
        if (this.quota) {
          const { rows: sizes } = await client.query<{ key: string; size: string }>(
            `SELECT key, size FROM ${this.table} WHERE ns = $1 AND key = ANY($2::text[])`,
            [ns, keys],
          );
          const current = new Map(sizes.map((row) => [row.key, Number(row.size)]));
          const batch = keys.map((key) => [key, latest.get(key)!.size] as const);
          checkBatchQuota(this.quota, await this.usage(client, ns), batch, (key) => current.get(key));
        }
        await this.upsert(client, ns, keys, latest, versions);
      });
    }
    return entries.map(([key]) => versions.get(key)!);
  }

  /** Stores `records` of `keys` (sorted) in batches, inside the caller's transaction; each key's new version goes into `versions`. */
  private async upsert(client: PoolClient, ns: string, keys: readonly string[], records: ReadonlyMap<string, EngineRecord>, versions: Map<string, number>): Promise<void> {
    for (let start = 0; start < keys.length; ) {
      let end = start;
      for (let bytes = 0; end < keys.length && end - start < BATCH_ROWS && bytes < BATCH_BYTES; end++) {
        bytes += records.get(keys[end]!)!.content.length;
      }
      const batch = keys.slice(start, end);
      const values = batch.map((key) => records.get(key)!);
      const { rows } = await client.query<{ key: string; version: string }>(
        `${this.insertRow(
          `SELECT $1, k, d, ${this.nextVersion}, e, c, o, s, ca, ma
           FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::text[]) AS u(k, d, e, c, o, s, ca, ma)`,
        )} ON CONFLICT (ns, key) DO UPDATE SET ${UPSERT} RETURNING key, version`,
        [
          ns,
          batch,
          batch.map((key) => splitKey(key).dir),
          values.map((r) => r.encoding),
          values.map((r) => r.content),
          values.map((r) => r.original),
          values.map((r) => r.size),
          values.map((r) => r.created_at),
          values.map((r) => r.modified_at),
        ],
      );
      for (const row of rows) versions.set(row.key, Number(row.version));
      start = end;
    }
  }

  async delete(namespace: Namespace, key: string, options: PutOptions = {}): Promise<boolean> {
    const ns = namespaceKey(namespace);
    checkEngineKey(key);
    const expected = options.expectedVersion;
    if (expected === null) {
      const current = await this.get(namespace, key);
      if (current) throw versionConflict(key, null, current.version);
      return false;
    }
    const { rowCount } = await this.query(
      `DELETE FROM ${this.table} WHERE ns = $1 AND key = $2${expected === undefined ? "" : " AND version = $3"}`,
      expected === undefined ? [ns, key] : [ns, key, expected],
    );
    if (rowCount) return true;
    if (expected === undefined) return false;
    const current = await this.get(namespace, key);
    if (!versionMatches(expected, current?.version)) throw versionConflict(key, expected, current?.version);
    return false;
  }

  async deleteTree(namespace: Namespace, dir: string): Promise<string[]> {
    const ns = namespaceKey(namespace);
    const range = keyRange(treePrefix(checkEngineKey(dir)));
    const { rows } = await this.query<{ key: string }>(
      `DELETE FROM ${this.table} WHERE ns = $1 AND key >= $2${range.end === undefined ? "" : " AND key < $3"} RETURNING key`,
      range.end === undefined ? [ns, range.start] : [ns, range.start, range.end],
    );
    return rows.map((row) => row.key).sort(byCodePoint);
  }

  async list(namespace: Namespace, options: ListOptions = {}): Promise<ListPage> {
    const ns = namespaceKey(namespace);
    const limit = pageSize(options.limit);
    const params: unknown[] = [ns];
    const where = ["ns = $1"];
    const range = keyRange(options.prefix ?? "");
    if (range.start !== "") where.push(`key >= $${params.push(range.start)}`);
    if (range.end !== undefined) where.push(`key < $${params.push(range.end)}`);
    if (options.after !== undefined) where.push(`key > $${params.push(options.after)}`);
    const { rows } = await this.query<KeyRow>(
      `SELECT ${KEY_COLUMNS} FROM ${this.table} WHERE ${where.join(" AND ")} ORDER BY key LIMIT $${params.push(limit + 1)}`,
      params,
    );
    const items = rows.slice(0, limit).map(toKey);
    return rows.length > limit ? { items, next: items[items.length - 1]!.key } : { items };
  }

  async listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing> {
    const ns = namespaceKey(namespace);
    const prefix = treePrefix(checkEngineKey(dir));
    const end = prefixEnd(prefix)!; // a prefix ending in "/" always has one
    // Files: the directory's own rows. Subdirectories: a loose index scan over
    // (ns, dir). All dirs below `prefix` sort together per child name (they
    // share `prefix + name + "/"`), so after finding one, jumping to
    // `prefix + name + "0"` ("0" follows "/") skips that child's whole subtree.
    const { rows } = await this.query<KeyRow & { is_dir: boolean }>(
      `WITH RECURSIVE sub(dir) AS (
         (SELECT dir FROM ${this.table} WHERE ns = $1::text AND dir > $2::text AND dir < $3::text ORDER BY dir LIMIT 1)
         UNION ALL
         SELECT (SELECT t.dir FROM ${this.table} t
                 WHERE t.ns = $1 AND t.dir >= $2 || split_part(substr(sub.dir, length($2) + 1), '/', 1) || '0' AND t.dir < $3
                 ORDER BY t.dir LIMIT 1)
         FROM sub WHERE sub.dir IS NOT NULL
       )
       SELECT split_part(substr(dir, length($2) + 1), '/', 1) AS key, NULL AS version, NULL AS size, NULL AS modified_at, true AS is_dir
       FROM sub WHERE dir IS NOT NULL
       UNION ALL
       SELECT ${KEY_COLUMNS}, false FROM ${this.table} WHERE ns = $1 AND dir = $2`,
      [ns, prefix, end],
    );
    const listing: DirectoryListing = { files: [], dirs: [] };
    for (const row of rows) {
      if (row.is_dir) listing.dirs.push(row.key);
      else listing.files.push(toKey(row));
    }
    return listing;
  }

  async *search(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem> {
    const ns = namespaceKey(namespace);
    if (typeof substring !== "string" || typeof prefix !== "string") throw errors.invalidArgument("search needs a substring and a prefix");
    const params: unknown[] = [ns];
    const where = ["ns = $1", "encoding <> 'base64'"];
    const range = keyRange(prefix);
    if (range.start !== "") where.push(`key >= $${params.push(range.start)}`);
    if (range.end !== undefined) where.push(`key < $${params.push(range.end)}`);
    const needle = searchableNeedle(substring);
    if (needle !== undefined && needle !== "") where.push(`content LIKE $${params.push(`%${escapeLike(needle)}%`)}`);
    // Keys first (the trigram index answers without reading content), then the
    // candidates' records a batch at a time, so memory stays bounded.
    const { rows } = await this.query<{ key: string }>(`SELECT key FROM ${this.table} WHERE ${where.join(" AND ")} ORDER BY key`, params);
    for (let start = 0; start < rows.length; start += SEARCH_BATCH) {
      const batch = rows.slice(start, start + SEARCH_BATCH).map((row) => row.key);
      const found = await this.query<ItemRow>(
        `SELECT ${ITEM_COLUMNS} FROM ${this.table} WHERE ns = $1 AND key = ANY($2::text[]) ORDER BY key`,
        [ns, batch],
      );
      for (const row of found.rows) yield toItem(row);
    }
  }

  /**
   * The namespace as it is now: the last history `seq` (see `historyLayout`),
   * recorded so the id survives a restart. Takes the table in SHARE mode for
   * that instant: it waits for writes already running (whose history rows
   * may carry a lower `seq` than one already committed) and holds new ones
   * back until it commits. O(1) besides that wait.
   */
  async snapshot(namespace: Namespace): Promise<string> {
    const ns = namespaceKey(namespace);
    const names = this.names();
    return this.transaction(async (client) => {
      await client.query(`LOCK TABLE ${this.table} IN SHARE MODE`);
      const { rows } = await client.query<{ seq: string }>(`SELECT coalesce(max(seq), 0) AS seq FROM ${names.history}`);
      const seq = rows[0]!.seq;
      await client.query(`INSERT INTO ${names.snapshots} (ns, seq) VALUES ($1, $2) ON CONFLICT DO NOTHING`, [ns, seq]);
      return String(seq);
    });
  }

  /**
   * Puts the namespace back as it was at snapshot `id`, in one transaction
   * holding the namespace's advisory lock and the table in SHARE ROW
   * EXCLUSIVE mode: writers wait for it, and readers see the files wholly
   * before or wholly after (each statement sees one committed state).
   * Costs O(keys changed since the snapshot). Restored rows get new
   * versions, and the restore is itself recorded, so later snapshots stay
   * valid.
   */
  async restore(namespace: Namespace, id: string): Promise<Restored> {
    const ns = namespaceKey(namespace);
    return this.transaction(async (client) => {
      await this.lockNamespace(client, ns);
      await client.query(`LOCK TABLE ${this.table} IN SHARE ROW EXCLUSIVE MODE`);
      const seq = await this.snapshotSeq(client, ns, id);
      const rows = await this.firstChanges(client, ns, seq);
      const gone = rows.filter((row) => !row.present).map((row) => row.key);
      let changed = 0;
      if (gone.length > 0) changed += (await client.query(`DELETE FROM ${this.table} WHERE ns = $1 AND key = ANY($2::text[])`, [ns, gone])).rowCount ?? 0;
      const back = rows.filter((row) => row.present);
      const { rows: current } = await client.query<{ key: string; version: string }>(
        `SELECT key, version FROM ${this.table} WHERE ns = $1 AND key = ANY($2::text[])`,
        [ns, back.map((row) => row.key)],
      );
      const versions = new Map(current.map((row) => [row.key, row.version]));
      const records = new Map<string, EngineRecord>();
      for (const row of back) if (versions.get(row.key) !== row.version) records.set(row.key, historyRecord(row));
      await this.upsert(client, ns, [...records.keys()].sort(byCodePoint), records, new Map());
      return { snapshot: id, changed: changed + records.size };
    });
  }

  /** Files that differ between snapshot `from` and `to` (default: now), read in one consistent view. */
  async diff(namespace: Namespace, from: string, to: SnapshotPoint = "now"): Promise<FileChange[]> {
    const ns = namespaceKey(namespace);
    const changes = await this.transaction(async (client) => {
      await client.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
      const a = from === "now" ? Infinity : await this.snapshotSeq(client, ns, from);
      const b = to === "now" ? Infinity : await this.snapshotSeq(client, ns, to);
      const at = async (seq: number) => {
        const values = new Map<string, FileData | undefined>();
        if (seq === Infinity) return values;
        for (const row of await this.firstChanges(client, ns, seq)) values.set(row.key, row.present ? fromEngineRecord(historyRecord(row)) : undefined);
        return values;
      };
      const early = await at(Math.min(a, b));
      const late = await at(Math.max(a, b));
      const unchanged = [...early.keys()].filter((key) => !late.has(key));
      const { rows } = await client.query<ItemRow>(`SELECT ${ITEM_COLUMNS} FROM ${this.table} WHERE ns = $1 AND key = ANY($2::text[])`, [ns, unchanged]);
      const now = new Map(rows.map((row) => [row.key, toItem(row).value]));
      const out = new Map<string, KeyChange<FileData>>();
      for (const [key, value] of early) {
        const other = late.has(key) ? late.get(key) : now.get(key);
        out.set(key, a <= b ? { before: value, after: other } : { before: other, after: value });
      }
      return out;
    });
    return describeFileChanges(changes);
  }

  /** The history `seq` of snapshot `id` of namespace `ns`; `invalid_argument` for an id the namespace never gave. */
  private async snapshotSeq(client: PoolClient, ns: string, id: unknown): Promise<number> {
    const seq = typeof id === "string" && /^(0|[1-9][0-9]{0,15})$/.test(id) ? id : undefined;
    const { rows } = seq === undefined ? { rows: [] } : await client.query(`SELECT 1 FROM ${this.names().snapshots} WHERE ns = $1 AND seq = $2`, [ns, seq]);
    if (rows.length === 0) throw unknownSnapshot(id);
    return Number(seq);
  }

  /** Each key's first change after `seq`: its row as it was at `seq` (`present` false: absent then). */
  private async firstChanges(client: PoolClient, ns: string, seq: number): Promise<HistoryRow[]> {
    const { rows } = await client.query<HistoryRow>(
      `SELECT DISTINCT ON (key) key, present, encoding, content, original, size, created_at, modified_at, version
       FROM ${this.names().history} WHERE ns = $1 AND seq > $2 ORDER BY key, seq`,
      [ns, seq],
    );
    return rows;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsPool) await this.client.end();
  }

  /** Namespace plus key must fit in a btree entry; a longer key could never be stored. */
  private checkKey(ns: string, key: string): string {
    checkEngineKey(key);
    const bytes = encodeText(ns).length + encodeText(key).length;
    if (bytes > MAX_INDEXED_BYTES) throw errors.invalidPath(key, `path is too long for the PostgreSQL store (${bytes} bytes with its namespace; the limit is ${MAX_INDEXED_BYTES})`);
    return key;
  }

  private insertRow(source: string): string {
    return `INSERT INTO ${this.table} AS t (ns, key, dir, version, encoding, content, original, size, created_at, modified_at) ${source}`;
  }

  private query<R extends QueryResultRow>(sql: string, params: unknown[]): Promise<QueryResult<R>> {
    return this.withSchema(() => this.gate.run(() => this.client.query<R>(sql, params)));
  }

  private transaction<T>(work: (client: PoolClient) => Promise<T>): Promise<T> {
    return this.withSchema(() => this.gate.run(() => this.inTransaction(work)));
  }

  private async inTransaction<T>(work: (client: PoolClient) => Promise<T>): Promise<T> {
    const client = await this.client.connect();
    // A connection lost while checked out is reported through the failing query;
    // without a listener the client's 'error' event would crash the process.
    const ignore = () => {};
    client.on("error", ignore);
    let lost = false;
    try {
      await client.query("BEGIN");
      const result = await work(client);
      await client.query("COMMIT");
      return result;
    } catch (error) {
      lost = storeError(error).code === "unavailable";
      if (!lost) await client.query("ROLLBACK").catch(() => {});
      throw error;
    } finally {
      client.off("error", ignore);
      client.release(lost);
    }
  }

  /**
   * Runs `work` once the schema exists, mapping failures to typed errors. A
   * table dropped behind the store's back (undefined_table) is recreated and
   * the work retried once.
   */
  private async withSchema<T>(work: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      await this.ready();
      try {
        return await work();
      } catch (error) {
        if ((error as { code?: unknown })?.code !== "42P01" || attempt > 1) throw storeError(error);
        this.schemaReady = undefined;
      }
    }
  }

  /** Creates the table, its indexes and sequence once; a failure is retried on the next call. */
  private ready(): Promise<void> {
    if (this.closed) return Promise.reject(storeClosed());
    this.schemaReady ??= this.createSchema().catch((error: unknown) => {
      this.schemaReady = undefined;
      throw storeError(error);
    });
    return this.schemaReady;
  }

  /**
   * Brings the table to the current layout (see MIGRATIONS): creates it when
   * missing, migrates an older layout, refuses a newer one (`unsupported`).
   * A current table is only read. Otherwise the work runs in one transaction
   * under an advisory lock of the table, the version read again once the lock
   * is held, so stores opening an old or fresh table at once migrate it once.
   */
  private async createSchema(): Promise<void> {
    const schema = this.options.schema ?? "public";
    const table = this.options.table ?? "strata_files";
    const seen = await this.layoutVersion(this.client);
    if (seen.version === SCHEMA_VERSION && seen.complete) return;
    refuseUnknown(seen.version);
    const client = await this.client.connect();
    const ignore = () => {};
    client.on("error", ignore);
    try {
      await client.query("BEGIN");
      // Stores starting together would race on CREATE ... IF NOT EXISTS, or both migrate.
      await client.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`strata:${schema}.${table}`]);
      const { version, complete } = await this.layoutVersion(client);
      refuseUnknown(version);
      if (version !== SCHEMA_VERSION || !complete) {
        if (version === undefined || version === SCHEMA_VERSION) {
          // Nothing there yet, or a current layout missing a part (a table dropped behind the store's back).
          await this.createLayout(client);
        } else {
          for (const step of MIGRATIONS.slice(version)) await step(client, this.names());
        }
        await client.query(
          `INSERT INTO ${this.names().meta} (name, value) VALUES ('schema_version', $1) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`,
          [SCHEMA_VERSION],
        );
      } // else another store brought it up to date while this one waited for the lock.
      await client.query("COMMIT");
    } catch (error) {
      await client.query("ROLLBACK").catch(() => {});
      throw error;
    } finally {
      client.off("error", ignore);
      client.release();
    }
  }

  /** The qualified names of the store's relations. */
  private names(): LayoutNames {
    const schema = this.options.schema ?? "public";
    const table = this.options.table ?? "strata_files";
    const name = (suffix: string) => `${pg().escapeIdentifier(schema)}.${pg().escapeIdentifier(`${table}${suffix}`)}`;
    return {
      table: this.table,
      dir: name("_dir"),
      sequence: this.sequence,
      meta: name("_meta"),
      history: name("_history"),
      historyIndex: pg().escapeIdentifier(`${table}_history_ns_seq`),
      snapshots: name("_snapshots"),
      historyFunction: name("_history_fn"),
      historyTrigger: pg().escapeIdentifier(`${table}_history`),
    };
  }

  /**
   * The recorded layout version: the meta table's, else 0 when the files
   * table exists without one (the layout before versions), else undefined
   * (nothing there). `complete` says the table, its directory index, its
   * sequence and its snapshot tables all exist.
   */
  private async layoutVersion(db: Pool | PoolClient): Promise<{ version: number | undefined; complete: boolean }> {
    const names = this.names();
    const { rows } = await db.query<{ meta: boolean; files: boolean; complete: boolean }>(
      `SELECT to_regclass($1) IS NOT NULL AS meta, to_regclass($2) IS NOT NULL AS files,
              to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL AND to_regclass($4) IS NOT NULL
                AND to_regclass($5) IS NOT NULL AND to_regclass($6) IS NOT NULL AS complete`,
      [names.meta, names.table, names.dir, names.sequence, names.history, names.snapshots],
    );
    const found = rows[0]!;
    if (!found.meta) return { version: found.files ? 0 : undefined, complete: found.complete };
    const meta = await db.query<{ value: string }>(`SELECT value FROM ${names.meta} WHERE name = 'schema_version'`);
    const version = meta.rows[0] ? Number(meta.rows[0].value) : found.files ? 0 : undefined;
    return { version, complete: found.complete };
  }

  /** The current layout, each part created if missing, inside the caller's transaction. */
  private async createLayout(client: PoolClient): Promise<void> {
    const schema = this.options.schema ?? "public";
    const table = this.options.table ?? "strata_files";
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${pg().escapeIdentifier(schema)}`);
    await client.query(`CREATE TABLE IF NOT EXISTS ${this.table} (
      ns text COLLATE "C" NOT NULL,
      key text COLLATE "C" NOT NULL,
      dir text COLLATE "C" NOT NULL,
      version bigint NOT NULL,
      encoding text NOT NULL,
      content text NOT NULL,
      original text,
      size bigint NOT NULL,
      created_at text NOT NULL,
      modified_at text NOT NULL,
      PRIMARY KEY (ns, key))`);
    await client.query(`CREATE INDEX IF NOT EXISTS ${pg().escapeIdentifier(`${table}_dir`)} ON ${this.table} (ns, dir)`);
    await client.query(`CREATE SEQUENCE IF NOT EXISTS ${this.sequence}`);
    // Without pg_trgm (no privilege to create it) search still works, by scanning.
    await client.query("SAVEPOINT trigram");
    try {
      await client.query("CREATE EXTENSION IF NOT EXISTS pg_trgm");
      await client.query(
        `CREATE INDEX IF NOT EXISTS ${pg().escapeIdentifier(`${table}_trgm`)} ON ${this.table} USING gin (content gin_trgm_ops) WHERE encoding <> 'base64'`,
      );
      await client.query("RELEASE SAVEPOINT trigram");
    } catch (error) {
      if (storeError(error).code === "unavailable") throw error;
      await client.query("ROLLBACK TO SAVEPOINT trigram");
    }
    await client.query(metaTable(this.names()));
    await historyLayout(client, this.names());
  }
}

/** A key's row before one change (`present` false: the key did not exist); bigint columns as pg returns them, text. */
interface HistoryRow {
  key: string;
  present: boolean;
  encoding: EngineRecord["encoding"];
  content: string;
  original: string | null;
  size: string;
  created_at: string;
  modified_at: string;
  version: string;
}

function historyRecord(row: HistoryRow): EngineRecord {
  return {
    encoding: row.encoding,
    content: row.content,
    original: row.original,
    size: Number(row.size),
    created_at: row.created_at,
    modified_at: row.modified_at,
  };
}

/**
 * Snapshots as versioned rows: from a namespace's first snapshot on, every
 * change to one of its files writes, in the same transaction (a trigger), the
 * row as it was before into `<table>_history` under an ever-growing `seq`. A
 * snapshot is the last `seq` at the time, recorded in `<table>_snapshots`;
 * the value a key had at snapshot S is the before-image of its first change
 * after S, or its current row when it has not changed since. Namespaces that
 * never took a snapshot pay one index probe per write and keep no history.
 */
async function historyLayout(client: PoolClient, names: LayoutNames): Promise<void> {
  const columns = "encoding, content, original, size, created_at, modified_at, version";
  await client.query(`CREATE TABLE IF NOT EXISTS ${names.history} (
    seq bigserial PRIMARY KEY,
    ns text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    present boolean NOT NULL,
    encoding text, content text, original text, size bigint, created_at text, modified_at text, version bigint)`);
  await client.query(`CREATE INDEX IF NOT EXISTS ${names.historyIndex} ON ${names.history} (ns, seq)`);
  await client.query(`CREATE TABLE IF NOT EXISTS ${names.snapshots} (ns text COLLATE "C" NOT NULL, seq bigint NOT NULL, PRIMARY KEY (ns, seq))`);
  await client.query(`CREATE OR REPLACE FUNCTION ${names.historyFunction}() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM ${names.snapshots} WHERE ns = NEW.ns) THEN
          INSERT INTO ${names.history} (ns, key, present) VALUES (NEW.ns, NEW.key, false);
        END IF;
      ELSIF EXISTS (SELECT 1 FROM ${names.snapshots} WHERE ns = OLD.ns) THEN
        INSERT INTO ${names.history} (ns, key, present, ${columns})
        VALUES (OLD.ns, OLD.key, true, OLD.encoding, OLD.content, OLD.original, OLD.size, OLD.created_at, OLD.modified_at, OLD.version);
      END IF;
      RETURN NULL;
    END $fn$`);
  await client.query(`DROP TRIGGER IF EXISTS ${names.historyTrigger} ON ${names.table}`);
  await client.query(`CREATE TRIGGER ${names.historyTrigger} AFTER INSERT OR UPDATE OR DELETE ON ${names.table} FOR EACH ROW EXECUTE FUNCTION ${names.historyFunction}()`);
}

/** The store's relations, schema-qualified and quoted. */
interface LayoutNames {
  table: string;
  dir: string;
  sequence: string;
  meta: string;
  history: string;
  historyIndex: string;
  snapshots: string;
  historyFunction: string;
  /** Unqualified: a trigger lives in its table's schema. */
  historyTrigger: string;
}

/** The table that records the layout version (name `schema_version`). */
function metaTable(names: LayoutNames): string {
  return `CREATE TABLE IF NOT EXISTS ${names.meta} (name text PRIMARY KEY, value bigint NOT NULL)`;
}

/**
 * The layout steps: MIGRATIONS[n] takes a table written in layout n to layout
 * n + 1, so the current layout is version MIGRATIONS.length, recorded in the
 * `<table>_meta` table. Version 0 is the layout from before versions were
 * recorded (a files table without a meta table). A change of layout edits
 * createLayout and appends one step here; the steps run in order in one
 * transaction, with the new version, and must keep every record.
 */
const MIGRATIONS: ReadonlyArray<(client: PoolClient, names: LayoutNames) => Promise<unknown>> = [
  // 0 -> 1: the version is recorded, in a table of its own; the files table is unchanged.
  (client, names) => client.query(metaTable(names)),
  // 1 -> 2: snapshots (a history of changed rows, recorded snapshots); the files table keeps its rows.
  (client, names) => historyLayout(client, names),
];

/** The layout this code writes and reads. */
const SCHEMA_VERSION = MIGRATIONS.length;

/** Refuses a recorded version this code does not know (`unsupported`). */
function refuseUnknown(version: number | undefined): void {
  if (version !== undefined && (version > SCHEMA_VERSION || version < 0)) throw newerLayout("PostgreSQL", version, SCHEMA_VERSION);
}

/**
 * At most `size` operations at once, the rest waiting in arrival order for at
 * most `timeoutMs`. The pool would queue them too, but its one timeout cannot
 * tell a long queue (busy: wait or retry) from a server that does not answer
 * (unavailable); behind this gate, the pool's own timeout only ever times a
 * real connection attempt.
 */
class Gate {
  private active = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(
    private readonly size: number,
    private readonly timeoutMs: number,
  ) {}

  async run<T>(task: () => Promise<T>): Promise<T> {
    await this.enter();
    try {
      return await task();
    } finally {
      this.leave();
    }
  }

  private enter(): Promise<void> {
    if (this.active < this.size) {
      this.active++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const admit = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        this.waiting.splice(this.waiting.indexOf(admit), 1);
        reject(
          new StrataError(
            "busy",
            `The PostgreSQL store is busy: all ${this.size} connections stayed in use for ${this.timeoutMs} ms. Retry later, or raise maxConnections or acquireTimeoutMs`,
          ),
        );
      }, this.timeoutMs);
      this.waiting.push(admit);
    });
  }

  /** Hands the slot straight to the next waiter, so a newcomer cannot overtake the queue. */
  private leave(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.active--;
  }
}

const KEY_COLUMNS = "key, version, size, modified_at";
const ITEM_COLUMNS = "key, version, encoding, content, original, size, created_at, modified_at";
const UPSERT = `version = EXCLUDED.version, encoding = EXCLUDED.encoding, content = EXCLUDED.content, original = EXCLUDED.original,
  size = EXCLUDED.size, created_at = EXCLUDED.created_at, modified_at = EXCLUDED.modified_at`;

function toKey(row: KeyRow): StoredKey {
  return { key: row.key, version: Number(row.version), size: Number(row.size), modified_at: row.modified_at };
}

function toItem(row: ItemRow): StoredItem {
  return { key: row.key, value: fromEngineRecord({ ...row, size: Number(row.size) }), version: Number(row.version) };
}

/** Keys starting with `prefix` are exactly those in [start, end); no end when none exists. */
function keyRange(prefix: string): { start: string; end: string | undefined } {
  return { start: prefix, end: prefix === "" ? undefined : prefixEnd(prefix) };
}

function escapeLike(text: string): string {
  return text.replace(/[\\%_]/g, "\\$&");
}

/** Code-point order, the order of a `COLLATE "C"` column. */
function byCodePoint(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** SQLSTATE classes and socket errors that mean the server cannot be reached. */
const UNREACHABLE_CODES = new Set(["57P01", "57P02", "57P03", "53300", "ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH", "ENOTFOUND", "ENOENT"]);
const UNREACHABLE_MESSAGES = /Connection terminated|timeout exceeded when trying to connect|Query read timeout|Connection terminated unexpectedly|Client has encountered a connection error|Client was closed|Cannot use a pool after calling end/i;

/**
 * A typed error for any failure. Messages never repeat the driver's text,
 * which can name socket paths; the original error is kept as `cause`.
 */
function storeError(error: unknown): StrataError {
  if (error instanceof StrataError) return error;
  const code = typeof (error as { code?: unknown })?.code === "string" ? (error as { code: string }).code : undefined;
  const message = error instanceof Error ? error.message : "";
  if (code === "57014") return new StrataError("timeout", "PostgreSQL cancelled a statement that ran past the statement timeout", { cause: error });
  if ((code !== undefined && (code.startsWith("08") || UNREACHABLE_CODES.has(code))) || UNREACHABLE_MESSAGES.test(message)) {
    return new StrataError("unavailable", `PostgreSQL is unavailable (${code ?? "connection lost or timed out"}); the store reconnects on the next call`, { cause: error });
  }
  if (code === "54000") return new StrataError("invalid_argument", "PostgreSQL rejected a value over its size limits", { cause: error });
  if (code?.startsWith("22")) return new StrataError("invalid_argument", `PostgreSQL rejected a value (SQLSTATE ${code})`, { cause: error });
  return new StrataError("io_error", `PostgreSQL failed${code ? ` (SQLSTATE ${code})` : ""}`, { cause: error });
}
