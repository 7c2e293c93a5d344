import { spawn } from "node:child_process";
import type { Stats } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";
import nodePath from "node:path";
import { BaseBackend, failure } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, StrataError, toFileOperationError } from "../core/errors.js";
import { decodeText, encodeText, fileDataFromBytes } from "../core/filedata.js";
import { DEFAULT_READ_LIMIT, errorString, forEachLine, formatRead, renderLines, renderWindow, validateReadWindow } from "../core/format.js";
import { compileGlob, type GlobMatcher } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { isWithin, joinPath, normalizePath, relativeTo, sortByPath } from "../core/paths.js";
import type {
  DeleteResult,
  EditResult,
  FileDataV2,
  FileDownloadResponse,
  FileInfo,
  FileUploadResponse,
  GrepMatch,
  GrepOptions,
  GrepResult,
  WriteOptions,
  WriteResult,
} from "../core/types.js";
import { at, errno, lstatAt, openDirAt, openDirPath, openRoot, procFdAvailable, READ_FLAGS, readDirAt, removeAt, walkFiles, writeAtomicAt } from "./safe-fs.js";

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
}

/** Files up to this size are read whole (exact formatRead semantics); larger ones stream. */
const WHOLE_FILE_LIMIT = 8 * 1024 * 1024;
const CHUNK_SIZE = 1024 * 1024;

