import { errors, printable, StrataError } from "../core/errors.js";
import { fileDataSize, isFileData } from "../core/filedata.js";
import { checkQuota, type Quota, type Usage } from "../core/limits.js";
import { ancestorsOf, normalizePath } from "../core/paths.js";
import type { FileChange, Restored, SnapshotPoint } from "../core/snapshots.js";
import type { FileData } from "../core/types.js";

/**
 * The small interface every persistence engine implements. Keys are
 * normalised virtual file paths; values are file records (v2 written, v1
 * still read). Every record carries a version so writers can compare-and-set.
 */

/** A namespace: non-empty strings, e.g. `["users", userId, "files"]`. */
export type Namespace = readonly string[];

export interface StoredItem {
  key: string;
  value: FileData;
  /** Increases on every put; used for optimistic concurrency. */
  version: number;
}

/** A key's metadata without its value, for listings. */
export interface StoredKey {
  key: string;
  version: number;
  size: number;
  modified_at: string;
}

export interface PutOptions {
  /**
   * Compare-and-set: `null` means the key must not exist yet; a number means
   * the stored version must equal it. A mismatch throws `StrataError("conflict")`.
   * Omitted: unconditional.
   */
  expectedVersion?: number | null;
}

export interface ListOptions {
  /** Only keys starting with this string. */
  prefix?: string;
  /** Resume after this key (exclusive), from a previous page. */
  after?: string;
  /** Page size; engines cap it. */
  limit?: number;
}

export interface ListPage {
  items: StoredKey[];
  /** Pass as `after` to get the next page; absent on the last page. */
  next?: string;
}

/** A directory's direct children, computed by the engine from its parent-path index. */
export interface DirectoryListing {
  files: StoredKey[];
  /** Names of child directories (implicit: they hold at least one file). */
  dirs: string[];
}

export interface Store {
  get(namespace: Namespace, key: string): Promise<StoredItem | undefined>;
  /** Stores a value and returns its new version. */
  put(namespace: Namespace, key: string, value: FileData, options?: PutOptions): Promise<number>;
  /**
   * `put` of a file in a directory tree, with the tree checked in the same
   * atomic step: throws `is_directory` when keys exist under `key + "/"` and
   * `not_a_directory` when an ancestor directory is itself a key (after the
   * `expectedVersion` check, which throws `conflict` as in `put`). Optional:
   * without it the backend checks the tree, then puts.
   */
  putFile?(namespace: Namespace, key: string, value: FileData, options?: PutOptions): Promise<number>;
  /**
   * `putMany` of files, with the tree checked (as in `putFile`) for every
   * entry in the same atomic step; on any failure nothing is stored. Optional:
   * without it the backend stores file by file with `putFile`.
   */
  putFiles?(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]>;
  /**
   * `get`, answered at once: for engines whose records live in this process
   * (MemoryStore), with the same checks, errors and copies as `get`. A small
   * read costs less than the promises around it, so StoreBackend uses this
   * form when it is there. Engines that do I/O omit it.
   */
  getSync?(namespace: Namespace, key: string): StoredItem | undefined;
  /**
   * `putFile`, answered at once (see `getSync`): the same atomic checks and
   * errors, thrown. `value` is handed over: the store may keep that very
   * object, so the caller must not change it afterwards.
   */
  putFileSync?(namespace: Namespace, key: string, value: FileData, options?: PutOptions): number;
  /** Stores many values atomically where the engine has transactions; returns new versions in order. */
  putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]>;
  /** Removes a key; false when it did not exist. */
  delete(namespace: Namespace, key: string, options?: PutOptions): Promise<boolean>;
  /** Removes every key under a directory prefix (`dir + "/"`); returns the keys removed. */
  deleteTree(namespace: Namespace, dir: string): Promise<string[]>;
  /** Keys in key order, paged. */
  list(namespace: Namespace, options?: ListOptions): Promise<ListPage>;
  /** Direct children of a directory, reading only that directory's keys. */
  listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing>;
  /**
   * Candidate keys under `prefix` whose text may contain `substring`, using a
   * native index where the engine has one. May return false positives, never
   * false negatives: the backend verifies every candidate exactly.
   * Engines without an index omit it; the backend then scans.
   */
  search?(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem>;
  /** Releases connections. The store is unusable afterwards. */
  close(): Promise<void>;
}

