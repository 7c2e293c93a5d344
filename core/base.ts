import type { Backend } from "./protocol.js";
import { StrataError, asStrataError, errors, isStrataError, printable, toErrorInfo, type ErrorCode, type ErrorInfo } from "./errors.js";
import { DEFAULT_READ_LIMIT, forEachLine } from "./format.js";
import { fileDataBytes, fileDataSize, fileDataText } from "./filedata.js";
import { maxCountOf, readWindow } from "./limits.js";
import { KeyedMutex } from "./lock.js";
import { mimeTypeOf } from "./mime.js";
import { isWithin, joinPath, normalizePath, parentOf, relativeTo } from "./paths.js";
import type {
  Changed,
  DeleteResult,
  DownloadItem,
  Edited,
  EditResult,
  FileData,
  FileInfo,
  FilesUpdate,
  GrepResult,
  Listing,
  Moved,
  OperationOptions,
  ReadContent,
  Result,
  UploadItem,
  WriteResult,
} from "./types.js";
import { toFileOperationError } from "./errors.js";

/** The error part of a seed-shaped result object, from any thrown value. */
export function failure(error: unknown, path: string): { error: string; code: ErrorCode } {
  const info = toErrorInfo(error, path);
  return { error: info.message, code: info.code };
}

/**
 * Rejects a batch argument that is not an array: a string would otherwise be
 * iterated character by character, and anything else throws a raw TypeError.
 */
export function checkBatch(items: unknown, method: "uploadFiles" | "downloadFiles"): void {
  if (!Array.isArray(items)) {
    const what = method === "uploadFiles" ? "an array of [path, bytes] pairs" : "an array of paths";
    throw errors.invalidArgument(`${method} takes ${what}, got ${items === null ? "null" : typeof items}`);
  }
}

/** A result's value, or its failure thrown as a StrataError: for code that calls the native API and lets `answer` catch. */
/**
 * A backend's answer to a plain `readRaw(path)` (no options) given at once,
 * where its records live in this process: the path and record, or undefined
 * when it cannot answer so (the promise route then answers, failures
 * included). Internal: the seed adapter asks it first, which saves a promise
 * on a small read, a good part of its cost.
 */
export const readRawNow = Symbol("strata.readRawNow");

/**
 * The same for a plain create, `write(path, content)` with no options: the
 * change done and answered at once, or undefined when the backend cannot
 * (nothing was changed then, and the promise route answers, failures
 * included).
 */
export const writeNow = Symbol("strata.writeNow");

/**
 * Internal: deletes a path in one step when it is not a directory (a file,
 * a link, a special file); a directory stays as it was and the answer is
 * its tree instead (every file under it, as `glob("**")` lists them). A
 * backend that cannot do that answers `unsupported`. The permission wrapper
 * deletes this way first: a file needs no listing to check, and a
 * directory's listing comes in the same round trip. With `names`
 * (PermissionPolicy.refusalNames), a directory none of whose entries below
 * it bears one of those names is deleted too, in the same step.
 */
export const deleteUnlessDirectory = Symbol("strata.deleteUnlessDirectory");

/** What deleteUnlessDirectory did: deleted the path, or left a directory and listed its files. */
export type SingleDelete = { deleted: Changed; tree?: undefined } | { tree: FileInfo[]; deleted?: undefined };

/**
 * Internal: an `ls` option, the names a listing leaves out among the listed
 * directory's own entries (the permission wrapper's rules, worked out for
 * that directory). A backend that reads names before it builds paths tests
 * them there: short strings, where a test on each built path would cost
 * more than the listing (a path built by concatenation is copied whole the
 * first time a character of it is read). Honoured only by a backend whose
 * `hidesNames` is true; the wrapper filters the paths itself otherwise.
 */
export const hiddenNames = Symbol("strata.hiddenNames");

/** Whether a backend's `ls` honours `hiddenNames`. */
export const hidesNames = Symbol("strata.hidesNames");

/** A backend that may leave names out of a listing itself (see hiddenNames). */
export interface HidesNames {
  readonly [hidesNames]: boolean;
}

/** Whether a backend's deleteUnlessDirectory answers (rather than `unsupported`): a wrapper asks before it checks its rules. */
export const deletesUnlessDirectory = Symbol("strata.deletesUnlessDirectory");

/** A backend that may delete a non-directory in one step (see deleteUnlessDirectory). */
export interface DeletesUnlessDirectory {
  [deleteUnlessDirectory](path: string, options?: OperationOptions, names?: readonly string[]): Promise<Result<SingleDelete>>;
  readonly [deletesUnlessDirectory]: boolean;
}