interface Resolved {
  /** Normalised virtual path. */
  path: string;
  /** What results and messages call it. */
  shown: string;
  segments: string[];
}

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
      return await this.withRoot(async (root) => {
        const start = await this.openStart(root, r, false);
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
      });
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
        return { text: current, mode: stat.mode & 0o7777 };
      });
      const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, r.shown);
      const bytes = encodeText(updated);
      this.checkSize(r.shown, bytes.length);
      await this.inParent(r, false, (dir, name) => writeAtomicAt(dir, name, bytes, { overwrite: true, mode }));
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
    const matcher = glob ? compileGlob(glob, r.path) : undefined;
    // No file needs more matches than the global cap plus one (to know it was cut).
    const perFile = options.maxCount === undefined ? Infinity : options.maxCount + 1;
    const matches: GrepMatch[] = [];
    try {
      await this.withRoot(async (root) => {
        const startPath = matcher ? matcher.root : r.path;
        const start = await this.openStart(root, this.located(startPath), true);
        if (start === undefined) return;
        if (!("dir" in start)) {
          try {
            if (start.stat.isFile() && (!matcher || matcher(startPath))) {
              matches.push(...(await grepAt(start.parent, start.name, this.outside(startPath), pattern, perFile)));
            }
          } finally {
            await start.parent.close();
          }
          return;
        }
        const candidates = (await this.usesRipgrep()) ? await ripgrepCandidates(start.dir, pattern) : undefined;
        if (candidates) return await this.verifyCandidates(start.dir, startPath, candidates, matcher, pattern, options.maxCount, matches);
        await walkFiles(start.dir, startPath, {
          file: async (dir, name, filePath) => {
            if (!matcher || matcher(filePath)) matches.push(...(await grepAt(dir, name, this.outside(filePath), pattern, perFile)));
          },
        });
      });
    } catch (error) {
      throw fsError(error, r.shown);
    }
    return capMatches(sortMatches(matches), options.maxCount);
  }

  async globInfo(pattern: string, path?: string): Promise<FileInfo[]> {
    const r = this.searchPath(path);
    const matcher = compileGlob(this.virtualPattern(pattern), r.path);
    const found: FileInfo[] = [];
    try {
      await this.withRoot(async (root) => {
        const start = await this.openStart(root, this.located(matcher.root), true);
        if (start === undefined) return;
        if (!("dir" in start)) {
          if (start.stat.isFile() && matcher(matcher.root)) found.push(this.info(matcher.root, start.stat));
          return await start.parent.close();
        }
        await walkFiles(start.dir, matcher.root, {
          file: async (dir, name, filePath) => {
            if (!matcher(filePath)) return;
            const stat = await lstatAt(dir, name).catch(() => undefined);
            if (stat?.isFile()) found.push(this.info(filePath, stat));
          },
        });
      });
    } catch (error) {
      throw fsError(error, r.shown);
    }
    return sortByPath(found);
  }

  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const responses: FileUploadResponse[] = [];
    // One at a time: two uploads to one path must land in input order.
    for (const [filePath, bytes] of files) {
      try {
        const r = this.resolve(filePath);
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        await this.store(r, bytes, true);
        responses.push({ path: r.shown, error: null });
      } catch (error) {
        responses.push({ path: filePath, error: toFileOperationError(fsError(error, filePath, true).code) });
      }
    }
    return responses;
  }

  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    return Promise.all(
      paths.map(async (filePath): Promise<FileDownloadResponse> => {
        try {
          const bytes = await this.openFile(this.resolve(filePath), (handle) => handle.readFile());
          return { path: filePath, content: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), error: null };
        } catch (error) {
          return { path: filePath, content: null, error: toFileOperationError(fsError(error, filePath).code) };
        }
      }),
    );
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

  private async withRoot<T>(body: (root: FileHandle) => Promise<T>): Promise<T> {
    const root = await openRoot(await this.hostRoot());
    try {
      return await body(root);
    } finally {
      await root.close();
    }
  }

  /** Runs `body` with the parent directory of `r` open and the last segment's name. */
  private inParent<T>(r: Resolved, create: boolean, body: (dir: FileHandle, name: string) => Promise<T>): Promise<T> {
    if (r.path === "/") throw errors.isDirectory(r.shown);
    return this.withRoot(async (root) => {
      const dir = await openDirPath(root, r.segments.slice(0, -1), create);
      try {
        return await body(dir, r.segments.at(-1)!);
      } finally {
        await dir.close();
      }
    });
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
  private async openStart(root: FileHandle, r: Resolved, refuseSymlink: boolean): Promise<SearchStart> {
    if (r.path === "/") return { dir: await openDirPath(root, []) };
    let parent: FileHandle;
    try {
      parent = await openDirPath(root, r.segments.slice(0, -1));
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
        await writeAtomicAt(dir, name, bytes, { overwrite, mode: existing && existing.mode & 0o7777 });
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

  /**
   * ripgrep only proposes files; each is re-read here through directory fds
   * and searched with the shared grepText. So results equal the JS engine's
   * exactly (binary, UTF-8 and line rules included), and a path rg was
   * tricked into following by a swapped symlink is refused, never read.
   */
  private async verifyCandidates(
    dir: FileHandle,
    dirPath: string,
    candidates: string[],
    matcher: GlobMatcher | undefined,
    pattern: string,
    maxCount: number | undefined,
    out: GrepMatch[],
  ): Promise<void> {
    try {
      const paths = candidates.map((relative) => joinPath(dirPath, relative)).filter((path) => !matcher || matcher(path));
      paths.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      const perFile = maxCount === undefined ? Infinity : maxCount + 1;
      // In path order, a few at a time, stopping once the cap is known to be exceeded.
      for (let i = 0; i < paths.length && (maxCount === undefined || out.length <= maxCount); i += 8) {
        const batch = paths.slice(i, i + 8).map(async (path) => {
          const segments = relativeTo(dirPath, path).split("/");
          const parent = await openDirPath(dir, segments.slice(0, -1)).catch(() => undefined);
          if (!parent) return [];
          try {
            return await grepAt(parent, segments.at(-1)!, this.outside(path), pattern, perFile);
          } finally {
            await parent.close();
          }
        });
        for (const found of await Promise.all(batch)) out.push(...found);
      }
    } finally {
      await dir.close();
    }
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
    case "ENAMETOOLONG":
      return errors.invalidPath(shown, "a name is too long for the filesystem");
    case "ERR_FS_FILE_TOO_LARGE":
      return new StrataError("too_large", `'${shown}' is too large to load at once; read it in windows instead`);
    default:
      return new StrataError("io_error", `I/O error on '${shown}' (${code ?? "unexpected error"})`, code ? undefined : { cause: error });
  }
}

/** Lines of `bytes` that end in `\n`, decoded; null for binary (NUL or invalid UTF-8). */
function decodeLines(parts: Buffer[]): string | null {
  return decodeText(parts.length === 1 ? parts[0]! : Buffer.concat(parts));
}

/**
 * `read` of a large file without loading it: lines before the window are
 * only counted (newline bytes, nothing decoded or kept), lines in it are
 * decoded and split by the shared line model, and reading stops after it.
 * Output equals formatRead's, except that NUL or invalid UTF-8 is only
 * noticed in the bytes read (NUL in any chunk read, UTF-8 in the window).
 */
async function readWindow(handle: FileHandle, path: string, size: number, offset: number, limit: number): Promise<string> {
  validateReadWindow(offset, limit);
  const end = offset + limit;
  const window: string[] = [];
  const buffer = Buffer.allocUnsafe(CHUNK_SIZE);
  let index = 0; // the line the next byte belongs to
  let carry: Buffer[] = []; // the start of line `index`, once inside the window
  let midLine = false;
  let pastWindow = false;
  const take = (parts: Buffer[]) => {
    const text = decodeLines(parts);
    if (text === null) throw errors.binary(path, size);
    forEachLine(text, (line) => {
      if (index >= end) {
        pastWindow = true;
        return false;
      }
      window.push(line);
      index++;
      return true;
    });
  };
  for (let position = 0; !pastWindow; ) {
    const { bytesRead } = await handle.read(buffer, 0, CHUNK_SIZE, position);
    if (bytesRead === 0) break;
    position += bytesRead;
    const chunk = buffer.subarray(0, bytesRead);
    if (chunk.includes(0)) throw errors.binary(path, size);
    midLine = chunk[bytesRead - 1] !== 10;
    let start = 0;
    for (let newline = chunk.indexOf(10); index < offset && newline !== -1; newline = chunk.indexOf(10, start)) {
      index++;
      start = newline + 1;
    }
    if (index < offset) continue;
    const last = chunk.lastIndexOf(10);
    if (last >= start) {
      take([...carry, chunk.subarray(start, last + 1)]);
      carry = [];
      start = last + 1;
    }
    if (start < bytesRead) carry.push(Buffer.from(chunk.subarray(start))); // copied: the buffer is reused
  }
  if (!pastWindow && carry.length > 0) take(carry);
  else if (!pastWindow && midLine && index < offset) index++; // an unterminated last line before the window
  return pastWindow ? renderLines(window, offset + 1) : renderWindow(window, offset, index, path);
}

/**
 * grep of one file through its directory fd. Small files are searched
 * whole; large ones in pieces cut at line ends, with line numbers carried
 * over, so memory stays at one chunk plus the matches. A NUL or invalid
 * UTF-8 anywhere makes the file binary: it is skipped.
 */
async function grepAt(dir: FileHandle, name: string, path: string, pattern: string, limit: number): Promise<GrepMatch[]> {
  let handle: FileHandle;
  try {
    handle = await fs.open(at(dir, name), READ_FLAGS);
  } catch {
    return []; // Vanished or replaced by a symlink since it was listed.
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) return [];
    const found: GrepMatch[] = [];
    if (stat.size <= WHOLE_FILE_LIMIT) {
      const text = decodeText(await handle.readFile());
      if (text !== null) grepText(path, text, pattern, found, limit);
      return found;
    }
    const buffer = Buffer.allocUnsafe(CHUNK_SIZE);
    let carry: Buffer[] = [];
    let firstLine = 1;
    const search = (parts: Buffer[]): boolean => {
      const text = decodeLines(parts);
      if (text === null) return false;
      const piece: GrepMatch[] = [];
      grepText(path, text, pattern, piece, limit - found.length);
      for (const match of piece) found.push({ ...match, line: match.line + firstLine - 1 });
      for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) firstLine++;
      return true;
    };
    for (let position = 0; ; ) {
      const { bytesRead } = await handle.read(buffer, 0, CHUNK_SIZE, position);
      if (bytesRead === 0) break;
      position += bytesRead;
      const chunk = buffer.subarray(0, bytesRead);
      if (chunk.includes(0)) return [];
      const last = chunk.lastIndexOf(10);
      if (last === -1) {
        carry.push(Buffer.from(chunk));
        continue;
      }
      if (!search([...carry, chunk.subarray(0, last + 1)])) return [];
      carry = last + 1 < bytesRead ? [Buffer.from(chunk.subarray(last + 1))] : [];
    }
    return carry.length === 0 || search(carry) ? found : [];
  } catch {
    return [];
  } finally {
    await handle.close();
  }
}

