/**
 * BubblewrapSandbox: every command runs in a fresh set of Linux namespaces
 * made by bubblewrap (`bwrap`): user, PID, IPC, UTS, cgroup and (unless
 * `network: true`) network. The sandbox sees /usr and a few /etc files
 * read-only, a private /tmp, its own /proc and /dev, and the workspace at
 * /workspace, the only writable place. No home directory, no /root, no
 * /etc/shadow, no host /tmp. When a command ends (or its timeout fires),
 * its PID namespace ends with it, so nothing it started survives.
 *
 * The host side (see bubblewrap-host.ts) never sees the caller's `env`: the
 * launcher runs with a fixed two-variable environment and the caller's
 * variables are handed to bwrap as --setenv after --clearenv. When this
 * process is root, the launcher drops to an unprivileged host user
 * (`sandboxUser`, default nobody) before bwrap starts, so nothing a command
 * creates is owned by root on the host; the workspace is handed to that user.
 *
 * Limits, per sandbox: processes and memory through a cgroup (v1 pids and
 * memory controllers, created under this process's own cgroups) when this
 * process may create one; otherwise through rlimits (RLIMIT_NPROC and
 * RLIMIT_AS, set with prlimit). `limits` says which is in force. CPU time is
 * an rlimit (per process). The workspace quota bounds every file a command
 * writes (RLIMIT_FSIZE), /tmp as a whole (a sized tmpfs) and uploads.
 * Output is capped like every sandbox's.
 */
import { existsSync, lstatSync, mkdtempSync, realpathSync, rmSync, statSync, chownSync } from "node:fs";
import { lstat } from "node:fs/promises";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { Slots } from "../core/concurrency.js";
import { StrataError, errors, isStrataError } from "../core/errors.js";
import type { DownloadAnswer, UploadAnswer } from "../core/base.js";
import { normalizePath } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { BaseSandbox, type BaseSandboxOptions, type IsolationLevel, type NetworkAccess, type ResourceLimitOptions } from "./base.js";
import { positiveInteger } from "./defaults.js";
import { checkTimeout, runProcess } from "./process.js";
import { checkCommand } from "./remote-command.js";
import { createCgroups, oomKills, removeCgroup } from "./cgroups.js";
import {
  BUSYBOX_INSIDE,
  busyboxApplets,
  checkReachable,
  dropTo,
  findExecutable,
  givePath,
  giveTree,
  hostUser,
  LAUNCHER_ENV,
  probe,
  type SandboxUser,
  sandboxEtc,
  systemArgs,
  validateSandboxUser,
  withLockDirectory,
  writePrivateFile,
} from "./bubblewrap-host.js";
import { lockName } from "./shell.js";
import { type Denied, DeniedFinder } from "./masks.js";
import type * as Warm from "./bubblewrap-warm.js";
import type { Supervisor, WarmRun } from "./bubblewrap-warm.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

export type { SandboxUser } from "./bubblewrap-host.js";

let warmModule: Promise<typeof Warm> | undefined;

/** The warm supervisor's module (node:net and its scripts) loads with the first command that can use it, not with the package. */
function loadWarm(): Promise<typeof Warm> {
  warmModule ??= import("./bubblewrap-warm.js");
  return warmModule;
}

/**
 * `quota`, `timeout` and `maxOutputBytes`: BaseSandboxOptions; `memoryMb`
 * and `maxProcesses`: ResourceLimitOptions (defaults in SANDBOX_DEFAULTS).
 */
