/**
 * BubblewrapSandbox: every command runs in a fresh set of Linux namespaces
 * made by bubblewrap (`bwrap`): user, PID, IPC, UTS, cgroup and (unless
 * `network: true`) network. The sandbox sees /usr and a few /etc files
 * read-only, a private /tmp, its own /proc and /dev, and the workspace at
 * /workspace, the only writable place. No home directory, no /root, no
 * /etc/shadow, no host /tmp. When a command ends (or its timeout fires),
 * its PID namespace ends with it, so nothing it started survives.
 *
 * Limits, per sandbox: processes and memory through a cgroup (v1 pids and
 * memory controllers, created under this process's own cgroups) when this
 * process may create one; otherwise through rlimits (RLIMIT_NPROC and
 * RLIMIT_AS, set with prlimit). `limits` says which is in force. RLIMIT_NPROC
 * does not bind a process running as host root, so as root without a
 * writable cgroup a fork bomb is contained only by the timeout. CPU time is
 * an rlimit (per process). Output is capped like every sandbox's.
 */
import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { constants as fsConstants, cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readlinkSync, realpathSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import fs from "node:fs/promises";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { StrataError, errors } from "../core/errors.js";
import { normalizePath } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse, FileDownloadResponse, FileUploadResponse } from "../core/types.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { BaseSandbox, DEFAULT_MAX_OUTPUT_BYTES } from "./base.js";
import { checkTimeout, runProcess } from "./process.js";

export interface BubblewrapSandboxOptions {
  /** Host directory mounted at /workspace. Default: a fresh temporary directory, removed by `close()`. */
  workspace?: string;
  /** Share the host's network (default false: a private network namespace with only its own loopback). */
  network?: boolean;
  /** Memory for all of the sandbox's processes together, in MiB (default 1024). */
  memoryMb?: number;
  /** Processes (and threads) the sandbox may have at once (default 256). */
  maxProcesses?: number;
  /** CPU seconds each process may use (default: no limit; the timeout bounds wall time). */
  cpuSeconds?: number;
  /** Output bytes kept per command (default 1 MiB); past 64 times that, the command is killed. */
  maxOutputBytes?: number;
  /** Seconds a command may run when the call gives no timeout (default 300). */
  timeout?: number;
  /**
   * Put the sandbox in cgroups for its memory and process limits (default
   * true, when this process may create them). false: rlimits only, which
   * saves the cgroup join on every command (a few ms) but limits memory per
   * process, not per sandbox, and, as root, does not limit processes.
   */
  cgroups?: boolean;
  /** Extra environment for every command (default: PATH, HOME=/workspace, LANG=C.UTF-8, TMPDIR=/tmp). */
  env?: Record<string, string>;
  /**
   * Where /bin and /usr/bin come from: "host" (default) or "busybox", which
   * replaces them with BusyBox applets (Debian's busybox-static) so the
   * derived file operations can be proven on a BusyBox userland.
   */
  toolset?: "host" | "busybox";
}

/**
 * How each limit is enforced. `processes: "none"`: no pids cgroup could be
 * made and this process runs as root, whose processes RLIMIT_NPROC does not
 * bind; only the timeout then stops a fork bomb. `cpu: "none"`: not set.
 */
export interface BubblewrapLimits {
  memory: "cgroup" | "rlimit";
  processes: "cgroup" | "rlimit" | "none";
  cpu: "rlimit" | "none";
}

/** Where the workspace appears inside the sandbox. */
const SANDBOX_WORKSPACE = "/workspace";
/** Where the BusyBox binary is mounted in "busybox" mode; its applet links point here. */
const BUSYBOX_INSIDE = "/.busybox/busybox";
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
const ROOT_ENTRIES = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

let counter = 0;

export class BubblewrapSandbox extends BaseSandbox {
  /** How far commands are contained. */
  readonly isolation = "namespaces" as const;
  readonly id: string;
  readonly workspace = SANDBOX_WORKSPACE;
  /** The workspace directory on the host (symlinks resolved). */
  readonly hostWorkspace: string;
  private readonly ownsWorkspace: boolean;
  private readonly memoryBytes: number;
  private readonly maxProcesses: number;
  private setup: Promise<Setup> | undefined;
  private readonly hostFiles: FilesystemBackend;

