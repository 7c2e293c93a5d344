/**
 * Race-free path resolution on Linux, by emulating `openat`: Node has no
 * `*at` calls, but `/proc/self/fd/<fd>/<name>` names `<name>` inside the
 * directory that `<fd>` is open on, whatever has happened to the path that
 * led there since. Every path is walked one component at a time with
 * O_NOFOLLOW | O_DIRECTORY, and every create, write, rename, link and unlink
 * goes through the parent's fd path, so a symlink swapped in mid-walk is
 * refused rather than followed. Symlinks are never followed, anywhere.
 *
 * Functions here throw Node errno errors (whose messages hold host paths);
 * callers map the `code` to a typed error and drop the message.
 *
 * Limits: like openat itself, a directory fd follows its directory if that
 * directory is *moved* elsewhere meanwhile; doing so needs write access
 * outside the root, which nothing in the backend grants. Temp files of
 * atomic writes (`.strata-tmp-*`) and lock files (`.strata-lock-*`) exist
 * beside their target for a moment; listings and searches hide them
 * (isInternalName).
 */
import { hostname } from "node:os";
import { closeSync, constants, fchmodSync, fstatSync, fsync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmdirSync, unlinkSync, writeSync, type Dirent, type Stats } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";
import { nodeCrypto, workerThreads } from "../stores/lazy-builtins.js";
import { isReservedName } from "../core/paths.js";

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_DIRECTORY, O_NOFOLLOW, O_NONBLOCK } = constants;

export const DIR_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW;
/** O_NONBLOCK so that opening a FIFO cannot hang a libuv thread; it is harmless on regular files. */
export const READ_FLAGS = O_RDONLY | O_NOFOLLOW | O_NONBLOCK;

/**
 * This process's fd directory. `/proc/<pid>/fd` resolves a little faster
 * than `/proc/self/fd` (no `self` link per lookup) and names the same table
 * from a child process (ripgrep's cwd). The pid is read from `/proc/self`,
 * so it is right in whatever pid namespace /proc was mounted from.
 */
let fdDirectory = "/proc/self/fd";

/** `name` inside the directory `dir` (a handle or a raw fd) is open on. */
export function at(dir: FileHandle | number, name = ""): string {
  const fd = typeof dir === "number" ? dir : dir.fd;
  return name === "" ? `${fdDirectory}/${fd}` : `${fdDirectory}/${fd}/${name}`;
}

/** True when this process can resolve paths through its /proc fd directory. */
export async function procFdAvailable(): Promise<boolean> {
  try {
    const pid = await fs.readlink("/proc/self");
    await fs.access(`/proc/${pid}/fd`);
    fdDirectory = `/proc/${pid}/fd`;
    return true;
  } catch {
    return false;
  }
}

/** An errno-style error raised here (no path in it). */
export function errno(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(code), { code });
}

/**
 * Opens the directory `name` inside `dir`. A symlink fails with ELOOP (the
 * kernel says ENOTDIR for O_DIRECTORY | O_NOFOLLOW on a link; the lstat that
 * tells the two apart only picks the error, it decides nothing).
 */
export async function openDirAt(dir: FileHandle | number, name: string): Promise<FileHandle> {
  try {
    return await fs.open(at(dir, name), DIR_FLAGS);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOTDIR") {
      const stat = await fs.lstat(at(dir, name)).catch(() => undefined);
      if (stat?.isSymbolicLink()) throw errno("ELOOP");
    }
    throw error;
  }
}

/** openDirAt, synchronously, on a raw fd: the same refusals (a symlink fails with ELOOP). */
function openDirAtSync(dirFd: number, name: string): number {
  try {
    return openSync(at(dirFd, name), DIR_FLAGS);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOTDIR") {
      let link = false;
      try {
        link = lstatSync(at(dirFd, name)).isSymbolicLink();
      } catch {
        // Gone meanwhile: the open's own error stands.
      }
      if (link) throw errno("ELOOP");
    }
    throw error;
  }
}

/**
 * Opens the directory at `segments` below the root and returns its handle
 * (the caller closes it). The root's own path is configuration, trusted;
 * everything below it is walked one component at a time. With `create`,
 * missing directories are made on the way. The walk itself is synchronous:
 * each step is one open of a directory entry, far cheaper done at once than
 * as a round trip through the thread pool; only the last directory is opened
 * as a handle.
 */