export interface BubblewrapSandboxOptions extends BaseSandboxOptions, ResourceLimitOptions {
  /**
   * The workspace: a host directory, mounted at /workspace inside the
   * sandbox. Default: a fresh temporary
   * directory, removed by `close()`. When this process is root, the
   * directory and everything in it (directories and singly-linked files;
   * never symlinks) is handed to `sandboxUser` before the first command.
   */
  workspace?: string;
  /** true: the host's network. Default false: a private network namespace with only its own loopback. */
  network?: NetworkAccess;
  /** CPU seconds each process may use (default: no limit; the timeout bounds wall time). */
  cpuSeconds?: number;
  /**
   * Put the sandbox in cgroups for its memory and process limits (default
   * true, when this process may create them). false: rlimits only, which
   * saves the cgroup join on every command (a few ms) but limits memory per
   * process, not per sandbox.
   */
  cgroups?: boolean;
  /**
   * Run commands through a warm supervisor started once inside the
   * sandbox's namespaces (default true; see docs/sandboxes.md): a command
   * then costs a fork and an `unshare`, not a bwrap start. false: a bwrap
   * per command, as BusyBox toolsets and hosts without nested user
   * namespaces always get.
   */
  warm?: boolean;
  /** Extra environment for every command (default: PATH, HOME=/workspace, LANG=C.UTF-8, TMPDIR=/tmp). */
  env?: Record<string, string>;
  /**
   * Where /bin and /usr/bin come from: "host" (default) or "busybox", which
   * replaces them with BusyBox applets (Debian's busybox-static) so the
   * derived file operations can be proven on a BusyBox userland.
   */
  toolset?: "host" | "busybox";
  /**
   * The host uid and gid commands run as when this process is root (default
   * 65534/65534, nobody/nogroup; a dedicated id is better when other
   * services run as nobody). Files commands create are owned by it on the
   * host, so a setuid bit a command sets is never setuid root. Ignored when
   * this process is not root: commands then run as this process's own user.
   */
  sandboxUser?: SandboxUser;
  /** fsync each file the file operations write before it replaces the old one (default true), as FilesystemBackend's option. */
  fsync?: boolean;
  // `quota` (BaseSandboxOptions, default SANDBOX_DEFAULTS.quota): `maxBytes` also bounds every single file
  // a command writes (RLIMIT_FSIZE: the write fails, the writer gets SIGXFSZ) and the private /tmp as a
  // whole (a sized tmpfs); uploads are held to the whole quota. Commands are not held to a total across
  // many files; see docs/sandboxes.md.
}

/**
 * How each limit is enforced. `processes: "none"`: no pids cgroup could be
 * made and commands run as root, whose processes RLIMIT_NPROC does not bind
 * (not the case since root drops to `sandboxUser`; kept for the type).
 * `cpu: "none"`: not set.
 */
export interface BubblewrapLimits {
  memory: "cgroup" | "rlimit";
  processes: "cgroup" | "rlimit" | "none";
  cpu: "rlimit" | "none";
}

/** Where the workspace appears inside the sandbox. */
const SANDBOX_WORKSPACE = "/workspace";

/**
 * The launcher: opens bwrap's argument file (so the host paths in it never
 * appear in bwrap's command line, which the sandbox can read as its
 * /proc/1/cmdline), joins the cgroups named before `--` (0 written to
 * `tasks` moves the writing thread, the whole of this single-threaded
 * shell, without the global lock a write to `cgroup.procs` takes and its
 * RCU grace period of milliseconds), then becomes the
 * rest (setpriv, prlimit, bwrap). It runs as this process's user with
 * LAUNCHER_ENV only.
 */
const LAUNCHER_SCRIPT = `[ -r "$1" ] || { echo "strata: this sandbox's launcher files are gone" >&2; exit 125; }
exec 3< "$1"
shift
while [ "$1" != -- ]; do echo 0 > "$1/tasks" || exit 125; shift; done
shift
exec "$@"`;

let counter = 0;
/** Paths uploaded at once (each holds its lock directory while FilesystemBackend writes it). */
const UPLOAD_CONCURRENCY = 8;