/** A backend that may answer `readRaw` and a plain create at once (see readRawNow, writeNow). */
export interface ReadsNow {
  [readRawNow]?(path: string): { path: string; data: FileData } | undefined;
  [writeNow]?(path: string, content: string): Changed | undefined;
}

export function unwrap<T extends object>(result: Result<T>): T {
  if (result.error) throw new StrataError(result.error.code, result.error.message, result.error.path === undefined ? undefined : { path: result.error.path });
  return result as T;
}

/** A window of a text file as a driver answers it: the lines (without endings) and the file's total. */
export interface TextWindow {
  lines: string[];
  totalLines: number;
}

/** One upload or download as a driver answers it: the full error code, or null. */
export interface UploadAnswer {
  path: string;
  error: ErrorCode | null;
}
export interface DownloadAnswer extends UploadAnswer {
  content: Uint8Array | null;
}

/**
 * The window [offset, offset+limit) of an in-memory text, and its total line
 * count. Scans instead of splitting, so 100 lines of a large text are cheap.
 */
export function textWindow(text: string, path: string, offset: number, limit: number): TextWindow {
  const lines: string[] = [];
  const end = offset + limit;
  const totalLines = forEachLine(text, (line, index) => {
    if (index >= offset && index < end) lines.push(line);
  });
  checkOffset(offset, totalLines, path);
  return { lines, totalLines };
}

/** An offset past the last line is an error; offset 0 of an empty file is not. */
export function checkOffset(offset: number, totalLines: number, path: string): void {
  if (offset > 0 && offset >= totalLines) {
    throw new StrataError("invalid_argument", `Line offset ${offset} exceeds the length of '${printable(path)}' (${totalLines} lines)`, { path });
  }
}

type Options = Record<string, unknown> & { signal?: AbortSignal };

/** What `answer` is given for an operation without a path of its own (never a value a caller can pass). */
const NO_PATH = Symbol("no path");

/**
 * Every backend's native API, written once. A backend implements the `do…`
 * driver methods, which may throw a StrataError; the public methods here check
 * every argument (an agent's tool call is untrusted JSON), honour the abort
 * signal, and turn whatever is thrown into `{ error: { code, message, path } }`.
 * This is the only place where a throw becomes a result.
 *
 * Drivers without real directories inherit `doStat`, `doMkdir`, `doCopy` and
 * `doMove` built from the others; engines that can do better override them.
 */
export abstract class BaseBackend implements Backend {
  // ---- the driver: what each backend implements (paths as the caller gave them) ----
  /**
   * `sizes` false: names and kinds are enough (see LsOptions); a driver may
   * ignore it. `hides`: see hiddenNames (given only where `hidesNames` is true).
   */
  protected abstract doLs(path: string, sizes?: boolean, hides?: (name: string) => boolean): Promise<FileInfo[]>;
  protected abstract doReadRaw(path: string): Promise<FileData>;
  protected abstract doWrite(path: string, content: string, overwrite: boolean): Promise<WriteResult>;
  protected abstract doEdit(path: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult>;
  protected abstract doDelete(path: string): Promise<DeleteResult>;
  protected abstract doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult>;
  /** Files matching; with `includeDirectories`, matching directories too (entries ending in `/`). `sizes` as for doLs. */
  protected abstract doGlob(pattern: string, path: string | null, includeDirectories?: boolean, sizes?: boolean): Promise<FileInfo[]>;
  protected abstract doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]>;

  /** A window of a text file; throws `binary_file` for binary content. Backends with a faster path override it. */
  protected async doRead(path: string, offset: number, limit: number): Promise<TextWindow> {
    const data = await this.doReadRaw(path);
    const text = fileDataText(data);
    if (text === null) throw errors.binary(normalizePath(path), fileDataSize(data));
    return textWindow(text, normalizePath(path), offset, limit);
  }