/**
 * Snapshots of one namespace, for the stores that keep them (MemoryStore,
 * SqliteStore, PostgresStore; see docs/undo.md). Ids are opaque and belong to
 * the namespace that gave them: another namespace's id, or one never given,
 * fails with `invalid_argument`. A restore is one atomic step: a writer
 * racing it sees the files before it or after it, never a mix.
 */
export interface SnapshotStore {
  /** The namespace as it is now, kept under the id returned (ids of one namespace may repeat when nothing changed between them). */
  snapshot(namespace: Namespace): Promise<string>;
  /** Puts the namespace back as it was at snapshot `id`; later snapshots stay valid. */
  restore(namespace: Namespace, id: string): Promise<Restored>;
  /** Files that differ between snapshot `from` and `to` (default: now). */
  diff(namespace: Namespace, from: string, to?: SnapshotPoint): Promise<FileChange[]>;
  /** An independent store sharing unchanged records with this one; only where that is cheap (MemoryStore). */
  fork?(): Store & SnapshotStore;
}

/** Whether a store keeps snapshots. */
export function hasSnapshots(store: Store): store is Store & SnapshotStore {
  const s = store as Partial<SnapshotStore>;
  return typeof s.snapshot === "function" && typeof s.restore === "function" && typeof s.diff === "function";
}

/** The error for a snapshot id the namespace never gave (no host path, the id shown printable). */
export function unknownSnapshot(id: unknown): StrataError {
  return errors.invalidArgument(`No snapshot '${printable(id as string)}' in this namespace`);
}

/**
 * Options every bundled store accepts. `quota` limits each namespace (total
 * bytes of content, number of files); a put that would go over it fails with
 * `quota_exceeded`, checked in the same atomic step as the write. A put that
 * shrinks, and every delete, is always allowed, so a full namespace can be
 * cleaned up.
 */
export interface StoreQuotaOptions {
  quota?: Quota;
}

/**
 * The quota check of a batch: `current` gives the size of a key already
 * stored (undefined when absent). Entries for one key count once, at their
 * last value, as the batch stores them.
 */
export function checkBatchQuota(
  quota: Quota | undefined,
  usage: Usage,
  entries: ReadonlyArray<readonly [string, number]>,
  current: (key: string) => number | undefined,
): void {
  if (!quota || entries.length === 0) return;
  const latest = new Map(entries);
  const delta: Usage = { bytes: 0, files: 0 };
  for (const [key, size] of latest) {
    const before = current(key);
    delta.bytes += size - (before ?? 0);
    if (before === undefined) delta.files += 1;
  }
  checkQuota(quota, usage, delta, entries[0]![0]);
}

/**
 * The tree check of `putFile`, for engines that answer two questions about a
 * key: is it a stored file, is it a directory (holds keys under it). Throws
 * `is_directory` for the root or a directory, `not_a_directory` when an
 * ancestor is a file.
 */
export function checkTreeFor(key: string, isFile: (key: string) => boolean, isDirectory: (key: string) => boolean): void {
  if (key === "/" || isDirectory(key)) throw errors.isDirectory(key);
  for (const dir of ancestorsOf(key)) if (dir !== "/" && isFile(dir)) throw errors.notADirectory(key);
}

/** A batch of files must itself be a tree: no key may be an ancestor of another (`not_a_directory`). */
export function checkBatchConsistent(keys: readonly string[]): void {
  const all = new Set(keys);
  for (const key of keys) {
    for (const dir of ancestorsOf(key)) if (dir !== "/" && all.has(dir)) throw errors.notADirectory(key);
  }
}

