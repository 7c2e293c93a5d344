import { errors } from "../core/errors.js";
import { fileDataSize, fileDataText } from "../core/filedata.js";
import { checkQuota, validateQuota, type Quota } from "../core/limits.js";
import { describeFileChanges, type FileChange, type KeyChange, type Restored, type SnapshotPoint, SnapshotTree } from "../core/snapshots.js";
import type { FileData, FileDataV2 } from "../core/types.js";
import { DEFAULT_MAX_VALUE_SIZE, DEFAULT_PAGE, MAX_PAGE, treePrefix } from "./records.js";
import {
  checkBatchConsistent,
  checkBatchQuota,
  describeKey,
  namespaceKey,
  storeClosed,
  validateKey,
  validateValue,
  versionConflict,
  unknownSnapshot,
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

/**
 * One namespace's records, with the key order and the directories kept up to
 * date. Directories are a count of the entries in each (per directory, not
 * per file: a per-file index would cost about 30 bytes a file, a tenth of a
 * small file's footprint); a listing walks the sorted keys and jumps over each
 * subdirectory's keys with a binary search.
 */
class Space {
  readonly items = new Map<string, StoredItem>();
  /** Entries (files and subdirectories) directly inside each directory but the root, which always exists. */
  private readonly dirs = new Map<string, number>();
  /** Keys in code-unit order, once `unsorted` is merged in: listings never re-sort the whole set. */
  private readonly ordered: string[] = [];
  /**
   * Keys added since the last listing, in arrival order. Inserting each into
   * `ordered` at once would move half the array per new file (O(n) per write);
   * the next listing sorts these few and merges them in one pass instead.
   */
  private unsorted: string[] = [];
  /** Total bytes of content, for the quota; kept only where there is one (`countsBytes`). */
  bytes = 0;

  /** `countsBytes`: the store has a quota, so `bytes` is kept; without one, no write needs a value's size. */
  constructor(private readonly countsBytes: boolean) {}
  /**
   * True once a key has been a file and a directory at once, which only the
   * unchecked `put` can make. Until then, a file's parent that is a directory
   * proves the tree check (no ancestor is a file) without a look at each.
   */
  private mixed = false;
  /**
   * The snapshot journal, from the namespace's first snapshot on: told every
   * change with the item it replaced. Absent until then, so a store that
   * never snapshots keeps no replaced items.
   */
  journal: SnapshotTree<StoredItem> | undefined;

  /** An independent copy sharing every item (items are never changed in place): O(keys) pointers. */
  clone(): Space {
    const copy = new Space(this.countsBytes);
    for (const [key, item] of this.items) copy.items.set(key, item);
    for (const key of this.sorted) copy.ordered.push(key);
    for (const [dir, files] of this.dirs) copy.dirs.set(dir, files);
    copy.bytes = this.bytes;
    copy.mixed = this.mixed;
    return copy;
  }

  /**
   * `size`: the value's size in bytes, `previous`: the item the key holds now,
   * `parent`: the key's directory; each when the caller has it already.
   */
  set(item: StoredItem, size?: number, previous = this.items.get(item.key), parent?: string): void {
    if (!previous) {
      if (this.dirs.has(item.key)) this.mixed = true;
      this.unsorted.push(item.key);
      this.count(item.key, 1, parent);
    }
    if (this.countsBytes) this.bytes += (size ?? fileDataSize(item.value)) - (previous ? fileDataSize(previous.value) : 0);
    this.items.set(item.key, item);
    this.journal?.note(item.key, previous, item);
  }

  remove(key: string): boolean {
    const previous = this.items.get(key);
    if (!previous) return false;
    this.items.delete(key);
    if (this.countsBytes) this.bytes -= fileDataSize(previous.value);
    const sorted = this.sorted;
    sorted.splice(lowerBound(sorted, key), 1);
    this.count(key, -1);
    this.journal?.note(key, previous, undefined);
    return true;
  }

  /**
   * Counts `key` in (delta 1) or out of (delta -1) its parent directory. A
   * directory that appears is counted into its own parent in turn, and one
   * left empty is dropped from it; most writes land in an existing directory
   * and stop at the first step.
   */
  private count(key: string, delta: 1 | -1, parent?: string): void {
    const dirs = this.dirs;
    for (let child = key, known = parent; ; known = undefined) {
      const i = child.lastIndexOf("/");
      if (i <= 0) return;
      const dir = known ?? child.slice(0, i);
      const entries = (dirs.get(dir) ?? 0) + delta;
      if (entries > 0) dirs.set(dir, entries);
      else dirs.delete(dir);
      // Only a directory that appeared (1 entry after an add) or went (0 after a removal) changes its parent.
      if (entries !== (delta === 1 ? 1 : 0)) return;
      if (delta === 1 && this.items.has(dir)) this.mixed = true;
      child = dir;
    }
  }

  isDirectory(key: string): boolean {
    return key === "/" || this.dirs.has(key);
  }

  /** Full keys of the files and names of the directories directly inside `dir`, in key order. */
  children(dir: string): { files: string[]; dirs: string[] } {
    const found: { files: string[]; dirs: string[] } = { files: [], dirs: [] };
    if (!this.isDirectory(dir)) return found;
    const sorted = this.sorted;
    const prefix = treePrefix(dir);
    for (let i = lowerBound(sorted, prefix); i < sorted.length && sorted[i]!.startsWith(prefix); ) {
      const key = sorted[i]!;
      const slash = key.indexOf("/", prefix.length);
      if (slash === -1) {
        found.files.push(key);
        i++;
      } else {
        found.dirs.push(key.slice(prefix.length, slash));
        // Every key under this subdirectory sorts before its path + "0" ("0" follows "/"): skip them all at once.
        i = lowerBound(sorted, `${key.slice(0, slash)}0`);
      }
    }
    return found;
  }

  /** Every key in code-unit order. */
  get sorted(): string[] {
    if (this.unsorted.length > 0) {
      const added = this.unsorted.sort();
      this.unsorted = [];
      mergeInto(this.ordered, added);
    }
    return this.ordered;
  }

  get usage() {
    return { bytes: this.bytes, files: this.items.size };
  }

  sizeOf(key: string): number | undefined {
    const item = this.items.get(key);
    return item && fileDataSize(item.value);
  }

  /**
   * The `putFile` tree check; synchronous, so no other write can run between it and the put.
   * Answers the key's directory (undefined at the top), which `set` then needs no second slice for.
   */
  checkTree(key: string): string | undefined {
    // checkTreeFor's rule, walked in place: no list of ancestors, no closures, on every write.
    if (this.isDirectory(key)) throw errors.isDirectory(key);
    const slash = key.lastIndexOf("/");
    if (slash <= 0) return undefined;
    const parent = key.slice(0, slash);
    // A directory is no file, and nor is any directory above it (each holds the one below): nothing more to look at.
    if (!this.mixed && this.dirs.has(parent)) return parent;
    let dir: string | undefined;
    for (let i = key.indexOf("/", 1); i !== -1; i = key.indexOf("/", i + 1)) {
      dir = key.slice(0, i);
      if (this.items.has(dir)) throw errors.notADirectory(key);
    }
    return dir;
  }

  /** Keys starting with `prefix`, from the first one greater than `after`. */
  *keys(prefix: string, after?: string): Generator<string> {
    const sorted = this.sorted;
    const from = after !== undefined && after >= prefix ? upperBound(sorted, after) : lowerBound(sorted, prefix);
    for (let i = from; i < sorted.length && sorted[i]!.startsWith(prefix); i++) yield sorted[i]!;
  }
}

export interface MemoryStoreOptions extends StoreQuotaOptions {
  /** Largest value, in bytes, a put accepts (default 64 MiB); larger ones fail with `too_large`. */
  maxValueSize?: number;
}

/**
 * Records in a Map: the store for tests, browsers and short-lived agents.
 * Pure TypeScript (no `node:` imports). Values are copied in and out, so a
 * caller mutating a record cannot change what is stored.
 */
export class MemoryStore implements Store, SnapshotStore {
  private readonly spaces = new Map<string, Space>();
  private version = 0;
  private closed = false;
  private readonly maxValueSize: number;
  private readonly quota: Quota | undefined;
  private readonly options: MemoryStoreOptions;

  constructor(options: MemoryStoreOptions = {}) {
    this.options = options;
    this.maxValueSize = options.maxValueSize ?? DEFAULT_MAX_VALUE_SIZE;
    this.quota = validateQuota(options.quota);
  }

  async get(namespace: Namespace, key: string): Promise<StoredItem | undefined> {
    return this.getSync(namespace, key);
  }

  getSync(namespace: Namespace, key: string): StoredItem | undefined {
    // A key found is valid (each was checked on its way in), so only a miss is checked: a hit skips the path scan.
    const item = this.space(namespace, false)?.items.get(key);
    if (item) return copyItem(item);
    checkedKey(key);
    return undefined;
  }

  // Every check below is synchronous, with no await between it and the write, so
  // no other caller's write can slip in: this is what makes them atomic here.
  async put(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, false);
  }

  async putFile(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, true);
  }

  putFileSync(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): number {
    return this.putOne(namespace, key, value, options, true);
  }

  async putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, false);
  }

  async putFiles(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, true);
  }

  private putOne(namespace: Namespace, key: string, value: FileData, options: PutOptions, asFile: boolean): number {
    const space = this.space(namespace, true);
    const current = space.items.get(checkedKey(key));
    const size = this.checkValue(key, value);
    if (!versionMatches(options.expectedVersion, current?.version)) throw versionConflict(key, options.expectedVersion ?? null, current?.version);
    const parent = asFile ? space.checkTree(key) : undefined;
    if (this.quota) checkQuota(this.quota, space.usage, { bytes: size! - (current ? fileDataSize(current.value) : 0), files: current ? 0 : 1 }, key);
    space.set({ key, value: copyIn(value), version: ++this.version }, size, current, parent);
    return this.version;
  }

  private putBatch(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, asFiles: boolean): number[] {
    const space = this.space(namespace, true);
    // All or nothing: validate everything before the first write.
    for (const [key, value] of entries) {
      checkedKey(key);
      this.checkValue(key, value);
      if (asFiles) space.checkTree(key);
    }
    if (asFiles) checkBatchConsistent(entries.map(([key]) => key));
    if (this.quota) checkBatchQuota(this.quota, space.usage, entries.map(([key, value]) => [key, fileDataSize(value)] as const), (key) => space.sizeOf(key));
    return entries.map(([key, value]) => {
      space.set({ key, value: copyIn(value), version: ++this.version });
      return this.version;
    });
  }

  async delete(namespace: Namespace, key: string, options: PutOptions = {}): Promise<boolean> {
    const space = this.space(namespace, false);
    const current = space?.items.get(checkedKey(key));
    if (!versionMatches(options.expectedVersion, current?.version)) throw versionConflict(key, options.expectedVersion ?? null, current?.version);
    return space?.remove(key) ?? false;
  }

  async deleteTree(namespace: Namespace, dir: string): Promise<string[]> {
    const space = this.space(namespace, false);
    if (!space) return [];
    const removed = [...space.keys(treePrefix(checkedKey(dir)))];
    for (const key of removed) space.remove(key);
    return removed;
  }

  async list(namespace: Namespace, options: ListOptions = {}): Promise<ListPage> {
    const space = this.space(namespace, false);
    const limit = Math.min(Math.max(1, options.limit ?? DEFAULT_PAGE), MAX_PAGE);
    const items: StoredKey[] = [];
    if (!space) return { items };
    for (const key of space.keys(options.prefix ?? "", options.after)) {
      if (items.length === limit) return { items, next: items[items.length - 1]!.key };
      items.push(describe(space.items.get(key)!));
    }
    return { items };
  }

  async listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing> {
    const space = this.space(namespace, false);
    const listing: DirectoryListing = { files: [], dirs: [] };
    if (!space) return listing;
    const { files, dirs } = space.children(checkedKey(dir));
    for (const key of files) listing.files.push(describe(space.items.get(key)!));
    listing.dirs = dirs;
    return listing;
  }

  async *search(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem> {
    const space = this.space(namespace, false);
    if (!space) return;
    for (const key of [...space.keys(prefix)]) {
      const item = space.items.get(key);
      if (item && fileDataText(item.value)?.includes(substring)) yield copyItem(item);
    }
  }

  /**
   * The namespace as it is now, under an id for `restore` and `diff`. O(1):
   * a snapshot holds only the items changed since the previous one and
   * shares them (core/snapshots.ts). Answered at once; `snapshot` is the
   * same through a promise, as SnapshotStore has it.
   */
  snapshotSync(namespace: Namespace): string {
    const space = this.space(namespace, true);
    space.journal ??= new SnapshotTree<StoredItem>(`${Math.random().toString(36).slice(2, 8)}-`);
    return space.journal.snapshot();
  }

  async snapshot(namespace: Namespace): Promise<string> {
    return this.snapshotSync(namespace);
  }

  /**
   * Puts the namespace back as it was at snapshot `id`, the very items (and
   * their versions) it held then. Synchronous from start to end, so a
   * concurrent operation sees it wholly before or wholly after. Costs
   * O(changes between now and the snapshot). Quotas are not checked: the
   * state restored was once accepted.
   */
  restoreSync(namespace: Namespace, id: string): Restored {
    const space = this.space(namespace, false);
    const journal = space?.journal;
    if (!space || !journal || typeof id !== "string" || !journal.has(id)) throw unknownSnapshot(id);
    const changes = journal.changes("now", id);
    // Removals first, so a file never lands where a directory still stands.
    for (const [key, { after }] of changes) if (after === undefined) space.remove(key);
    for (const [, { after }] of changes) if (after !== undefined) space.set(after);
    journal.moveTo(id);
    return { snapshot: id, changed: changes.size };
  }

  async restore(namespace: Namespace, id: string): Promise<Restored> {
    return this.restoreSync(namespace, id);
  }

  /** Files that differ between snapshot `from` and `to` (default: now); O(changes between them). */
  async diff(namespace: Namespace, from: string, to: SnapshotPoint = "now"): Promise<FileChange[]> {
    const journal = this.space(namespace, false)?.journal;
    for (const id of [from, to]) if (!journal || typeof id !== "string" || (id !== "now" && !journal.has(id))) throw unknownSnapshot(id);
    const files = new Map<string, KeyChange<FileData>>();
    for (const [key, { before, after }] of journal!.changes(from, to)) files.set(key, { before: before?.value, after: after?.value });
    return describeFileChanges(files);
  }

  /**
   * An independent store holding the same records: every item is shared
   * (nothing is copied but each namespace's key table, O(keys) pointers),
   * and changes on either side never reach the other. Same options; no
   * snapshots.
   */
  fork(): MemoryStore {
    if (this.closed) throw storeClosed();
    const copy = new MemoryStore(this.options);
    copy.version = this.version;
    for (const [id, space] of this.spaces) copy.spaces.set(id, space.clone());
    return copy;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.spaces.clear();
  }

  /**
   * Validates a value and answers its size in bytes; undefined where nothing
   * needs it: no quota, and a text too short to pass maxValueSize whatever it
   * holds (a UTF-16 unit is at most 3 bytes of UTF-8). Measuring the size was
   * a good part of a small write's cost.
   */
  private checkValue(key: string, value: FileData): number | undefined {
    validateValue(value);
    if (!this.quota && typeof value.content === "string" && value.content.length * 3 <= this.maxValueSize) return undefined;
    const size = fileDataSize(value);
    if (size > this.maxValueSize) throw errors.tooLarge(key, size, this.maxValueSize);
    return size;
  }

  /** The last namespace's parts and id: a backend asks for the same namespace call after call. */
  private lastNamespace: readonly string[] | undefined;
  private lastId = "";

  /** `namespaceKey`, without validating and serialising again a namespace equal to the last one. */
  private namespaceId(namespace: Namespace): string {
    const last = this.lastNamespace;
    if (last && Array.isArray(namespace) && namespace.length === last.length) {
      let same = true;
      for (let i = 0; same && i < last.length; i++) same = namespace[i] === last[i];
      if (same) return this.lastId;
    }
    const id = namespaceKey(namespace);
    this.lastNamespace = [...namespace];
    this.lastId = id;
    return id;
  }

  private space(namespace: Namespace, create: true): Space;
  private space(namespace: Namespace, create: boolean): Space | undefined;
  private space(namespace: Namespace, create: boolean): Space | undefined {
    if (this.closed) throw storeClosed();
    const id = this.namespaceId(namespace);
    let space = this.spaces.get(id);
    if (!space && create) this.spaces.set(id, (space = new Space(this.quota !== undefined)));
    return space;
  }
}