  /** Downloads through `doReadRaw`, one file after another; backends with a batch channel override it. */
  protected async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    const answers: DownloadAnswer[] = [];
    for (const path of paths) {
      try {
        answers.push({ path, content: fileDataBytes(await this.doReadRaw(path)), error: null });
      } catch (error) {
        answers.push({ path, content: null, error: toErrorInfo(error, path).code });
      }
    }
    return answers;
  }

  /** From the parent's listing; backends with a real `stat` override it. */
  protected async doStat(path: string): Promise<FileInfo> {
    const target = normalizePath(path);
    if (target === "/") return { path: "/", is_dir: true };
    const entry = (await this.doLs(parentOf(target))).find((e) => e.path === target || e.path === `${target}/`);
    if (!entry) throw errors.notFound(target);
    return entry;
  }

  /**
   * Without real directories a directory exists while something is under it,
   * so mkdir checks the place is free and creates nothing. Backends with real
   * directories override it.
   */
  protected async doMkdir(path: string, recursive: boolean): Promise<FilesUpdate> {
    const target = normalizePath(path);
    const existing = await this.statOrNull(target);
    if (existing?.is_dir) {
      if (recursive) return null;
      throw new StrataError("already_exists", `Directory '${printable(target)}' already exists`, { path: target });
    }
    if (existing) throw errors.alreadyExists(target);
    for (let dir = parentOf(target); dir !== "/"; dir = parentOf(dir)) {
      const above = await this.statOrNull(dir);
      if (above && !above.is_dir) throw errors.notADirectory(target);
      if (!above && !recursive && dir === parentOf(target)) throw errors.notFound(dir);
    }
    return null;
  }

  /**
   * A file or a tree copied file by file (and, where directories are real,
   * its empty directories made). All or nothing: every target is checked
   * before the first write, and a failure puts back what each written target
   * held before (or removes it).
   */
  protected async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transfers.run("", async () => {
      const plan = await this.transferPlan(from, to, overwrite);
      const journal = new TransferJournal(this.transferOps());
      try {
        await journal.copy(plan, overwrite);
      } catch (error) {
        await journal.undo();
        throw error;
      }
      return journal.update();
    });
  }

  /**
   * Copy, then remove each source only if it still holds what was copied
   * (`removeIfUnchanged`), so a write that lands on a source meanwhile is
   * never lost: the move then answers `conflict` and is undone.
   */
  protected async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transfers.run("", async () => {
      const plan = await this.transferPlan(from, to, overwrite);
      const journal = new TransferJournal(this.transferOps());
      try {
        await journal.copy(plan, overwrite);
        for (const file of journal.copied) await journal.remove(file);
        // The source's directories go when empty, deepest first: a file written into the tree meanwhile stays.
        for (const dir of [...plan.sourceDirs].reverse()) {
          if ((await this.doLs(dir)).length === 0) await this.doDelete(dir);
        }
      } catch (error) {
        await journal.undo();
        throw error;
      }
      return journal.update();
    });
  }

  /**
   * Removes a moved file if it still holds `data`. The default compares what
   * is there now and then deletes: a writer between the two can still be lost,
   * in a window of one call. Stores with versions override it with an atomic
   * conditional delete.
   */
  protected async removeIfUnchanged(path: string, data: FileData): Promise<FilesUpdate> {
    const now = await this.doReadRaw(path);
    if (now.modified_at !== data.modified_at || fileDataSize(now) !== fileDataSize(data) || fileDataText(now) !== fileDataText(data)) {
      throw errors.conflict(path, "it was written while being moved");
    }
    const removed = await this.doDelete(path);
    if (removed.error !== undefined) throw new StrataError(removed.code ?? "io_error", removed.error, { path });
    return removed.filesUpdate ?? null;
  }

  /** Generic moves and copies of one backend run one at a time: two that cross (a to b, b to a) cannot both win. */
  private readonly transfers = new KeyedMutex();

  /** What a copy or move does, after every check that can be made before the first change. */
  protected async transferPlan(from: string, to: string, overwrite: boolean): Promise<TransferPlan> {
    const source = normalizePath(from);
    const target = normalizePath(to);
    const info = await this.doStat(source);
    const existing = await this.statOrNull(target);
    if (!info.is_dir) {
      if (existing?.is_dir) throw errors.isDirectory(target);
      if (existing && !overwrite) throw errors.alreadyExists(target);
      return { files: [[source, target]], dirs: [], sourceDirs: [] };
    }
    if (existing && !existing.is_dir) throw errors.notADirectory(joinPath(target, "x"));
    if (existing && !overwrite) throw errors.alreadyExists(target);
    // A directory replaces only an empty one (as rename(2) does): merging two trees is not a move.
    if (existing && (await this.doLs(target)).length > 0) {
      throw errors.notEmpty(target);
    }
    const files = (await this.doGlob("**", source, false, false)).map((f): [string, string] => [f.path, joinPath(target, relativeTo(source, f.path))]);
    const sourceDirs: string[] = [source];
    for (let i = 0; i < sourceDirs.length; i++) {
      for (const entry of await this.doLs(sourceDirs[i]!)) {
        if (entry.is_dir) sourceDirs.push(entry.path.replace(/\/$/, ""));
      }
    }
    const dirs = sourceDirs.map((dir) => (dir === source ? target : joinPath(target, relativeTo(source, dir))));
    for (const [, file] of files) {
      const there = await this.statOrNull(file);
      if (there?.is_dir) throw errors.isDirectory(file);
    }
    return { files, dirs, sourceDirs };
  }

  /** What a TransferJournal may do to this backend. */
  private transferOps(): TransferOps {
    return {
      read: (path) => this.doReadRaw(path),
      readOrNull: (path) =>
        this.doReadRaw(path).catch((error: unknown) => {
          if (isStrataError(error, "file_not_found")) return null;
          throw error;
        }),
      put: (path, data, overwrite) => this.putData(path, data, overwrite),
      removeMoved: (path, data) => this.removeIfUnchanged(path, data),
      deleteQuietly: async (path) => {
        await this.doDelete(path).catch(() => undefined);
      },
      makeDir: (path) => this.doMkdir(path, true),
    };
  }

  /** Writes a record's content (text or bytes) at `path`. */
  private async putData(path: string, data: FileData, overwrite: boolean): Promise<FilesUpdate> {
    const text = fileDataText(data);
    if (text !== null) {
      const written = await this.doWrite(path, text, overwrite);
      if (written.error !== undefined) throw new StrataError(written.code ?? "io_error", written.error, { path });
      return written.filesUpdate ?? null;
    }
    if (!overwrite && (await this.statOrNull(path))) throw errors.alreadyExists(path);
    const [answer] = await this.doUpload([[path, fileDataBytes(data)]]);
    if (answer?.error) throw new StrataError(answer.error, `Writing '${printable(path)}' failed (${answer.error.replace(/_/g, " ")})`, { path });
    return null;
  }

  private async statOrNull(path: string): Promise<FileInfo | null> {
    try {
      return await this.doStat(path);
    } catch (error) {
      if (isStrataError(error, "file_not_found") || isStrataError(error, "not_a_directory")) return null;
      throw error;
    }
  }

  // ---- the caller's path space ----

  /**
   * Where the caller's paths start: "/" for most backends; a sandbox's
   * workspace (e.g. "/workspace"), so that the path a file operation takes is
   * the path a command sees. Drivers always see paths relative to it (their
   * "/" is the root); the native API translates both ways, once, here.
   */
  protected get pathRoot(): string {
    return "/";
  }

  /** Where this backend's path space starts: "/", or a sandbox's workspace. */
  get root(): string {
    return this.pathRoot;
  }

  /** A caller's path as the driver names it. Relative paths start at the root; absolute ones must lie within it. */
  protected toDriverPath(path: string): string {
    const root = this.pathRoot;
    if (root === "/" || !path.startsWith("/")) return path;
    const normal = normalizePath(path);
    if (!isWithin(root, normal)) throw errors.invalidPath(path, `it lies outside the workspace '${root}'`);
    return normal === root ? "/" : normal.slice(root.length);
  }

  /** A driver's path as the caller names it (a directory keeps its trailing `/`). */
  protected toCallerPath(path: string): string {
    const root = this.pathRoot;
    if (root === "/" || !path.startsWith("/")) return path;
    return path === "/" ? root : root + path;
  }

  protected callerError(info: ErrorInfo): ErrorInfo {
    if (this.pathRoot === "/" || info.path === undefined || !info.path.startsWith("/")) return info;
    const path = this.toCallerPath(info.path);
    return { ...info, message: info.message.split(`'${printable(info.path)}'`).join(`'${printable(path)}'`), path };
  }

  private callerInfo = (info: FileInfo): FileInfo => ({ ...info, path: this.toCallerPath(info.path) });

  private callerUpdate(update: FilesUpdate): FilesUpdate {
    if (!update || this.pathRoot === "/") return update;
    return Object.fromEntries(Object.entries(update).map(([path, data]) => [this.toCallerPath(path), data]));
  }

  private callerChange = <T extends Changed>(change: T): T => ({ ...change, path: this.toCallerPath(change.path), filesUpdate: this.callerUpdate(change.filesUpdate) });

  private callerItem = <T extends UploadItem>(item: T): T => (item.error ? { ...item, error: this.callerError(item.error) } : item);

  // ---- the native API ----

  /** With no path: the start of the backend's path space (a sandbox's workspace). */
  ls(path?: unknown, options?: unknown): Promise<Result<Listing>> {
    return this.answer(path === undefined ? NO_PATH : path, options, true, async (p, o) => ({ entries: await this.doLs(p, o.sizes === undefined || flag(o, "sizes"), this[hidesNames] ? hidingOption(o) : undefined) }), (v) => ({ entries: v.entries.map(this.callerInfo) }));
  }

  read(path: unknown, options?: unknown): Promise<Result<ReadContent>> {
    return this.answer(
      path,
      options,
      true,
      async (p, o): Promise<ReadContent> => {
        const { offset, limit } = readWindow(o.offset ?? 0, o.limit ?? DEFAULT_READ_LIMIT);
        const shown = normalizePath(p);
        try {
          const { lines, totalLines } = await this.doRead(p, offset, limit);
          const content = lines.join("\n");
          return { path: shown, encoding: "utf-8", content, mimeType: mimeTypeOf(shown, true), totalLines, offset, lineCount: lines.length };
        } catch (error) {
          if (!isStrataError(error, "binary_file")) throw error;
          const bytes = fileDataBytes(await this.doReadRaw(p));
          return { path: shown, encoding: "binary", content: bytes, mimeType: mimeTypeOf(shown, false), size: bytes.length };
        }
      },
      (v) => ({ ...v, path: this.toCallerPath(v.path) }),
    );
  }

  readRaw(path: unknown, options?: unknown): Promise<Result<{ path: string; data: FileData }>> {
    return this.answer(
      path,
      options,
      true,
      async (p) => ({ path: normalizePath(p), data: await this.doReadRaw(p) }),
      (v) => ({ ...v, path: this.toCallerPath(v.path) }),
    );
  }

  write(path: unknown, content: unknown, options?: unknown): Promise<Result<Changed>> {
    return this.answer(
      path,
      options,
      false,
      async (p, o) => {
        if (typeof content !== "string") throw errors.invalidArgument(`content must be a string, got ${typeName(content)}`);
        return changed(await this.doWrite(p, content, flag(o, "overwrite")), p);
      },
      this.callerChange,
    );
  }

  edit(path: unknown, oldString: unknown, newString: unknown, options?: unknown): Promise<Result<Edited>> {
    return this.answer(
      path,
      options,
      false,
      async (p, o) => {
        if (typeof oldString !== "string") throw errors.invalidArgument(`oldString must be a string, got ${typeName(oldString)}`);
        if (typeof newString !== "string") throw errors.invalidArgument(`newString must be a string, got ${typeName(newString)}`);
        const result = await this.doEdit(p, oldString, newString, flag(o, "replaceAll"));
        const edited: Edited = { ...changed(result, p), occurrences: result.occurrences ?? 0 };
        if (typeof result.content === "string") edited.content = result.content;
        return edited;
      },
      this.callerChange,
    );
  }

  delete(path: unknown, options?: unknown): Promise<Result<Changed>> {
    return this.answer(path, options, false, async (p) => changed(await this.doDelete(p), p), this.callerChange);
  }

  [deleteUnlessDirectory](path: unknown, options?: unknown, names?: readonly string[]): Promise<Result<SingleDelete>> {
    return this.answer(
      path,
      options,
      false,
      async (p): Promise<SingleDelete> => {
        const done = await this.doDeleteUnlessDirectory(p, names);
        return Array.isArray(done) ? { tree: done } : { deleted: changed(done, p) };
      },
      (v) => (v.tree ? { tree: v.tree.map(this.callerInfo) } : { deleted: this.callerChange(v.deleted) }),
    );
  }

  /** See hiddenNames: true where doLs applies `hides`. */
  get [hidesNames](): boolean {
    return false;
  }

  /** See deletesUnlessDirectory: true where doDeleteUnlessDirectory is overridden and answers. */
  get [deletesUnlessDirectory](): boolean {
    return false;
  }

  /** See deleteUnlessDirectory (the tree as an array); backends that can delete a non-directory in one step override it. */
  protected doDeleteUnlessDirectory(path: string, _names?: readonly string[]): Promise<DeleteResult | FileInfo[]> {
    return Promise.reject(new StrataError("unsupported", `This backend cannot delete '${printable(path)}' only when it is not a directory`, { path }));
  }

  grep(pattern: unknown, options?: unknown): Promise<Result<GrepResult>> {
    return this.answer(
      NO_PATH,
      options,
      true,
      async (_, o) => {
        if (typeof pattern !== "string") throw errors.invalidArgument(`pattern must be a string, got ${typeName(pattern)}`);
        const glob = optionalString(o, "glob");
        return this.doGrep(pattern, this.driverSearchPath(o.path), glob === null ? null : this.driverPattern(glob), maxCountOf(o.maxCount));
      },
      (v) => ({ ...v, matches: v.matches.map((m) => ({ ...m, path: this.toCallerPath(m.path) })) }),
    );
  }

  glob(pattern: unknown, options?: unknown): Promise<Result<Listing>> {
    return this.answer(
      NO_PATH,
      options,
      true,
      async (_, o) => {
        if (typeof pattern !== "string") throw errors.invalidArgument(`pattern must be a string, got ${typeName(pattern)}`);
        const sizes = o.sizes === undefined || flag(o, "sizes");
        return { entries: await this.doGlob(this.driverPattern(pattern), this.driverSearchPath(o.path), flag(o, "includeDirectories"), sizes) };
      },
      (v) => ({ entries: v.entries.map(this.callerInfo) }),
    );
  }

  stat(path: unknown, options?: unknown): Promise<Result<FileInfo>> {
    return this.answer(path, options, true, (p) => this.doStat(p), this.callerInfo);
  }

  mkdir(path: unknown, options?: unknown): Promise<Result<Changed>> {
    return this.answer(
      path,
      options,
      false,
      async (p, o) => ({ path: normalizePath(p), filesUpdate: await this.doMkdir(p, flag(o, "recursive")) }),
      this.callerChange,
    );
  }

  move(from: unknown, to: unknown, options?: unknown): Promise<Result<Moved>> {
    return this.transfer(from, to, options, (source, target, overwrite) => this.doMove(source, target, overwrite));
  }

  copy(from: unknown, to: unknown, options?: unknown): Promise<Result<Moved>> {
    return this.transfer(from, to, options, (source, target, overwrite) => this.doCopy(source, target, overwrite));
  }

  private async transfer(from: unknown, to: unknown, options: unknown, run: (from: string, to: string, overwrite: boolean) => Promise<FilesUpdate>): Promise<Result<Moved>> {
    let target: string;
    try {
      target = this.toDriverPath(checkPath(to));
    } catch (error) {
      return { error: toErrorInfo(error, typeof to === "string" ? safeNormalize(to) : undefined) }; // the caller's own path, as given
    }
    return this.answer(
      from,
      options,
      false,
      async (p, o) => {
        const source = normalizePath(p);
        const into = normalizePath(target);
        // Checked once here for every backend: the drivers take them as given.
        if (source === "/") throw new StrataError("invalid_argument", "Cannot move or copy '/'", { path: source });
        if (source === into || isWithin(source, into)) {
          throw new StrataError("invalid_argument", `Cannot move or copy '${printable(source)}' into itself ('${printable(into)}')`, { path: into });
        }
        return { from: source, to: into, filesUpdate: await run(p, target, flag(o, "overwrite")) };
      },
      (v) => this.callerMove(v),
    );
  }

  private callerMove(moved: Moved): Moved {
    return { from: this.toCallerPath(moved.from), to: this.toCallerPath(moved.to), filesUpdate: this.callerUpdate(moved.filesUpdate) };
  }

  /** Answers echo each path exactly as the caller gave it (seed 000). */
  uploadFiles(files: unknown, options?: unknown): Promise<Result<{ files: UploadItem[] }>> {
    return this.answer(
      NO_PATH,
      options,
      false,
      async () => {
        checkBatch(files, "uploadFiles");
        const items = files as unknown[];
        const pending: { index: number; item: readonly [string, Uint8Array] }[] = [];
        const answers: (UploadItem | undefined)[] = items.map((item, index) => {
          if (!Array.isArray(item) || typeof item[0] !== "string") return itemFailure(pathOfItem(item), errors.invalidPath(pathOfItem(item), "an upload is a [path, bytes] pair with a string path"));
          if (!(item[1] instanceof Uint8Array)) return itemFailure(item[0], errors.invalidArgument(`The content of '${printable(item[0])}' must be bytes (a Uint8Array)`));
          try {
            pending.push({ index, item: [this.toDriverPath(item[0]), item[1]] });
          } catch (error) {
            return itemFailure(item[0], asStrataError(error, "/"));
          }
          return undefined;
        });
        const done = pending.length > 0 ? await this.doUpload(pending.map(({ item }) => item)) : [];
        // A driver's item errors name driver paths: translated here; those refused above already name the caller's.
        pending.forEach(({ index, item }, i) => (answers[index] = this.callerItem(uploadItem((items[index] as [string])[0], item[0], done[i] ? done[i].error : "io_error"))));
        return { files: answers as UploadItem[] };
      },
      (v) => v,
    );
  }

  /** Answers echo each path exactly as the caller gave it (seed 000). */
  downloadFiles(paths: unknown, options?: unknown): Promise<Result<{ files: DownloadItem[] }>> {
    return this.answer(
      NO_PATH,
      options,
      true,
      async () => {
        checkBatch(paths, "downloadFiles");
        const items = paths as unknown[];
        const pending: { index: number; path: string }[] = [];
        const answers: (DownloadItem | undefined)[] = items.map((path, index) => {
          if (typeof path !== "string") return { ...itemFailure(path, errors.invalidPath(pathOfItem(path), "a path must be a string")), content: null };
          try {
            pending.push({ index, path: this.toDriverPath(path) });
          } catch (error) {
            return { ...itemFailure(path, asStrataError(error, "/")), content: null };
          }
          return undefined;
        });
        const done = pending.length > 0 ? await this.doDownload(pending.map(({ path }) => path)) : [];
        pending.forEach(({ index, path }, i) => {
          const answer = done[i];
          answers[index] = { ...this.callerItem(uploadItem(items[index] as string, path, answer ? answer.error : "io_error")), content: answer?.error === null ? answer.content : null };
        });
        return { files: answers as DownloadItem[] };
      },
      (v) => v,
    );
  }

  private driverSearchPath(path: unknown): string | null {
    if (path === undefined || path === null) return null;
    return this.toDriverPath(checkPath(path));
  }

  /** An absolute glob names caller paths; the driver matches its own. */
  private driverPattern(pattern: string): string {
    const root = this.pathRoot;
    if (root === "/" || !pattern.startsWith("/")) return pattern;
    if (pattern.startsWith(`${root}/`)) return pattern.slice(root.length);
    throw errors.invalidArgument(`The glob '${printable(pattern)}' lies outside the workspace '${root}'`);
  }

  /**
   * Checks the path and the options object, honours the signal, runs the
   * operation, and answers every throw as `{ error }`. A read-only operation
   * stops waiting when the signal aborts; a change is refused only before it
   * starts, so an `aborted` answer never hides a change that landed.
   * `path` NO_PATH: the operation takes no path of its own.
   */
  protected async answer<T extends object>(
    path: unknown,
    options: unknown,
    readOnly: boolean,
    run: (path: string, options: Options) => Promise<T>,
    toCaller: (value: T) => T,
  ): Promise<Result<T>> {
    let checked: Options;
    let target: string;
    try {
      checked = checkOptions(options);
      target = path === NO_PATH ? "/" : this.toDriverPath(checkPath(path));
    } catch (error) {
      // Refused before the driver saw it: the error names the caller's own path.
      return { error: toErrorInfo(error, typeof path === "string" ? safeNormalize(path) : undefined) };
    }
    try {
      const signal = checked.signal;
      if (signal?.aborted) throw errors.aborted();
      const value = !signal || !readOnly ? await run(target, checked) : await abortable(run(target, checked), signal);
      return (this.pathRoot === "/" ? value : toCaller(value)) as Result<T>;
    } catch (error) {
      return { error: this.callerError(toErrorInfo(error, path === NO_PATH ? undefined : safeNormalize(target))) };
    }
  }
}

