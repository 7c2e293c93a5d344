import { BaseBackend, textWindow, unwrap, type TextWindow, type UploadAnswer } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, printable, StrataError, toErrorInfo } from "../core/errors.js";
import { fileDataBytes, fileDataFromBytes, fileDataFromText, fileDataInfo, fileDataSize, fileDataText, now, toFileDataV2 } from "../core/filedata.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { KeyedMutex } from "../core/lock.js";
import { ancestorsOf, baseName, isReservedName, isWithin, joinPath, normalizePath, parentOf, relativeTo, sortByPath } from "../core/paths.js";
import type { PermissionOptions } from "../core/permissions.js";
import { describeFileChanges, type FileChange, type KeyChange } from "../core/snapshots.js";
import type { DeleteResult, EditResult, FileData, FileDataV2, FileInfo, FilesUpdate, GrepMatch, GrepResult, Result, WriteResult } from "../core/types.js";
import type { Namespace, Store } from "../stores/store.js";
import { FilesystemBackend } from "./filesystem.js";
import { guarded } from "./permissions.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

export interface OverlayBackendOptions {
  /** The host directory the layer lies over. It is only read until `commit()`. */
  workspace: string;
  /**
   * Where the layer is kept. Default: in memory, for the backend's lifetime.
   * With a Store (SqliteStore, PostgresStore, …) every change is saved as it
   * is made, and a new OverlayBackend over the same store and `namespace`
   * finds the layer again after a restart.
   */
  store?: Store;
  /** The layer's namespace in `store`. Default `["overlay"]`. */
  namespace?: Namespace;
  /** Largest file, in bytes, that write, edit and upload accept. */
  maxFileSize?: number;
  /** Use ripgrep for grep's reads of the disk (default true), as FilesystemBackend does. */
  useRipgrep?: boolean;
  /** fsync each file `commit()` writes (default true), as FilesystemBackend does. */
  fsync?: boolean;
  /** Permission rules, as FilesystemBackend's (default: the secrets preset; false: none). */
  permissions?: PermissionOptions | false;
}

/** What the layer holds at a path: a file, a directory, or a whiteout hiding what the disk has there. */
type Entry =
  | { kind: "file"; data: FileDataV2 }
  /** `opaque`: the disk's tree at this path is hidden (it was deleted, then the directory made again). */
  | { kind: "dir"; opaque: boolean; created_at: string }
  | { kind: "whiteout" };

/** What the disk held at a path when the layer first touched it; `commit` refuses a path whose disk state moved on. */
type BaseVersion = { kind: "absent" } | { kind: "dir" } | { kind: "file"; size: number; modified_at?: string; hash: string } | { kind: "other"; modified_at?: string };

/** One path of the layer, as `virtualFiles()` shows it (seed 002's `virtual_files`). */
export interface VirtualFile {
  path: string;
  kind: "file" | "directory" | "deleted";
  /** Bytes of a file. */
  size?: number;
  /** A text file's content (absent for binary files). */
  content?: string;
}

/** A path `commit()` refuses: the disk changed there since the layer read or based it. */
export interface OverlayConflict {
  path: string;
  /** What the layer based its change on, and what the disk holds now. */
  reason: "modified" | "deleted" | "created" | "replaced";
}

export interface OverlayCommit {
  /** Files written to disk. */
  written: string[];
  /** Paths removed from disk (a file, or a directory with everything under it). */
  removed: string[];
  /** Directories made. */
  directories: string[];
}

/**
 * A copy-on-write layer over a host directory (seed 002's virtual mode, not
 * to be confused with FilesystemBackend's `virtualMode`, which is about path
 * naming). Reads see the layer first, then the disk; writes, edits,
 * deletes (whiteouts), moves, copies and mkdir land in the layer. The disk
 * is untouched until `commit()`, which applies the layer file by file
 * (each atomic: temp file, then rename) after checking every path for a
 * conflict; `discard()` drops the layer; `diff()` shows it.
 *
 * The disk is read through a FilesystemBackend, so paths are resolved the
 * same race-free way and symlinks are never followed. Every change runs
 * alone (one queue per backend): it reads what it needs, then changes the
 * layer synchronously, so concurrent reads see it whole or not at all.
 */
