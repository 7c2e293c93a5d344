import type { BaseStore, Item } from "@langchain/langgraph-checkpoint";
import { errors, StrataError } from "../core/errors.js";
import { encodeBase64, fileDataSize, fileDataText, isFileData } from "../core/filedata.js";
import { validateQuota, type Quota, type Usage } from "../core/limits.js";
import { ancestorsOf, isWithin, normalizePath, parentOf, relativeTo } from "../core/paths.js";
import type { FileData } from "../core/types.js";
import { DEFAULT_MAX_VALUE_SIZE, DEFAULT_PAGE } from "./records.js";
import {
  checkBatchConsistent,
  checkBatchQuota,
  checkValueSize,
  describeKey,
  storeClosed,
  validateKey,
  validateNamespace,
  validateValue,
  versionConflict,
  versionMatches,
  type DirectoryListing,
  type ListOptions,
  type ListPage,
  type Namespace,
  type PutOptions,
  type Store,
  type StoredItem,
  type StoredKey,
  type StoreQuotaOptions,
} from "./store.js";

export interface LangGraphStoreOptions extends StoreQuotaOptions {
  /** The LangGraph store to wrap (InMemoryStore, PostgresStore, …); it stays the caller's: `close()` leaves it open. */
  store: BaseStore;
  /** Items fetched per `search` call while scanning a namespace (default 500). */
  pageSize?: number;
  /** Largest value, in bytes, a put accepts (default 64 MiB); larger ones fail with `too_large`. */
  maxValueSize?: number;
}

/** Where the adapter keeps a record's version inside the stored value; readers such as deepagents ignore it. */
export const VERSION_FIELD = "strata_version";

/**
 * A LangGraph `BaseStore` (InMemoryStore, PostgresStore, …) as a Strata
 * Store, so deepagents users keep the store, namespaces and records they
 * already have: keys are file paths and values are file records, as the
 * deepagents StoreBackend writes them (text, v1 lines, or bytes).
 *
 * What BaseStore cannot do, the adapter does as well as it can, and says so:
 * - It has no versions or compare-and-set. Versions live in the value
 *   (`strata_version`), and this adapter serialises its own writes, so
 *   compare-and-set holds among writers sharing one adapter. Writers in other
 *   processes, or writing to the BaseStore directly, are not covered.
 * - It has no key-range or parent index, and `search` by namespace prefix
 *   also returns sub-namespaces. Listings and searches scan the namespace
 *   and keep only items whose namespace is exactly the one asked for.
 * - It has no transactions: `putMany` is one `batch` call, atomic only
 *   where the underlying store makes batches atomic.
 * - The tree check of `putFile`/`putFiles` (a path is never both a file and a
 *   directory) and the quota check hold only among writes through this one
 *   adapter, which runs them one at a time; they cost a scan of the
 *   namespace per write, as BaseStore has no key-range query. Another
 *   process, or code writing to the BaseStore directly, can still put `/a`
 *   and `/a/b` side by side or go past the quota: LangGraph gives no way to
 *   prevent it.
 */
export class LangGraphStore implements Store {
  private readonly pageSize: number;
  private readonly maxValueSize: number;
  private readonly quota: Quota | undefined;
  private writes: Promise<unknown> = Promise.resolve();
  private lastVersion = 0;
  private closed = false;

  /** The wrapped LangGraph store (`options.store`): the escape hatch to it. */
  readonly client: BaseStore;

  constructor(options: LangGraphStoreOptions) {
    const store: unknown = options?.store;
    if (typeof store !== "object" || store === null || typeof (store as BaseStore).search !== "function") {
      throw errors.invalidArgument("LangGraphStore needs { store }: a LangGraph BaseStore to wrap");
    }
    this.client = store as BaseStore;
    this.pageSize = Math.max(1, options.pageSize ?? 500);
    this.maxValueSize = options.maxValueSize ?? DEFAULT_MAX_VALUE_SIZE;
    this.quota = validateQuota(options.quota);
  }

  async get(namespace: Namespace, key: string): Promise<StoredItem | undefined> {
    this.check(namespace, key);
    const item = await this.call(() => this.client.get([...namespace], key));
    if (!item) return undefined;
    const stored = toStoredItem(item);
    if (!stored) throw new StrataError("invalid_argument", `'${key}' holds a record that is not a file`);
    return stored;
  }