/**
 * A stored record of the plain shape: the four fields Strata writes, all
 * strings, in that order, nothing else. Its copy out is one object literal,
 * several times cheaper than the general copy (a field scan and a spread),
 * which was a good part of a small read's cost. Never handed out: reads copy.
 */
class PlainRecord implements FileDataV2 {
  constructor(
    readonly content: string,
    readonly encoding: FileDataV2["encoding"],
    readonly created_at: string,
    readonly modified_at: string,
  ) {}
}

/** The fields of a plain record, in the order fileDataFromText writes them. */
const PLAIN_FIELDS = ["content", "encoding", "created_at", "modified_at"] as const;

/**
 * A stored copy of `value`: a PlainRecord where it has the plain shape, else a copy no caller can reach into.
 * Symbol-keyed fields are not kept, as no other store keeps them (nor structuredClone).
 */
function copyIn(value: FileData): FileData {
  const fields = value as unknown as Record<string, unknown>;
  let n = 0;
  for (const key in fields) {
    if (key !== PLAIN_FIELDS[n++] || typeof fields[key] !== "string") return copyValue(value);
  }
  if (n !== 4) return copyValue(value);
  const { content, encoding, created_at, modified_at } = value as FileDataV2;
  return new PlainRecord(content, encoding, created_at, modified_at);
}