export class BubblewrapSandbox extends BaseSandbox {
  /** How far commands are contained. */
  readonly isolation: IsolationLevel = "namespace";
  readonly id: string;
  readonly workspace = SANDBOX_WORKSPACE;
  /** The workspace directory on the host (symlinks resolved). */
  readonly hostWorkspace: string;
  /** The host user commands run as and workspace files belong to; undefined when this process is not root. */
  readonly sandboxUser: SandboxUser | undefined;
  private readonly ownsWorkspace: boolean;
  private readonly memoryBytes: number;
  private readonly maxProcesses: number;
  private readonly quotaBytes: number | undefined;
  private readonly baseEnv: Record<string, string>;
  private setup: Promise<Setup> | undefined;
  private readonly hostFiles: FilesystemBackend;
  /** Finds what commands must not see; remembers unchanged directories between commands. */
  private deniedFinder: DeniedFinder | undefined;
  /** Warm supervisors taking new commands, by kind ("own", or "caller:" and the masks' key). */
  private readonly supervisors = new Map<string, Supervisor>();
  /** Every supervisor not yet closed, retiring ones included. */
  private readonly allSupervisors = new Set<Supervisor>();

  constructor(private readonly options: BubblewrapSandboxOptions = {}) {
    super(options);
    positiveInteger(options.cpuSeconds, "cpuSeconds");
    if (options.network !== undefined && typeof options.network !== "boolean") throw errors.invalidArgument("network must be true or false");
    checkCommand("", options.env);
    this.baseEnv = { ...this.passedEnv, ...options.env };
    this.quotaBytes = this.quota?.maxBytes;
    this.memoryBytes = this.settings.memoryMb * 1024 * 1024;
    this.maxProcesses = this.settings.maxProcesses;
    this.sandboxUser = hostUser(options.sandboxUser === undefined ? undefined : validateSandboxUser(options.sandboxUser));
    this.ownsWorkspace = options.workspace === undefined;
    // A random name under the temporary directory: the one host path a command can learn (mountinfo) says nothing else.
    const dir = options.workspace ?? mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-"));
    if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.invalidArgument("BubblewrapSandbox workspace must be an existing directory");
    }
    this.hostWorkspace = realpathSync(dir);
    if (this.ownsWorkspace && this.sandboxUser) chownSync(this.hostWorkspace, this.sandboxUser.uid, this.sandboxUser.gid);
    this.hostFiles = new FilesystemBackend({ workspace: this.hostWorkspace, quota: this.quota, permissions: false, fsync: options.fsync });
    this.id = `bwrap-${process.pid}-${++counter}`;
  }

  /** True when bwrap is installed and can create the namespaces (checked once per process, by one tiny run). */
  static async isAvailable(): Promise<boolean> {
    return (await probe(hostUser(undefined))).ok;
  }

  /** Why bwrap cannot be used here, or undefined when it can. */
  static async unavailableReason(): Promise<string | undefined> {
    const result = await probe(hostUser(undefined));
    return result.ok ? undefined : result.reason;
  }

  /** How the limits are enforced; known after the first command. */
  get limits(): BubblewrapLimits | undefined {
    return this.settled?.limits;
  }
  private settled: Setup | undefined;

  protected async doExecute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    checkCommand(command, options.env);
    checkTimeout(options.timeout);
    const cwd = normalizePath(options.cwd ?? "/");
    this.checkCwd(cwd);
    const setup = await this.ready();
    this.assertOpen();
    const maxOutputBytes = options.maxOutputBytes ?? this.settings.maxOutputBytes;
    const env = { ...setup.env, ...options.env };
    // What the rules deny for reading is hidden from the command: found on the host now, masked in its mount namespace.
    const hidden = this.hiddenFromCommand(options);
    let denied: Denied[] = [];
    if (hidden) {
      this.deniedFinder ??= new DeniedFinder(this.hostWorkspace, SANDBOX_WORKSPACE, hidden);
      denied = await this.deniedFinder.find();
    }
    const io = {
      stdin: options.stdin,
      timeout: options.timeout ?? this.settings.timeoutSeconds,
      maxOutputBytes,
      // A caller streaming the raw output (spawn) keeps its own bound on what waits unread.
      killAfterBytes: options.onData ? Number.MAX_SAFE_INTEGER : Math.max(maxOutputBytes, this.settings.maxOutputBytes * 64),
      onOutput: options.onOutput,
      onData: options.onData,
      signal: this.commandSignal(options.signal),
    };
    const warm = setup.warm ? await loadWarm() : undefined;
    if (warm?.warmable(command, env)) {
      const script = warm.slotScript(command, this.sandboxPath(cwd), env);
      const response = await this.runWarm(warm, setup, hidden ? await maskKey(this.hostWorkspace, denied) : undefined, denied, { ...io, script });
      if (response) return this.annotate(response, setup);
    }
    const bwrapArgs = ["--args", "3", "--clearenv"];
    for (const [name, value] of Object.entries(env)) bwrapArgs.push("--setenv", name, value);
    bwrapArgs.push(...maskArgs(denied));
    bwrapArgs.push("--chdir", this.sandboxPath(cwd), "/bin/sh", "-c", command);
    const response = await runProcess({
      file: "/bin/sh",
      args: ["-c", LAUNCHER_SCRIPT, "strata-launcher", setup.argsFile, ...setup.cgroups, "--", ...setup.launcher, ...bwrapArgs],
      cwd: "/",
      env: { ...LAUNCHER_ENV },
      ...io,
    });
    return this.annotate(response, setup);
  }

  /** Says why a command was killed when the memory limit or the quota did it. */
  private async annotate(response: ExecuteResponse, setup: Setup): Promise<ExecuteResponse> {
    if (response.exitCode === 137 && setup.memoryCgroup && (await oomKills(setup.memoryCgroup)) > setup.oomKillsSeen) {
      setup.oomKillsSeen = await oomKills(setup.memoryCgroup);
      response.output += `\n[Command killed: the sandbox's memory limit of ${this.memoryBytes / 1024 / 1024} MiB was reached]`;
    }
    if (response.exitCode === 153 && this.quotaBytes !== undefined) {
      response.output += `\n[Command killed: it wrote a file past the workspace quota of ${this.quotaBytes} bytes]`;
    }
    return response;
  }

  /**
   * Runs a command on a warm supervisor (see bubblewrap-warm.ts): the one
   * for Strata's own scripts and sandboxes without rules, or, for a caller's
   * command under rules that deny reading, the one whose masks are the ones
   * found now (`key`: their paths and inodes). Masks are mounted when a
   * supervisor starts, so when they change a new supervisor starts and the
   * old one closes once its commands end; the two kinds never share one, so
   * a caller's command never reaches the unmasked one. Undefined: the cold
   * path serves (no supervisor could start).
   */
  private async runWarm(warm: typeof Warm, setup: Setup, key: string | undefined, denied: Denied[], job: WarmRun): Promise<ExecuteResponse | undefined> {
    const name = key === undefined ? "own" : `caller:${key}`;
    for (let attempt = 0; attempt < 3 && setup.warm && !this.closed; attempt++) {
      let supervisor = this.supervisors.get(name);
      if (!supervisor || supervisor.dead) {
        if (supervisor) this.forget(supervisor);
        supervisor = this.startSupervisor(warm, setup, denied);
        if (!supervisor) return undefined;
        this.supervisors.set(name, supervisor);
        this.allSupervisors.add(supervisor);
        if (key !== undefined) {
          for (const [other, old] of this.supervisors) {
            if (other !== name && other.startsWith("caller:")) {
              this.supervisors.delete(other);
              old.retire();
            }
          }
        }
      }
      if (!(await supervisor.ready)) {
        this.forget(supervisor);
        return undefined;
      }
      try {
        return await supervisor.run(job);
      } catch (error) {
        if (!(error instanceof warm.NotAccepted)) throw error;
        this.forget(supervisor);
      }
    }
    return undefined;
  }

  /** A new supervisor with these masks, or undefined when its files or cgroup cannot be made (the cold path serves). */
  private startSupervisor(warm: typeof Warm, setup: Setup, denied: Denied[]): Supervisor | undefined {
    try {
      return new warm.Supervisor({
        id: this.id,
        args: setup.args,
        masks: maskArgs(denied),
        cgroups: setup.cgroups,
        pidsCgroup: setup.pidsCgroup!,
        launcher: setup.warmLauncher,
        launcherScript: LAUNCHER_SCRIPT,
        cpuSeconds: this.options.cpuSeconds,
        user: this.sandboxUser,
      });
    } catch {
      return undefined;
    }
  }

  /** Takes no more commands to it, and retires it (it closes once its commands end); close() still ends it unless it is gone already. */
  private forget(supervisor: Supervisor): void {
    for (const [name, known] of this.supervisors) if (known === supervisor) this.supervisors.delete(name);
    if (supervisor.dead) this.allSupervisors.delete(supervisor);
    // A live one forgotten (slots it could not make, not ready) would otherwise hold its bwrap, cgroups and files until close().
    else supervisor.retire();
  }

  /**
   * Straight into the host directory behind /workspace, through
   * FilesystemBackend's descriptor walk, which never follows a symlink, so a
   * link a command planted cannot lead an upload out of the workspace. Ten
   * times faster than moving the bytes through a shell inside the sandbox.
   * As root, what an upload creates is then handed to the sandbox user, so
   * commands can change it.
   */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    this.assertOpen();
    const responses = await this.uploadUnderLocks(files);
    const user = this.sandboxUser;
    if (user) {
      await Promise.all(
        responses.map(async (response) => {
          if (response.error !== null) return;
          try {
            await givePath(this.hostWorkspace, normalizePath(response.path), user);
          } catch {
            // Replaced by a command meanwhile: what is there now is the command's own.
          }
        }),
      );
    }
    return responses;
  }

  /**
   * Each upload holds the path's lock directory (`.strata-lock-<hash>` in
   * the workspace's top directory, see withLockDirectory) around
   * FilesystemBackend's write-and-rename: the lock the sandbox's shell takes
   * for overwrite, edit's compare-and-swap and delete. FilesystemBackend's
   * own lock file is a different protocol the shell cannot see; without
   * this, an upload could land between an edit's checksum compare and its
   * rename, and the edit would put back what the acknowledged upload
   * replaced. (Taking the shell's lock from the host is simpler than the
   * alternatives: moving uploads into the shell costs a round trip and the
   * speed of the host path; moving edits to the host would split the
   * derived operations between two implementations.) Uploads of one path
   * run one after another, in input order; up to 8 paths at once.
   */
  private async uploadUnderLocks(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    const turns = new Map<string, Promise<unknown>>();
    const slots = new Slots(() => UPLOAD_CONCURRENCY);
    return Promise.all(
      files.map((item) => {
        let path: string | undefined;
        try {
          path = normalizePath(item[0]);
        } catch {
          path = undefined; // FilesystemBackend answers it (invalid_path).
        }
        const one = async (): Promise<UploadAnswer> => {
          const upload = async (): Promise<UploadAnswer> => {
            const result = await this.hostFiles.uploadFiles([item]);
            const answer = result.error ? { error: result.error } : result.files[0]!;
            return { path: item[0], error: answer.error?.code ?? null };
          };
          if (path === undefined || path === "/") return upload();
          await slots.acquire();
          try {
            return await withLockDirectory(this.hostWorkspace, lockName(path), upload);
          } catch (error) {
            return { path: item[0], error: isStrataError(error) ? error.code : "io_error" };
          } finally {
            slots.release();
          }
        };
        if (path === undefined) return one();
        const result = (turns.get(path) ?? Promise.resolve()).then(one);
        turns.set(path, result.catch(() => undefined));
        return result;
      }),
    );
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    this.assertOpen();
    const result = await this.hostFiles.downloadFiles(paths);
    if (result.error) return paths.map((path) => ({ path, content: null, error: result.error.code }));
    return result.files.map((f) => ({ path: f.path, content: f.content, error: f.error?.code ?? null }));
  }

  /** Closes the sandbox: removes its cgroups and argument file, and the workspace if the sandbox created it. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    const setup = await this.setup?.catch(() => undefined);
    await Promise.all([...this.allSupervisors].map((supervisor) => supervisor.close()));
    this.allSupervisors.clear();
    this.supervisors.clear();
    for (const dir of setup?.cgroups ?? []) await removeCgroup(dir);
    if (setup) rmSync(setup.argsFile, { force: true });
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
    const user = this.sandboxUser;
    const available = await probe(user);
    if (!available.ok) throw new StrataError("unavailable", available.reason);
    if (user) {
      checkReachable(this.hostWorkspace, user);
      await giveTree(this.hostWorkspace, user);
    }
    const busybox = this.options.toolset === "busybox" ? busyboxApplets() : undefined;
    const args = [
      "--unshare-user",
      "--unshare-pid",
      "--unshare-ipc",
      "--unshare-uts",
      "--unshare-cgroup-try",
      ...(this.options.network === true ? [] : ["--unshare-net"]),
      "--die-with-parent",
      "--new-session",
      "--hostname",
      "strata",
      ...systemArgs(),
    ];
    if (busybox) {
      args.push("--ro-bind", busybox.binary, BUSYBOX_INSIDE);
      for (const dir of ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]) {
        if (!lstatSync(dir, { throwIfNoEntry: false })?.isSymbolicLink()) args.push("--ro-bind", busybox.applets, dir);
      }
    }
    const uid = user?.uid ?? process.getuid?.() ?? 0;
    const gid = user?.gid ?? process.getgid?.() ?? 0;
    args.push("--ro-bind", sandboxEtc(uid, gid), "/etc");
    // Often a symlink into /run; bwrap binds what it points to.
    if (this.options.network === true && existsSync("/etc/resolv.conf")) args.push("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf");
    args.push("--proc", "/proc", "--dev", "/dev");
    // A size of 0 would mean "no limit" to tmpfs.
    if (this.quotaBytes !== undefined) args.push("--size", String(Math.max(this.quotaBytes, 1)));
    args.push("--tmpfs", "/tmp", "--bind", this.hostWorkspace, SANDBOX_WORKSPACE);
    // The root is bwrap's scratch tmpfs; read-only, so /workspace and /tmp are the only writable places.
    args.push("--remount-ro", "/");

    const cgroups = this.options.cgroups === false ? {} : await createCgroups(`strata-${this.id}`, this.memoryBytes, this.maxProcesses);
    const runsAsRoot = uid === 0;
    const limits: BubblewrapLimits = {
      memory: cgroups.memory ? "cgroup" : "rlimit",
      processes: cgroups.pids ? "cgroup" : runsAsRoot ? "none" : "rlimit",
      cpu: this.options.cpuSeconds ? "rlimit" : "none",
    };
    const rlimits = [
      ...(cgroups.memory ? [] : [`--as=${this.memoryBytes}`]),
      ...(cgroups.pids ? [] : [`--nproc=${this.maxProcesses}`]),
      ...(this.options.cpuSeconds ? [`--cpu=${this.options.cpuSeconds}`] : []),
      ...(this.quotaBytes !== undefined ? [`--fsize=${this.quotaBytes}`] : []),
    ];
    const bwrap = findExecutable("bwrap")!;
    let launcher = [bwrap];
    if (rlimits.length > 0) {
      const prlimit = findExecutable("prlimit");
      if (!prlimit) throw new StrataError("unavailable", "prlimit (Debian package util-linux) is needed to set the sandbox's limits");
      launcher = [prlimit, ...rlimits, "--", bwrap];
    }
    // setpriv before prlimit: RLIMIT_NPROC is then checked against the sandbox user's processes, not root's.
    launcher = [...dropTo(user), ...launcher];
    // The warm supervisor lives long: CPU seconds bind each command (ulimit -t), not the supervisor.
    const warmRlimits = rlimits.filter((limit) => !limit.startsWith("--cpu="));
    const warmLauncher = [...dropTo(user), ...(warmRlimits.length > 0 ? [findExecutable("prlimit")!, ...warmRlimits, "--"] : []), bwrap];

    const argsFile = writePrivateFile(`args-${this.id}-${nodeCrypto().randomBytes(6).toString("hex")}`, args.map((arg) => `${arg}\0`).join(""));
    const env: Record<string, string> = {
      PATH: busybox ? "/usr/bin:/bin" : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      HOME: SANDBOX_WORKSPACE,
      LANG: "C.UTF-8",
      TMPDIR: "/tmp",
      ...this.baseEnv,
    };
    return {
      argsFile,
      args,
      launcher,
      warmLauncher,
      pidsCgroup: cgroups.pids,
      // Without a pids cgroup nothing could find what a command left running: a bwrap per command then.
      warm: this.options.warm !== false && cgroups.pids !== undefined,
      env,
      limits,
      cgroups: [cgroups.pids, cgroups.memory].filter((dir): dir is string => dir !== undefined),
      memoryCgroup: cgroups.memory,
      oomKillsSeen: cgroups.memory ? await oomKills(cgroups.memory) : 0,
    };
  }
}

/**
 * bwrap arguments that hide each denied path: a file becomes /dev/null
 * (read-only: empty, unwritable), a directory an empty read-only tmpfs. The
 * mounts come after the workspace's bind, in the command's own namespace; a
 * mounted-over path cannot be renamed or linked from inside (EBUSY, EXDEV).
 */