export class OverlayBackend extends BaseBackend {
  /** The disk beneath the layer (no permission rules of its own: the overlay's apply). */
  readonly disk: FilesystemBackend;
  private readonly lower: LowerFilesystem;
  readonly workspace: string;
  private readonly entries = new Map<string, Entry>();
  /** Names of entries, by parent directory, for listings. */
  private readonly children = new Map<string, Set<string>>();
  private readonly bases = new Map<string, BaseVersion>();
  private readonly changes = new KeyedMutex();
  private readonly store: Store | undefined;
  private readonly namespace: Namespace;
  private loading: Promise<void> | undefined;

  constructor(private readonly options: OverlayBackendOptions) {
    super();
    if (typeof options?.workspace !== "string" || options.workspace === "") {
      throw errors.invalidArgument("OverlayBackend needs { workspace }: the host directory the layer lies over");
    }
    this.disk = this.lower = new LowerFilesystem({ workspace: options.workspace, useRipgrep: options.useRipgrep, fsync: options.fsync, permissions: false });
    this.workspace = this.disk.workspace;
    this.store = options.store;
    this.namespace = options.namespace ?? ["overlay"];
    return guarded(this, options.permissions);
  }

  // ---- the layer's own API ----

  /** What the layer holds, sorted by path: files written, directories made, and paths deleted (whiteouts). */
  async virtualFiles(): Promise<Result<{ files: VirtualFile[] }>> {
    return this.settle(async () => {
      await this.loaded();
      const files: VirtualFile[] = [];
      for (const [path, entry] of this.entries) {
        if (entry.kind === "dir") files.push({ path, kind: "directory" });
        else if (entry.kind === "whiteout") files.push({ path, kind: "deleted" });
        else {
          const text = fileDataText(entry.data);
          files.push(text === null ? { path, kind: "file", size: fileDataSize(entry.data) } : { path, kind: "file", size: fileDataSize(entry.data), content: text });
        }
      }
      return { files: sortByPath(files) };
    });
  }

  /**
   * What `commit()` would change on disk: added, modified and deleted files
   * (against the disk as it is now), sorted by path, each text file with a
   * unified diff.
   */
  async diff(): Promise<Result<{ changes: FileChange[] }>> {
    return this.settle(() => this.changes.run("", async () => {
      await this.loaded();
      const changes = new Map<string, KeyChange<FileData>>();
      const before = async (path: string) => {
        const raw = await this.disk.readRaw(path);
        return raw.error ? undefined : raw.data;
      };
      for (const [path, entry] of [...this.entries]) {
        if (entry.kind === "file") changes.set(path, { before: await before(path), after: entry.data });
        if (entry.kind === "dir" && !entry.opaque) continue;
        // Whatever the disk holds under a whiteout, an opaque directory or a file is gone from the view.
        const there = await this.disk.stat(path);
        if (there.error) continue;
        if (!there.is_dir) {
          if (entry.kind === "whiteout" || entry.kind === "dir") changes.set(path, { before: await before(path), after: undefined });
          continue;
        }
        for (const file of unwrap(await this.disk.glob("**", { path, sizes: false })).entries) {
          if (this.entries.get(file.path)?.kind === "file" || changes.has(file.path)) continue;
          changes.set(file.path, { before: await before(file.path), after: undefined });
        }
      }
      return { changes: describeFileChanges(changes) };
    }));
  }

  /** The paths `commit()` would refuse, with what changed on disk. */
  async conflicts(): Promise<Result<{ conflicts: OverlayConflict[] }>> {
    return this.settle(() => this.changes.run("", async () => ({ conflicts: await this.findConflicts() })));
  }

