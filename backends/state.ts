import { BaseBackend, type UploadAnswer, failure } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, printable, StrataError, toErrorInfo } from "../core/errors.js";
import { fileDataInfo, fileDataFromBytes, fileDataFromText, fileDataSize, fileDataText, toFileDataV2 } from "../core/filedata.js";
import { compileGlob, impliedDirectories, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { checkQuota, type Quota, type Usage, validateQuota } from "../core/limits.js";
import { ancestorsOf, isWithin, joinPath, normalizePath, relativeTo, sortByPath } from "../core/paths.js";
import { BackendRuntime } from "../core/protocol.js";
import { describeFileChanges, type FileChange, type SnapshotPoint, type Snapshots, SnapshotTree } from "../core/snapshots.js";
import { DirectoryIndex } from "../core/tree.js";
import type {
  DeleteResult,
  EditResult,
  FileData,
  FileDataV2,
  FileInfo,
  FilesUpdate,
  GrepMatch,
  GrepResult,
  Result,
  WriteResult,
} from "../core/types.js";

export type FilesState = Record<string, FileData>;

export interface StateBackendOptions {
  /**
   * Where the files live: `runtime.state.files` (a BackendRuntime, or any
   * object with a `state`, as deepagents passes). Default: a runtime of the
   * backend's own, holding an empty files map.
   */
  runtime?: BackendRuntime | StateRuntimeLike;
  /** Largest file, in bytes, that write, edit and upload accept. */
  maxFileSize?: number;
  /** Limits on the total bytes and number of files held; write, edit and upload beyond it fail with `quota_exceeded`. */
  quota?: Quota;
}

/** What deepagents passes: any object with a `state` holding `files` (its runtime: `{ state, store?, config? }`). */
export interface StateRuntimeLike {
  state: Record<string, unknown>;
}

/** Whether a constructor argument is a runtime (it has a `state`) rather than options. */
function isRuntime(value: unknown): value is BackendRuntime | StateRuntimeLike {
  return value instanceof BackendRuntime || (typeof value === "object" && value !== null && "state" in value);
}

interface Indexed {
  /** The bare files object the index describes (the backend reads and writes it directly). */
  files: FilesState;
  watch: Watch;
  /** The watch's version this index reflects. */
  version: number;
  index: DirectoryIndex;
  entries?: Entries;
  usage?: Usage;
}

/**
 * Every file and its record, in two arrays side by side: scanning them is about
 * three times faster than looking 100k keys up in a large object, and two
 * arrays cost 16 bytes a file where an array of pairs costs about 70.
 */
interface Entries {
  keys: string[];
  values: FileData[];
}

/**
 * One per files map: `runtime.state.files` is set to `proxy`, which counts
 * every change others make through it; backends count their own changes.
 * An index built at another version is rebuilt.
 */
interface Watch {
  proxy: FilesState;
  version: number;
  /** Snapshot journals following this map: told every change, with the record it replaced. */
  listeners?: Set<ChangeListener>;
}

type ChangeListener = (key: string, before: FileData | undefined, after: FileData | undefined) => void;

function notify(watch: Watch, key: string, before: FileData | undefined, after: FileData | undefined): void {
  if (watch.listeners) for (const listener of watch.listeners) listener(key, before, after);
}

const own = (files: FilesState, key: string) => (Object.hasOwn(files, key) ? files[key] : undefined);

const bareOf = new WeakMap<object, FilesState>();
const watches = new WeakMap<FilesState, Watch>();

function watchOf(files: FilesState): Watch {
  let watch = watches.get(files);
  if (!watch) {
    const w: Watch = { proxy: files, version: 0 };
    // Changes made through the proxy reach the snapshot journals too, so they can be undone like the backend's own.
    const tell = (target: FilesState, key: string | symbol, after: FileData | undefined) => {
      if (w.listeners && typeof key === "string") notify(w, key, own(target, key), after);
    };
    w.proxy = new Proxy(files, {
      set: (target, key, value) => (w.version++, tell(target, key, value as FileData), Reflect.set(target, key, value)),
      deleteProperty: (target, key) => (w.version++, tell(target, key, undefined), Reflect.deleteProperty(target, key)),
      defineProperty: (target, key, descriptor) => (
        w.version++, tell(target, key, descriptor.value as FileData | undefined), Reflect.defineProperty(target, key, descriptor)
      ),
    });
    bareOf.set(w.proxy, files);
    watches.set(files, w);
    watch = w;
  }
  return watch;
}

/** A backend's snapshot journal and the map it follows. */
interface Journal {
  tree: SnapshotTree<FileData>;
  files: FilesState;
  watch: Watch;
  listener: ChangeListener;
}

/**
 * Files in the agent's state (`runtime.state.files`), or in a map of its own
 * when constructed without a runtime. Writes apply to that map and also
 * return `filesUpdate`, so a LangGraph reducer that merges them stays in step.
 *
 * Others may change the files too. Replacing `runtime.state.files` wholesale
 * is noticed by identity; changing it in place (a key set or deleted) is
 * noticed because the backend puts the map behind a Proxy that counts every
 * such change, and an index built at an older count is rebuilt (reads go to
 * the bare map, so they cost nothing extra; several backends may share one
 * map). A reference to the bare map taken before the backend first
 * saw it bypasses the proxy: change the files through `runtime.state.files`
 * or `backend.files`. Every mutation here is synchronous (no await between
 * reading a record and storing its successor), so concurrent calls on one
 * path apply one after another and none is lost.
 *
 * Constructed with options (`new StateBackend({ runtime, quota })`). One
 * compatibility form: an argument with a `state` key is the runtime itself,
 * so deepagents' `new StateBackend(runtime)` (its `{ state: { files }, store?,
 * config? }`) works unchanged.
 */
export class StateBackend extends BaseBackend implements Snapshots {
  readonly runtime: BackendRuntime;
  private readonly options: StateBackendOptions;
  private readonly quota: Quota | undefined;
  private indexed: Indexed | undefined;
  private journal: Journal | undefined;

  constructor(options: StateBackendOptions | BackendRuntime | StateRuntimeLike = {}) {
    super();
    if (typeof options !== "object" || options === null) {
      throw errors.invalidArgument("StateBackend takes options { runtime?, quota?, maxFileSize? } or a runtime (a BackendRuntime or an object with a `state`)");
    }
    const settings: StateBackendOptions = isRuntime(options) ? { runtime: options } : options;
    const runtime = settings.runtime ?? new BackendRuntime({ files: {} });
    if (runtime instanceof BackendRuntime) this.runtime = runtime;
    else if (typeof runtime === "object" && runtime !== null && typeof runtime.state === "object" && runtime.state !== null) {
      // The same state object, so files the caller's runtime holds are the ones used.
      this.runtime = new BackendRuntime(runtime.state);
    } else throw errors.invalidArgument("StateBackend's runtime must be a BackendRuntime or an object with a `state`");
    this.options = settings;
    this.quota = validateQuota(settings.quota);
  }

  /** The live files map (behind the change-noticing proxy). */
  get files(): FilesState {
    return this.indexes.watch.proxy;
  }

  /**
   * The snapshot journal, attached to the map in use on first use. Every
   * change reaches it (the backend's own and those made through
   * `runtime.state.files`), O(1) each; a map replaced wholesale (a LangGraph
   * reducer handing in a new `files` object) is compared with the old one
   * key by key, once: O(files).
   */
  private get snapshots(): SnapshotTree<FileData> {
    const { files, watch } = this.indexes;
    const journal = this.journal;
    if (!journal) {
      const tree = new SnapshotTree<FileData>(`${Math.random().toString(36).slice(2, 8)}-`);
      const listener: ChangeListener = (key, before, after) => tree.note(key, before, after);
      (watch.listeners ??= new Set()).add(listener);
      this.journal = { tree, files, watch, listener };
      return tree;
    }
    if (journal.files !== files) {
      const old = journal.files;
      for (const key of Object.keys(old)) if (own(files, key) !== old[key]) journal.tree.note(key, old[key], own(files, key));
      for (const key of Object.keys(files)) if (!Object.hasOwn(old, key)) journal.tree.note(key, undefined, files[key]);
      journal.watch.listeners?.delete(journal.listener);
      (watch.listeners ??= new Set()).add(journal.listener);
      journal.files = files;
      journal.watch = watch;
    }
    return journal.tree;
  }

  /**
   * The files as they are now, kept under an id for `restore` and `diff`.
   * O(1): a snapshot holds only what changed since the previous one and
   * shares every record (see core/snapshots.ts). Ids carry a random prefix of
   * this backend's, so another backend's id is refused, not misread.
   */
  snapshot(): string {
    return this.snapshots.snapshot();
  }

  /**
   * Puts the files back as they were at snapshot `id` (later snapshots stay
   * restorable). Synchronous from start to end, so a concurrent operation sees
   * the files wholly before or wholly after, never a mix. Costs O(changes
   * between now and the snapshot). Quotas are not checked: the state restored
   * was once accepted.
   */
  restore(id: string): Result<{ snapshot: string; changed: number }> {
    try {
      const tree = this.snapshots;
      if (typeof id !== "string" || !tree.has(id)) throw errors.invalidArgument(`No snapshot '${printable(String(id))}' on this backend`);
      const changes = tree.changes("now", id);
      // Removals first, so a file never lands where a directory still stands.
      const puts: Array<[string, FileData]> = [];
      for (const [key, { after }] of changes) {
        if (after === undefined) this.removeNow(key);
        else puts.push([key, after]);
      }
      for (const [key, data] of puts) this.restoreNow(key, data);
      tree.moveTo(id);
      return { snapshot: id, changed: changes.size };
    } catch (error) {
      return { error: toErrorInfo(error) };
    }
  }

  /**
   * What changed from snapshot `from` to snapshot `to` (default: now):
   * added, modified and deleted files, sorted by path, each text file with a
   * unified diff. Costs O(changes between them), not O(files).
   */
  diff(from: string, to: SnapshotPoint = "now"): Result<{ changes: FileChange[] }> {
    try {
      const tree = this.snapshots;
      for (const id of [from, to]) {
        if (typeof id !== "string" || (id !== "now" && !tree.has(id))) throw errors.invalidArgument(`No snapshot '${printable(String(id))}' on this backend`);
      }
      return { changes: describeFileChanges(tree.changes(from, to)) };
    } catch (error) {
      return { error: toErrorInfo(error) };
    }
  }

  /**
   * An independent backend holding the same files, in a map of its own: the
   * records are shared (nothing is copied but the key table, O(files)
   * pointers: about 0.3 s and 6 MiB at 100k files), and changes on either
   * side never reach the other. Same quota
   * and size limit; no snapshots.
   */
  fork(): StateBackend {
    const files = this.indexes.files;
    // A key loop, not a spread: V8 builds a 100k-key object about 3x faster this way.
    const copy: FilesState = {};
    for (const key of Object.keys(files)) copy[key] = files[key]!;
    return new StateBackend({ ...this.options, runtime: new BackendRuntime({ files: copy }) });
  }

  private get index(): DirectoryIndex {
    return this.indexes.index;
  }

  private get indexes(): Indexed {
    let current = this.runtime.getState<FilesState | undefined>("files");
    if (typeof current !== "object" || current === null) current = {};
    const files = bareOf.get(current) ?? current;
    const watch = watchOf(files);
    if (current !== watch.proxy) this.runtime.setState("files", watch.proxy);
    if (this.indexed?.files === files && this.indexed.version === watch.version) return this.indexed;
    this.indexed = { files, watch, version: watch.version, index: DirectoryIndex.of(Object.keys(files)) };
    return this.indexed;
  }

  /** Records a change this backend made (its index already follows it), so other backends on the map re-index. */
  private changed(indexes: Indexed): void {
    indexes.entries = undefined;
    indexes.version = ++indexes.watch.version;
  }

  /**
   * Every file with its record, cached until the next change: scanning an
   * array is about three times faster than looking 100k keys up in a large
   * object, and searches run far more often than writes between them.
   */
  private get entries(): Entries {
    const indexes = this.indexes;
    if (!indexes.entries) {
      const files = indexes.files;
      const keys = Object.keys(files);
      const values = new Array<FileData>(keys.length);
      for (let i = 0; i < keys.length; i++) values[i] = files[keys[i]!]!;
      indexes.entries = { keys, values };
    }
    return indexes.entries;
  }

  /** Bytes and files held, measured once per index and then kept up to date by `store` and `delete`. */
  private get usage(): Usage {
    const indexes = this.indexes;
    if (!indexes.usage) {
      let bytes = 0;
      const { values } = this.entries;
      for (const data of values) bytes += fileDataSize(data);
      indexes.usage = { bytes, files: values.length };
    }
    return indexes.usage;
  }

  private record(path: string): FileData | undefined {
    const files = this.indexes.files;
    return Object.hasOwn(files, path) ? files[path] : undefined;
  }

  protected async doLs(dirPath: string): Promise<FileInfo[]> {
    const dir = normalizePath(dirPath);
    const file = this.record(dir);
    if (file) return [fileDataInfo(dir, file)];
    const entries: FileInfo[] = [];
    for (const path of this.index.list(dir)) {
      const data = this.record(path);
      entries.push(data ? fileDataInfo(path, data) : { path: `${path}/`, is_dir: true });
    }
    return sortByPath(entries);
  }

  protected async doReadRaw(filePath: string): Promise<FileDataV2> {
    return this.readNow(normalizePath(filePath));
  }

  private readNow(path: string): FileDataV2 {
    const data = this.record(path);
    if (data) return toFileDataV2(data);
    throw this.index.isDirectory(path) ? errors.isDirectory(path) : errors.notFound(path);
  }

  protected async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      const existing = this.record(path);
      if (existing && !overwrite) throw errors.alreadyExists(path);
      const data = fileDataFromText(content, existing?.created_at);
      this.store(path, data);
      return { path, filesUpdate: { [path]: data } };
    } catch (error) {
      return failure(error, path);
    }
  }

  protected async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      // Synchronous from here to the store: no other call can change the file in between.
      const current = this.readNow(path);
      const text = fileDataText(current);
      if (text === null) throw errors.binary(path, fileDataSize(current));
      const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, path);
      const data = fileDataFromText(updated, current.created_at);
      this.store(path, data);
      return { path, occurrences, filesUpdate: { [path]: data } };
    } catch (error) {
      return failure(error, path);
    }
  }

  protected async doDelete(filePath: string): Promise<DeleteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
      const removed: Record<string, null> = {};
      const indexes = this.indexes;
      const { files, index } = indexes;
      const remove = (key: string) => {
        if (indexes.usage) {
          indexes.usage.bytes -= fileDataSize(files[key]!);
          indexes.usage.files -= 1;
        }
        notify(indexes.watch, key, files[key], undefined);
        delete files[key];
        removed[key] = null;
      };
      if (this.record(path)) {
        remove(path);
        index.removeFile(path);
      } else if (index.isDirectory(path)) {
        for (const key of Object.keys(files)) if (isWithin(path, key)) remove(key);
        index.removeTree(path);
      } else {
        throw errors.notFound(path);
      }
      this.changed(indexes);
      return { path, filesUpdate: removed };
    } catch (error) {
      return failure(error, path);
    }
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const matches: GrepMatch[] = [];
    const { keys, values } = this.entries;
    const everywhere = root === "/" && !matcher;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      if (!everywhere && (!isWithin(root, key) || (matcher && !matcher(key)))) continue;
      const data = values[i]!;
      // Most files do not hold the pattern: one indexOf rules them out before anything else is looked at.
      const content = data.content;
      if (typeof content === "string" && (data as FileDataV2).encoding === "utf-8" && !content.includes(pattern)) continue;
      const text = fileDataText(data);
      if (text !== null) grepText(key, text, pattern, matches);
    }
    return capMatches(sortMatches(matches), maxCount);
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false): Promise<FileInfo[]> {
    const matcher = compileGlob(pattern, searchRoot(path));
    const found: FileInfo[] = [];
    const under: string[] = [];
    const { keys, values } = this.entries;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      const data = values[i]!;
      if (!isWithin(matcher.root, key)) continue;
      if (includeDirectories) under.push(key);
      if (matcher(key)) found.push(fileDataInfo(key, data));
    }
    if (includeDirectories) found.push(...impliedDirectories(matcher, under));
    return sortByPath(found);
  }

  /** Responses echo each path exactly as the caller gave it (seed 000). */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    return files.map((item) => {
      const filePath = Array.isArray(item) ? (item[0] as string) : String(item);
      try {
        if (!Array.isArray(item)) throw errors.invalidArgument("each upload must be a [path, bytes] pair");
        const path = normalizePath(filePath);
        const bytes: unknown = item[1];
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        this.store(path, fileDataFromBytes(bytes, this.record(path)?.created_at));
        return { path: filePath, error: null };
      } catch (error) {
        return { path: filePath, error: failure(error, filePath).code };
      }
    });
  }

  /** Checks the place is free for a file, then stores it and indexes it. */
  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transferNow(from, to, overwrite, false);
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transferNow(from, to, overwrite, true);
  }

  /**
   * A copy or move done synchronously, start to end: no other call runs in
   * between, so it is atomic, and a failure part-way (a quota, a file in the
   * way) puts everything back before it answers.
   */
  private transferNow(from: string, to: string, overwrite: boolean, move: boolean): FilesUpdate {
    const source = normalizePath(from);
    const target = normalizePath(to);
    const files = this.indexes.files;
    const isFile = this.record(source) !== undefined;
    if (!isFile && !this.index.isDirectory(source)) throw errors.notFound(source);
    const targetIsDir = target === "/" || this.index.isDirectory(target);
    if (isFile && targetIsDir) throw errors.isDirectory(target);
    if (!isFile && this.record(target)) throw errors.notADirectory(joinPath(target, "x"));
    // Directories here exist only while they hold files, so an existing one is never empty.
    if (!isFile && targetIsDir) throw errors.notEmpty(target);
    if (isFile && this.record(target) && !overwrite) throw errors.alreadyExists(target);
    const pairs: Array<[string, string]> = isFile
      ? [[source, target]]
      : Object.keys(files)
          .filter((key) => isWithin(source, key))
          .map((key) => [key, joinPath(target, relativeTo(source, key))]);
    const moved = pairs.map(([key]) => toFileDataV2(files[key]!));
    const replaced = pairs.map(([, key]) => this.record(key));
    const update: Record<string, FileData | null> = {};
    try {
      if (move) for (const [key] of pairs) this.removeNow(key);
      pairs.forEach(([, key], i) => {
        // A move keeps the record as it was (mv keeps times); a copy is a new file.
        const data = move ? moved[i]! : { ...moved[i]!, created_at: new Date().toISOString(), modified_at: new Date().toISOString() };
        this.store(key, data);
        update[key] = data;
      });
      if (move) for (const [key] of pairs) update[key] = null;
    } catch (error) {
      for (const [, key] of pairs) if (this.record(key)) this.removeNow(key);
      pairs.forEach(([, key], i) => {
        const before = replaced[i];
        if (before) this.restoreNow(key, toFileDataV2(before));
      });
      if (move) pairs.forEach(([key], i) => this.restoreNow(key, moved[i]!));
      throw error;
    }
    return update;
  }

  /** Removes one file record, keeping the index and the usage right. */
  private removeNow(path: string): void {
    const indexes = this.indexes;
    const previous = indexes.files[path];
    if (previous === undefined) return;
    if (indexes.usage) {
      indexes.usage.bytes -= fileDataSize(previous);
      indexes.usage.files -= 1;
    }
    notify(indexes.watch, path, previous, undefined);
    delete indexes.files[path];
    indexes.index.removeFile(path);
    this.changed(indexes);
  }

  /** Puts a record back during an undo, past the checks that made the change fail. */
  private restoreNow(path: string, data: FileData): void {
    const indexes = this.indexes;
    const previous = indexes.files[path];
    if (indexes.usage) {
      indexes.usage.bytes += fileDataSize(data) - (previous ? fileDataSize(previous) : 0);
      if (!previous) indexes.usage.files += 1;
    }
    notify(indexes.watch, path, previous, data);
    indexes.files[path] = data;
    if (!previous) indexes.index.addFile(path);
    this.changed(indexes);
  }

  private store(path: string, data: FileDataV2): void {
    if (path === "/" || this.index.isDirectory(path)) throw errors.isDirectory(path);
    for (const ancestor of ancestorsOf(path)) {
      if (ancestor !== "/" && this.record(ancestor)) throw errors.notADirectory(path);
    }
    const size = fileDataSize(data);
    if (this.options.maxFileSize !== undefined && size > this.options.maxFileSize) {
      throw errors.tooLarge(path, size, this.options.maxFileSize);
    }
    const previous = this.record(path);
    if (this.quota) {
      checkQuota(this.quota, this.usage, { bytes: size - (previous ? fileDataSize(previous) : 0), files: previous ? 0 : 1 }, path);
    }
    const indexes = this.indexes;
    if (indexes.usage) {
      indexes.usage.bytes += size - (previous ? fileDataSize(previous) : 0);
      if (!previous) indexes.usage.files += 1;
    }
    notify(indexes.watch, path, previous, data);
    indexes.files[path] = data;
    if (!previous) indexes.index.addFile(path);
    this.changed(indexes);
  }
}


/** The seeds' helper: a StateBackend together with the runtime that holds its files. */
export function createStateBackend(options: Omit<StateBackendOptions, "runtime"> = {}): { backend: StateBackend; runtime: BackendRuntime } {
  const backend = new StateBackend({ ...options, runtime: new BackendRuntime({ files: {} }) });
  return { backend, runtime: backend.runtime };
}