/** Validates a namespace: a non-empty array of non-empty strings without NUL. */
export function validateNamespace(namespace: Namespace): void {
  if (!Array.isArray(namespace) || namespace.length === 0) throw errors.invalidArgument("namespace must be a non-empty array of strings");
  for (const part of namespace) {
    if (typeof part !== "string" || part === "") throw errors.invalidArgument("namespace parts must be non-empty strings");
    if (part.includes("\0")) throw errors.invalidArgument("namespace parts must not contain NUL");
  }
}

/**
 * One string per namespace that no other namespace's string starts with,
 * so `["a"]` never sees keys of `["a","b"]` or `["ab"]` (deepagents JS #772).
 */
export function namespaceKey(namespace: Namespace): string {
  validateNamespace(namespace);
  return JSON.stringify(namespace);
}

/** Validates a key: stores hold normalised virtual paths only (no NUL, no `..`, leading `/`). */
export function validateKey(key: string): void {
  if (normalizePath(key) !== key) throw errors.invalidPath(key, "store keys must be normalised absolute paths");
}

/** Validates a value: a v2 or v1 file record with string timestamps. */
export function validateValue(value: FileData): void {
  if (!isFileData(value) || typeof value.created_at !== "string" || typeof value.modified_at !== "string") {
    throw errors.invalidArgument("store values must be file records (content, encoding, created_at, modified_at)");
  }
}

/** Refuses a value over `maxValueSize` bytes with `too_large`. */
export function checkValueSize(key: string, value: FileData, maxValueSize: number): void {
  const size = fileDataSize(value);
  if (size > maxValueSize) throw errors.tooLarge(key, size, maxValueSize);
}

/** A key's listing metadata, computed from its value. */
export function describeKey(key: string, value: FileData, version: number): StoredKey {
  return { key, version, size: fileDataSize(value), modified_at: value.modified_at };
}

/** The error every store throws once closed. */
export function storeClosed(): StrataError {
  return new StrataError("unavailable", "The store is closed");
}

/**
 * What a persistent store answers when its storage records a layout version
 * newer than this code knows: it never reads or writes a layout it does not
 * understand. `found` is the recorded version (a number, or the raw text when
 * it is not one); the message names versions only, never a host path.
 */
export function newerLayout(engine: string, found: number | string, known: number): StrataError {
  return new StrataError(
    "unsupported",
    `The ${engine} store was written by a newer Strata: it records schema version ${found}, and this Strata knows versions up to ${known}. Upgrade Strata to open it`,
  );
}

/** The compare-and-set failure every store throws. */
export function versionConflict(key: string, expected: number | null, actual: number | undefined): StrataError {
  const wanted = expected === null ? "no file" : `version ${expected}`;
  const found = actual === undefined ? "no file" : `version ${actual}`;
  return new StrataError("conflict", `'${key}' changed concurrently: expected ${wanted}, found ${found}`);
}

/** True when a put/delete's `expectedVersion` accepts the current version (undefined: absent). */
export function versionMatches(expected: number | null | undefined, actual: number | undefined): boolean {
  if (expected === undefined) return true;
  return expected === null ? actual === undefined : actual === expected;
}

/**
 * The smallest string greater than every string starting with `prefix`, in
 * code-point (UTF-8 byte) order, for `key >= prefix AND key < end` range scans
 * in SQL engines. Undefined when no such bound exists (prefix of U+10FFFF only).
 */
export function prefixEnd(prefix: string): string | undefined {
  const points = Array.from(prefix);
  while (points.length > 0) {
    const last = points.pop()!.codePointAt(0)!;
    if (last < 0x10ffff) {
      const next = last + 1 === 0xd800 ? 0xe000 : last + 1;
      return points.join("") + String.fromCodePoint(next);
    }
  }
  return undefined;
}