  /**
   * Applies the layer to disk: removals first, then directories, then files,
   * each file written atomically (temp file, then rename). Every path is
   * checked first: when the disk changed anywhere the layer read or based a
   * change, nothing is applied and the answer is `conflict`, listing them
   * (`conflicts()` gives the list as data). A failure part-way (a disk
   * error) leaves the layer holding exactly what is not yet applied, so a
   * second commit finishes the job.
   */
  async commit(): Promise<Result<OverlayCommit>> {
    return this.settle(() =>
      this.changes.run("", async () => {
        await this.loaded();
        // A closed or unreachable store fails here, before the disk is touched: else the files would land and the layer could not record it.
        if (this.store) await this.store.list(this.namespace, { limit: 1 });
        const conflicts = await this.findConflicts();
        if (conflicts.length > 0) {
          const list = conflicts.map((c) => `${printable(c.path)} (${c.reason})`).join(", ");
          throw new StrataError("conflict", `Nothing committed: ${conflicts.length} path(s) changed on disk since the overlay read them: ${list}`);
        }
        const done: OverlayCommit = { written: [], removed: [], directories: [] };
        const dirty = new Set<string>();
        try {
          await this.applyLayer(done, dirty);
        } finally {
          await this.persist(dirty);
        }
        if (this.entries.size === 0) {
          this.bases.clear();
          await this.wipeStore();
        }
        return done;
      }),
    );
  }

  /** Drops the layer: the view is the disk again. */
  async discard(): Promise<Result<{ discarded: number }>> {
    return this.settle(() =>
      this.changes.run("", async () => {
        await this.loaded();
        const discarded = this.entries.size;
        await this.wipeStore();
        this.entries.clear();
        this.children.clear();
        this.bases.clear();
        return { discarded };
      }),
    );
  }

  // ---- the driver ----

  protected async doLs(dirPath: string): Promise<FileInfo[]> {
    await this.loaded();
    const dir = normalizePath(dirPath);
    const here = await this.viewStat(dir);
    if (!here) return [];
    if (!here.is_dir) return [here];
    const out = new Map<string, FileInfo>();
    if (this.diskVisibleUnder(dir)) {
      const listed = await this.disk.ls(dir);
      if (listed.error && listed.error.code !== "file_not_found") throw toStrata(listed.error);
      for (const info of listed.entries ?? []) {
        const path = info.path.endsWith("/") ? info.path.slice(0, -1) : info.path;
        // A file put on disk where the layer has a directory lists as itself: not a child.
        if (path !== dir && !this.entries.has(path)) out.set(path, info);
      }
    }
    for (const name of this.children.get(dir) ?? []) {
      const path = joinPath(dir, name);
      const entry = this.entries.get(path)!;
      if (entry.kind === "whiteout") out.delete(path);
      else out.set(path, entryInfo(path, entry));
    }
    return sortByPath([...out.values()]);
  }

  protected async doReadRaw(filePath: string): Promise<FileDataV2> {
    await this.loaded();
    const path = normalizePath(filePath);
    const entry = this.entries.get(path);
    if (entry) return entryData(path, entry);
    if (this.hidden(path)) throw errors.notFound(path);
    return toFileDataV2(unwrap(await this.disk.readRaw(path)).data);
  }

  protected override async doRead(filePath: string, offset: number, limit: number): Promise<TextWindow> {
    await this.loaded();
    const path = normalizePath(filePath);
    const entry = this.entries.get(path);
    if (entry) {
      const data = entryData(path, entry);
      const text = fileDataText(data);
      if (text === null) throw errors.binary(path, fileDataSize(data));
      return textWindow(text, path, offset, limit);
    }
    if (this.hidden(path)) throw errors.notFound(path);
    return this.lower.readWindow(path, offset, limit);
  }

  protected override async doStat(filePath: string): Promise<FileInfo> {
    await this.loaded();
    const path = normalizePath(filePath);
    const info = await this.viewStat(path);
    if (!info) throw errors.notFound(path);
    return info;
  }

