/**
 * The host side of BubblewrapSandbox: finding the tools, the one-time probe,
 * the generated /etc and BusyBox applet links, the launcher's fixed
 * environment, and handing workspace files to the unprivileged host user
 * commands run as when this process is root.
 */
import { chmodSync, cpSync, existsSync, lstatSync, mkdirSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import fs, { type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { errors, StrataError } from "../core/errors.js";
import { findOnPath } from "../backends/executable.js";
import { at, DIR_FLAGS, openDirAt, READ_FLAGS, readDirAt } from "../backends/safe-fs.js";
import { childProcess, nodeCrypto } from "../stores/lazy-builtins.js";

/**
 * The whole environment of every host process that starts a sandbox (the
 * cgroup-joining shell, setpriv, prlimit, bwrap). Nothing of the caller's
 * `env` is in it: a variable such as LD_PRELOAD would otherwise act on these
 * host processes before any namespace exists. The caller's variables reach
 * only the sandboxed command, through bwrap's --clearenv and --setenv.
 */
export const LAUNCHER_ENV: Readonly<Record<string, string>> = Object.freeze({ PATH: "/usr/bin:/bin" });

/** The host ids commands run as (see BubblewrapSandboxOptions.sandboxUser). */
export interface SandboxUser {
  uid: number;
  gid: number;
}

/** nobody/nogroup on Debian. */
export const DEFAULT_SANDBOX_USER: SandboxUser = { uid: 65534, gid: 65534 };

export function validateSandboxUser(user: unknown): SandboxUser {
  const valid = (id: unknown) => typeof id === "number" && Number.isInteger(id) && id > 0 && id < 0xffffffff;
  if (typeof user !== "object" || user === null || !valid((user as SandboxUser).uid) || !valid((user as SandboxUser).gid)) {
    throw errors.invalidArgument("sandboxUser must be { uid, gid }, integers above 0 (root is what it replaces)");
  }
  return { uid: (user as SandboxUser).uid, gid: (user as SandboxUser).gid };
}

/** The host user commands run as: `requested` (or the default) when this process is root, else none. */
export function hostUser(requested: SandboxUser | undefined): SandboxUser | undefined {
  return process.getuid?.() === 0 ? (requested ?? DEFAULT_SANDBOX_USER) : undefined;
}

export const ROOT_ENTRIES = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/** /usr and the root's lib and bin entries, read-only (symlinks recreated as links). */
export function systemArgs(): string[] {
  const args = ["--ro-bind", "/usr", "/usr"];
  for (const name of ROOT_ENTRIES) {
    const host = `/${name}`;
    const stat = lstatSync(host, { throwIfNoEntry: false });
    if (stat?.isSymbolicLink()) args.push("--symlink", readlinkSync(host), host);
    else if (stat?.isDirectory()) args.push("--ro-bind", host, host);
  }
  return args;
}

/** A host tool (bwrap, setpriv, prlimit, busybox): on PATH (the usual directories when it is unset), then in /usr/bin and /usr/sbin. */
export function findExecutable(name: string): string | undefined {
  return findOnPath(name, { path: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin", then: ["/usr/bin", "/usr/sbin"] });
}

/** argv that switches to `user` before the rest runs, or nothing when there is no user to switch to. */
export function dropTo(user: SandboxUser | undefined): string[] {
  if (!user) return [];
  const setpriv = findExecutable("setpriv");
  if (!setpriv) throw new StrataError("unavailable", "setpriv (Debian package util-linux) is needed to run the sandbox as an unprivileged user");
  return [setpriv, `--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups", "--"];
}

type Probe = { ok: true } | { ok: false; reason: string };
const probes = new Map<string, Promise<Probe>>();

/**
 * Runs `bwrap … true` once per host user with the namespaces every sandbox
 * uses, to tell "works" from "why not".
 */
export function probe(user: SandboxUser | undefined): Promise<Probe> {
  const key = user ? `${user.uid}:${user.gid}` : "self";
  let probed = probes.get(key);
  if (probed) return probed;
  probed = new Promise<Probe>((resolve) => {
    const bwrap = findExecutable("bwrap");
    if (!bwrap) {
      resolve({ ok: false, reason: "bubblewrap is not installed: install the Debian package 'bubblewrap' (apt-get install bubblewrap)" });
      return;
    }
    let launcher: string[];
    try {
      launcher = [...dropTo(user), bwrap];
    } catch (error) {
      resolve({ ok: false, reason: (error as Error).message });
      return;
    }
    const args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent", "--new-session"];
    args.push(...systemArgs(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/sh", "-c", "exit 0");
    childProcess().execFile(launcher[0]!, [...launcher.slice(1), ...args], { timeout: 10_000, env: LAUNCHER_ENV, cwd: "/" }, (error, _stdout, stderr) => {
      if (!error) resolve({ ok: true });
      else {
        const detail = String(stderr).trim().split("\n")[0] || error.message;
        resolve({
          ok: false,
          reason: `bubblewrap cannot create a sandbox here (${detail}). It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) and, inside a container, permission to mount /proc`,
        });
      }
    });
  });
  probes.set(key, probed);
  return probed;
}

/**
 * A per-user directory for generated files: the sandbox's /etc, BusyBox
 * applet links, bwrap argument files. Readable by the sandbox user (it
 * reads /etc from here as that user), writable only by this one.
 */
export function supportDir(): string {
  const uid = process.getuid?.() ?? 0;
  const dir = nodePath.join(tmpdir(), `strata-bwrap-support-${uid}`);
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  const stat = lstatSync(dir);
  if (!stat.isDirectory() || stat.uid !== uid || (stat.mode & 0o022) !== 0) {
    throw new StrataError("unavailable", "The bubblewrap support directory is not private to this user");
  }
  if ((stat.mode & 0o055) !== 0o055) chmodSync(dir, 0o755);
  return dir;
}

/** A private file in the support directory, for bwrap's --args (read by the launcher before it drops privileges). */
export function writePrivateFile(name: string, content: string): string {
  const file = nodePath.join(supportDir(), name);
  writeFileSync(file, content, { mode: 0o600, flag: "wx" });
  return file;
}

/** /etc entries the userland needs. Never /etc/shadow, never /etc/ssl/private. */
const ETC_ENTRIES = [
  "ld.so.cache",
  "ld.so.conf",
  "ld.so.conf.d",
  "alternatives",
  "localtime",
  "nsswitch.conf",
  "hosts",
  "protocols",
  "services",
  "host.conf",
  "gai.conf",
  "mime.types",
  "ssl/certs",
  "ssl/openssl.cnf",
  "ca-certificates",
];

/**
 * The sandbox's /etc, mounted as one directory (one bind instead of fifteen
 * keeps start-up fast): copies of the entries the userland needs (symlinks
 * kept as links) and a passwd and group naming only the ids the sandbox runs
 * as, so no host account leaks in. Built once per version of its sources
 * (named by their lstat fingerprint) and shared by every process of this user.
 */
export function sandboxEtc(uid: number, gid: number): string {
  const fingerprint = nodeCrypto().createHash("sha256").update(`${uid}:${gid}`);
  for (const entry of ETC_ENTRIES) {
    const stat = lstatSync(`/etc/${entry}`, { throwIfNoEntry: false });
    fingerprint.update(`|${entry}:${stat ? `${stat.ino}:${stat.size}:${stat.mtimeMs}` : "-"}`);
  }
  const dir = nodePath.join(supportDir(), `etc-${fingerprint.digest("hex").slice(0, 16)}`);
  if (existsSync(dir)) return dir;
  const building = `${dir}.${process.pid}.tmp`;
  rmSync(building, { recursive: true, force: true });
  mkdirSync(building, { mode: 0o755 });
  for (const entry of ETC_ENTRIES) {
    const source = `/etc/${entry}`;
    if (!lstatSync(source, { throwIfNoEntry: false })) continue;
    mkdirSync(nodePath.dirname(nodePath.join(building, entry)), { recursive: true });
    // Unreadable entries are left out, not copied.
    try {
      cpSync(source, nodePath.join(building, entry), { recursive: true, verbatimSymlinks: true });
    } catch {
      rmSync(nodePath.join(building, entry), { recursive: true, force: true });
    }
  }
  const passwd = uid === 0 ? "root:x:0:0:root:/workspace:/bin/sh\n" : `root:x:0:0:root:/root:/bin/sh\nsandbox:x:${uid}:${gid}:sandbox:/workspace:/bin/sh\n`;
  const group = gid === 0 ? "root:x:0:\n" : `root:x:0:\nsandbox:x:${gid}:\n`;
  writeFileSync(nodePath.join(building, "passwd"), `${passwd}nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`, { mode: 0o644 });
  writeFileSync(nodePath.join(building, "group"), `${group}nogroup:x:65534:\n`, { mode: 0o644 });
  // Mount point for the host's resolv.conf in sandboxes with network; empty otherwise.
  writeFileSync(nodePath.join(building, "resolv.conf"), "", { mode: 0o644 });
  try {
    renameSync(building, dir);
  } catch {
    rmSync(building, { recursive: true, force: true }); // Another process built it first.
  }
  return dir;
}

/** Where the BusyBox binary is mounted in "busybox" mode; its applet links point here. */
export const BUSYBOX_INSIDE = "/.busybox/busybox";

/** A directory of links named after each BusyBox applet, all pointing at BUSYBOX_INSIDE. Built once per BusyBox binary. */
export function busyboxApplets(): { binary: string; applets: string } {
  const binary = findExecutable("busybox");
  if (!binary) throw new StrataError("unavailable", "BusyBox is not installed: install the Debian package 'busybox-static'");
  const stat = statSync(binary);
  const applets = nodePath.join(supportDir(), `busybox-${stat.ino}-${stat.size}-${Math.floor(stat.mtimeMs)}`);
  if (!existsSync(applets)) {
    const building = `${applets}.${process.pid}.tmp`;
    rmSync(building, { recursive: true, force: true });
    mkdirSync(building, { mode: 0o755 });
    for (const name of readApplets(binary)) symlinkSync(BUSYBOX_INSIDE, nodePath.join(building, name));
    try {
      renameSync(building, applets);
    } catch {
      rmSync(building, { recursive: true, force: true }); // Another process built it first.
    }
  }
  return { binary, applets };
}

/** Every applet compiled into the binary (`busybox --list`); runs once per binary. */
function readApplets(binary: string): string[] {
  return childProcess().execFileSync(binary, ["--list"], { encoding: "utf8", env: LAUNCHER_ENV })
    .split("\n")
    .filter((name) => /^[A-Za-z0-9_.[-]+$/.test(name));
}

// ---- handing files to the sandbox user ----
//
// Only directories and regular files with a single link change owner: a
// hard link placed in the workspace may share its inode with a file
// elsewhere on the host, which must never change hands. Every step goes
// through directory fds and O_NOFOLLOW (safe-fs.ts), so a symlink a command
// swaps in meanwhile is refused, never followed.

async function giveHandle(handle: FileHandle, user: SandboxUser): Promise<void> {
  const stat = await handle.stat();
  if (stat.uid === user.uid && stat.gid === user.gid) return;
  if (stat.isDirectory() || (stat.isFile() && stat.nlink === 1)) await handle.chown(user.uid, user.gid);
}

async function giveEntry(dir: FileHandle, name: string, user: SandboxUser, recursive: boolean): Promise<void> {
  let handle: FileHandle;
  try {
    handle = await fs.open(at(dir, name), READ_FLAGS);
  } catch {
    return; // A symlink, or gone: nothing to hand over.
  }
  try {
    await giveHandle(handle, user);
    if (recursive && (await handle.stat()).isDirectory()) {
      for (const entry of await readDirAt(handle)) {
        if (entry.isDirectory() || entry.isFile()) await giveEntry(handle, entry.name, user, true);
      }
    }
  } finally {
    await handle.close();
  }
}

/**
 * Fails unless `user` can reach `dir` (bwrap, running as that user, opens it
 * by path); the message names no host path.
 */
export function checkReachable(dir: string, user: SandboxUser): void {
  for (let parent = nodePath.dirname(dir); ; parent = nodePath.dirname(parent)) {
    const stat = statSync(parent);
    const bits = stat.uid === user.uid ? 0o100 : stat.gid === user.gid ? 0o010 : 0o001;
    if ((stat.mode & bits) === 0) {
      throw new StrataError(
        "permission_denied",
        `The sandbox user (uid ${user.uid}) cannot reach the workspace: every directory above it must be searchable by that user`,
      );
    }
    if (parent === "/") return;
  }
}

/** Hands the workspace and everything in it to the sandbox user. */
export async function giveTree(root: string, user: SandboxUser): Promise<void> {
  const handle = await fs.open(root, DIR_FLAGS);
  try {
    await giveHandle(handle, user);
    for (const entry of await readDirAt(handle)) {
      if (entry.isDirectory() || entry.isFile()) await giveEntry(handle, entry.name, user, true);
    }
  } finally {
    await handle.close();
  }
}

/** Hands one uploaded file, and the directories leading to it, to the sandbox user. */
export async function givePath(root: string, path: string, user: SandboxUser): Promise<void> {
  const segments = path.split("/").filter((segment) => segment !== "");
  if (segments.length === 0) return;
  let dir = await fs.open(root, DIR_FLAGS);
  try {
    for (const segment of segments.slice(0, -1)) {
      const next = await openDirAt(dir, segment);
      await dir.close();
      dir = next;
      await giveHandle(dir, user);
    }
    await giveEntry(dir, segments.at(-1)!, user, false);
  } finally {
    await dir.close();
  }
}

// ---- the shell's per-path lock, taken from the host ----

/** A lock directory older than this is stale (LOCK_FN breaks it at the same age). */
const STALE_LOCK_MS = 30_000;
/** How long an upload waits for a live holder before answering busy (LOCK_FN waits as long). */
const LOCK_WAIT_MS = 60_000;

/**
 * Runs `body` holding the lock directory `name` (lockName of a virtual
 * path) in the workspace's top directory, the very lock the sandbox's shell
 * takes with `mkdir` around overwrite, edit's compare-and-swap and delete
 * (LOCK_FN). Same protocol: mkdir is the atomic step, a directory older than
 * 30 s is broken, a live one is waited for up to a minute, then `busy`.
 * Every step goes through a descriptor of the workspace directory opened
 * with O_NOFOLLOW (mkdir and rmdir never follow a final symlink), so a link
 * a command planted under the lock's name only makes the upload wait.
 */
export async function withLockDirectory<T>(root: string, name: string, body: () => Promise<T>): Promise<T> {
  const dir = await fs.open(root, DIR_FLAGS);
  try {
    const lock = at(dir, name);
    const start = Date.now();
    for (let pause = 2; ; pause = Math.min(pause * 2, 50)) {
      try {
        await fs.mkdir(lock, 0o755);
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      const held = await fs.lstat(lock).catch(() => undefined);
      if (held === undefined) continue; // Released meanwhile.
      if (held.isDirectory() && Date.now() - held.mtimeMs > STALE_LOCK_MS) {
        await fs.rmdir(lock).catch(() => undefined);
        continue;
      }
      if (Date.now() - start > LOCK_WAIT_MS) throw new StrataError("busy", "The file stayed locked by another operation for a minute; try again");
      await new Promise((resolve) => setTimeout(resolve, pause + Math.random() * pause));
    }
    try {
      return await body();
    } finally {
      await fs.rmdir(lock).catch(() => undefined);
    }
  } finally {
    await dir.close();
  }
}