/** What a caller gets of a stored value: a copy it may change freely. */
function copyOut(value: FileData): FileData {
  if (value instanceof PlainRecord) return { content: value.content, encoding: value.encoding, created_at: value.created_at, modified_at: value.modified_at };
  return copyValue(value);
}

/**
 * A copy no caller can reach into. A record whose fields are all strings (every
 * record Strata writes) is copied field by field, a fraction of the cost of
 * structuredClone; anything else (a legacy list of lines, an extra object) is
 * cloned deeply.
 */
function copyValue(value: FileData): FileData {
  for (const key in value) {
    const field = (value as unknown as Record<string, unknown>)[key];
    if (typeof field === "object" && field !== null) return structuredClone(value);
  }
  return { ...value };
}

function checkedKey(key: string): string {
  validateKey(key);
  return key;
}

function describe(item: StoredItem): StoredKey {
  return describeKey(item.key, item.value, item.version);
}

function copyItem(item: StoredItem): StoredItem {
  return { key: item.key, value: copyOut(item.value), version: item.version };
}

/** Merges sorted `added` (no key already in `into`) into sorted `into`, in place, from the back. */
function mergeInto(into: string[], added: readonly string[]): void {
  let i = into.length - 1;
  let j = added.length - 1;
  into.length += added.length;
  for (let k = into.length - 1; j >= 0; k--) {
    if (i >= 0 && into[i]! > added[j]!) into[k] = into[i--]!;
    else into[k] = added[j--]!;
  }
}

function lowerBound(sorted: readonly string[], key: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function upperBound(sorted: readonly string[], key: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! <= key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
