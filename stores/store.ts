import { errors } from "../core/errors.js";
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