/** The files (source, target) and the target directories of a copy or move. */
export interface TransferPlan {
  files: Array<[string, string]>;
  /** The target directories to make (parents first), and the source directories they mirror. */
  dirs: string[];
  sourceDirs: string[];
}

/** What a copy or move changed, so a failure can put every target and source back. */
interface TransferOps {
  read(path: string): Promise<FileData>;
  readOrNull(path: string): Promise<FileData | null>;
  put(path: string, data: FileData, overwrite: boolean): Promise<FilesUpdate>;
  removeMoved(path: string, data: FileData): Promise<FilesUpdate>;
  deleteQuietly(path: string): Promise<void>;
  makeDir(path: string): Promise<FilesUpdate>;
}

class TransferJournal {
  /** Targets written, each with what it held before (null: nothing). */
  private readonly written: Array<{ path: string; before: FileData | null }> = [];
  /** Sources removed by a move, with the data they held. */
  private readonly removed: Array<{ path: string; data: FileData }> = [];
  readonly copied: Array<{ source: string; data: FileData }> = [];
  private readonly changes: Record<string, FileData | null> = {};

  constructor(private readonly backend: TransferOps) {}

  async copy(plan: TransferPlan, overwrite: boolean): Promise<void> {
    for (const dir of plan.dirs) this.merge(await this.backend.makeDir(dir));
    for (const [source, target] of plan.files) {
      const data = await this.backend.read(source);
      const before = overwrite ? await this.backend.readOrNull(target) : null;
      this.merge(await this.backend.put(target, data, overwrite));
      this.written.push({ path: target, before });
      this.copied.push({ source, data });
    }
  }

