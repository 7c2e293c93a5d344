import type { Stats } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";
import nodePath from "node:path";
import { BaseBackend, failure } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, StrataError, toFileOperationError } from "../core/errors.js";
import { decodeText, encodeText, fileDataFromBytes } from "../core/filedata.js";
import { DEFAULT_READ_LIMIT, errorString, formatRead } from "../core/format.js";
import { compileGlob } from "../core/glob.js";
import { capMatches, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { isWithin, joinPath, normalizePath, relativeTo, sortByPath } from "../core/paths.js";
import type { DeleteResult, EditResult, FileDataV2, FileDownloadResponse, FileInfo, FileUploadResponse, GrepMatch } from "../core/types.js";
import type { GrepOptions, GrepResult, WriteOptions, WriteResult } from "../core/types.js";
import { grepFile, type Needle, readWindow, ripgrepCandidates, ripgrepPath, WHOLE_FILE_LIMIT } from "./filesystem-text.js";
import { at, errno, lstatAt, lstatAtSync, openDirAt, openDirPath, procFdAvailable, READ_FLAGS } from "./safe-fs.js";
import { DirCursor, readDirAt, removeAt, Slicer, walkFiles, writeAtomicAt } from "./safe-fs.js";

export interface FilesystemBackendOptions {
  /** The directory the workspace lives in; created if missing. */
  rootDir: string;
  /**
   * true (default): paths are virtual, `/` is `rootDir`, and results and
   * messages never show a host path. false: paths are host paths, which must
   * still lie under `rootDir`; results and messages use host paths, since
   * that is the caller's own naming. Either way nothing outside `rootDir` is
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

/**
 * Files on the real disk, confined to `rootDir`. Every path is resolved
 * through directory fds (see safe-fs.ts), so neither `..`, nor a symlink,
 * nor a symlink swapped in mid-operation leads outside the root. Symlinks
 * are never followed: ls shows them as entries, reading or walking through
 * one is `permission_denied`, deleting one removes the link. Writes are
 * atomic (temp file, fsync, rename or link).
 */
export class FilesystemBackend extends BaseBackend {
  readonly rootDir: string;
  readonly virtualMode: boolean;
  private hostRootReady: Promise<string> | undefined;

  constructor(private readonly options: FilesystemBackendOptions) {
    super();
    this.rootDir = nodePath.resolve(options.rootDir);
    this.virtualMode = options.virtualMode ?? true;
  }

  /** True when grep will use ripgrep to find candidate files. */
  async usesRipgrep(): Promise<boolean> {
    return this.options.useRipgrep !== false && (await ripgrepPath()) !== undefined;
  }

  async lsInfo(dirPath: string): Promise<FileInfo[]> {
    const r = this.resolve(dirPath);
    try {
      const start = await this.openStart(r, false);
      if (start === undefined) return [];
      if (!("dir" in start)) {
        await start.parent.close();
        return [this.info(r.path, start.stat)];
      }
      try {
        const entries = await readDirAt(start.dir);
        const infos = await Promise.all(
          entries.map(async (entry) => {
            const stat = await lstatAt(start.dir, entry.name).catch(() => undefined);
            return stat && this.info(joinPath(r.path, entry.name), stat);
          }),
        );
        return sortByPath(infos.filter((info) => info !== undefined));
      } finally {
        await start.dir.close();
      }
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  async readRaw(filePath: string): Promise<FileDataV2> {
    const r = this.resolve(filePath);
    try {
      return await this.openFile(r, async (handle, stat) => ({
        ...fileDataFromBytes(await handle.readFile()),
        created_at: (stat.birthtimeMs > 0 ? stat.birthtime : stat.mtime).toISOString(),
        modified_at: stat.mtime.toISOString(),
      }));
    } catch (error) {
      throw fsError(error, r.shown);
    }
  }

  /** Streams files over 8 MiB, holding only the requested lines (see readWindow). */
  override async read(filePath: string, offset = 0, limit = DEFAULT_READ_LIMIT): Promise<string> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      return await this.openFile(r, async (handle, stat) => {
        if (stat.size > WHOLE_FILE_LIMIT) return readWindow(handle, r.shown, stat.size, offset, limit);
        const text = decodeText(await handle.readFile());
        if (text === null) throw errors.binary(r.shown, stat.size);
        return formatRead(text, r.shown, offset, limit);
      });
    } catch (error) {
      return errorString(fsError(error, shown));
    }
  }

  async write(filePath: string, content: string, options: WriteOptions = {}): Promise<WriteResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      await this.store(r, encodeText(content), options.overwrite === true);
      return { path: r.shown, filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown, true), shown);
    }
  }

  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      const { text, mode } = await this.openFile(r, async (handle, stat) => {
        const current = decodeText(await handle.readFile());
        if (current === null) throw errors.binary(r.shown, stat.size);
        return { text: current, mode: stat.mode & 0o777 };
      });
      const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, r.shown);
      const bytes = encodeText(updated);
      this.checkSize(r.shown, bytes.length);
      await this.inParent(r, false, (dir, name) => writeAtomicAt(dir, name, bytes, { overwrite: true, mode, fsync: this.options.fsync }));
      return { path: r.shown, occurrences, filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown), shown);
    }
  }

  async delete(filePath: string): Promise<DeleteResult> {
    let shown = filePath;
    try {
      const r = this.resolve(filePath);
      shown = r.shown;
      if (r.path === "/") throw new StrataError("permission_denied", `Refusing to delete '${r.shown}'`);
      await this.inParent(r, false, removeAt);
      return { path: r.shown, filesUpdate: null };
    } catch (error) {
      return failure(fsError(error, shown), shown);
    }
  }

  async grep(pattern: string, path?: string | null, glob?: string | null, options: GrepOptions = {}): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(options.maxCount);
    const r = this.searchPath(path);
    const matcher = glob ? compileGlob(this.virtualPattern(glob), r.path) : undefined;
    const startPath = matcher ? matcher.root : r.path;
    // No file needs more matches than the global cap plus one (to know it was cut).
    const needle: Needle = { text: pattern, bytes: Buffer.from(pattern), limit: (options.maxCount ?? Infinity) + 1 };
    const matches: GrepMatch[] = [];
    const search: FileVisitor = (dirFd, name, filePath) => {
      if (!matcher || matcher(filePath)) return grepFile(dirFd, name, this.outside(filePath), needle, matches);
    };
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
    return capMatches(sortMatches(matches), options.maxCount);
  }

  /**
   * ripgrep only proposes files; `search` re-reads each through directory
   * fds and applies the glob and the shared grepText. So results equal the
   * JS walk's exactly (binary, UTF-8 and line rules included), and a path rg
   * was tricked into following by a swapped symlink is refused, never read.
   * False when rg failed: the caller walks instead.
   */
  private async searchWithRipgrep(dir: FileHandle, dirPath: string, pattern: string, search: FileVisitor): Promise<boolean> {
    const cursor = new DirCursor(dir.fd);
    const slicer = new Slicer();
    try {
      return await ripgrepCandidates(dir, pattern, (relative) => {
        const segments = relative.split("/");
        const parentFd = cursor.enter(segments.slice(0, -1));
        const reading = parentFd === undefined ? undefined : search(parentFd, segments.at(-1)!, joinPath(dirPath, relative));
        return reading ?? slicer.maybeYield();
      });
    } finally {
      cursor.close();
    }
  }

  async globInfo(pattern: string, path?: string): Promise<FileInfo[]> {
    const r = this.searchPath(path);
    const matcher = compileGlob(this.virtualPattern(pattern), r.path);
    const found: FileInfo[] = [];
    try {
      const start = await this.openStart(this.located(matcher.root), true);
      if (start !== undefined && !("dir" in start)) {
        await start.parent.close();
        if (start.stat.isFile() && matcher(matcher.root)) found.push(this.info(matcher.root, start.stat));
      } else if (start !== undefined) {
        try {
          await walkFiles(start.dir, matcher.root, {
            file: (dirFd, name, filePath) => {
              if (!matcher(filePath)) return;
              const stat = lstatAtSync(dirFd, name);
              if (stat?.isFile()) found.push(this.info(filePath, stat));
            },
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

  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    // Several at a time (each waits on an fsync); two uploads to one path still land in input order.
    const lastWrite = new Map<string, Promise<unknown>>();
    return mapLimit(files, IO_CONCURRENCY, async ([filePath, bytes]): Promise<FileUploadResponse> => {
      try {
        const r = this.resolve(filePath);
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        const write = (lastWrite.get(r.path) ?? Promise.resolve()).catch(() => undefined).then(() => this.store(r, bytes, true));
        lastWrite.set(r.path, write);
        await write;
        return { path: r.shown, error: null };
      } catch (error) {
        return { path: filePath, error: toFileOperationError(fsError(error, filePath, true).code) };
      }
    });
  }

  override async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    return mapLimit(paths, IO_CONCURRENCY, async (filePath): Promise<FileDownloadResponse> => {
      try {
        const bytes = await this.openFile(this.resolve(filePath), (handle) => handle.readFile());
        return { path: filePath, content: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), error: null };
      } catch (error) {
        return { path: filePath, content: null, error: toFileOperationError(fsError(error, filePath).code) };
      }
    });
  }

  // --- paths ---

  /** A caller's path, validated, as a virtual path. */
  private resolve(input: string): Resolved {
    const normalized = normalizePath(input);
    if (this.virtualMode) return this.located(normalized);
    if (!isWithin(this.rootDir, normalized)) throw errors.invalidPath(normalized, "it lies outside the root directory");
    return this.located(`/${relativeTo(this.rootDir, normalized)}`);
  }

  private located(path: string): Resolved {
    return { path, shown: this.outside(path), segments: path === "/" ? [] : path.slice(1).split("/") };
  }

  /** An omitted search path means the whole workspace, in either mode. */
  private searchPath(path: string | null | undefined): Resolved {
    return path === undefined || path === null ? this.located("/") : this.resolve(path);
  }

  /** A virtual path as the caller names it. */
  private outside(path: string): string {
    if (this.virtualMode) return path;
    return path === "/" ? this.rootDir : this.rootDir === "/" ? path : this.rootDir + path;
  }

  /** In host-path mode an absolute glob under the root is made virtual. */
  private virtualPattern(pattern: string): string {
    if (this.virtualMode || typeof pattern !== "string" || !pattern.startsWith(`${this.rootDir}/`)) return pattern;
    return pattern.slice(this.rootDir.length);
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
        await fs.mkdir(this.rootDir, { recursive: true });
        return await fs.realpath(this.rootDir);
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
    return this.inParent(r, false, async (dir, name) => {
      const handle = await fs.open(at(dir, name), READ_FLAGS);
      try {
        const stat = await handle.stat();
        if (stat.isDirectory()) throw errors.isDirectory(r.shown);
        if (!stat.isFile()) throw errors.permissionDenied(r.shown);
        return await body(handle, stat);
      } finally {
        await handle.close();
      }
    });
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
    await this.inParent(r, true, async (dir, name) => {
      const existing = await lstatAt(dir, name).catch(() => undefined);
      if (existing?.isDirectory()) throw errors.isDirectory(r.shown);
      if (existing && !overwrite) throw errors.alreadyExists(r.shown);
      if (existing?.isSymbolicLink()) throw symlinkRefused(r.shown);
      try {
        await writeAtomicAt(dir, name, bytes, { overwrite, mode: existing && existing.mode & 0o777, fsync: this.options.fsync });
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

/** `fn` over `items` with at most `limit` running, results in input order; items start in input order. */
async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
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
    case "ENAMETOOLONG":
      return errors.invalidPath(shown, "a name is too long for the filesystem");
    case "ERR_FS_FILE_TOO_LARGE":
      return new StrataError("too_large", `'${shown}' is too large to load at once; read it in windows instead`);
    default:
      return new StrataError("io_error", `I/O error on '${shown}' (${code ?? "unexpected error"})`, code ? undefined : { cause: error });
  }
}
