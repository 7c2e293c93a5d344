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
 * atomic writes (`.strata-tmp-*`) are visible to listings for a moment.
 */
import { randomBytes } from "node:crypto";
import { closeSync, constants, lstatSync, openSync, readdirSync, rmdirSync, unlinkSync, type Dirent, type Stats } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";

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
export async function openDirAt(dir: FileHandle, name: string): Promise<FileHandle> {
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

/**
 * Opens the directory at `segments` below the root and returns its handle
 * (the caller closes it). The root's own path is configuration, trusted;
 * everything below it is walked one component at a time. With `create`,
 * missing directories are made on the way.
 */
export async function openDirPath(hostRoot: string, segments: readonly string[], create = false): Promise<FileHandle> {
  let current = await fs.open(hostRoot, DIR_FLAGS);
  try {
    for (const segment of segments) {
      let next: FileHandle;
      try {
        next = await openDirAt(current, segment);
      } catch (error) {
        if (!create || (error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
        // EEXIST means another writer made it first; the open below still refuses a symlink.
        await fs.mkdir(at(current, segment)).catch((e: NodeJS.ErrnoException) => {
          if (e.code !== "EEXIST") throw e;
        });
        next = await openDirAt(current, segment);
      }
      await current.close();
      current = next;
    }
    return current;
  } catch (error) {
    await current.close();
    throw error;
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
}

/**
 * Writes `bytes` to `name` in `dir` atomically: a temp file in the same
 * directory, fsync, then rename (overwrite) or link (create: link fails with
 * EEXIST instead of clobbering a file that appeared meanwhile). Readers see
 * the old content or the new, never a torn file.
 */
export async function writeAtomicAt(dir: FileHandle, name: string, bytes: Uint8Array, options: AtomicWriteOptions): Promise<void> {
  const temp = `.strata-tmp-${randomBytes(8).toString("hex")}`;
  const handle = await fs.open(at(dir, temp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o666);
  try {
    try {
      await handle.writeFile(bytes);
      if (options.mode !== undefined) await handle.chmod(options.mode);
      if (options.fsync !== false) await handle.sync();
    } finally {
      await handle.close();
    }
    if (options.overwrite) await fs.rename(at(dir, temp), at(dir, name));
    else await fs.link(at(dir, temp), at(dir, name));
  } finally {
    // After a rename the temp name is gone already; after a link or a failure it must go.
    await fs.unlink(at(dir, temp)).catch(() => undefined);
  }
}

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
          for (const grandchild of readdirSync(at(child))) {
            await remove(child, grandchild).catch((error: NodeJS.ErrnoException) => {
              if (error.code !== "ENOENT") throw error; // removed by someone else meanwhile: fine
            });
          }
        } finally {
          closeSync(child);
        }
        return rmdirSync(at(dirFd, entry));
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
  /**
   * A promise to await when the slice is over, else undefined (awaiting
   * nothing would still cost a microtask turn per step).
   */
  maybeYield(): Promise<void> | undefined {
    // Reading the clock costs more than most steps of a walk: look every 32 steps.
    if ((++this.calls & 31) !== 0 || performance.now() - this.start < SLICE_MS) return undefined;
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
}

/**
 * Walks every directory under `start` (left open for the caller) depth
 * first through directory fds, never following symlinks; `startPath` is
 * its virtual path. Directories that vanish or turn into symlinks midway
 * are skipped. Open fds: one per level of depth.
 */
export async function walkFiles(start: FileHandle, startPath: string, options: WalkOptions): Promise<void> {
  interface Frame {
    fd: number;
    path: string;
    entries: Dirent[];
    next: number;
  }
  const stack: Frame[] = [];
  const enter = (fd: number, path: string) => {
    try {
      stack.push({ fd, path, entries: readdirSync(at(fd), { withFileTypes: true }), next: 0 });
    } catch {
      if (fd !== start.fd) closeSync(fd);
    }
  };
  const slicer = new Slicer();
  try {
    enter(start.fd, startPath);
    while (stack.length > 0) {
      const frame = stack.at(-1)!;
      const entry = frame.entries[frame.next++];
      if (entry === undefined) {
        stack.pop();
        if (frame.fd !== start.fd) closeSync(frame.fd);
        continue;
      }
      const path = frame.path === "/" ? `/${entry.name}` : `${frame.path}/${entry.name}`;
      if (entry.isDirectory()) {
        const fd = tryOpenDirSync(frame.fd, entry.name);
        if (fd !== undefined) enter(fd, path);
      } else if (entry.isFile()) {
        const pending = options.file(frame.fd, entry.name, path);
        if (pending) await pending;
      }
      const pause = slicer.maybeYield();
      if (pause) await pause;
    }
  } finally {
    for (const frame of stack) if (frame.fd !== start.fd) closeSync(frame.fd);
  }
}

/**
 * Opens directories for a sorted run of paths, keeping the directories a
 * path shares with the previous one open (sorted candidates share most).
 */
export class DirCursor {
  private readonly open: Array<{ name: string; fd: number }> = [];
  constructor(private readonly base: number) {}

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