  async remove(file: { source: string; data: FileData }): Promise<void> {
    this.merge(await this.backend.removeMoved(file.source, file.data));
    this.removed.push({ path: file.source, data: file.data });
  }

  /** Puts back removed sources, then every written target's previous content. */
  async undo(): Promise<void> {
    for (const { path, data } of this.removed.reverse()) await this.backend.put(path, data, true).catch(() => undefined);
    for (const { path, before } of this.written.reverse()) {
      if (before) await this.backend.put(path, before, true).catch(() => undefined);
      else await this.backend.deleteQuietly(path);
    }
  }

  update(): FilesUpdate {
    return Object.keys(this.changes).length > 0 ? this.changes : null;
  }

  private merge(update: FilesUpdate): void {
    Object.assign(this.changes, update ?? {});
  }
}

function abortable<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(errors.aborted());
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

function changed(result: WriteResult | DeleteResult, path: string): Changed {
  if (result.error !== undefined) throw new StrataError(result.code ?? "io_error", result.error, { path: safeNormalize(path) });
  return { path: result.path ?? normalizePath(path), filesUpdate: result.filesUpdate ?? null };
}

/** An item's answer: the caller's path echoed, the error worded with the driver's path (translated later like every error). */
function uploadItem(path: string, driverPath: string, code: ErrorCode | null): UploadItem {
  if (code === null) return { path, error: null, seedError: null };
  const error = toErrorInfo(describeItemError(code, safeNormalize(driverPath) ?? driverPath), safeNormalize(driverPath));
  return { path, error, seedError: toFileOperationError(code) };
}

