import { closeSync, type Dirent, fstatSync, openSync, statfsSync, type Stats } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";
import nodePath from "node:path";
import { BaseBackend, failure, hidesNames, textWindow, type TextWindow, type UploadAnswer, type DownloadAnswer } from "../core/base.js";
import { mapLimit } from "../core/concurrency.js";
import { applyEdit } from "../core/edit.js";
import { errors, StrataError } from "../core/errors.js";
import { decodeText, encodeText, fileDataFromBytes } from "../core/filedata.js";
import { compileGlob, type GlobMatcher } from "../core/glob.js";
import { capMatches, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { checkQuota, type Quota, type Usage, validateQuota } from "../core/limits.js";
import { KeyedMutex } from "../core/lock.js";
import { baseName, isWithin, joinPath, normalizePath, parentOf, relativeTo, sortByPath, sortEntriesOfOneDirectory } from "../core/paths.js";
import type { DeleteResult, EditResult, FileDataV2, FileInfo, FilesUpdate, GrepMatch } from "../core/types.js";
import type { PermissionOptions } from "../core/permissions.js";
import type { GrepResult, WriteResult } from "../core/types.js";
import { ListingCache } from "./listing-cache.js";
import { guarded } from "./permissions.js";
import { grepFile, type Needle, readWindow, ripgrepCandidates, ripgrepPath, WHOLE_FILE_LIMIT } from "./filesystem-text.js";
import { at, errno, isInternalName, lstatAt, lstatAtSync, lstatNamesSync, openDirAt, openDirPath, openDirPathSync, procFdAvailable, READ_FLAGS, withFileLock } from "./safe-fs.js";
import { DIR_FLAGS, DirCursor, readDirFast, readKnownSizeSync, removeAt, replaceAtomicAtFd, Slicer, tryFileLockSync, walkFiles, writeAtomicAt } from "./safe-fs.js";

export interface FilesystemBackendOptions {
  /** The workspace: the host directory holding the files; created if missing. */
  workspace: string;
  /**
   * true (default): paths are virtual, `/` is `workspace`, and results and
   * messages never show a host path. false: paths are host paths, which must
   * still lie under `workspace`; results and messages use host paths, since
   * that is the caller's own naming. Either way nothing outside `workspace` is
   * reachable and no symlink is followed.
   */
  virtualMode?: boolean;
  /** Largest file, in bytes, that write, edit and upload accept. `read` streams, so it reads larger files too. */
  maxFileSize?: number;
  /** Use ripgrep (when `rg` is on PATH) to find candidate files for grep. Default true. */
  useRipgrep?: boolean;
  /**
   * fsync each written file before it replaces the old one (default true).
   * false keeps writes atomic for readers but not across a power cut, and
   * makes them several times faster.
   */
  fsync?: boolean;
  /**
   * Limits on the total bytes and number of files under `workspace`; write,
   * edit and upload beyond it fail with `quota_exceeded`. Usage is measured
   * with one walk when first needed, then kept up to date from this
   * backend's own changes; files written by anything else (a command, another
   * process) are only counted at the next measure, which happens whenever a
   * change would exceed the quota, so a stale count never refuses wrongly.
   */
  quota?: Quota;
  /**
   * Permission rules on every operation (docs/permissions.md). Default
   * `{ rules: SECRETS_PRESET }`: secret files (.env*, private keys, .ssh, cloud
   * credentials, .git/config) are denied. `{ rules, ask }` replaces the
   * default; false turns rules off.
   */
  permissions?: PermissionOptions | false;
}

/** Files up to this size are read synchronously (readSmallNow); larger ones through the thread pool. */
const SMALL_FILE_BYTES = 1024 * 1024;
/** Entries of a listing lstatted at once, between looks at the clock (see Slicer). */
const LSTAT_CHUNK = 64;

/** A small regular file read at once: its bytes and the stat of the very file read. */
interface SmallFile {
  bytes: Buffer;
  stat: Stats;
}

/** The small regular file `name` in the directory `dirFd`, never following a symlink; undefined when the async path should answer. */
function readSmallAt(dirFd: number, name: string): SmallFile | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(at(dirFd, name), READ_FLAGS);
    const stat = fstatSync(fd);
    if (!stat.isFile() || stat.size > SMALL_FILE_BYTES) return undefined;
    return { bytes: readKnownSizeSync(fd, stat.size), stat };
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** Uploads and downloads in flight at once. */
const IO_CONCURRENCY = 8;

interface Resolved {
  /** Normalised virtual path. */
  path: string;
  /** What results and messages call it. */
  shown: string;
  segments: string[];
}

type FileVisitor = (dirFd: number, name: string, path: string) => void | Promise<void>;

/** Where a search starts: a directory (handle owned by the caller) or a single file. */
type SearchStart = { dir: FileHandle } | { parent: FileHandle; name: string; stat: Stats } | undefined;
type ListStart = { fd: number; close: () => Promise<void> } | { stat: Stats } | undefined;

/**
 * Every change of a path takes its turn here first (backends over one root
 * share the key), so within a process only one change per path at a time
 * waits on the path's lock file.
 */
const pathTurns = new KeyedMutex();

/**
 * Files on the real disk, confined to `workspace`. Every path is resolved
 * through directory fds (see safe-fs.ts), so neither `..`, nor a symlink,
 * nor a symlink swapped in mid-operation leads outside the root. Symlinks
 * are never followed: ls shows them as entries, reading or walking through
 * one is `permission_denied`, deleting one removes the link. Writes are
 * atomic (temp file, fsync, rename or link).
 *
 * No acknowledged change is lost: every write, edit, upload and delete of a
 * path runs alone, in this process (a per-path turn) and across Strata
 * processes sharing the disk (an exclusive lock file beside the target, see
 * withFileLock). Writers that are not Strata take no lock; against them an
 * edit checks, right before its rename, that the file is still the one it
 * read (inode, size, mtime, ctime) and answers `conflict` otherwise.
 */
export class FilesystemBackend extends BaseBackend {
  /** The workspace directory on the host, as an absolute path. */
  readonly workspace: string;
  readonly virtualMode: boolean;
  private hostRootReady: Promise<string> | undefined;
  /** The root's real path once hostRoot() has resolved it (the synchronous paths need it at hand). */
  private hostRootPath: string | undefined;
  /** Small reads asked for in this turn of the microtask queue, answered together (readSmallBatch). */
  private smallReads: Array<{ r: Resolved; resolve: (file: SmallFile | undefined) => void }> | undefined;
  private readonly quota: Quota | undefined;
  /** What the root holds, once measured; undefined until needed or after a change too large to track (a directory delete). */
  private usage: Usage | undefined;
  private measuring: Promise<Usage> | undefined;
  /** Quota-checked changes counted in `usage` but maybe not on disk yet. */
  private inFlight = 0;
  /** Listings without sizes of directories unchanged since (see ListingCache). */
  private readonly listings = new ListingCache();

  constructor(private readonly options: FilesystemBackendOptions) {
    super();
    if (typeof options?.workspace !== "string" || options.workspace === "") {
      throw errors.invalidArgument("FilesystemBackend needs { workspace }: the host directory holding the files");
    }
    this.workspace = nodePath.resolve(options.workspace);
    this.virtualMode = options.virtualMode ?? true;
    this.quota = validateQuota(options.quota);
    // The caller gets the instance behind its permission rules (the instance itself, guarded; see guarded()).
    return guarded(this, options.permissions);
  }

  /** True when grep will use ripgrep to find candidate files. */
  async usesRipgrep(): Promise<boolean> {
    return this.options.useRipgrep !== false && (await ripgrepPath()) !== undefined;
  }

  override get [hidesNames](): boolean {
    return true;
  }

  protected async doLs(dirPath: string, sizes = true, hides?: (name: string) => boolean): Promise<FileInfo[]> {
    const r = this.resolve(dirPath);
    try {
      const start = this.listStartSync(r) ?? (await this.listStart(r));
      if (start === undefined) return [];
      if ("stat" in start) return [this.info(r.path, start.stat)];
      try {
        const askedAt = Date.now();
        const stat = fstatSync(start.fd);
        const keep = !sizes && this.listings.trusts(stat.dev, () => statfsSync(at(start.fd)).type);
        if (keep) {
          const kept = this.listings.get(r.path, stat);
          if (kept) return visible(kept, hides);
        }
        const all = (await readDirFast(start.fd, stat)).filter((entry) => !isInternalName(entry.name));
        if (keep && this.listings.keeps(stat, askedAt, all.length)) {
          // The whole listing is kept, for whatever a later call hides.
          const infos = this.kindsOnly(start.fd, r.path, all);
          this.listings.set(r.path, stat, askedAt, infos);
          return visible(infos, hides);
        }
        const entries = hides ? all.filter((entry) => !hides(entry.name)) : all;
        if (!sizes) return this.kindsOnly(start.fd, r.path, entries);
        // One lstat per entry, synchronously in slices (Slicer: a thread-pool round trip each costs several times the call).
        const infos: FileInfo[] = [];
        const shown: string[] = [];
        const slicer = new Slicer();
        for (let i = 0; i < entries.length; i += LSTAT_CHUNK) {
          const names = entries.slice(i, i + LSTAT_CHUNK).map((entry) => entry.name);
          const stats = lstatNamesSync(start.fd, names);
          names.forEach((name, k) => {
            const stat = stats[k];
            if (!stat) return;
            infos.push(this.info(joinPath(r.path, name), stat));
            shown.push(stat.isDirectory() ? `${name}/` : name);
          });
          const pause = slicer.yieldIfDue();
          if (pause) await pause;
        }
        return sortEntriesOfOneDirectory(infos, shown);
      } finally {
        await start.close();
      }
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  /** What ls lists: the directory open (an fd, and how to close it), else what is there instead, else undefined when nothing is. */
  private async listStart(r: Resolved): Promise<ListStart> {
    const start = await this.openStart(r, false);
    if (start === undefined) return undefined;
    if ("dir" in start) return { fd: start.dir.fd, close: () => start.dir.close() };
    await start.parent.close();
    return { stat: start.stat };
  }

  /**
   * listStart with synchronous opens (a listing's few opens and stats are
   * each far cheaper than a thread-pool round trip); null when the root is
   * not resolved yet or anything fails, for listStart to answer (its exact error).
   */
  private listStartSync(r: Resolved): ListStart | null {
    if (this.hostRootPath === undefined) return null;
    let parent: number | undefined;
    try {
      if (r.segments.length === 0) {
        const fd = openSync(this.hostRootPath, DIR_FLAGS);
        return { fd, close: async () => closeSync(fd) };
      }
      parent = openDirPathSync(this.hostRootPath, r.segments.slice(0, -1));
      const name = r.segments.at(-1)!;
      const stat = lstatAtSync(parent, name);
      if (!stat) return null;
      if (!stat.isDirectory()) return { stat };
      const fd = openSync(at(parent, name), DIR_FLAGS);
      return { fd, close: async () => closeSync(fd) };
    } catch {
      return null;
    } finally {
      if (parent !== undefined) closeSync(parent);
    }
  }

  protected async doReadRaw(filePath: string): Promise<FileDataV2> {
    const r = this.resolve(filePath);
    const small = await this.readSmall(r);
    if (small) return { ...fileDataFromBytes(small.bytes), ...this.times(small.stat) };
    try {
      return await this.openFile(r, async (handle, stat) => ({ ...fileDataFromBytes(await handle.readFile()), ...this.times(stat) }));
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  /** Streams files over 8 MiB, holding only the requested lines (see readWindow). */
  protected override async doRead(filePath: string, offset: number, limit: number): Promise<TextWindow> {
    const r = this.resolve(filePath);
    const small = await this.readSmall(r);
    if (small) {
      const text = decodeText(small.bytes);
      if (text === null) throw errors.binary(r.shown, small.stat.size);
      return textWindow(text, r.shown, offset, limit);
    }
    try {
      return await this.openFile(r, async (handle, stat) => {
        if (stat.size > WHOLE_FILE_LIMIT) return readWindow(handle, r.shown, stat.size, offset, limit);
        const text = decodeText(await handle.readFile());
        if (text === null) throw errors.binary(r.shown, stat.size);
        return textWindow(text, r.shown, offset, limit);
      });
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  protected async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      await this.store(r, encodeText(content), overwrite === true);
      return { path: r.shown, filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown, true), shown);
    }
  }

  protected async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      const quick = await this.editSmall(r, oldString, newString, replaceAll);
      if (quick !== undefined) return { path: r.shown, ...quick, filesUpdate: null };
      const { occurrences, content } = await this.mutate(r, false, async (dir, name) => {
        const { text, read } = await openFileIn(dir, name, r.shown, async (handle, stat) => {
          const current = decodeText(await handle.readFile());
          if (current === null) throw errors.binary(r.shown, stat.size);
          return { text: current, read: stat };
        });
        const edited = applyEdit(text, oldString, newString, replaceAll, r.shown);
        const bytes = encodeText(edited.text);
        this.checkSize(r.shown, bytes.length);
        // A writer that is not Strata takes no lock: make sure the file is still the one read.
        const unchanged = async () => {
          const now = await lstatAt(dir, name).catch(() => undefined);
          const same = now && now.ino === read.ino && now.size === read.size && now.mtimeMs === read.mtimeMs && now.ctimeMs === read.ctimeMs;
          if (!same) throw errors.conflict(r.shown, "another program changed it");
        };
        await this.withinQuota(r.shown, { bytes: bytes.length - read.size, files: 0 }, () =>
          writeAtomicAt(dir, name, bytes, { overwrite: true, mode: read.mode & 0o777, fsync: this.options.fsync, beforeReplace: unchanged }),
        );
        return { occurrences: edited.occurrences, content: textAsWritten(edited.text) };
      });
      return { path: r.shown, occurrences, ...(content === undefined ? {} : { content }), filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown), shown);
    }
  }

  /**
   * The edit of a small file, in its turn as mutate()
   * runs one, each step a synchronous call but the fsync: the lock file, the
   * read, the temp file, the check that the file is still the one read, the
   * rename; the same guarantees as the general path without a thread-pool
   * round trip per step (a dozen of them, most of an edit's time).
   * Undefined when the general path should do it: the root not resolved
   * yet, the lock held by another writer, or a file that is not a
   * small regular file (whose exact error that path answers).
   */
  private async editSmall(r: Resolved, oldString: string, newString: string, replaceAll: boolean): Promise<{ occurrences: number; content?: string } | undefined> {
    if (this.hostRootPath === undefined || r.segments.length === 0) return undefined;
    const hostRoot = this.hostRootPath;
    return pathTurns.run(`${this.workspace}\0${r.path}`, async () => {
      let dir: number;
      try {
        dir = openDirPathSync(hostRoot, r.segments.slice(0, -1));
      } catch {
        return undefined;
      }
      const name = r.segments.at(-1)!;
      let release: (() => void) | undefined;
      try {
        release = tryFileLockSync(dir, name);
        if (!release) return undefined;
        const read = readSmallAt(dir, name);
        if (!read) return undefined;
        const text = decodeText(read.bytes);
        if (text === null) throw errors.binary(r.shown, read.stat.size);
        const edited = applyEdit(text, oldString, newString, replaceAll, r.shown);
        const bytes = encodeText(edited.text);
        this.checkSize(r.shown, bytes.length);
        const before = read.stat;
        await this.withinQuota(r.shown, { bytes: bytes.length - before.size, files: 0 }, () =>
          replaceAtomicAtFd(dir, name, bytes, {
            mode: before.mode & 0o777,
            fsync: this.options.fsync,
            // A writer that is not Strata takes no lock: make sure the file is still the one read.
            beforeReplace: () => {
              const now = lstatAtSync(dir, name);
              const same = now && now.ino === before.ino && now.size === before.size && now.mtimeMs === before.mtimeMs && now.ctimeMs === before.ctimeMs;
              if (!same) throw errors.conflict(r.shown, "another program changed it");
            },
          }),
        );
        return { occurrences: edited.occurrences, content: textAsWritten(edited.text) };
      } finally {
        release?.();
        closeSync(dir);
      }
    });
  }

  protected async doDelete(filePath: string): Promise<DeleteResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      if (r.path === "/") throw new StrataError("permission_denied", `Refusing to delete '${r.shown}'`);
      await this.mutate(r, false, async (dir, name) => {
        const stat = await lstatAt(dir, name);
        await removeAt(dir, name);
        if (!this.usage) return;
        if (stat.isDirectory()) this.usage = undefined; // measured again when next needed
        else if (stat.isFile()) this.usage = { bytes: this.usage.bytes - stat.size, files: this.usage.files - 1 };
      });
      return { path: r.shown, filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown), shown);
    }
  }

  protected override async doStat(filePath: string): Promise<FileInfo> {
    const r = this.resolve(filePath);
    try {
      if (r.path === "/") return { path: `${this.outside("/")}/`.replace(/\/\/$/, "/"), is_dir: true };
      return await this.inParent(r, false, async (dir, name) => this.info(r.path, await lstatAt(dir, name)));
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  protected override async doMkdir(filePath: string, recursive: boolean): Promise<FilesUpdate> {
    const r = this.resolve(filePath);
    try {
      if (r.path === "/") {
        if (recursive) return null;
        throw new StrataError("already_exists", `Directory '${r.shown}' already exists`, { path: r.shown });
      }
      await this.mutate(r, recursive, async (dir, name) => {
        try {
          await fs.mkdir(at(dir, name));
        } catch (error) {
          if (!isCode(error, "EEXIST")) throw error;
          const stat = await lstatAt(dir, name);
          if (!stat.isDirectory()) throw errors.alreadyExists(r.shown);
          if (!recursive) throw new StrataError("already_exists", `Directory '${r.shown}' already exists`, { path: r.shown });
        }
      });
      return null;
    } catch (error) {
      throw fsError(error, r.shown, true);
    }
  }

  /**
   * One rename, under both paths' turns and lock files (taken in path order,
   * so opposite moves cannot deadlock): atomic, never half-done. Without
   * `overwrite` a file moves by link-then-unlink, which the kernel refuses
   * with EEXIST when the target exists: no window where a racing writer's
   * file is replaced.
   */
  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    const source = this.resolve(from);
    const target = this.resolve(to);
    const [first, second] = source.path < target.path ? [source, target] : [target, source];
    let shown = source.shown;
    try {
      await this.mutate(first, first === target, (firstDir, firstName) =>
        this.mutate(second, second === target, async (secondDir, secondName) => {
          const [fromDir, fromName, toDir, toName] =
            first === source ? [firstDir, firstName, secondDir, secondName] : [secondDir, secondName, firstDir, firstName];
          const moving = await lstatAt(fromDir, fromName);
          shown = target.shown;
          const existing = await lstatAt(toDir, toName).catch(() => undefined);
          if (existing?.isDirectory() && !moving.isDirectory()) throw errors.isDirectory(target.shown);
          if (existing && !existing.isDirectory() && moving.isDirectory()) throw errors.notADirectory(`${target.shown}/x`);
          if (existing && !overwrite) throw errors.alreadyExists(target.shown);
          if (!overwrite && moving.isFile()) {
            await fs.link(at(fromDir, fromName), at(toDir, toName));
            await fs.unlink(at(fromDir, fromName));
          } else {
            await fs.rename(at(fromDir, fromName), at(toDir, toName));
          }
        }),
      );
      return null;
    } catch (error) {
      throw fsError(error, shown, true);
    }
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const r = this.searchPath(path);
    const matcher = glob ? compileGlob(this.virtualPattern(glob), r.path) : undefined;
    const startPath = matcher ? matcher.root : r.path;
    // No file needs more matches than the global cap plus one (to know it was cut).
    const needle: Needle = { text: pattern, bytes: Buffer.from(pattern), limit: (maxCount ?? Infinity) + 1 };
    const matches: GrepMatch[] = [];
    const run: GrepRun = { matcher, needle, matches, shownPrefix: this.virtualMode || this.workspace === "/" ? "" : this.workspace };
    const search: FileVisitor = (dirFd, name, filePath) => searchFile(run, dirFd, name, filePath);
    try {
      const start = await this.openStart(this.located(startPath), true);
      if (start !== undefined && !("dir" in start)) {
        try {
          if (start.stat.isFile()) await search(start.parent.fd, start.name, startPath);
        } finally {
          await start.parent.close();
        }
      } else if (start !== undefined) {
        try {
          const viaRipgrep = (await this.usesRipgrep()) && (await this.searchWithRipgrep(start.dir, startPath, pattern, search));
          if (!viaRipgrep) {
            matches.length = 0;
            await walkFiles(start.dir, startPath, { file: search });
          }
        } finally {
          await start.dir.close();
        }
      }
    } catch (error) {
      throw fsError(error, r.shown);
    }
    return capMatches(sortMatches(matches), maxCount);
  }

  /**
   * ripgrep only proposes files; `search` re-reads each through directory
   * fds and applies the glob and the shared grepText. So results equal the
   * JS walk's exactly (binary, UTF-8 and line rules included), and a path rg
   * was tricked into following by a swapped symlink is refused, never read.
   * False when rg failed: the caller walks instead.
   */
  private async searchWithRipgrep(dir: FileHandle, dirPath: string, pattern: string, search: FileVisitor): Promise<boolean> {
    const candidates: Candidates = { cursor: new DirCursor(dir.fd), slicer: new Slicer(), dirPath, search };
    try {
      return await ripgrepCandidates(dir, pattern, (relative) => checkCandidate(candidates, relative));
    } finally {
      candidates.cursor.close();
    }
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    const r = this.searchPath(path);
    const matcher = compileGlob(this.virtualPattern(pattern), r.path);
    const byName = matcher.byName;
    const found: FileInfo[] = [];
    try {
      const start = await this.openStart(this.located(matcher.root), true);
      if (start !== undefined && !("dir" in start)) {
        await start.parent.close();
        if (start.stat.isFile() && matcher(matcher.root)) found.push(this.info(matcher.root, start.stat));
      } else if (start !== undefined) {
        try {
          await walkFiles(start.dir, matcher.root, {
            fileName: byName,
            fileSuffix: matcher.nameSuffix,
            // Without sizes the directory entry's kind is the answer: no stat per match (what `rg --files` does).
            file: (dirFd, name, filePath) => {
              if (!byName && !matcher(filePath)) return;
              if (!sizes) return void found.push({ path: this.outside(filePath), is_dir: false });
              const stat = lstatAtSync(dirFd, name);
              if (stat?.isFile()) found.push(this.info(filePath, stat));
            },
            dir: includeDirectories
              ? (dirFd, name, dirPath) => {
                  if (!matcher.matchesDirectory(dirPath)) return;
                  if (!sizes) return void found.push({ path: `${this.outside(dirPath)}/`, is_dir: true });
                  const stat = lstatAtSync(dirFd, name);
                  if (stat?.isDirectory()) found.push(this.info(dirPath, stat));
                }
              : undefined,
          });
        } finally {
          await start.dir.close();
        }
      }
    } catch (error) {
      throw fsError(error, r.shown);
    }
    return sortByPath(found);
  }

  /** Responses echo each path exactly as the caller gave it (seed 000). */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    // Several at a time (each waits on an fsync). Two uploads to one path still land in input order:
    // items start in input order and each takes its path's turn (FIFO) before its first await.
    return mapLimit(files, IO_CONCURRENCY, async (item): Promise<UploadAnswer> => {
      const filePath = Array.isArray(item) ? (item[0] as string) : String(item);
      try {
        if (!Array.isArray(item)) throw errors.invalidArgument("each upload must be a [path, bytes] pair");
        const r = this.resolve(filePath);
        const bytes: unknown = item[1];
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        await this.store(r, bytes, true);
        return { path: filePath, error: null };
      } catch (error) {
        return { path: filePath, error: fsError(error, filePath, true).code };
      }
    });
  }

  /**
   * A batch (a search reads its candidates through here) is read
   * synchronously in slices, through one DirCursor: paths in the same
   * directories share their opens, and each small file is an open, fstat,
   * read and close without a thread-pool round trip (see Slicer). A file the
   * fast path does not answer (large, missing, refused) takes the async path,
   * which answers its exact error.
   */
  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    const answers: Array<DownloadAnswer | undefined> = [];
    // A root that cannot be opened leaves every item to the async path, which answers each one's error.
    const root = await this.hostRoot()
      .then((hostRoot) => openDirPath(hostRoot, []))
      .catch(() => undefined);
    if (root) {
      const cursor = new DirCursor(root.fd);
      const slicer = new Slicer();
      try {
        for (const filePath of paths) {
          answers.push(this.downloadNow(cursor, filePath));
          const pause = slicer.maybeYield();
          if (pause) await pause;
        }
      } finally {
        cursor.close();
        await root.close();
      }
    }
    const slow = paths.map((filePath, i) => ({ filePath, i })).filter(({ i }) => answers[i] === undefined);
    await mapLimit(slow, IO_CONCURRENCY, async ({ filePath, i }) => {
      try {
        const bytes = await this.openFile(this.resolve(filePath), (handle) => handle.readFile());
        answers[i] = { path: filePath, content: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), error: null };
      } catch (error) {
        answers[i] = { path: filePath, content: null, error: fsError(error, filePath).code };
      }
    });
    return answers as DownloadAnswer[];
  }

  /** One small regular file, read at once through the cursor; undefined when the async path should answer. */
  private downloadNow(cursor: DirCursor, filePath: string): DownloadAnswer | undefined {
    let fd: number | undefined;
    try {
      const r = this.resolve(filePath);
      if (r.segments.length === 0) return undefined;
      const parent = cursor.enter(r.segments.slice(0, -1));
      if (parent === undefined) return undefined;
      fd = openSync(at(parent, r.segments.at(-1)!), READ_FLAGS);
      const stat = fstatSync(fd);
      if (!stat.isFile() || stat.size > SMALL_FILE_BYTES) return undefined;
      const bytes = readKnownSizeSync(fd, stat.size);
      return { path: filePath, content: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), error: null };
    } catch {
      return undefined;
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }

  private times(stat: Stats): { created_at: string; modified_at: string } {
    return { created_at: (stat.birthtimeMs > 0 ? stat.birthtime : stat.mtime).toISOString(), modified_at: stat.mtime.toISOString() };
  }

  /**
   * A small regular file read at once, synchronously: a model reads many
   * small files, and each thread-pool round trip (open, stat, read, close,
   * the directories on the way) costs more than the call (see Slicer).
   * Undefined when the async path should answer: the root not resolved yet,
   * a file over SMALL_FILE_BYTES, or any failure (whose exact error the
   * async path gives). Reads asked together are answered together
   * (readSmallBatch).
   */
  private readSmall(r: Resolved): Promise<SmallFile | undefined> | undefined {
    if (this.hostRootPath === undefined || r.segments.length === 0) return undefined;
    return new Promise((resolve) => {
      if (this.smallReads === undefined) {
        this.smallReads = [];
        queueMicrotask(() => this.readSmallBatch());
      }
      this.smallReads.push({ r, resolve });
    });
  }

  /**
   * Answers the small reads asked for in one turn of the microtask queue
   * (parallel reads: read_multiple_files, a model's parallel read_file
   * calls) together, through one DirCursor: files in the same directories
   * share the opens of the directories on the way. Each read is asked before
   * the batch runs, so each still sees the disk as it is after it was asked.
   */
  private readSmallBatch(): void {
    const batch = this.smallReads ?? [];
    this.smallReads = undefined;
    if (batch.length === 1) {
      batch[0]!.resolve(this.readSmallNow(batch[0]!.r));
      return;
    }
    let root: number | undefined;
    try {
      root = openSync(this.hostRootPath!, DIR_FLAGS);
    } catch {
      for (const item of batch) item.resolve(undefined);
      return;
    }
    const cursor = new DirCursor(root);
    try {
      // In directory order, so that files of one directory (and of its neighbours) share their opens.
      const order = batch.map((item) => ({ item, parent: item.r.segments.slice(0, -1), key: parentOf(item.r.path) }));
      order.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      for (const { item, parent } of order) {
        const dir = cursor.enter(parent);
        item.resolve(dir === undefined ? undefined : readSmallAt(dir, item.r.segments.at(-1)!));
      }
    } finally {
      cursor.close();
      closeSync(root);
    }
  }

  /** One small read alone: the directories on the way opened for it. */
  private readSmallNow(r: Resolved): SmallFile | undefined {
    if (this.hostRootPath === undefined || r.segments.length === 0) return undefined;
    let dir: number | undefined;
    try {
      dir = openDirPathSync(this.hostRootPath, r.segments.slice(0, -1));
      return readSmallAt(dir, r.segments.at(-1)!);
    } catch {
      return undefined;
    } finally {
      if (dir !== undefined) closeSync(dir);
    }
  }

  // --- paths ---

  /** A caller's path, validated, as a virtual path. */
  private resolve(input: string): Resolved {
    const normalized = normalizePath(input);
    if (this.virtualMode) return this.located(normalized);
    if (!isWithin(this.workspace, normalized)) throw errors.invalidPath(normalized, "it lies outside the workspace");
    return this.located(`/${relativeTo(this.workspace, normalized)}`);
  }

  private located(path: string): Resolved {
    const segments = path === "/" ? [] : path.slice(1).split("/");
    if (segments.some(isInternalName)) {
      throw errors.invalidPath(this.outside(path), "names starting with '.strata-tmp-' or '.strata-lock-' are reserved for the backend's own temporary files");
    }
    return { path, shown: this.outside(path), segments };
  }

  /** An omitted search path means the whole workspace, in either mode. */
  private searchPath(path: string | null | undefined): Resolved {
    return path === undefined || path === null ? this.located("/") : this.resolve(path);
  }

  /** A virtual path as the caller names it. */
  private outside(path: string): string {
    if (this.virtualMode) return path;
    return path === "/" ? this.workspace : this.workspace === "/" ? path : this.workspace + path;
  }

  /** In host-path mode an absolute glob under the root is made virtual. */
  private virtualPattern(pattern: string): string {
    if (this.virtualMode || typeof pattern !== "string" || !pattern.startsWith(`${this.workspace}/`)) return pattern;
    return pattern.slice(this.workspace.length);
  }

  /**
   * Names and kinds from the directory entries themselves (the kernel's
   * d_type), no stat: an lstat only for an entry whose kind the filesystem
   * does not report. A symlink is a file here, as info() makes it.
   */
  private kindsOnly(dirFd: number, dir: string, entries: readonly Dirent[]): FileInfo[] {
    const infos: FileInfo[] = [];
    const shown: string[] = [];
    for (const entry of entries) {
      const { name } = entry;
      let isDir = entry.isDirectory();
      if (!isDir && !entry.isFile() && !entry.isSymbolicLink()) {
        const stat = lstatAtSync(dirFd, name);
        if (!stat) continue;
        isDir = stat.isDirectory();
      }
      const path = this.outside(joinPath(dir, name));
      infos.push(isDir ? { path: `${path}/`, is_dir: true } : { path, is_dir: false });
      shown.push(isDir ? `${name}/` : name);
    }
    return sortEntriesOfOneDirectory(infos, shown);
  }

  private info(path: string, stat: Stats): FileInfo {
    const modified_at = stat.mtime.toISOString();
    if (stat.isDirectory()) return { path: `${this.outside(path)}/`, is_dir: true, modified_at };
    // A symlink's own size is the length of its target, a host path: not shown.
    if (stat.isSymbolicLink()) return { path: this.outside(path), is_dir: false, modified_at };
    return { path: this.outside(path), is_dir: false, size: stat.size, modified_at };
  }

  // --- disk access, always through directory fds ---

  private hostRoot(): Promise<string> {
    this.hostRootReady ??= (async () => {
      if (!(await procFdAvailable())) {
        throw new StrataError("unsupported", "FilesystemBackend needs Linux's /proc/self/fd to resolve paths without races");
      }
      try {
        await fs.mkdir(this.workspace, { recursive: true });
        return (this.hostRootPath = await fs.realpath(this.workspace));
      } catch {
        throw new StrataError("unavailable", "The workspace root directory cannot be opened");
      }
    })().catch((error: unknown) => {
      this.hostRootReady = undefined;
      throw error;
    });
    return this.hostRootReady;
  }

  /** Runs `body` with the parent directory of `r` open and the last segment's name. */
  private async inParent<T>(r: Resolved, create: boolean, body: (dir: FileHandle, name: string) => Promise<T>): Promise<T> {
    if (r.path === "/") throw errors.isDirectory(r.shown);
    const dir = await openDirPath(await this.hostRoot(), r.segments.slice(0, -1), create);
    try {
      return await body(dir, r.segments.at(-1)!);
    } finally {
      await dir.close();
    }
  }

  /** Opens a regular file without following a symlink; directories and special files are refused. */
  private openFile<T>(r: Resolved, body: (handle: FileHandle, stat: Stats) => Promise<T>): Promise<T> {
    return this.inParent(r, false, (dir, name) => openFileIn(dir, name, r.shown, body));
  }

  /** Runs a change of `r` in its turn: alone in this process, then holding its lock file against other processes. */
  private mutate<T>(r: Resolved, create: boolean, body: (dir: FileHandle, name: string) => Promise<T>): Promise<T> {
    return pathTurns.run(`${this.workspace}\0${r.path}`, () => this.inParent(r, create, (dir, name) => withFileLock(dir, name, () => body(dir, name))));
  }

  /**
   * Runs `change` if growing by `delta` stays within the quota. A check that
   * would fail measures the disk again first (others may have deleted files),
   * unless changes of ours are in flight (a walk could miss them).
   * The delta is counted before the change starts, so concurrent changes
   * cannot each pass the check alone and overshoot together; it is taken back
   * if the change fails.
   */
  private async withinQuota<T>(shown: string, delta: Usage, change: () => Promise<T>): Promise<T> {
    if (!this.quota) return change();
    let counted = this.usage ?? (await this.remeasure());
    try {
      checkQuota(this.quota, counted, delta, shown);
    } catch (error) {
      // A walk would miss changes counted but not yet on disk: measure only when none is in flight.
      if (this.inFlight > 0) throw error;
      counted = await this.remeasure();
      checkQuota(this.quota, counted, delta, shown);
    }
    counted.bytes += delta.bytes;
    counted.files += delta.files;
    this.inFlight++;
    try {
      return await change();
    } catch (error) {
      counted.bytes -= delta.bytes;
      counted.files -= delta.files;
      throw error;
    } finally {
      this.inFlight--;
    }
  }

  /** Measures usage again; callers that ask while a walk runs share it. */
  private remeasure(): Promise<Usage> {
    this.measuring ??= this.measure().then(
      (usage) => {
        this.measuring = undefined;
        return (this.usage = usage);
      },
      (error: unknown) => {
        this.measuring = undefined;
        throw error;
      },
    );
    return this.measuring;
  }

  /** One walk of the root: bytes and number of regular files (symlinks and the backend's own temporary files excluded). */
  private async measure(): Promise<Usage> {
    const usage: Usage = { bytes: 0, files: 0 };
    const root = await openDirPath(await this.hostRoot(), []);
    try {
      await walkFiles(root, "/", {
        file: (dirFd, name) => {
          if (isInternalName(name)) return;
          const stat = lstatAtSync(dirFd, name);
          if (!stat?.isFile()) return;
          usage.bytes += stat.size;
          usage.files += 1;
        },
      });
    } finally {
      await root.close();
    }
    return usage;
  }

  /**
   * Opens where a listing or search starts. Missing (or under a file):
   * undefined. A symlink is listed as itself by ls, refused by searches.
   */
  private async openStart(r: Resolved, refuseSymlink: boolean): Promise<SearchStart> {
    const hostRoot = await this.hostRoot();
    if (r.path === "/") return { dir: await openDirPath(hostRoot, []) };
    let parent: FileHandle;
    try {
      parent = await openDirPath(hostRoot, r.segments.slice(0, -1));
    } catch (error) {
      if (isCode(error, "ENOENT", "ENOTDIR")) return undefined;
      throw error;
    }
    const name = r.segments.at(-1)!;
    try {
      const stat = await lstatAt(parent, name);
      if (stat.isSymbolicLink() && refuseSymlink) throw errno("ELOOP");
      if (!stat.isDirectory()) return { parent, name, stat };
      const dir = await openDirAt(parent, name);
      await parent.close();
      return { dir };
    } catch (error) {
      await parent.close();
      if (isCode(error, "ENOENT")) return undefined;
      throw error;
    }
  }

  /** Creates or replaces a file with `bytes`, making parent directories as needed. */
  private async store(r: Resolved, bytes: Uint8Array, overwrite: boolean): Promise<void> {
    this.checkSize(r.shown, bytes.length);
    // A delete of a parent racing this write removes the directory the write holds open (ENOENT
    // inside it): walk again, creating the parents anew, as if the write had come second.
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.storeOnce(r, bytes, overwrite);
      } catch (error) {
        if (!isCode(error, "ENOENT") || attempt === 5) throw error;
      }
    }
  }

  private async storeOnce(r: Resolved, bytes: Uint8Array, overwrite: boolean): Promise<void> {
    await this.mutate(r, true, async (dir, name) => {
      const existing = await lstatAt(dir, name).catch(() => undefined);
      if (existing?.isDirectory()) throw errors.isDirectory(r.shown);
      if (existing && !overwrite) throw errors.alreadyExists(r.shown);
      if (existing?.isSymbolicLink()) throw symlinkRefused(r.shown);
      try {
        const delta = existing?.isFile() ? { bytes: bytes.length - existing.size, files: 0 } : { bytes: bytes.length, files: 1 };
        await this.withinQuota(r.shown, delta, () =>
          writeAtomicAt(dir, name, bytes, { overwrite, mode: existing && existing.mode & 0o777, fsync: this.options.fsync }),
        );
      } catch (error) {
        // A directory or file that appeared since the lstat.
        if (!isCode(error, "EEXIST")) throw error;
        throw (await lstatAt(dir, name).catch(() => undefined))?.isDirectory() ? errors.isDirectory(r.shown) : errors.alreadyExists(r.shown);
      }
    });
  }

  private checkSize(shown: string, size: number): void {
    const max = this.options.maxFileSize;
    if (max !== undefined && size > max) throw errors.tooLarge(shown, size, max);
  }
}