  protected async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    const path = normalizePath(filePath);
    if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
    await this.change(async () => {
      const existing = await this.placeForFile(path, overwrite);
      return this.plan([path, ...existing.missing], () => {
        for (const dir of existing.missing) this.putDir(dir);
        this.set(path, { kind: "file", data: this.sized(path, fileDataFromText(content, existing.created_at)) });
      });
    });
    return { path, filesUpdate: null };
  }

  protected async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    const path = normalizePath(filePath);
    const occurrences = await this.change(async () => {
      const current = await this.doReadRaw(path);
      const text = fileDataText(current);
      if (text === null) throw errors.binary(path, fileDataSize(current));
      const edited = applyEdit(text, oldString, newString, replaceAll, path);
      const data = this.sized(path, fileDataFromText(edited.text, current.created_at));
      await this.plan([path], () => this.set(path, { kind: "file", data }));
      return edited.occurrences;
    });
    return { path, occurrences, filesUpdate: null };
  }

  protected async doDelete(filePath: string): Promise<DeleteResult> {
    const path = normalizePath(filePath);
    if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
    await this.change(async () => {
      if (!(await this.viewStat(path))) throw errors.notFound(path);
      const removal = await this.removalPlan(path);
      await this.plan(removal.touched, () => this.remove(path, removal.whiteout));
    });
    return { path, filesUpdate: null };
  }

  protected override async doMkdir(filePath: string, recursive: boolean): Promise<FilesUpdate> {
    await this.loaded();
    const path = normalizePath(filePath);
    checkName(path);
    await this.change(async () => {
      const existing = await this.viewStat(path);
      if (existing?.is_dir) {
        if (recursive) return;
        throw new StrataError("already_exists", `Directory '${printable(path)}' already exists`, { path });
      }
      if (existing) throw errors.alreadyExists(path);
      const missing = await this.missingParents(path);
      if (missing.length > 0 && !recursive) throw errors.notFound(path);
      await this.plan([path, ...missing], () => {
        for (const dir of missing) this.putDir(dir);
        this.putDir(path);
      });
    });
    return null;
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    await this.transferInLayer(from, to, overwrite, true);
    return null;
  }

  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    await this.transferInLayer(from, to, overwrite, false);
    return null;
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    await this.loaded();
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const root = searchRoot(path);
    const options = { path: path ?? undefined, glob: glob ?? undefined };
    if (this.entries.size === 0) return unwrap(await this.disk.grep(pattern, { ...options, maxCount }));
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const matches: GrepMatch[] = [];
    for (const [key, entry] of this.entries) {
      if (entry.kind !== "file" || !isWithin(root, key) || (matcher && !matcher(key))) continue;
      const text = fileDataText(entry.data);
      if (text !== null) grepText(key, text, pattern, matches);
    }
    if (this.diskSearchable(root)) {
      let found = unwrap(await this.disk.grep(pattern, { ...options, maxCount }));
      let kept = found.matches.filter((m) => this.diskShows(m.path));
      // The disk's cap may have counted matches the layer hides: search again without it.
      if (found.truncated && kept.length < found.matches.length) {
        found = unwrap(await this.disk.grep(pattern, options));
        kept = found.matches.filter((m) => this.diskShows(m.path));
      }
      matches.push(...kept);
    }
    return capMatches(sortMatches(matches), maxCount);
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    await this.loaded();
    const matcher = compileGlob(pattern, searchRoot(path));
    const options = { path: path ?? undefined, includeDirectories, sizes };
    if (this.entries.size === 0) return unwrap(await this.disk.glob(pattern, options)).entries;
    const found = new Map<string, FileInfo>();
    if (this.diskSearchable(matcher.root)) {
      for (const info of unwrap(await this.disk.glob(pattern, options)).entries) {
        const key = info.path.endsWith("/") ? info.path.slice(0, -1) : info.path;
        if (this.diskShows(key)) found.set(key, info);
      }
    }
    for (const [key, entry] of this.entries) {
      if (!isWithin(matcher.root, key)) continue;
      if (entry.kind === "file" && matcher(key)) found.set(key, entryInfo(key, entry));
      else if (entry.kind === "dir" && includeDirectories && matcher.matchesDirectory(key)) found.set(key, entryInfo(key, entry));
    }
    return sortByPath([...found.values()]);
  }

  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    await this.loaded();
    const answers: UploadAnswer[] = [];
    for (const item of files) {
      const filePath = Array.isArray(item) ? (item[0] as string) : String(item);
      try {
        if (!Array.isArray(item) || !(item[1] instanceof Uint8Array)) throw errors.invalidArgument("each upload must be a [path, bytes] pair");
        const path = normalizePath(filePath);
        const bytes = item[1];
        await this.change(async () => {
          const existing = await this.placeForFile(path, true);
          await this.plan([path, ...existing.missing], () => {
            for (const dir of existing.missing) this.putDir(dir);
            this.set(path, { kind: "file", data: this.sized(path, fileDataFromBytes(bytes, existing.created_at)) });
          });
        });
        answers.push({ path: filePath, error: null });
      } catch (error) {
        answers.push({ path: filePath, error: toErrorInfo(error, filePath).code });
      }
    }
    return answers;
  }

  // ---- the view: the layer over the disk ----

  /** Whether the disk's entry at `path` is hidden by the layer: a whiteout there, or above it a whiteout, a file or an opaque directory. */
  private hidden(path: string): boolean {
    if (this.entries.size === 0) return false;
    if (this.entries.get(path)?.kind === "whiteout") return true;
    for (const dir of ancestorsOf(path)) {
      const entry = this.entries.get(dir);
      if (entry && (entry.kind !== "dir" || entry.opaque)) return true;
    }
    return false;
  }

  /** Whether a disk search result at `path` is what the view shows. */
  private diskShows(path: string): boolean {
    return !this.entries.has(path) && !this.hidden(path);
  }

  /** Whether the disk's content under `dir` can show through (not hidden, not replaced by a layer file or an opaque directory). */
  private diskVisibleUnder(dir: string): boolean {
    const entry = this.entries.get(dir);
    if (entry && (entry.kind !== "dir" || entry.opaque)) return false;
    return dir === "/" || !this.hidden(dir);
  }

  /** A search of the disk under `root` is worth running (a layer file there replaces the disk's whole tree). */
  private diskSearchable(root: string): boolean {
    const entry = this.entries.get(root);
    if (entry?.kind === "file") return false;
    return !this.hidden(root);
  }

  /** What the view holds at `path`, or null. */
  private async viewStat(path: string): Promise<FileInfo | null> {
    const entry = this.entries.get(path);
    if (entry) return entry.kind === "whiteout" ? null : entryInfo(path, entry);
    if (path !== "/" && this.hidden(path)) return null;
    const info = await this.disk.stat(path);
    if (info.error) {
      if (info.error.code === "file_not_found" || info.error.code === "not_a_directory") return null;
      throw toStrata(info.error);
    }
    return info;
  }

  /** The view's files and directories under a directory (recursively), by listing. */
  private async viewTree(dir: string): Promise<{ files: string[]; dirs: string[] }> {
    const files: string[] = [];
    const dirs: string[] = [];
    const pending = [dir];
    while (pending.length > 0) {
      for (const info of await this.doLs(pending.pop()!)) {
        if (info.is_dir) {
          const sub = info.path.slice(0, -1);
          dirs.push(sub);
          pending.push(sub);
        } else files.push(info.path);
      }
    }
    return { files, dirs: dirs.sort() };
  }

  /** Checks `path` can take a file; answers the parents to make and the created time to keep. */
  private async placeForFile(path: string, overwrite: boolean): Promise<{ missing: string[]; created_at?: string }> {
    checkName(path);
    if (path === "/") throw errors.isDirectory(path);
    const existing = await this.viewStat(path);
    if (existing?.is_dir) throw errors.isDirectory(path);
    if (existing && !overwrite) throw errors.alreadyExists(path);
    const missing = await this.missingParents(path);
    let created_at: string | undefined;
    if (existing) {
      const entry = this.entries.get(path);
      created_at = entry?.kind === "file" ? entry.data.created_at : existing.modified_at;
    }
    return { missing, created_at };
  }

  /** The ancestors of `path` the view lacks, outermost first; `not_a_directory` when one is a file. */
  private async missingParents(path: string): Promise<string[]> {
    const missing: string[] = [];
    for (let dir = parentOf(path); dir !== "/"; dir = parentOf(dir)) {
      const info = await this.viewStat(dir);
      if (info && !info.is_dir) throw errors.notADirectory(path);
      if (info) break;
      missing.unshift(dir);
    }
    return missing;
  }

  /** What removing `path` from the view touches on disk, and whether a whiteout must hide the disk's entry. */
  private async removalPlan(path: string): Promise<{ touched: string[]; whiteout: boolean }> {
    const touched = [path];
    // Under a whiteout, a file or an opaque directory the disk's tree is gone from the view already.
    if (this.hiddenAbove(path)) return { touched, whiteout: false };
    const there = await this.disk.stat(path);
    if (there.error) return { touched, whiteout: false };
    if (there.is_dir) for (const file of unwrap(await this.disk.glob("**", { path, sizes: false })).entries) touched.push(file.path);
    return { touched, whiteout: true };
  }

  private hiddenAbove(path: string): boolean {
    return ancestorsOf(path).some((dir) => {
      const entry = this.entries.get(dir);
      return entry !== undefined && (entry.kind !== "dir" || entry.opaque);
    });
  }

  private async transferInLayer(from: string, to: string, overwrite: boolean, move: boolean): Promise<void> {
    await this.loaded();
    const source = normalizePath(from);
    const target = normalizePath(to);
    checkName(target);
    await this.change(async () => {
      const info = await this.viewStat(source);
      if (!info) throw errors.notFound(source);
      const existing = await this.viewStat(target);
      if (!info.is_dir) {
        if (existing?.is_dir) throw errors.isDirectory(target);
        if (existing && !overwrite) throw errors.alreadyExists(target);
      } else {
        if (existing && !existing.is_dir) throw errors.notADirectory(joinPath(target, "x"));
        if (existing && !overwrite) throw errors.alreadyExists(target);
        if (existing && (await this.doLs(target)).length > 0) throw errors.notEmpty(target);
      }
      const missing = await this.missingParents(target);
      const tree = info.is_dir ? await this.viewTree(source) : { files: [source], dirs: [] };
      const moved = (path: string) => (path === source ? target : joinPath(target, relativeTo(source, path)));
      const contents = new Map<string, FileDataV2>();
      for (const file of tree.files) {
        const data = await this.doReadRaw(file);
        const stamp = now();
        contents.set(moved(file), move ? data : { ...data, created_at: stamp, modified_at: stamp });
      }
      const removal = move ? await this.removalPlan(source) : { touched: [], whiteout: false };
      const touched = [...removal.touched, target, ...missing, ...tree.dirs.map(moved), ...contents.keys()];
      await this.plan(touched, () => {
        if (move) this.remove(source, removal.whiteout);
        for (const dir of missing) this.putDir(dir);
        if (info.is_dir) for (const dir of [target, ...tree.dirs.map(moved)]) this.putDir(dir);
        for (const [path, data] of contents) this.set(path, { kind: "file", data });
      });
    });
  }

  // ---- changing the layer ----

  /** The paths the running change set, with what they held before (undefined: nothing), for undo. */
  private journal: Map<string, Entry | undefined> | undefined;

  /** Runs one change alone, with the layer loaded. */
  private async change<T>(body: () => Promise<T>): Promise<T> {
    await this.loaded();
    return this.changes.run("", body);
  }

  /**
   * Records the disk's version of every touched path not yet based, then runs
   * `apply` (synchronous: nobody sees half of it), then saves what changed.
   * A save that fails puts the layer back as it was.
   */
  private async plan(touched: readonly string[], apply: () => void): Promise<void> {
    for (const path of touched) if (!this.bases.has(path)) this.bases.set(path, await this.diskVersion(path));
    const journal = new Map<string, Entry | undefined>();
    this.journal = journal;
    try {
      apply();
    } catch (error) {
      this.undo(journal);
      throw error;
    } finally {
      this.journal = undefined;
    }
    try {
      await this.persist(new Set([...touched, ...journal.keys()]));
    } catch (error) {
      this.undo(journal);
      throw error;
    }
  }

  private undo(journal: Map<string, Entry | undefined>): void {
    for (const [path, entry] of journal) this.setRaw(path, entry);
  }

  private set(path: string, entry: Entry | undefined): void {
    if (this.journal && !this.journal.has(path)) this.journal.set(path, this.entries.get(path));
    this.setRaw(path, entry);
  }

  private setRaw(path: string, entry: Entry | undefined): void {
    const parent = parentOf(path);
    if (entry) {
      this.entries.set(path, entry);
      let names = this.children.get(parent);
      if (!names) this.children.set(parent, (names = new Set()));
      names.add(baseName(path));
    } else if (this.entries.delete(path)) {
      const names = this.children.get(parent);
      names?.delete(baseName(path));
      if (names?.size === 0) this.children.delete(parent);
    }
  }

  /** A directory in the layer; opaque when it takes the place of something deleted (the disk's tree there stays hidden). */
  private putDir(path: string): void {
    const previous = this.entries.get(path);
    if (previous?.kind === "dir") return;
    this.set(path, { kind: "dir", opaque: previous !== undefined, created_at: now() });
  }

  /** Takes `path` out of the view: its layer entries go, and a whiteout hides what the disk has there. */
  private remove(path: string, whiteout: boolean): void {
    for (const key of [...this.entries.keys()]) if (key !== path && isWithin(path, key)) this.set(key, undefined);
    this.set(path, whiteout ? { kind: "whiteout" } : undefined);
  }

  private sized<T extends FileDataV2>(path: string, data: T): T {
    const max = this.options.maxFileSize;
    const size = fileDataSize(data);
    if (max !== undefined && size > max) throw errors.tooLarge(path, size, max);
    return data;
  }

  // ---- the disk's versions and commit ----

  private async diskVersion(path: string): Promise<BaseVersion> {
    const info = await this.disk.stat(path);
    if (info.error) return { kind: "absent" };
    if (info.is_dir) return { kind: "dir" };
    const bytes = await this.disk.downloadFiles([path]);
    const content = bytes.files?.[0]?.content;
    if (!content) return { kind: "other", modified_at: info.modified_at };
    return { kind: "file", size: content.length, modified_at: info.modified_at, hash: hashOf(content) };
  }

  private async findConflicts(): Promise<OverlayConflict[]> {
    await this.loaded();
    const conflicts = new Map<string, OverlayConflict>();
    for (const [path, base] of this.bases) {
      // A path the layer no longer changes (written, then deleted again) cannot conflict.
      if (!this.entries.has(path) && !this.hiddenAbove(path)) continue;
      const current = await this.diskVersion(path);
      if (sameVersion(base, current)) continue;
      const reason = base.kind === "absent" ? "created" : current.kind === "absent" ? "deleted" : base.kind === current.kind ? "modified" : "replaced";
      conflicts.set(path, { path, reason });
    }
    // A file that appeared on disk inside a tree the layer removes would be lost without a word.
    for (const [path, entry] of this.entries) {
      if (entry.kind === "dir" && !entry.opaque) continue;
      const there = await this.disk.stat(path);
      if (there.error || !there.is_dir) continue;
      for (const file of unwrap(await this.disk.glob("**", { path, sizes: false })).entries) {
        if (!this.bases.has(file.path) && !conflicts.has(file.path)) conflicts.set(file.path, { path: file.path, reason: "created" });
      }
    }
    return sortByPath([...conflicts.values()]);
  }

  /**
   * Removals (whiteouts, and what opaque directories and files replace),
   * then directories (parents first), then files. Each applied path leaves
   * the layer at once (its base with it), so the layer always holds what is
   * still to do.
   */
  private async applyLayer(done: OverlayCommit, dirty: Set<string>): Promise<void> {
    const forget = (path: string) => {
      this.setRaw(path, undefined);
      this.bases.delete(path);
      dirty.add(path);
    };
    const sorted = [...this.entries.keys()].sort();
    for (const path of sorted) {
      const entry = this.entries.get(path);
      if (!entry || (entry.kind === "dir" && !entry.opaque)) continue;
      const there = await this.disk.stat(path);
      if (!there.error && (entry.kind !== "file" || there.is_dir)) {
        const removed = await this.disk.delete(path);
        if (removed.error && removed.error.code !== "file_not_found") throw toStrata(removed.error);
        done.removed.push(path);
        // The disk holds nothing there any more: what is still to be written there is based on absence.
        for (const key of [...this.bases.keys()]) {
          if (!isWithin(path, key)) continue;
          if (this.entries.has(key)) this.bases.set(key, { kind: "absent" });
          else this.bases.delete(key);
          dirty.add(key);
        }
      }
      if (entry.kind === "whiteout") forget(path);
      else if (entry.kind === "dir") {
        this.setRaw(path, { ...entry, opaque: false });
        dirty.add(path);
      }
    }
    for (const path of sorted) {
      const entry = this.entries.get(path);
      if (entry?.kind !== "dir") continue;
      const made = await this.disk.mkdir(path, { recursive: true });
      if (made.error) throw toStrata(made.error);
      done.directories.push(path);
      forget(path);
    }
    const files = sorted.filter((path) => this.entries.get(path)?.kind === "file");
    for (let i = 0; i < files.length; i += 64) {
      const batch = files.slice(i, i + 64);
      const uploaded = unwrap(await this.disk.uploadFiles(batch.map((path) => [path, fileDataBytes((this.entries.get(path) as { data: FileDataV2 }).data)] as const)));
      uploaded.files.forEach((item, j) => {
        if (item.error) throw toStrata(item.error);
        done.written.push(batch[j]!);
        forget(batch[j]!);
      });
    }
  }

  // ---- keeping the layer in a Store ----

  /** Loads the layer from the store, once. */
  private loaded(): Promise<void> {
    if (!this.store) return Promise.resolve();
    this.loading ??= this.load().catch((error: unknown) => {
      this.loading = undefined;
      throw error;
    });
    return this.loading;
  }

  private async load(): Promise<void> {
    const store = this.store!;
    let after: string | undefined;
    do {
      const page = await store.list(this.namespace, { after });
      for (const { key } of page.items) {
        const item = await store.get(this.namespace, key);
        if (!item) continue;
        const record = parseRecord(key, fileDataText(item.value));
        if (record.entry) this.setRaw(key, record.entry);
        if (record.base) this.bases.set(key, record.base);
      }
      after = page.next;
    } while (after !== undefined);
  }

  /** Saves each path's entry and base as one record (one atomic batch where the store has transactions). */
  private async persist(paths: Set<string>): Promise<void> {
    const store = this.store;
    if (!store || paths.size === 0) return;
    const puts: Array<[string, FileData]> = [];
    for (const path of paths) {
      const entry = this.entries.get(path);
      const base = this.bases.get(path);
      if (!entry && !base) await store.delete(this.namespace, path);
      else puts.push([path, fileDataFromText(JSON.stringify({ v: 1, entry, base }))]);
    }
    if (puts.length > 0) await store.putMany(this.namespace, puts);
  }

  private async wipeStore(): Promise<void> {
    if (this.store) await this.store.deleteTree(this.namespace, "/");
  }

  /** Runs one of the layer's own operations, answering a throw as `{ error }` like every native operation. */
  private async settle<T extends object>(body: () => Promise<T>): Promise<Result<T>> {
    try {
      return (await body()) as Result<T>;
    } catch (error) {
      return { error: toErrorInfo(error) };
    }
  }
}