  constructor(private readonly options: BubblewrapSandboxOptions = {}) {
    super();
    checkTimeout(options.timeout);
    for (const key of ["memoryMb", "maxProcesses", "cpuSeconds", "maxOutputBytes"] as const) {
      const value = options[key];
      if (value !== undefined && !(Number.isInteger(value) && value > 0)) {
        throw errors.invalidArgument(`${key} must be a positive integer, got ${String(value)}`);
      }
    }
    this.memoryBytes = (options.memoryMb ?? 1024) * 1024 * 1024;
    this.maxProcesses = options.maxProcesses ?? 256;
    this.ownsWorkspace = options.workspace === undefined;
    const dir = options.workspace ?? mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-"));
    if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.invalidArgument("BubblewrapSandbox workspace must be an existing directory");
    }
    this.hostWorkspace = realpathSync(dir);
    this.hostFiles = new FilesystemBackend({ rootDir: this.hostWorkspace });
    this.id = `bwrap-${process.pid}-${++counter}`;
  }

  /** True when bwrap is installed and can create the namespaces (checked once per process, by one tiny run). */
  static async isAvailable(): Promise<boolean> {
    return (await probe()).ok;
  }

  /** Why bwrap cannot be used here, or undefined when it can. */
  static async unavailableReason(): Promise<string | undefined> {
    const result = await probe();
    return result.ok ? undefined : result.reason;
  }

  /** How the limits are enforced; known after the first command. */
  get limits(): BubblewrapLimits | undefined {
    return this.settled?.limits;
  }
  private settled: Setup | undefined;

  async execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    if (typeof command !== "string") throw errors.invalidArgument("command must be a string");
    checkTimeout(options.timeout);
    const cwd = normalizePath(options.cwd ?? "/");
    this.checkCwd(cwd);
    const setup = await this.ready();
    this.assertOpen();
    const maxOutputBytes = options.maxOutputBytes ?? this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const args = [...setup.bwrapArgs, "--chdir", this.sandboxPath(cwd), "/bin/sh", "-c", command];
    const response = await runProcess({
      file: setup.launcher[0]!,
      args: [...setup.launcher.slice(1), ...args],
      cwd: this.hostWorkspace,
      env: { ...setup.env, ...options.env },
      stdin: options.stdin,
      timeout: options.timeout ?? this.options.timeout ?? 300,
      maxOutputBytes,
      killAfterBytes: Math.max(maxOutputBytes, (this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES) * 64),
      onOutput: options.onOutput,
      signal: this.commandSignal(options.signal),
    });
    if (response.exitCode === 137 && setup.memoryCgroup && (await oomKills(setup.memoryCgroup)) > setup.oomKillsSeen) {
      setup.oomKillsSeen = await oomKills(setup.memoryCgroup);
      response.output += `\n[Command killed: the sandbox's memory limit of ${this.memoryBytes / 1024 / 1024} MiB was reached]`;
    }
    return response;
  }

  /**
   * Straight into the host directory behind /workspace, through
   * FilesystemBackend's descriptor walk, which never follows a symlink, so a
   * link a command planted cannot lead an upload out of the workspace. Ten
   * times faster than moving the bytes through a shell inside the sandbox.
   */
  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    this.assertOpen();
    return this.hostFiles.uploadFiles(files);
  }

  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    this.assertOpen();
    return this.hostFiles.downloadFiles(paths);
  }

  /** Closes the sandbox: removes its cgroups, and the workspace if the sandbox created it. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    const setup = await this.setup?.catch(() => undefined);
    for (const dir of setup?.cgroups ?? []) await removeCgroup(dir);
    if (this.ownsWorkspace) rmSync(this.hostWorkspace, { recursive: true, force: true });
  }

  /**
   * A missing working directory is `file_not_found`. Checked with lstat one
   * component at a time, never following a symlink on the host; a symlink
   * is left for bwrap to resolve inside the sandbox.
   */
  private checkCwd(cwd: string): void {
    let host = this.hostWorkspace;
    for (const segment of cwd === "/" ? [] : cwd.slice(1).split("/")) {
      host = nodePath.join(host, segment);
      const stat = lstatSync(host, { throwIfNoEntry: false });
      if (stat?.isSymbolicLink()) return;
      if (!stat?.isDirectory()) throw errors.notFound(cwd);
    }
  }

  private ready(): Promise<Setup> {
    this.setup ??= this.prepare().then((setup) => (this.settled = setup));
    return this.setup;
  }

  private async prepare(): Promise<Setup> {
    const available = await probe();
    if (!available.ok) throw new StrataError("unavailable", available.reason);
    const busybox = this.options.toolset === "busybox" ? busyboxApplets() : undefined;
    const args = [
      "--unshare-user",
      "--unshare-pid",
      "--unshare-ipc",
      "--unshare-uts",
      "--unshare-cgroup-try",
      ...(this.options.network ? [] : ["--unshare-net"]),
      "--die-with-parent",
      "--new-session",
      "--hostname",
      "strata",
      "--ro-bind",
      "/usr",
      "/usr",
    ];
    for (const name of ROOT_ENTRIES) {
      const host = `/${name}`;
      const stat = lstatSync(host, { throwIfNoEntry: false });
      if (stat?.isSymbolicLink()) args.push("--symlink", readlinkSync(host), host);
      else if (stat?.isDirectory()) args.push("--ro-bind", host, host);
    }
    if (busybox) {
      args.push("--ro-bind", busybox.binary, BUSYBOX_INSIDE);
      for (const dir of ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]) {
        if (!lstatSync(dir, { throwIfNoEntry: false })?.isSymbolicLink()) args.push("--ro-bind", busybox.applets, dir);
      }
    }
    args.push("--ro-bind", sandboxEtc(), "/etc");
    // Often a symlink into /run; bwrap binds what it points to.
    if (this.options.network && existsSync("/etc/resolv.conf")) args.push("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf");
    args.push("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", this.hostWorkspace, SANDBOX_WORKSPACE);
    // The root is bwrap's scratch tmpfs; read-only, so /workspace and /tmp are the only writable places.
    args.push("--remount-ro", "/");

    const cgroups = this.options.cgroups === false ? {} : await createCgroups(`strata-${this.id}`, this.memoryBytes, this.maxProcesses);
    const limits: BubblewrapLimits = {
      memory: cgroups.memory ? "cgroup" : "rlimit",
      processes: cgroups.pids ? "cgroup" : process.getuid?.() === 0 ? "none" : "rlimit",
      cpu: this.options.cpuSeconds ? "rlimit" : "none",
    };
    const rlimits = [
      ...(cgroups.memory ? [] : [`--as=${this.memoryBytes}`]),
      ...(cgroups.pids ? [] : [`--nproc=${this.maxProcesses}`]),
      ...(this.options.cpuSeconds ? [`--cpu=${this.options.cpuSeconds}`] : []),
    ];
    const bwrap = findExecutable("bwrap")!;
    let launcher = [bwrap];
    if (rlimits.length > 0) {
      const prlimit = findExecutable("prlimit");
      if (!prlimit) throw new StrataError("unavailable", "prlimit (Debian package util-linux) is needed to set the sandbox's limits");
      launcher = [prlimit, ...rlimits, "--", bwrap];
    }
    const dirs = [cgroups.pids, cgroups.memory].filter((dir): dir is string => dir !== undefined);
    if (dirs.length > 0) {
      // The launcher joins the cgroups before it becomes bwrap, so no process of the sandbox starts outside them.
      const join = dirs.map((dir) => `echo $$ > '${dir}/cgroup.procs'`).join(" && ");
      launcher = ["/bin/sh", "-c", `${join} && exec "$@"`, "strata-launcher", ...launcher];
    }
    const env: Record<string, string> = {
      PATH: busybox ? "/usr/bin:/bin" : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      HOME: SANDBOX_WORKSPACE,
      LANG: "C.UTF-8",
      TMPDIR: "/tmp",
      ...this.options.env,
    };
    return {
      bwrapArgs: args,
      launcher,
      env,
      limits,
      cgroups: dirs,
      memoryCgroup: cgroups.memory,
      oomKillsSeen: cgroups.memory ? await oomKills(cgroups.memory) : 0,
    };
  }
}

