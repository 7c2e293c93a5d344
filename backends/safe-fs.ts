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
 */
import { randomBytes } from "node:crypto";
import { constants, type Dirent } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_DIRECTORY, O_NOFOLLOW, O_NONBLOCK } = constants;

const DIR_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW;
/** O_NONBLOCK so that opening a FIFO cannot hang a libuv thread; it is harmless on regular files. */
export const READ_FLAGS = O_RDONLY | O_NOFOLLOW | O_NONBLOCK;

/** `name` inside the directory `dir` is open on. */
export function at(dir: FileHandle, name = ""): string {
  return name === "" ? `/proc/self/fd/${dir.fd}` : `/proc/self/fd/${dir.fd}/${name}`;
}

/** True when this process can resolve paths through `/proc/self/fd`. */
export async function procFdAvailable(): Promise<boolean> {
  try {
    await fs.access("/proc/self/fd");
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

/** Opens the trusted root directory itself (its own path is configuration, not input). */
export function openRoot(hostRoot: string): Promise<FileHandle> {
  return fs.open(hostRoot, DIR_FLAGS);
}

/**
 * Walks `segments` down from `root` and returns a new handle on the last
 * directory (the caller closes it); `root` stays open. With `create`,
 * missing directories are made one component at a time.
 */
export async function openDirPath(root: FileHandle, segments: readonly string[], create = false): Promise<FileHandle> {
  let current = await openDirAt(root, ".");
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

export function readDirAt(dir: FileHandle): Promise<Dirent[]> {
  return fs.readdir(at(dir), { withFileTypes: true });
}

export interface AtomicWriteOptions {
  /** Replace an existing file (rename); otherwise fail with EEXIST, even against a concurrent creator (link). */
  overwrite: boolean;
  /** Permission bits to give the new file (an edited file keeps its mode). */
  mode?: number;
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
      await handle.sync();
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

/** Removes `name` from `dir`: a file or symlink is unlinked (never followed), a directory emptied through fds, then removed. */
export async function removeAt(dir: FileHandle, name: string): Promise<void> {
  const stat = await lstatAt(dir, name);
  if (stat.isDirectory()) {
    let child: FileHandle | undefined;
    try {
      child = await openDirAt(dir, name);
    } catch (error) {
      // Swapped for a symlink since the lstat: remove the link, not what it points to.
      if ((error as NodeJS.ErrnoException).code !== "ELOOP") throw error;
    }
    if (child) {
      try {
        for (const entry of await readDirAt(child)) await removeAt(child, entry.name);
      } finally {
        await child.close();
      }
      return fs.rmdir(at(dir, name));
    }
  }
  return fs.unlink(at(dir, name));
}

/** A directory handle shared by the tasks that still need it; closed by the last one. */
class SharedDir {
  private users = 1;
  constructor(readonly handle: FileHandle) {}
  retain(): void {
    this.users++;
  }
  async release(): Promise<void> {
    if (--this.users === 0) await this.handle.close();
  }
}

type Task = () => Promise<Task[]>;

/**
 * Runs tasks (which may add tasks) with bounded concurrency. Last in, first
 * out, so the walk goes deep before wide and few directories stay open.
 */
function runTasks(first: Task, concurrency: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const stack: Task[] = [first];
    let active = 0;
    let failed = false;
    const pump = (): void => {
      while (!failed && active < concurrency && stack.length > 0) {
        const task = stack.pop()!;
        active++;
        task().then(
          (more) => {
            active--;
            for (const t of more) stack.push(t);
            pump();
          },
          (error: unknown) => {
            failed = true;
            reject(error);
          },
        );
      }
      if (!failed && active === 0 && stack.length === 0) resolve();
    };
    pump();
  });
}

export interface WalkOptions {
  /** Called for each regular file (symlinks and special files are skipped). The first error it throws ends the walk's result. */
  file: (dir: FileHandle, name: string, path: string) => Promise<void>;
  /** Directories whose walk is not needed can be pruned. */
  descend?: (path: string) => boolean;
  concurrency?: number;
}

/**
 * Walks every directory under `start` (a handle the walk takes over and
 * closes) through directory fds, never following symlinks. `startPath` is
 * the virtual path of `start`. Unreadable or vanished directories are skipped.
 */
export async function walkFiles(start: FileHandle, startPath: string, options: WalkOptions): Promise<void> {
  const join = (dir: string, name: string) => (dir === "/" ? `/${name}` : `${dir}/${name}`);
  // Tasks never reject (so every handle is released); a visitor's error is rethrown at the end.
  let firstError: { error: unknown } | undefined;
  const list = async (dir: SharedDir, path: string): Promise<Task[]> => {
    const tasks: Task[] = [];
    try {
      for (const entry of await readDirAt(dir.handle)) {
        const child = join(path, entry.name);
        if (entry.isDirectory() && (options.descend?.(child) ?? true)) {
          dir.retain();
          tasks.push(() => openThenList(dir, entry.name, child));
        } else if (entry.isFile()) {
          dir.retain();
          tasks.push(async () => {
            try {
              await options.file(dir.handle, entry.name, child);
            } catch (error) {
              firstError ??= { error };
            } finally {
              await dir.release();
            }
            return [];
          });
        }
      }
    } catch {
      // Vanished or unreadable: nothing to report under it.
    } finally {
      await dir.release();
    }
    return tasks;
  };
  const openThenList = async (parent: SharedDir, name: string, path: string): Promise<Task[]> => {
    let handle: FileHandle;
    try {
      handle = await openDirAt(parent.handle, name);
    } catch {
      return []; // Gone, or swapped for a symlink: not followed.
    } finally {
      await parent.release();
    }
    return list(new SharedDir(handle), path);
  };
  await runTasks(() => list(new SharedDir(start), startPath), options.concurrency ?? 16);
  if (firstError) throw firstError.error;
}
