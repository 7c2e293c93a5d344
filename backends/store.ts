import { BaseBackend, type UploadAnswer, failure, readRawNow, writeNow } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, isStrataError, StrataError, toErrorInfo } from "../core/errors.js";
import { fileDataInfo, fileDataFromBytes, fileDataFromText, fileDataSize, fileDataText, toFileDataV2 } from "../core/filedata.js";
import { compileGlob, impliedDirectories, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { ancestorsOf, isWithin, joinPath, normalizePath, sortByPath } from "../core/paths.js";
import { BackendRuntime, type BackendFactory } from "../core/protocol.js";
import type { FileChange, Restored, SnapshotPoint, Snapshots } from "../core/snapshots.js";
import type {
  Changed,
  FilesUpdate,
  DeleteResult,
  EditResult,
  FileData,
  FileDataV2,
  FileInfo,
  GrepMatch,
  GrepResult,
  Result,
  WriteResult,
} from "../core/types.js";
import { DEFAULT_PAGE, treePrefix } from "../stores/records.js";
import {
  hasSnapshots,
  validateNamespace,
  type Namespace,
  type SnapshotStore,
  type Store,
  type StoredItem,
  type StoredKey,
} from "../stores/store.js";

/** A fixed namespace, or one computed per call from the runtime (per user, assistant or thread). */
export type NamespaceSpec = Namespace | ((runtime: BackendRuntime) => Namespace);

export interface StoreBackendOptions {
  store: Store;
  /** Defaults to `["filesystem"]`, the deepagents package's default. */
  namespace?: NamespaceSpec;
  /** What a namespace function sees; defaults to an empty runtime. */
  runtime?: BackendRuntime;
  /** Largest file, in bytes, that write, edit and upload accept. */
  maxFileSize?: number;
  /** Reads-and-writes an edit attempts before reporting a conflict (default 10). */
  editAttempts?: number;
}

const DEFAULT_NAMESPACE: Namespace = ["filesystem"];
/** The put options of a create: succeed only where no record exists. */
const CREATE = Object.freeze({ expectedVersion: null });

/**
 * Files in a Store (memory, SQLite, PostgreSQL, Redis, a LangGraph store),
 * persistent across threads. Every write carries the version it read, so
 * concurrent writers never lose each other's updates: a create fails if the
 * file appeared meanwhile, an edit re-reads and retries. Listings and searches
 * are pushed down to the engine's indexes.
 */
export class StoreBackend extends BaseBackend implements Snapshots {
  readonly store: Store;
  readonly runtime: BackendRuntime;
  private readonly namespaceSpec: NamespaceSpec;
  private readonly maxFileSize: number | undefined;
  private readonly editAttempts: number;
  private readonly options: StoreBackendOptions;

  constructor(options: StoreBackendOptions) {
    super();
    this.options = options;
    this.store = options.store;
    this.runtime = options.runtime ?? new BackendRuntime();
    this.namespaceSpec = options.namespace ?? DEFAULT_NAMESPACE;
    this.maxFileSize = options.maxFileSize;
    this.editAttempts = Math.max(1, options.editAttempts ?? 10);
    if (typeof this.namespaceSpec !== "function") validateNamespace(this.namespaceSpec);
  }

  /**
   * The files of the current namespace as they are now, under an id for
   * `restore` and `diff`, when the store keeps snapshots (MemoryStore,
   * SqliteStore, PostgresStore: see docs/undo.md). Rejects with a StrataError:
   * `unsupported` when the store keeps none, `unavailable` once closed.
   */
  async snapshot(): Promise<string> {
    return this.snapshotStore().snapshot(this.namespace);
  }

  /** Puts the namespace's files back as they were at snapshot `id`, in one atomic step. */
  async restore(id: string): Promise<Result<Restored>> {
    try {
      return await this.snapshotStore().restore(this.namespace, id);
    } catch (error) {
      return { error: toErrorInfo(error) };
    }
  }

  /** Files that differ between snapshot `from` and `to` (default: now), each text file with a unified diff. */
  async diff(from: string, to: SnapshotPoint = "now"): Promise<Result<{ changes: FileChange[] }>> {
    try {
      return { changes: await this.snapshotStore().diff(this.namespace, from, to) };
    } catch (error) {
      return { error: toErrorInfo(error) };
    }
  }

  /**
   * A backend over a fork of the store (same options): independent, sharing
   * unchanged records. Only stores that fork cheaply offer it (MemoryStore);
   * others throw `unsupported`.
   */
  fork(): StoreBackend {
    const store = this.store as Partial<SnapshotStore>;
    if (typeof store.fork !== "function") throw new StrataError("unsupported", "This store cannot fork; MemoryStore can");
    return new StoreBackend({ ...this.options, store: store.fork() });
  }

  private snapshotStore(): SnapshotStore {
    if (!hasSnapshots(this.store)) throw new StrataError("unsupported", "This store keeps no snapshots; MemoryStore, SqliteStore and PostgresStore do");
    return this.store;
  }

  /** The namespace of the current call. */
  get namespace(): Namespace {
    // A fixed namespace was validated once, in the constructor.
    if (typeof this.namespaceSpec !== "function") return this.namespaceSpec;
    const namespace = this.namespaceSpec(this.runtime);
    validateNamespace(namespace);
    return namespace;
  }

  protected async doLs(dirPath: string): Promise<FileInfo[]> {
    const dir = normalizePath(dirPath);
    const ns = this.namespace;
    const file = dir === "/" ? undefined : await this.store.get(ns, dir);
    if (file) return [fileDataInfo(dir, file.value)];
    const { files, dirs } = await this.store.listDirectory(ns, dir);
    const entries: FileInfo[] = files.map(keyInfo);
    for (const name of dirs) entries.push({ path: `${joinPath(dir, name)}/`, is_dir: true });
    return sortByPath(entries);
  }

  protected async doReadRaw(filePath: string): Promise<FileDataV2> {
    const path = normalizePath(filePath);
    const ns = this.namespace;
    const item = await this.store.get(ns, path);
    if (item) return toFileDataV2(item.value);
    throw (await this.isDirectory(ns, path)) ? errors.isDirectory(path) : errors.notFound(path);
  }

  protected async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      const ns = this.namespace;
      // A create needs nothing from a stored record: where the store checks the tree itself, one call does it all.
      const existing = overwrite || !this.store.putFile ? await this.store.get(ns, path) : undefined;
      if (existing && !overwrite) throw errors.alreadyExists(path);
      const data = fileDataFromText(content, existing?.value.created_at);
      const putOptions = overwrite ? {} : CREATE;
      try {
        if (this.store.putFile) {
          this.checkSize(path, data);
          await this.store.putFile(ns, path, data, putOptions);
        } else {
          await this.checkPlace(ns, path, data);
          await this.store.put(ns, path, data, putOptions);
        }
      } catch (error) {
        throw isStrataError(error, "conflict") ? errors.alreadyExists(path) : error;
      }
      return { path, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  // ---- the in-process fast path ----
  // Over a store that answers at once (getSync, putFileSync), a plain read or
  // create of a file is done here, without the promise chain of the generic
  // route (options check, driver call, store call), which costs more than the
  // operation. It applies only where the generic route would do exactly the
  // same: no options, a fixed namespace, this class's own driver methods.
  // Anything else, and every failure, takes the generic route, which then
  // gives the answer (a failed create changed nothing, so it is safe to redo).

  override readRaw(path: unknown, options?: unknown): Promise<Result<{ path: string; data: FileData }>> {
    const now = options === undefined && typeof path === "string" ? this[readRawNow](path) : undefined;
    return now ? Promise.resolve(now) : super.readRaw(path, options);
  }

  /** The plain read, answered at once where the store can; undefined sends the caller down the generic route. */
  [readRawNow](path: string): { path: string; data: FileDataV2 } | undefined {
    const store = this.store;
    if (!store.getSync || !this.direct) return undefined;
    try {
      // A path that starts with `/` is looked up as given: the store checks a key it does not hold, and one it holds
      // is normal, so a hit needs no normalising. Any other path (`a.txt`, `/a//b`) is answered by the generic route.
      const item = store.getSync(this.namespaceSpec as Namespace, path.charCodeAt(0) === 47 ? path : normalizePath(path));
      return item && { path: item.key, data: toFileDataV2(item.value) };
    } catch {
      // the generic route answers it
      return undefined;
    }
  }

  override write(path: unknown, content: unknown, options?: unknown): Promise<Result<Changed>> {
    const now = options === undefined && typeof path === "string" && typeof content === "string" ? this[writeNow](path, content) : undefined;
    return now ? Promise.resolve(now) : super.write(path, content, options);
  }

  /** The plain create, done at once where the store can; undefined (nothing changed) sends the caller down the generic route. */
  [writeNow](path: string, content: string): Changed | undefined {
    const store = this.store;
    if (!store.putFileSync || !this.direct) return undefined;
    try {
      const key = normalizePath(path);
      const data = fileDataFromText(content);
      this.checkSize(key, data);
      store.putFileSync(this.namespaceSpec as Namespace, key, data, CREATE);
      return { path: key, filesUpdate: null };
    } catch {
      // the generic route answers it
      return undefined;
    }
  }

  /**
   * True when the fast path applies: a fixed namespace, caller paths that are
   * driver paths, and this class's own readRaw, write, doReadRaw and doWrite. Asked once:
   * none of these changes after construction.
   */
  private get direct(): boolean {
    return (this.isDirect ??=
      typeof this.namespaceSpec !== "function" &&
      this.pathRoot === "/" &&
      this.readRaw === StoreBackend.prototype.readRaw &&
      this.write === StoreBackend.prototype.write &&
      this.doReadRaw === StoreBackend.prototype.doReadRaw &&
      this.doWrite === StoreBackend.prototype.doWrite);
  }

  private isDirect: boolean | undefined;

  protected async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      const ns = this.namespace;
      for (let attempt = 1; ; attempt++) {
        const item = await this.store.get(ns, path);
        if (!item) throw (await this.isDirectory(ns, path)) ? errors.isDirectory(path) : errors.notFound(path);
        const current = toFileDataV2(item.value);
        const text = fileDataText(current);
        if (text === null) throw errors.binary(path, fileDataSize(current));
        const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, path);
        const data = fileDataFromText(updated, current.created_at);
        this.checkSize(path, data);
        try {
          await this.store.put(ns, path, data, { expectedVersion: item.version });
          return { path, occurrences, filesUpdate: null };
        } catch (error) {
          if (!isStrataError(error, "conflict")) throw error;
          if (attempt >= this.editAttempts) {
            throw new StrataError(
              "conflict",
              `'${path}' kept changing under concurrent writers (${attempt} attempts); the edit was not applied. Read it again and retry`,
            );
          }
          await backoff(attempt);
        }
      }
    } catch (error) {
      return failure(error, path);
    }
  }

  protected async doDelete(filePath: string): Promise<DeleteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
      const ns = this.namespace;
      if (!(await this.store.delete(ns, path)) && (await this.store.deleteTree(ns, path)).length === 0) throw errors.notFound(path);
      return { path, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  /**
   * A moved file is deleted only at the version that was copied (the store's
   * compare-and-set), so a write that lands on it during the move makes the
   * move answer `conflict` and undo itself instead of being lost.
   */
  protected override async removeIfUnchanged(filePath: string, data: FileData): Promise<FilesUpdate> {
    const path = normalizePath(filePath);
    const ns = this.namespace;
    const item = await this.store.get(ns, path);
    if (!item || item.value.modified_at !== data.modified_at || fileDataText(item.value) !== fileDataText(data) || fileDataSize(item.value) !== fileDataSize(data)) {
      throw errors.conflict(path, "it was written while being moved");
    }
    try {
      if (!(await this.store.delete(ns, path, { expectedVersion: item.version }))) throw errors.conflict(path, "it was deleted while being moved");
    } catch (error) {
      throw isStrataError(error, "conflict") ? errors.conflict(path, "it was written while being moved") : error;
    }
    return null;
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const scope = matcher ? matcher.root : root;
    const ns = this.namespace;
    const matches: GrepMatch[] = [];
    const visit = (item: StoredItem) => {
      if (!isWithin(root, item.key) || (matcher && !matcher(item.key))) return;
      const text = fileDataText(item.value);
      if (text !== null) grepText(item.key, text, pattern, matches);
    };
    const file = scope === "/" ? undefined : await this.store.get(ns, scope);
    if (file) visit(file);
    for await (const item of this.candidates(ns, pattern, treePrefix(scope))) visit(item);
    return capMatches(sortMatches(matches), maxCount);
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false): Promise<FileInfo[]> {
    const matcher = compileGlob(pattern, searchRoot(path));
    const ns = this.namespace;
    const found: FileInfo[] = [];
    const under: string[] = [];
    const file = matcher.root === "/" ? undefined : await this.store.get(ns, matcher.root);
    if (file && matcher(file.key)) found.push(fileDataInfo(file.key, file.value));
    for await (const key of this.keys(ns, treePrefix(matcher.root))) {
      if (includeDirectories) under.push(key.key);
      if (matcher(key.key)) found.push(keyInfo(key));
    }
    if (includeDirectories) found.push(...impliedDirectories(matcher, under));
    return sortByPath(found);
  }

  /** Validates every file, then stores all the valid ones in one transaction. Responses echo each path as the caller gave it (seed 000). */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    const requested = files.map((item) => (Array.isArray(item) ? (item[0] as string) : String(item)));
    let ns: Namespace;
    try {
      ns = this.namespace;
    } catch (error) {
      const code = failure(error, "/").code;
      return requested.map((path) => ({ path, error: code }));
    }
    const responses: UploadAnswer[] = [];
    /** The normalised path each accepted response stands for. */
    const accepted = new Map<UploadAnswer, string>();
    const batch = new Batch();
    for (const [i, item] of files.entries()) {
      const filePath = requested[i]!;
      try {
        if (!Array.isArray(item)) throw errors.invalidArgument("each upload must be a [path, bytes] pair");
        const path = normalizePath(filePath);
        const bytes: unknown = item[1];
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        const createdAt = batch.files.get(path)?.created_at ?? (await this.store.get(ns, path))?.value.created_at;
        const data = fileDataFromBytes(bytes, createdAt);
        await this.checkPlace(ns, path, data, batch);
        batch.add(path, data);
        const response: UploadAnswer = { path: filePath, error: null };
        accepted.set(response, path);
        responses.push(response);
      } catch (error) {
        responses.push({ path: filePath, error: failure(error, filePath).code });
      }
    }
    if (batch.files.size === 0) return responses;
    const store = this.store;
    try {
      // putFiles checks the tree in the store's own atomic step; putMany relies on the checks above.
      await (store.putFiles ? store.putFiles(ns, [...batch.files]) : store.putMany(ns, [...batch.files]));
    } catch {
      // The store refused the batch (a value over its size limit, a concurrent
      // writer's file in the way, say): store file by file instead, so each
      // response carries its own outcome.
      const failed = new Map<string, UploadAnswer["error"]>();
      for (const [path, data] of batch.files) {
        const stored = store.putFile ? store.putFile(ns, path, data) : store.put(ns, path, data);
        await stored.catch((error: unknown) => failed.set(path, failure(error, path).code));
      }
      for (const [response, path] of accepted) if (failed.has(path)) response.error = failed.get(path)!;
    }
    return responses;
  }

  /** Checks the place is free for a file (not a directory, no parent is a file) and the size is allowed. */
  private async checkPlace(ns: Namespace, path: string, data: FileData, pending?: Batch): Promise<void> {
    if (pending?.dirs.has(path) || (await this.isDirectory(ns, path))) throw errors.isDirectory(path);
    for (const ancestor of ancestorsOf(path)) {
      if (ancestor === "/") continue;
      if (pending?.files.has(ancestor) || (await this.store.get(ns, ancestor))) throw errors.notADirectory(path);
    }
    this.checkSize(path, data);
  }

  private checkSize(path: string, data: FileData): void {
    if (this.maxFileSize === undefined) return;
    const size = fileDataSize(data);
    if (size > this.maxFileSize) throw errors.tooLarge(path, size, this.maxFileSize);
  }

  private async isDirectory(ns: Namespace, path: string): Promise<boolean> {
    if (path === "/") return true;
    return (await this.store.list(ns, { prefix: `${path}/`, limit: 1 })).items.length > 0;
  }

  /** Every key under a prefix, page by page. */
  private async *keys(ns: Namespace, prefix: string): AsyncIterable<StoredKey> {
    let after: string | undefined;
    do {
      const page = await this.store.list(ns, { prefix, after, limit: DEFAULT_PAGE });
      yield* page.items;
      after = page.next;
    } while (after !== undefined);
  }

  /** Records under a prefix that may contain `pattern`: the engine's index if it has one, else every record. */
  private async *candidates(ns: Namespace, pattern: string, prefix: string): AsyncIterable<StoredItem> {
    if (this.store.search) {
      yield* this.store.search(ns, pattern, prefix);
      return;
    }
    for await (const key of this.keys(ns, prefix)) {
      const item = await this.store.get(ns, key.key);
      if (item) yield item;
    }
  }
}

/** Builds a StoreBackend per call from the runtime, for agents that take a backend factory. */
export function storeBackendFactory(options: Omit<StoreBackendOptions, "runtime">): BackendFactory<StoreBackend> {
  return (runtime) => new StoreBackend({ ...options, runtime });
}

/** Files accepted so far in one upload, so later files in it are checked against them. */
class Batch {
  readonly files = new Map<string, FileDataV2>();
  readonly dirs = new Set<string>();

  add(path: string, data: FileDataV2): void {
    this.files.set(path, data);
    for (const ancestor of ancestorsOf(path)) this.dirs.add(ancestor);
  }
}

function keyInfo(key: StoredKey): FileInfo {
  return { path: key.key, is_dir: false, size: key.size, modified_at: key.modified_at };
}

/** Randomised exponential backoff, so retrying writers stop colliding in step. */
function backoff(attempt: number): Promise<void> {
  const ms = Math.random() * Math.min(2 ** attempt, 100);
  return new Promise((resolve) => setTimeout(resolve, ms));
}