interface Setup {
  bwrapArgs: string[];
  /** argv that precedes bwrap's own arguments: bwrap itself, or a cgroup-joining shell and/or prlimit in front of it. */
  launcher: string[];
  env: Record<string, string>;
  limits: BubblewrapLimits;
  cgroups: string[];
  memoryCgroup: string | undefined;
  oomKillsSeen: number;
}

function findExecutable(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin").split(":").concat(["/usr/bin", "/usr/sbin"])) {
    if (dir === "") continue;
    const candidate = nodePath.join(dir, name);
    try {
      if (statSync(candidate).isFile()) return candidate;
    } catch {
      // Not here.
    }
  }
  return undefined;
}

type Probe = { ok: true } | { ok: false; reason: string };
let probed: Promise<Probe> | undefined;

/** Runs `bwrap … true` once with the namespaces every sandbox uses, to tell "works" from "why not". */
function probe(): Promise<Probe> {
  probed ??= new Promise<Probe>((resolve) => {
    const bwrap = findExecutable("bwrap");
    if (!bwrap) {
      resolve({ ok: false, reason: "bubblewrap is not installed: install the Debian package 'bubblewrap' (apt-get install bubblewrap)" });
      return;
    }
    const args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent", "--new-session"];
    args.push("--ro-bind", "/usr", "/usr");
    for (const name of ROOT_ENTRIES) {
      const stat = lstatSync(`/${name}`, { throwIfNoEntry: false });
      if (stat?.isSymbolicLink()) args.push("--symlink", readlinkSync(`/${name}`), `/${name}`);
      else if (stat?.isDirectory()) args.push("--ro-bind", `/${name}`, `/${name}`);
    }
    args.push("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/sh", "-c", "exit 0");
    execFile(bwrap, args, { timeout: 10_000 }, (error, _stdout, stderr) => {
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
  return probed;
}

/** A per-user directory for generated files: the sandbox's /etc, BusyBox applet links. */
function supportDir(): string {
  const uid = process.getuid?.() ?? 0;
  const dir = nodePath.join(tmpdir(), `strata-bwrap-support-${uid}`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const stat = statSync(dir);
  if (stat.uid !== uid || (stat.mode & 0o022) !== 0) throw new StrataError("unavailable", "The bubblewrap support directory is not private to this user");
  return dir;
}

/**
 * The sandbox's /etc, mounted as one directory (one bind instead of fifteen
 * keeps start-up fast): copies of the entries the userland needs (symlinks
 * kept as links) and a passwd and group naming only the ids the sandbox runs
 * as, so no host account leaks in. Built once per version of its sources
 * (named by their lstat fingerprint) and shared by every process of this user.
 */
function sandboxEtc(): string {
  const uid = process.getuid?.() ?? 0;
  const gid = process.getgid?.() ?? 0;
  const fingerprint = createHash("sha256").update(`${uid}:${gid}`);
  for (const entry of ETC_ENTRIES) {
    const stat = lstatSync(`/etc/${entry}`, { throwIfNoEntry: false });
    fingerprint.update(`|${entry}:${stat ? `${stat.ino}:${stat.size}:${stat.mtimeMs}` : "-"}`);
  }
  const dir = nodePath.join(supportDir(), `etc-${fingerprint.digest("hex").slice(0, 16)}`);
  if (existsSync(dir)) return dir;
  const building = `${dir}.${process.pid}.tmp`;
  rmSync(building, { recursive: true, force: true });
  mkdirSync(building);
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
  writeFileSync(nodePath.join(building, "passwd"), `${passwd}nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`);
  writeFileSync(nodePath.join(building, "group"), `${group}nogroup:x:65534:\n`);
  // Mount point for the host's resolv.conf in sandboxes with network; empty otherwise.
  writeFileSync(nodePath.join(building, "resolv.conf"), "");
  try {
    renameSync(building, dir);
  } catch {
    rmSync(building, { recursive: true, force: true }); // Another process built it first.
  }
  return dir;
}

/** A directory of links named after each BusyBox applet, all pointing at BUSYBOX_INSIDE. Built once per BusyBox binary. */
function busyboxApplets(): { binary: string; applets: string } {
  const binary = findExecutable("busybox");
  if (!binary) throw new StrataError("unavailable", "BusyBox is not installed: install the Debian package 'busybox-static'");
  const stat = statSync(binary);
  const applets = nodePath.join(supportDir(), `busybox-${stat.ino}-${stat.size}-${Math.floor(stat.mtimeMs)}`);
  if (!existsSync(applets)) {
    const building = `${applets}.${process.pid}.tmp`;
    rmSync(building, { recursive: true, force: true });
    mkdirSync(building);
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
  return execFileSync(binary, ["--list"], { encoding: "utf8" })
    .split("\n")
    .filter((name) => /^[A-Za-z0-9_.[-]+$/.test(name));
}

// ---- cgroups (v1: pids and memory controllers) ----

/**
 * Creates the sandbox's cgroups under this process's own (so limits set
 * above still apply) and sets the limits. A controller that is missing or
 * not writable is left out; the caller falls back to rlimits for it.
 */
async function createCgroups(name: string, memoryBytes: number, maxProcesses: number): Promise<{ pids?: string; memory?: string }> {
  const result: { pids?: string; memory?: string } = {};
  const pids = await controllerDir("pids");
  if (pids) {
    const dir = nodePath.join(pids, name);
    if (await tryCreate(dir, [["pids.max", String(maxProcesses)]])) result.pids = dir;
  }
  const memory = await controllerDir("memory");
  if (memory) {
    const dir = nodePath.join(memory, name);
    if (await tryCreate(dir, [["memory.limit_in_bytes", String(memoryBytes)]])) {
      // Without swap limits a bomb would swap instead of being stopped; absent when swap accounting is off.
      await fs.writeFile(nodePath.join(dir, "memory.memsw.limit_in_bytes"), String(memoryBytes)).catch(() => undefined);
      result.memory = dir;
    }
  }
  return result;
}

async function tryCreate(dir: string, settings: [string, string][]): Promise<boolean> {
  try {
    await fs.mkdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") return false;
  }
  try {
    for (const [file, value] of settings) await fs.writeFile(nodePath.join(dir, file), value);
    await fs.access(nodePath.join(dir, "cgroup.procs"), fsConstants.W_OK);
    return true;
  } catch {
    await removeCgroup(dir);
    return false;
  }
}

/** This process's cgroup directory for a v1 controller, from /proc/self/cgroup and /proc/self/mountinfo. */
async function controllerDir(controller: string): Promise<string | undefined> {
  try {
    const membership = (await fs.readFile("/proc/self/cgroup", "utf8"))
      .split("\n")
      .map((line) => line.split(":"))
      .find((fields) => fields.length >= 3 && fields[1]!.split(",").includes(controller));
    if (!membership) return undefined;
    const path = membership.slice(2).join(":");
    for (const line of (await fs.readFile("/proc/self/mountinfo", "utf8")).split("\n")) {
      const [left, right] = line.split(" - ");
      if (!left || !right) continue;
      const [fstype, , superOptions = ""] = right.split(" ");
      if (fstype !== "cgroup" || !superOptions.split(",").includes(controller)) continue;
      const fields = left.split(" ");
      const root = fields[3]!;
      const mountPoint = fields[4]!;
      if (path !== root && !path.startsWith(root === "/" ? "/" : `${root}/`)) continue;
      return nodePath.join(mountPoint, path.slice(root === "/" ? 0 : root.length));
    }
  } catch {
    // No /proc or no cgroups: rlimits it is.
  }
  return undefined;
}

async function oomKills(memoryDir: string): Promise<number> {
  try {
    const match = /^oom_kill (\d+)$/m.exec(await fs.readFile(nodePath.join(memoryDir, "memory.oom_control"), "utf8"));
    return match ? Number(match[1]) : 0;
  } catch {
    return 0;
  }
}

/** Removes a cgroup; its processes are gone once the PID namespace ended, which can take a moment. */
async function removeCgroup(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      await fs.rmdir(dir);
      return;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return;
      if (code !== "EBUSY") return;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
}