/** The disk beneath: a FilesystemBackend whose read driver the overlay calls directly (a read is its hot path: no second round of argument checks). */
class LowerFilesystem extends FilesystemBackend {
  readWindow(path: string, offset: number, limit: number): Promise<TextWindow> {
    return this.doRead(path, offset, limit);
  }
}

function entryInfo(path: string, entry: Entry): FileInfo {
  if (entry.kind === "file") return fileDataInfo(path, entry.data);
  return { path: `${path}/`, is_dir: true, modified_at: entry.kind === "dir" ? entry.created_at : undefined };
}

function entryData(path: string, entry: Entry): FileDataV2 {
  if (entry.kind === "file") return entry.data;
  throw entry.kind === "dir" ? errors.isDirectory(path) : errors.notFound(path);
}

/** Names the disk backend keeps for its temporary and lock files cannot be created through the layer either. */
function checkName(path: string): void {
  if (path.split("/").some(isReservedName)) {
    throw errors.invalidPath(path, "names starting with '.strata-tmp-' or '.strata-lock-' are reserved for the backend's own temporary files");
  }
}

function hashOf(bytes: Uint8Array): string {
  return nodeCrypto().createHash("sha256").update(bytes).digest("hex");
}

function sameVersion(base: BaseVersion, current: BaseVersion): boolean {
  if (base.kind !== current.kind) return false;
  if (base.kind === "file" && current.kind === "file") return base.size === current.size && base.hash === current.hash;
  if (base.kind === "other" && current.kind === "other") return base.modified_at === current.modified_at;
  return true;
}

function toStrata(info: { code: StrataError["code"]; message: string; path?: string }): StrataError {
  return new StrataError(info.code, info.message, info.path === undefined ? undefined : { path: info.path });
}

function parseRecord(key: string, text: string | null): { entry?: Entry; base?: BaseVersion } {
  try {
    const parsed = JSON.parse(text ?? "") as { v?: number; entry?: Entry; base?: BaseVersion };
    if (parsed.v === 1) return { entry: parsed.entry, base: parsed.base };
  } catch {
    // Answered below.
  }
  throw new StrataError("io_error", `The overlay's record for '${printable(key)}' cannot be read: the store holds something else under this namespace`);
}