let ripgrepLookup: Promise<string | undefined> | undefined;

/** The `rg` executable on PATH, looked up once per process. */
function ripgrepPath(): Promise<string | undefined> {
  ripgrepLookup ??= (async () => {
    for (const dir of (process.env.PATH ?? "").split(":")) {
      if (!dir) continue;
      const candidate = nodePath.join(dir, "rg");
      if (await fs.access(candidate, fs.constants.X_OK).then(() => true, () => false)) return candidate;
    }
    return undefined;
  })();
  return ripgrepLookup;
}

/**
 * Relative paths of files under `dir` that ripgrep says contain `pattern`,
 * or undefined when rg fails (the caller then walks in JS). rg runs in the
 * directory itself (cwd through our fd, not a path), never follows links,
 * reads no ignore or config files, and compares raw bytes (`-E none`: no
 * BOM sniffing or transcoding), so it cannot miss what grepText would find.
 */
async function ripgrepCandidates(dir: FileHandle, pattern: string): Promise<string[] | undefined> {
  const rg = await ripgrepPath();
  if (!rg) return undefined;
  const args = ["--files-with-matches", "--null", "--fixed-strings", "--hidden", "--no-ignore", "--no-config", "--no-messages", "-E", "none"];
  return new Promise((resolve) => {
    const child = spawn(rg, [...args, "-e", pattern, "--", "."], { cwd: `/proc/${process.pid}/fd/${dir.fd}`, stdio: ["ignore", "pipe", "ignore"] });
    const chunks: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => chunks.push(chunk));
    child.on("error", () => resolve(undefined));
    child.on("close", (code) => {
      if (code !== 0 && code !== 1) return resolve(undefined);
      const names = Buffer.concat(chunks).toString("utf8").split("\0").filter((name) => name !== "");
      resolve(names.map((name) => (name.startsWith("./") ? name.slice(2) : name)));
    });
  });
}