function itemFailure(path: unknown, error: StrataError): UploadItem {
  return { path: path as string, error: toErrorInfo(error), seedError: toFileOperationError(error.code) };
}

/** The message for a per-item code, worded like every other backend's. */
function describeItemError(code: ErrorCode, path: string): StrataError {
  switch (code) {
    case "file_not_found":
      return errors.notFound(path);
    case "is_directory":
      return errors.isDirectory(path);
    case "not_a_directory":
      return errors.notADirectory(path);
    case "permission_denied":
      return errors.permissionDenied(path);
    case "invalid_path":
      return errors.invalidPath(path, "the backend cannot address it");
    default:
      return new StrataError(code, `'${printable(path)}': ${code.replace(/_/g, " ")}`, { path });
  }
}

/** The options object, copied once: a getter that throws, or a Proxy, is read here and only here. */
/**
 * An options object read once into a plain copy: a getter or a Proxy that
 * throws is `invalid_argument`, never a raw error later. Anything that is not
 * an object comes back as it is, for the caller's own type check.
 */
export function readOptions<T>(options: T): T {
  if (typeof options !== "object" || options === null || Array.isArray(options)) return options;
  try {
    return { ...options };
  } catch {
    throw errors.invalidArgument("options could not be read (a getter or a Proxy threw)");
  }
}