  put(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, false);
  }

  /** `put` with the tree checked first, inside this adapter's one-at-a-time writes (see the class comment for its limits). */
  putFile(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, true);
  }

  putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, false);
  }

  putFiles(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, true);
  }

  private async putOne(namespace: Namespace, key: string, value: FileData, options: PutOptions, asFile: boolean): Promise<number> {
    this.check(namespace, key);
    this.checkValue(key, value);
    return this.exclusive(async () => {
      const current = await this.call(() => this.client.get([...namespace], key));
      const version = current ? versionOf(current) : undefined;
      if (!versionMatches(options.expectedVersion, version)) throw versionConflict(key, options.expectedVersion ?? null, version);
      if (asFile || this.quota) await this.checkPlaces(namespace, [[key, value]], asFile);
      const next = this.nextVersion(version);
      await this.call(() => this.client.put([...namespace], key, toStoreValue(value, next)));
      return next;
    });
  }

  private async putBatch(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, asFiles: boolean): Promise<number[]> {
    for (const [key, value] of entries) {
      this.check(namespace, key);
      this.checkValue(key, value);
    }
    if (asFiles) checkBatchConsistent(entries.map(([key]) => key));
    return this.exclusive(async () => {
      if (asFiles || this.quota) await this.checkPlaces(namespace, entries, asFiles);
      const ns = [...namespace];
      const current = await this.call(() => this.client.batch(entries.map(([key]) => ({ namespace: ns, key }))));
      const latest = new Map<string, number | undefined>();
      const versions = entries.map(([key], i) => {
        const previous = latest.has(key) ? latest.get(key) : current[i] ? versionOf(current[i]) : undefined;
        const version = this.nextVersion(previous);
        latest.set(key, version);
        return version;
      });
      await this.call(() => this.client.batch(entries.map(([key, value], i) => ({ namespace: ns, key, value: toStoreValue(value, versions[i]!) }))));
      return versions;
    });
  }

  /** The tree and quota checks, from one scan of the namespace. */
  private async checkPlaces(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, checkTree: boolean): Promise<void> {
    const sizes = new Map<string, number>();
    for await (const item of this.scan(namespace)) sizes.set(item.key, fileDataSize(item.value));
    if (checkTree) {
      const keys = [...sizes.keys()];
      for (const [key] of entries) {
        if (key === "/" || keys.some((other) => other.startsWith(`${key}/`))) throw errors.isDirectory(key);
        if (ancestorsOf(key).some((dir) => dir !== "/" && sizes.has(dir))) throw errors.notADirectory(key);
      }
    }
    const usage: Usage = { bytes: 0, files: sizes.size };
    for (const size of sizes.values()) usage.bytes += size;
    checkBatchQuota(this.quota, usage, entries.map(([key, value]) => [key, fileDataSize(value)] as const), (key) => sizes.get(key));
  }

  async delete(namespace: Namespace, key: string, options: PutOptions = {}): Promise<boolean> {
    this.check(namespace, key);
    return this.exclusive(async () => {
      const current = await this.call(() => this.client.get([...namespace], key));
      const version = current ? versionOf(current) : undefined;
      if (!versionMatches(options.expectedVersion, version)) throw versionConflict(key, options.expectedVersion ?? null, version);
      if (!current) return false;
      await this.call(() => this.client.delete([...namespace], key));
      return true;
    });
  }

  async deleteTree(namespace: Namespace, dir: string): Promise<string[]> {
    this.check(namespace, dir);
    return this.exclusive(async () => {
      const keys: string[] = [];
      for await (const item of this.scan(namespace)) if (item.key !== dir && isWithin(dir, item.key)) keys.push(item.key);
      if (keys.length > 0) await this.call(() => this.client.batch(keys.map((key) => ({ namespace: [...namespace], key, value: null }))));
      return keys;
    });
  }

  async list(namespace: Namespace, options: ListOptions = {}): Promise<ListPage> {
    this.check(namespace);
    const prefix = options.prefix ?? "";
    const limit = Math.max(1, options.limit ?? DEFAULT_PAGE);
    const keys: StoredKey[] = [];
    for await (const item of this.scan(namespace)) {
      if (item.key.startsWith(prefix) && (options.after === undefined || item.key > options.after)) keys.push(describe(item));
    }
    keys.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    if (keys.length <= limit) return { items: keys };
    const items = keys.slice(0, limit);
    return { items, next: items[limit - 1]!.key };
  }

  async listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing> {
    this.check(namespace, dir);
    const files: StoredKey[] = [];
    const dirs = new Set<string>();
    for await (const item of this.scan(namespace)) {
      if (parentOf(item.key) === dir) files.push(describe(item));
      else if (item.key !== dir && isWithin(dir, item.key)) dirs.add(relativeTo(dir, item.key).split("/", 1)[0]!);
    }
    return { files, dirs: [...dirs] };
  }

  async *search(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem> {
    this.check(namespace);
    for await (const item of this.scan(namespace)) {
      if (item.key.startsWith(prefix) && fileDataText(item.value)?.includes(substring)) yield item;
    }
  }

  /** Stops using the wrapped store; the store itself belongs to the caller and stays open. */
  async close(): Promise<void> {
    this.closed = true;
  }

  /**
   * A version above the key's previous one and above every version this
   * adapter handed out, and time-based across adapters, so a deleted and
   * recreated key does not repeat a version a writer may still hold.
   */
  private nextVersion(previous: number | undefined): number {
    this.lastVersion = Math.max((previous ?? 0) + 1, this.lastVersion + 1, Date.now());
    return this.lastVersion;
  }

  /** Every file record in exactly this namespace (BaseStore's search also returns sub-namespaces). */
  private async *scan(namespace: Namespace): AsyncIterable<StoredItem> {
    for (let offset = 0; ; offset += this.pageSize) {
      const page = await this.call(() => this.client.search([...namespace], { limit: this.pageSize, offset }));
      for (const item of page) {
        if (!sameNamespace(item.namespace, namespace) || !isNormalizedKey(item.key)) continue;
        const stored = toStoredItem(item);
        if (stored) yield stored;
      }
      if (page.length < this.pageSize) return;
    }
  }

  private check(namespace: Namespace, key?: string): void {
    if (this.closed) throw storeClosed();
    validateNamespace(namespace);
    if (key !== undefined) validateKey(key);
  }

  private checkValue(key: string, value: FileData): void {
    validateValue(value);
    checkValueSize(key, value, this.maxValueSize);
  }

  /** Runs writes one at a time, so each read-compare-write is not interleaved with another. */
  private exclusive<T>(operation: () => Promise<T>): Promise<T> {
    const run = this.writes.then(operation, operation);
    this.writes = run.catch(() => undefined);
    return run;
  }

  /** Calls the wrapped store, turning its errors into typed ones. */
  private async call<T>(operation: () => Promise<T>): Promise<T> {
    if (this.closed) throw storeClosed();
    try {
      return await operation();
    } catch (error) {
      if (error instanceof StrataError) throw error;
      if (error instanceof Error && error.name === "InvalidNamespaceError") {
        throw new StrataError("invalid_argument", `The LangGraph store rejected the namespace: ${error.message}`, { cause: error });
      }
      throw new StrataError("io_error", "The LangGraph store failed", { cause: error });
    }
  }
}