function maskArgs(denied: Denied[]): string[] {
  const args: string[] = [];
  for (const { path, dir } of denied) {
    const target = `${SANDBOX_WORKSPACE}/${path}`;
    if (dir) args.push("--tmpfs", target, "--remount-ro", target);
    else args.push("--ro-bind", "/dev/null", target);
  }
  return args;
}

/**
 * What a set of masks stands for: each denied path, whether a directory, and
 * its inode. A path replaced on the host (a new inode under the same name)
 * is no longer covered by a mount made on the old one, so it needs a new
 * supervisor as surely as a new path does.
 */
async function maskKey(hostWorkspace: string, denied: Denied[]): Promise<string> {
  const parts = await Promise.all(
    denied.map(async ({ path, dir }) => {
      const stat = await lstat(nodePath.join(hostWorkspace, path), { bigint: true }).catch(() => undefined);
      return `${path}\0${dir ? "d" : "f"}\0${stat ? `${stat.dev}:${stat.ino}` : "-"}`;
    }),
  );
  return parts.sort().join("\0\0");
}

interface Setup {
  /** bwrap's namespace and mount arguments, NUL-separated, read through fd 3 (--args). */
  argsFile: string;
  /** The same arguments, as a list (the warm supervisors write their own file, with their masks). */
  args: string[];
  /** argv between the launcher script and bwrap's per-command arguments: setpriv, prlimit, bwrap. */
  launcher: string[];
  /** The same for a warm supervisor: no CPU limit on the supervisor itself. */
  warmLauncher: string[];
  /** The sandbox's pids cgroup, under which warm supervisors make one cgroup per command slot. */
  pidsCgroup: string | undefined;
  /** Commands go to a warm supervisor (false: `warm: false`, or no pids cgroup). */
  warm: boolean;
  env: Record<string, string>;
  limits: BubblewrapLimits;
  /** cgroup directories the launcher joins. */
  cgroups: string[];
  memoryCgroup: string | undefined;
  oomKillsSeen: number;
}