/** One grep's state, for the module-level steps below (whose optimized code, unlike a closure's made per call, outlives a full GC). */
interface GrepRun {
  matcher: GlobMatcher | undefined;
  needle: Needle;
  matches: GrepMatch[];
  /** What turns a virtual path into the one results show (outside()): the workspace in host-path mode. */
  shownPrefix: string;
}

function searchFile(run: GrepRun, dirFd: number, name: string, filePath: string): void | Promise<void> {
  if (isInternalName(name)) return;
  if (!run.matcher || run.matcher(filePath)) return grepFile(dirFd, name, run.shownPrefix + filePath, run.needle, run.matches);
}

/** What checking ripgrep's candidates needs: the directories on the way kept open, and the clock. */
interface Candidates {
  cursor: DirCursor;
  slicer: Slicer;
  dirPath: string;
  search: FileVisitor;
}

function checkCandidate(c: Candidates, relative: string): void | Promise<void> {
  const segments = relative.split("/");
  if (segments.some(isInternalName)) return c.slicer.maybeYield();
  const parentFd = c.cursor.enter(segments.slice(0, -1));
  const reading = parentFd === undefined ? undefined : c.search(parentFd, segments.at(-1)!, joinPath(c.dirPath, relative));
  return reading ?? c.slicer.maybeYield();
}