function versionOf(item: Item): number {
  const version = (item.value as Record<string, unknown>)[VERSION_FIELD];
  return typeof version === "number" && Number.isSafeInteger(version) ? version : 0;
}

function toStoreValue(value: FileData, version: number): Record<string, unknown> {
  return { ...structuredClone(value), [VERSION_FIELD]: version };
}

/**
 * Reads the records deepagents writes as well as ours: v1 lines, v2 text
 * with or without an `encoding`, and (deepagents JS) binary as bytes.
 */
function toStoredItem(item: Item): StoredItem | undefined {
  const raw = item.value as Record<string, unknown>;
  const { content, created_at, modified_at } = raw;
  if (typeof created_at !== "string" || typeof modified_at !== "string") return undefined;
  let value: FileData;
  if (ArrayBuffer.isView(content)) {
    const bytes = new Uint8Array(content.buffer, content.byteOffset, content.byteLength);
    value = { content: encodeBase64(bytes), encoding: "base64", created_at, modified_at };
  } else if (typeof content === "string" && raw.encoding === undefined) {
    value = { content, encoding: "utf-8", created_at, modified_at };
  } else {
    const candidate = Array.isArray(content)
      ? { content: [...(content as string[])], created_at, modified_at }
      : { content, encoding: raw.encoding, created_at, modified_at };
    if (!isFileData(candidate)) return undefined;
    value = candidate;
  }
  return { key: item.key, value, version: versionOf(item) };
}

function describe(item: StoredItem): StoredKey {
  return describeKey(item.key, item.value, item.version);
}

function sameNamespace(a: readonly string[], b: Namespace): boolean {
  return a.length === b.length && a.every((part, i) => part === b[i]);
}

function isNormalizedKey(key: string): boolean {
  try {
    return normalizePath(key) === key;
  } catch {
    return false;
  }
}