function checkOptions(options: unknown): Options {
  if (options === undefined || options === null) return {};
  if (typeof options !== "object" || Array.isArray(options)) {
    throw errors.invalidArgument(`options must be an object, got ${typeName(options)}`);
  }
  const copy = readOptions(options as Options);
  if (copy.signal !== undefined && !(copy.signal instanceof AbortSignal)) throw errors.invalidArgument("signal must be an AbortSignal");
  return copy;
}

function hidingOption(options: Options): ((name: string) => boolean) | undefined {
  const hides = (options as { [hiddenNames]?: unknown })[hiddenNames];
  return typeof hides === "function" ? (hides as (name: string) => boolean) : undefined;
}

function checkPath(path: unknown): string {
  if (typeof path !== "string") throw errors.invalidPath(path as string, `a path must be a string, got ${typeName(path)}`);
  return path;
}

function flag(options: Options, name: string): boolean {
  const value = options[name];
  if (value === undefined) return false;
  if (typeof value !== "boolean") throw errors.invalidArgument(`${name} must be true or false, got ${typeName(value)}`);
  return value;
}

function optionalString(options: Options, name: string): string | null {
  const value = options[name];
  if (value === undefined || value === null) return null;
  if (typeof value !== "string") throw errors.invalidArgument(`${name} must be a string, got ${typeName(value)}`);
  return value;
}

function pathOfItem(item: unknown): string {
  return (Array.isArray(item) ? item[0] : item) as string;
}

function safeNormalize(path: string): string | undefined {
  try {
    return normalizePath(path);
  } catch {
    return undefined;
  }
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "number" ? `the number ${value}` : typeof value;
}