/** Opens the regular file `name` in `dir` without following a symlink; directories and special files are refused. */
async function openFileIn<T>(dir: FileHandle, name: string, shown: string, body: (handle: FileHandle, stat: Stats) => Promise<T>): Promise<T> {
  const handle = await fs.open(at(dir, name), READ_FLAGS);
  try {
    const stat = await handle.stat();
    if (stat.isDirectory()) throw errors.isDirectory(shown);
    if (!stat.isFile()) throw errors.permissionDenied(shown);
    return await body(handle, stat);
  } finally {
    await handle.close();
  }
}

function isCode(error: unknown, ...codes: string[]): boolean {
  return codes.includes((error as NodeJS.ErrnoException | undefined)?.code ?? "");
}

function symlinkRefused(shown: string): StrataError {
  return new StrataError("permission_denied", `Permission denied: '${shown}' is or passes through a symbolic link, and symlinks are not followed`);
}

/**
 * Maps a Node error to a typed one by its code alone: Node's messages hold
 * host paths, so they are dropped. `creating`: a file in the way of a parent
 * directory is `not_a_directory`; when only looking, the path is not found.
 */
function fsError(error: unknown, shown: string, creating = false): StrataError {
  if (error instanceof StrataError) return error;
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  switch (code) {
    case "ENOENT":
      return errors.notFound(shown);
    case "ENOTDIR":
      return creating ? errors.notADirectory(shown) : errors.notFound(shown);
    case "EISDIR":
      return errors.isDirectory(shown);
    case "ELOOP":
      return symlinkRefused(shown);
    case "EACCES":
    case "EPERM":
    case "EROFS":
      return errors.permissionDenied(shown);
    case "EEXIST":
      return errors.alreadyExists(shown);
    case "ENOTEMPTY":
      return errors.notEmpty(shown);
    case "ENAMETOOLONG":
      return errors.invalidPath(shown, "a name is too long for the filesystem");
    case "EBUSY":
      return new StrataError("busy", `'${shown}' is being changed by another process; try again`);
    case "ERR_FS_FILE_TOO_LARGE":
      return new StrataError("too_large", `'${shown}' is too large to load at once; read it in windows instead`);
    default:
      return new StrataError("io_error", `I/O error on '${shown}' (${code ?? "unexpected error"})`, code ? undefined : { cause: error });
  }
}

/**
 * Edited.content: the text the edit wrote, unless it holds a lone surrogate
 * (a caller's newString may), which UTF-8 writes as U+FFFD: that text is not
 * what the file holds, so it is left out and a caller reads the file.
 */
function textAsWritten(text: string): string | undefined {
  return /\p{Cs}/u.test(text) ? undefined : text;
}

/** The entries of a whole listing whose own name `hides` does not hide (a directory's path ends in `/`). */
function visible(infos: FileInfo[], hides: ((name: string) => boolean) | undefined): FileInfo[] {
  return hides ? infos.filter((info) => !hides(baseName(info.is_dir ? info.path.slice(0, -1) : info.path))) : infos;
}