export async function openDirPath(hostRoot: string, segments: readonly string[], create = false): Promise<FileHandle> {
  if (segments.length === 0) return fs.open(hostRoot, DIR_FLAGS);
  let current = openSync(hostRoot, DIR_FLAGS);
  try {
    for (const segment of segments.slice(0, -1)) {
      const next = enterSync(current, segment, create);
      closeSync(current);
      current = next;
    }
    const last = segments.at(-1)!;
    try {
      return await openDirAt(current, last);
    } catch (error) {
      if (!create || (error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      // EEXIST means another writer made it first; the open below still refuses a symlink.
      await fs.mkdir(at(current, last)).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== "EEXIST") throw e;
      });
      return await openDirAt(current, last);
    }
  } finally {
    closeSync(current);
  }
}

/** openDirPath, synchronously, as a raw fd (the caller closes it); no creating. */
export function openDirPathSync(hostRoot: string, segments: readonly string[]): number {
  let current = openSync(hostRoot, DIR_FLAGS);
  try {
    for (const segment of segments) {
      const next = openDirAtSync(current, segment);
      closeSync(current);
      current = next;
    }
    return current;
  } catch (error) {
    closeSync(current);
    throw error;
  }
}

/** One step of openDirPath: the directory `name` in `dirFd`, made first when missing and `create` is set. */
function enterSync(dirFd: number, name: string, create: boolean): number {
  try {
    return openDirAtSync(dirFd, name);
  } catch (error) {
    if (!create || (error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    try {
      mkdirSync(at(dirFd, name));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    }
    return openDirAtSync(dirFd, name);
  }
}

export function lstatAt(dir: FileHandle, name: string) {
  return fs.lstat(at(dir, name));
}

/** lstat without following, synchronously (see Slicer); undefined when the entry is gone. */
export function lstatAtSync(dirFd: number, name: string): Stats | undefined {
  try {
    return lstatSync(at(dirFd, name));
  } catch {
    return undefined;
  }
}

/**
 * Whether lstatNamesSync may borrow the process's working directory. Off by
 * default: a library must not move the cwd of its host process, whose own
 * relative paths (an fs call on the thread pool, a worker) would follow it.
 * A process that is all Strata's own (the `strata` command) turns it on.
 */
let borrowCwd = false;

/** Lets lstatNamesSync borrow this process's working directory, or (`false`) no longer; main thread only (see borrowCwd). */
export function borrowWorkingDirectory(on = true): void {
  borrowCwd = on && workerThreads().isMainThread;
}

/**
 * lstat of each of `names` (entry names, no '/') in the directory `dirFd`,
 * undefined for one that is gone; never follows a symlink. Synchronous.
 * With the working directory borrowed: chdir into the directory through its
 * fd (the kernel takes the very directory the fd is open on, as fchdir
 * does), lstat each name relative to it (fstatat with AT_SYMLINK_NOFOLLOW),
 * then back to where the process was, through an fd kept on it, all before
 * any other JavaScript runs. Half the cost of resolving
 * /proc/<pid>/fd/<fd>/<name> once per name.
 */
export function lstatNamesSync(dirFd: number, names: readonly string[]): Array<Stats | undefined> {
  let home: number | undefined;
  if (borrowCwd && names.length > 1) {
    try {
      home = openSync(".", DIR_FLAGS);
    } catch {
      // The cwd cannot be reopened (gone, unreadable): the fd paths answer.
    }
  }
  if (home === undefined) return names.map((name) => lstatAtSync(dirFd, name));
  try {
    process.chdir(at(dirFd));
    try {
      return names.map((name) => {
        try {
          return lstatSync(name);
        } catch {
          return undefined;
        }
      });
    } finally {
      process.chdir(at(home));
    }
  } catch {
    return names.map((name) => lstatAtSync(dirFd, name));
  } finally {
    closeSync(home);
  }
}

/** Directories up to this size (st_size: about 9,000 entries on ext4, 4 ms) are read synchronously. */
const SYNC_DIR_BYTES = 256 * 1024;

/**
 * The entries of the directory `dirFd`, sorted by name (libuv's scandir
 * sorts them). A small directory is read synchronously: the read costs
 * about what a thread-pool round trip alone does on a busy machine, and
 * blocks the event loop for a few milliseconds at most. A larger one is
 * read on the thread pool, so no call stalls the others for long. `stat`:
 * the directory's, when the caller has it already.
 */
export function readDirFast(dirFd: number, stat: Stats = fstatSync(dirFd)): Dirent[] | Promise<Dirent[]> {
  if (stat.size <= SYNC_DIR_BYTES) return readdirSync(at(dirFd), { withFileTypes: true });
  return fs.readdir(at(dirFd), { withFileTypes: true });
}

/**
 * The bytes of the regular file open on `fd` whose fstat the caller has
 * already taken (`size`): readFileSync(fd) would fstat it again. As
 * readFileSync, at most `size` bytes, fewer when it shrank meanwhile. An
 * empty file is read to its end (a special filesystem reports 0 for a file
 * that is not empty).
 */
export function readKnownSizeSync(fd: number, size: number): Buffer {
  if (size === 0) return readFileSync(fd);
  const bytes = Buffer.allocUnsafe(size);
  let filled = 0;
  while (filled < size) {
    const n = readSync(fd, bytes, filled, size - filled, null);
    if (n === 0) break;
    filled += n;
  }
  return filled === size ? bytes : bytes.subarray(0, filled);
}

export function readDirAt(dir: FileHandle): Promise<Dirent[]> {
  return fs.readdir(at(dir), { withFileTypes: true });
}

export interface AtomicWriteOptions {
  /** Replace an existing file (rename); otherwise fail with EEXIST, even against a concurrent creator (link). */
  overwrite: boolean;
  /** Permission bits to give the new file (an edited file keeps its mode, less setuid, setgid and sticky). */
  mode?: number;
  /** fsync the data before it replaces anything (default true). */
  fsync?: boolean;
  /** Called right before the new content replaces the old; a throw abandons the write. */
  beforeReplace?: () => Promise<void>;
}

/**
 * Writes `bytes` to `name` in `dir` atomically: a temp file in the same
 * directory, fsync, then rename (overwrite) or link (create: link fails with
 * EEXIST instead of clobbering a file that appeared meanwhile). Readers see
 * the old content or the new, never a torn file.
 */
export async function writeAtomicAt(dir: FileHandle, name: string, bytes: Uint8Array, options: AtomicWriteOptions): Promise<void> {
  const temp = `${TEMP_PREFIX}${nodeCrypto().randomBytes(8).toString("hex")}`;
  const handle = await fs.open(at(dir, temp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o666);
  let renamed = false;
  try {
    try {
      await handle.writeFile(bytes);
      if (options.mode !== undefined) await handle.chmod(options.mode);
      if (options.fsync !== false) await handle.sync();
    } finally {
      await handle.close();
    }
    await options.beforeReplace?.();
    if (options.overwrite) {
      await fs.rename(at(dir, temp), at(dir, name));
      renamed = true;
    } else await fs.link(at(dir, temp), at(dir, name));
  } finally {
    // After a rename the temp name is gone already; after a link or a failure it must go.
    if (!renamed) await fs.unlink(at(dir, temp)).catch(() => undefined);
  }
}

/**
 * The lock file of `name` in the directory `dirFd`, taken at once
 * (synchronously, as withFileLock takes it) or not at all: undefined when it
 * is held, by a live holder or an abandoned one, for withFileLock to wait on
 * or break. Answers the release.
 */
export function tryFileLockSync(dirFd: number, name: string): (() => void) | undefined {
  const lock = at(dirFd, lockName(name));
  let fd: number;
  try {
    fd = openSync(lock, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o644);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return undefined;
    throw error;
  }
  try {
    writeAll(fd, Buffer.from(JSON.stringify({ pid: process.pid, host: thisHost, time: Date.now() } satisfies LockOwner)));
  } catch (error) {
    closeSync(fd);
    unlinkSafely(lock);
    throw error;
  }
  closeSync(fd);
  return () => unlinkSafely(lock);
}

function unlinkSafely(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // Gone already (broken as stale by another writer): nothing to release.
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at);
}

/**
 * writeAtomicAt through a directory fd, each step a synchronous call but
 * the fsync (which waits on the disk, so it leaves the event loop free):
 * the same temp file, fsync, check and rename, without a thread-pool round
 * trip per step. For small files (see Slicer on what a round trip costs).
 */
export async function replaceAtomicAtFd(dirFd: number, name: string, bytes: Uint8Array, options: Omit<AtomicWriteOptions, "overwrite" | "beforeReplace"> & { beforeReplace?: () => void }): Promise<void> {
  const temp = at(dirFd, `${TEMP_PREFIX}${nodeCrypto().randomBytes(8).toString("hex")}`);
  // Created with the mode wanted: a chmod (a change the filesystem journals) only when the umask or a default ACL altered it.
  const fd = openSync(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, options.mode ?? 0o666);
  let renamed = false;
  try {
    try {
      writeAll(fd, bytes);
      if (options.mode !== undefined && (fstatSync(fd).mode & 0o7777) !== options.mode) fchmodSync(fd, options.mode);
      if (options.fsync !== false) await new Promise<void>((resolve, reject) => fsync(fd, (error) => (error ? reject(error) : resolve())));
    } finally {
      closeSync(fd);
    }
    options.beforeReplace?.();
    renameSync(temp, at(dirFd, name));
    renamed = true;
  } finally {
    if (!renamed) unlinkSafely(temp);
  }
}

/** How many times a directory delete empties a directory that others keep filling before it gives up. */
const REMOVE_ROUNDS = 5;

/**
 * Removes `name` from `dir`: a file or symlink is unlinked (never followed),
 * a directory is emptied through its own fd, depth first, then removed.
 */
export async function removeAt(dir: FileHandle, name: string): Promise<void> {
  const slicer = new Slicer();
  const remove = async (dirFd: number, entry: string): Promise<void> => {
    const pause = slicer.maybeYield();
    if (pause) await pause;
    if (lstatSync(at(dirFd, entry)).isDirectory()) {
      let child: number | undefined;
      try {
        child = openSync(at(dirFd, entry), DIR_FLAGS);
      } catch (error) {
        // Swapped for a symlink since the lstat: remove the link, not what it points to.
        if ((error as NodeJS.ErrnoException).code !== "ENOTDIR") throw error;
      }
      if (child !== undefined) {
        try {
          // A writer creating a file inside meanwhile makes the rmdir fail (ENOTEMPTY): that file was made before
          // this delete, so it goes too; empty again. Writers that keep at it win after a few rounds (EBUSY).
          for (let round = 1; ; round++) {
            for (const grandchild of readdirSync(at(child))) {
              await remove(child, grandchild).catch((error: NodeJS.ErrnoException) => {
                if (error.code !== "ENOENT") throw error; // removed by someone else meanwhile: fine
              });
            }
            try {
              return rmdirSync(at(dirFd, entry));
            } catch (error) {
              if ((error as NodeJS.ErrnoException).code !== "ENOTEMPTY") throw error;
              if (round === REMOVE_ROUNDS) throw Object.assign(new Error("still being filled"), { code: "EBUSY" });
            }
          }
        } finally {
          closeSync(child);
        }
      }
    }
    unlinkSync(at(dirFd, entry));
  };
  await remove(dir.fd, name);
}

/** Synchronous slices of a walk end after this long, so the event loop keeps turning. */
const SLICE_MS = 4;

/**
 * Yields to the event loop once the current synchronous slice is over.
 * Walks and batch reads run synchronously in slices: they are thousands of
 * tiny calls, and a threadpool round trip costs several times the call
 * itself (measured on a 50k-file tree: 4-5x slower when every call is async).
 */
export class Slicer {
  private start = performance.now();
  private calls = 0;
  constructor() {
    keepShape(this);
  }
  /**
   * A promise to await when the slice is over, else undefined (awaiting
   * nothing would still cost a microtask turn per step).
   */
  maybeYield(): Promise<void> | undefined {
    // Reading the clock costs more than most steps of a walk: look every 32 steps.
    if ((++this.calls & 31) !== 0) return undefined;
    return this.yieldIfDue();
  }

  /** maybeYield for a caller whose steps are large (many calls each): looks at the clock every time. */
  yieldIfDue(): Promise<void> | undefined {
    if (performance.now() - this.start < SLICE_MS) return undefined;
    return new Promise((resolve) => setImmediate(() => {
      this.start = performance.now();
      resolve();
    }));
  }
}

/** Opens a directory without following a symlink, or undefined when it cannot be (gone, swapped, not a directory). */
function tryOpenDirSync(dirFd: number, name: string): number | undefined {
  try {
    return openSync(at(dirFd, name), DIR_FLAGS);
  } catch {
    return undefined;
  }
}

export interface WalkOptions {
  /** Called for each regular file (symlinks and special files are skipped); may return a promise for slow work. */
  file: (dirFd: number, name: string, path: string) => void | Promise<void>;
  /** Files whose name fails this are skipped before their path is even built (a glob that tests names alone). */
  fileName?: (name: string) => boolean;
  /** fileName as a suffix (GlobMatcher.nameSuffix): files whose name does not end with it are skipped, with no call per name. */
  fileSuffix?: string;
  /** Called for each directory before it is entered (symlinks to directories are not directories here). */
  dir?: (dirFd: number, name: string, path: string) => void;
}

/** Directories whose entries may be read on the thread pool at once, while this thread reads and handles others. */
const READ_AHEAD = 32;

/** A directory met by a walk: its fd stays open while its own entries or subdirectories not yet opened need it. */
interface WalkDir {
  fd: number;
  path: string;
  /** Its entries being read or handled (1), plus subdirectories not opened yet. */
  holds: number;
}

/** One walk's state, handed to the module-level steps below. */
interface Walk {
  startFd: number;
  options: WalkOptions;
  /** Subdirectories found, not opened yet; last in, first opened, so the walk stays deep and its open fds few. */
  todo: Array<{ parent: WalkDir; name: string; path: string }>;
  /** Directories the pool has read, not handled yet. */
  read: Array<{ dir: WalkDir; entries: Dirent[] | undefined }>;
  inFlight: number;
  wake: (() => void) | undefined;
  slicer: Slicer;
}

/**
 * One object of each class that hot code relies on, kept alive. V8 keeps
 * the hidden class of an object only while some object has it, and drops
 * optimized code that relied on a class it dropped: after a full GC between
 * two searches (a long-running agent has them all the time, between tool
 * calls) Node's Dirent and Stats code and ours ran unoptimized and were
 * compiled again, a third more CPU per walk. For the same reason the walk's
 * steps are module-level functions, not closures made per walk (whose
 * optimized code V8 holds only while one of them lives).
 */
const keptShapes = new Map<unknown, object>();

/** Keeps `value` alive as its class's one object that outlives a search (see keptShapes); once per search, not per entry. */
export function keepShape(value: object): void {
  if (!keptShapes.has(value.constructor)) keptShapes.set(value.constructor, value);
}

/**
 * Walks every directory under `start` (left open for the caller) through
 * directory fds, never following symlinks; `startPath` is its virtual path.
 * Each subdirectory is opened (O_NOFOLLOW) through its parent's fd and its
 * entries are read through its own fd. Reading entries is most of a walk's
 * time (ripgrep reads with a thread per core), so up to READ_AHEAD
 * directories are read on the thread pool while this thread reads others
 * itself and handles whatever has been read; the pool's answers come in at
 * each of the Slicer's turns of the event loop. Callbacks run one at a time,
 * in no set order (callers sort). Directories that vanish or turn into
 * symlinks midway are skipped. Open fds: READ_AHEAD and about one per
 * subdirectory waiting along the current path.
 */
export async function walkFiles(start: FileHandle, startPath: string, options: WalkOptions): Promise<void> {
  const w: Walk = { startFd: start.fd, options, todo: [], read: [], inFlight: 0, wake: undefined, slicer: new Slicer() };
  try {
    const entries = readEntriesSync(start.fd);
    if (entries !== undefined && entries.length > 0) keepShape(entries[0]!);
    const first = handleDir(w, { fd: start.fd, path: startPath, holds: 1 }, entries);
    if (first) await first;
    for (;;) {
      // The pool takes the directories found first (the bottom of the stack); this thread, the last.
      while (w.inFlight + w.read.length < READ_AHEAD && w.todo.length > 1) {
        const d = openNext(w);
        if (d) readOnPool(w, d);
      }
      const ready = w.read.shift();
      if (ready) {
        const pending = handleDir(w, ready.dir, ready.entries);
        if (pending) await pending;
      } else if (w.todo.length > 0) {
        const d = openNext(w);
        if (d) {
          const pending = handleDir(w, d, readEntriesSync(d.fd));
          if (pending) await pending;
        }
        // A turn of the event loop takes in what the pool has read meanwhile and lets it read on.
        if (w.inFlight > 0) await new Promise((resolve) => setImmediate(resolve));
      } else if (w.inFlight > 0) {
        await new Promise<void>((resolve) => (w.wake = resolve));
        w.wake = undefined;
      } else {
        break;
      }
      const pause = w.slicer.yieldIfDue();
      if (pause) await pause;
    }
  } finally {
    // Left early (a callback threw): no fd is closed while a read may still be using it.
    while (w.inFlight > 0) await new Promise<void>((resolve) => (w.wake = resolve));
    for (const { dir: d } of w.read.splice(0)) if (d.fd !== w.startFd) closeSync(d.fd);
    const open = new Set(w.todo.splice(0).map((item) => item.parent));
    for (const d of open) if (d.fd !== w.startFd) closeSync(d.fd);
  }
}

function release(w: Walk, d: WalkDir): void {
  if (--d.holds === 0 && d.fd !== w.startFd) closeSync(d.fd);
}

/** Opens the subdirectory found last, or undefined when it cannot be (gone, swapped for a symlink). */
function openNext(w: Walk): WalkDir | undefined {
  const next = w.todo.pop()!;
  const fd = tryOpenDirSync(next.parent.fd, next.name);
  release(w, next.parent);
  return fd === undefined ? undefined : { fd, path: next.path, holds: 1 };
}

function readOnPool(w: Walk, d: WalkDir): void {
  w.inFlight++;
  void fs
    .readdir(at(d.fd), { withFileTypes: true })
    .catch(() => undefined)
    .then((entries) => {
      w.inFlight--;
      w.read.push({ dir: d, entries });
      w.wake?.();
    });
}

/** Handles the entries of `current`, then releases it; a promise only when a callback or the Slicer makes it wait. */
function handleDir(w: Walk, current: WalkDir, entries: Dirent[] | undefined): Promise<void> | undefined {
  let pending: Promise<void> | undefined;
  try {
    pending = entries === undefined ? undefined : handleEntries(w, current, entries, 0);
  } finally {
    if (pending === undefined) release(w, current);
  }
  return pending?.finally(() => release(w, current));
}

/** Handles entries[from..] of `current`, synchronously until a callback answers a promise or a slice is over. */
function handleEntries(w: Walk, current: WalkDir, entries: Dirent[], from: number): Promise<void> | undefined {
  const { file, fileName, fileSuffix, dir } = w.options;
  const prefix = current.path === "/" ? "/" : `${current.path}/`;
  for (let i = from; i < entries.length; i++) {
    const entry = entries[i]!;
    const name = entry.name;
    // Whatever sits under an internal name (a command may make a directory of one) is as hidden as the name.
    if (isInternalName(name)) continue;
    if (entry.isDirectory()) {
      const path = prefix + name;
      dir?.(current.fd, name, path);
      current.holds++;
      w.todo.push({ parent: current, name, path });
    } else if (entry.isFile() && (fileSuffix !== undefined ? name.endsWith(fileSuffix) : fileName === undefined || fileName(name))) {
      const done = file(current.fd, name, prefix + name);
      const pause = done ? done.then(() => w.slicer.maybeYield()) : w.slicer.maybeYield();
      if (pause) return pause.then(() => handleEntries(w, current, entries, i + 1));
    }
  }
  return undefined;
}

/** The entries of the directory `fd` is open on, or undefined when it cannot be read (gone meanwhile). */
function readEntriesSync(fd: number): Dirent[] | undefined {
  try {
    return readdirSync(at(fd), { withFileTypes: true });
  } catch {
    return undefined;
  }
}

/**
 * Opens directories for a sorted run of paths, keeping the directories a
 * path shares with the previous one open (sorted candidates share most).
 */
export class DirCursor {
  private readonly open: Array<{ name: string; fd: number }> = [];
  constructor(private readonly base: number) {
    keepShape(this);
  }

  /** The fd of the directory at `segments` below the base, or undefined when it cannot be opened safely. */
  enter(segments: readonly string[]): number | undefined {
    let common = 0;
    while (common < this.open.length && common < segments.length && this.open[common]!.name === segments[common]) common++;
    while (this.open.length > common) closeSync(this.open.pop()!.fd);
    for (let i = common; i < segments.length; i++) {
      const fd = tryOpenDirSync(i === 0 ? this.base : this.open[i - 1]!.fd, segments[i]!);
      if (fd === undefined) return undefined;
      this.open.push({ name: segments[i]!, fd });
    }
    return segments.length === 0 ? this.base : this.open.at(-1)!.fd;
  }

  close(): void {
    while (this.open.length > 0) closeSync(this.open.pop()!.fd);
  }
}

const TEMP_PREFIX = ".strata-tmp-";
const LOCK_PREFIX = ".strata-lock-";

/** Names this module creates beside a target (temp files, lock files): core's reserved names, hidden from listings. */
export const isInternalName = isReservedName;

/** A lock older than this is stale whoever holds it: every locked step is one read, one write and one rename. */
export const STALE_LOCK_MS = 30_000;
/** How long a writer waits for a live holder before answering `busy`. */
export const LOCK_WAIT_MS = 15_000;

interface LockOwner {
  pid: number;
  host: string;
  time: number;
}

const thisHost = hostname();

/** The lock file of `name`: a fixed-length hash, so a 255-byte name still has a lock name that fits. */
function lockName(name: string): string {
  return LOCK_PREFIX + nodeCrypto().createHash("sha256").update(name).digest("hex").slice(0, 32);
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM"; // alive, owned by someone else
  }
}

/**
 * Whether the lock at `path` is abandoned: its holder (pid, host, time
 * written in it) is a dead process on this host, or it is older than
 * STALE_LOCK_MS. A lock whose owner line is not written yet is judged by its
 * mtime alone. Returns the inode judged, so only that very file is broken.
 */
async function staleLock(path: string): Promise<number | undefined> {
  let handle: FileHandle;
  try {
    handle = await fs.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
  } catch {
    return undefined; // released meanwhile: just retry
  }
  try {
    const stat = await handle.stat();
    let owner: Partial<LockOwner> = {};
    try {
      owner = JSON.parse(await handle.readFile("utf8")) as Partial<LockOwner>;
    } catch {
      // Being written, or torn by a crash: the age decides.
    }
    const age = Date.now() - (typeof owner.time === "number" ? owner.time : stat.mtimeMs);
    const deadHere = owner.host === thisHost && typeof owner.pid === "number" && !isAlive(owner.pid);
    return deadHere || age > STALE_LOCK_MS ? stat.ino : undefined;
  } finally {
    await handle.close();
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs `body` holding the lock file of `name` in `dir`: an exclusive create
 * (O_CREAT | O_EXCL, through the directory fd like every other create), so
 * Strata processes sharing a disk take turns on a path. A held lock is waited
 * for; an abandoned one (see staleLock) is removed and the create retried.
 * Throws errno EBUSY after LOCK_WAIT_MS. Breaking a stale lock re-checks its
 * inode first; two breakers of one stale lock can still, in a window of one
 * lstat, remove a lock just taken by a third: stale locks need a crash first.
 */
export async function withFileLock<T>(dir: FileHandle, name: string, body: () => Promise<T>): Promise<T> {
  const lock = at(dir, lockName(name));
  const owner: LockOwner = { pid: process.pid, host: thisHost, time: Date.now() };
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (let pause = 2; ; pause = Math.min(pause * 2, 50)) {
    let handle: FileHandle | undefined;
    try {
      handle = await fs.open(lock, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o644);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    if (handle) {
      try {
        owner.time = Date.now();
        await handle.writeFile(JSON.stringify(owner));
      } finally {
        await handle.close();
      }
      try {
        return await body();
      } finally {
        await fs.unlink(lock).catch(() => undefined);
      }
    }
    const stale = await staleLock(lock);
    if (stale !== undefined) {
      const now = await fs.lstat(lock).catch(() => undefined);
      if (now?.ino === stale) await fs.unlink(lock).catch(() => undefined);
      continue;
    }
    if (Date.now() > deadline) throw errno("EBUSY");
    await sleep(pause + Math.random() * pause);
  }
}
