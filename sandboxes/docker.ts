/**
 * DockerSandbox: a long-lived container (no network by default, memory,
 * CPU and process limits) with the workspace in a directory inside it.
 * Commands and scripts run as requests on exec sessions kept open
 * (docker-session.ts: an exec costs four daemon requests, a request on a
 * running shell a fork). Sessions run as root only: root's own work (the
 * secret lock, the workspace set-up) runs there as it is, and the
 * unprivileged user's commands and scripts are started by root, dropped to
 * the user for the command only (droppedBody: setpriv, or BusyBox's
 * nsenter -S), waited for and reported by root. A session shell of the
 * user itself could be hijacked by the user's own leftovers
 * (reusesSessions). An image that has neither keeps an exec per command, under the shared wrapper
 * (remote-command.ts). Uploads move as raw bytes on the stdin of one
 * request per batch (a session's up to 1 MiB, an exec's beyond).
 *
 * The container is the isolation boundary. Commands, uploads and downloads
 * run as an unprivileged user (default 65534:65534, `user` to change it),
 * so nothing a command creates is setuid root on the host, and a file
 * transfer can do nothing the command could not do itself. By default the
 * root filesystem is read-only too: only the workspace (a volume of the
 * container's own) and /tmp (a tmpfs) are writable.
 *
 * Links, one rule per direction. Reads (download, `read`, `cat`) resolve a
 * path as the shell does, following links wherever they point inside the
 * container, with the user's rights: a download can show nothing a command
 * could not print. Changes (upload, `write`, `edit`, `delete`, …) never
 * pass through a link: a link among the parent directories refuses the
 * change (permission_denied), a link at the path is the change's object. The check and the write are not
 * one atomic step, but both run as the command user, so a command racing
 * them gains nothing it could not do itself.
 *
 * Stopping commands: a timeout, an abort or close() kills the command's
 * process group, every process carrying its marker variable, every process
 * still holding its output pipe, and, in a container this sandbox owns
 * (created, or removeOnClose), every orphan started since the command
 * began, which catches `setsid env -i cmd >/dev/null &`. An attached
 * sandbox shares the container with others, so there such an escapee
 * (its own session, no marker, output elsewhere) survives: the limit of
 * attach. After a normal exit, only what still holds the output is killed;
 * a background job writing elsewhere is left running, as in every sandbox.
 *
 * Not hidden: /proc/self/mountinfo shows the host paths of the workspace
 * volume and the image layers (Docker does not mask it). No host process
 * takes a path or environment from the caller, so they are inert.
 *
 * Why not the archive API: the daemon unpacks an archive as root, outside
 * the container's mounts, following links a command planted (a link to
 * /usr/bin let an upload replace /usr/bin/ls in the read-only image, and a
 * link to /tmp landed files in the image's /tmp, under the tmpfs the shell
 * sees). It also resolves links against the image, not as the shell does.
 */
import { once } from "node:events";
import { type Duplex, Writable } from "node:stream";
import type Docker from "dockerode";
import { StrataError, errors, isStrataError, type ErrorCode } from "../core/errors.js";
import { timeoutSeconds } from "../core/limits.js";
import { ancestorsOf, joinPath, normalizePath } from "../core/paths.js";
import type { PermissionPolicy } from "../core/permissions.js";
import type { DownloadAnswer, UploadAnswer } from "../core/base.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import { BaseSandbox, type BaseSandboxOptions, type IsolationLevel, type NetworkAccess, type ResourceLimitOptions } from "./base.js";
import { sandboxLimits } from "./defaults.js";
import { Slots } from "../core/concurrency.js";
import { MARKER_VARIABLE, RemoteRun, STOPPED_PREFIX, SWEEP_KILL, SWEEP_ROUNDS, UNLESS_STOPPED, WRAPPER, checkCommand, newMarker } from "./remote-command.js";
import { feedStdin } from "./process.js";
import { LOCK_FN, QUOTA_FN, lockName } from "./shell.js";
import { optionalPackage } from "../stores/optional-package.js";
import { denialFindScript } from "./masks.js";
import { type DropTool, ExecSession, SESSION_STDIN_BYTES, SessionPool, doneLine, endMarker, lineQuote } from "./docker-session.js";

/** The dockerode package, loaded when a DockerSandbox first makes a client (an optional peer dependency). */
const dockerode = optionalPackage<typeof Docker>("dockerode", "DockerSandbox");

/**
 * `quota`, `timeout` and `maxOutputBytes`: BaseSandboxOptions; `memoryMb`
 * and `maxProcesses`: ResourceLimitOptions, applied to a created container
 * (defaults in SANDBOX_DEFAULTS; swap counts towards the memory).
 */
export interface DockerSandboxOptions extends BaseSandboxOptions, ResourceLimitOptions {
  /**
   * The workspace: a directory inside the container. Default "/workspace".
   * `create` mounts a volume there; `attach` creates it if missing (owned by `user`).
   */
  workspace?: string;
  /** A Dockerode client, or the daemon's unix socket path. Default: DOCKER_HOST, else /var/run/docker.sock. */
  docker?: Docker | string;
  /**
   * The user commands and file transfers run as, "uid:gid" (numeric, so the
   * image needs no passwd entry). Default "65534:65534" (nobody). "0:0" runs
   * them as root, which lets a command leave setuid-root files in the volume
   * on the host.
   */
  user?: string;
  /**
   * A created container's network. Default false: none at all (Docker's
   * "none" network, only a loopback). true: Docker's default bridge, or the
   * network `dockerNetwork` names.
   */
  network?: NetworkAccess;
  /**
   * The Docker network a created container joins ("host", a user-defined
   * network, …) when `network` is true or left out; with `network: false` it
   * is `invalid_argument`. Default: the default bridge.
   */
  dockerNetwork?: string;
  /** CPU limit of a created container, in CPUs (1.5 = one and a half). Default: none. */
  cpus?: number;
  /**
   * Seconds a created container lives, enforced inside it: its first process
   * exits at the deadline and the daemon removes the container and its
   * volume, whether or not this process is still running. The deadline is
   * also a label (`strata.deadline`, Unix seconds), so `sweepExpired` (run by
   * every `create`) removes one that outlived it. Default: no limit.
   */
  lifetimeSeconds?: number;
  /** Environment of every command, on top of the image's. */
  env?: Record<string, string>;
  /** Labels of a created container. */
  labels?: Record<string, string>;
  /**
   * Mount the image read-only, so a command can write only to the workspace
   * and /tmp (default true). Set false for work that installs into the image
   * (apt, pip into the system; with `user: "0:0"`).
   */
  readOnlyRoot?: boolean;
  /** Remove the container (and its workspace volume) on close(). Default: true for create, false for attach. */
  removeOnClose?: boolean;
}

/** The label holding a created container's deadline, in Unix seconds. */
export const DEADLINE_LABEL = "strata.deadline";
const DEFAULT_USER = "65534:65534";
const ROOT = "0:0";
const USER_PATTERN = /^\d{1,10}(:\d{1,10})?$/;

/** Locks each path ($2…, relative to the workspace $1): owned by root, no access for group and others. A path gone meanwhile is skipped; -h: a symlink swapped in is changed itself, never its target. */
const LOCK = `cd "$1" || exit 1
shift
for f; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  chown -h 0:0 -- "$f" || exit 1
  [ -L "$f" ] || chmod go-rwx -- "$f" || exit 1
done`;

/**
 * PID 1: waits until the deadline ($1, Unix seconds; empty for none),
 * reaping orphans meanwhile, then exits, which stops the container. The
 * sleep is restarted if something kills it, and the remaining time is read
 * from the clock each round, so a restarted container keeps its deadline.
 */
const INIT = `trap 'exit 0' TERM
while :; do
  n=3600
  if [ -n "$1" ]; then n=$(($1 - $(date +%s))); [ "$n" -gt 0 ] || exit 0; fi
  sleep "$n" & wait $!
done`;

/**
 * Run before the shared WRAPPER, in the same shell: reports the exec's
 * output pipe and the shell's start time (clock ticks since boot), as
 * "strata-run <pipe inode> <start>" on stderr. A process that still holds
 * the pipe is one of the command's, whatever it did to its group and
 * environment; an orphan that started later is one of the command's in a
 * container nothing else runs in.
 */
const PRELUDE = `strata_run() { set -f; set -- $1; echo "strata-run $1 \${21}" >&2; set +f; }
i=$(readlink /proc/$$/fd/1 2>/dev/null); i=\${i#pipe:[}; i=\${i%]}
{ read -r l </proc/$$/stat; } 2>/dev/null
strata_run "\${i:-none} \${l##*) }"
unset -f strata_run; unset i l
`;

/**
 * `sh -c KILL strata <pgid> <marker> <pipe inode> <since>`, as the command user: kills
 * the group, then, in rounds (SWEEP_KILL), every process carrying the marker
 * with the group it leads, every process holding the pipe, and (given
 * `since`) every orphan (parent PID 1) started at or after `since`. The
 * last two alone: after a normal exit the wrapper still holds the pipe for
 * a moment, and its group holds what the caller left running on purpose
 * (`sleep 1000 >/dev/null &`). Only shell
 * builtins run before the first kill, so it works even when a fork bomb has
 * used up the process limit.
 */
const KILL = `g=$1 m=$2 i=$3 t=$4
[ -n "$g" ] && kill -9 -"$g" 2>/dev/null
[ -z "$m" ] || : > "${STOPPED_PREFIX}$m" 2>/dev/null
idle=
for _ in ${SWEEP_ROUNDS}; do
  k= j=
  if [ -n "$m" ]; then
    k="$k $(grep -l -z -F "${MARKER_VARIABLE}=$m" /proc/[0-9]*/environ 2>/dev/null | sed 's|^/proc/||; s|/environ$||')"
  fi
  if [ -n "$i" ]; then
    o=$(ls -l /proc/[0-9]*/fd 2>/dev/null)
    while IFS= read -r l; do
      case $l in
        /proc/*/fd:) p=\${l#/proc/} p=\${p%/fd:} ;;
        *" pipe:[$i]") j="$j $p" ;;
      esac
    done <<EOF
$o
EOF
  fi
  if [ -n "$t" ]; then
    for s in /proc/[0-9]*/stat; do
      { read -r l <"$s"; } 2>/dev/null || continue
      p=\${l%% *}; l=\${l##*) }
      set -f; set -- $l; set +f
      [ "$2" = 1 ] && [ "$p" != 1 ] && [ "\${20}" -ge "$t" ] && j="$j $p"
    done
  fi
  ${SWEEP_KILL}
done
exit 0`;

/**
 * `sh -c UPLOAD strata <workspace> <max bytes> <max files> <path> <size> <lock>...`,
 * as the command user, with the files' bytes concatenated on stdin. The
 * quota (-1: no limit) is kept here, in the same request: the workspace is
 * measured (QUOTA_FN) before the first file, and each file counts as a new
 * one of its full size (an overwrite is over-counted, never under), as
 * BaseSandbox counts them; a file that would not fit answers "quota" and
 * the next may still fit. Each file is written to
 * a temporary name beside its target, checked to hold exactly <size> bytes
 * (stdin cut short by close() or a dropped connection is only an early end
 * of file to dd: a torn temporary never replaces the target), then renamed
 * over the target holding the path's lock directory <workspace>/<lock>
 * (LOCK_FN, the lock the shell's overwrite, edit's compare-and-swap and
 * delete take), so an edit cannot put back content an acknowledged upload
 * replaced. `mv -T` renames: a link in the final component is replaced,
 * never written through, and a directory there refuses the file. Every
 * directory below the workspace is checked on the way down: a link (planted
 * by a command) refuses the file, a missing directory is made with plain
 * mkdir, which never follows one. One status line per file: ok, link,
 * notdir, isdir, denied, busy, failed, quota. A file that cannot be written still
 * has its bytes consumed; when the stream position is lost (a write failed
 * or came up short), the rest of the batch fails.
 */
const UPLOAD = `W=$1 QB=$2 QF=$3 UB=-1 UF=-1; shift 3
set -C
n=0 broken= locked= t=
${LOCK_FN}
${QUOTA_FN}
trap '[ -z "$locked" ] || rmdir -- "$L"; [ -z "$t" ] || rm -f -- "$t"' EXIT
take() {
  [ "$1" -gt 0 ] || return 0
  # One dd for a file up to 1 MiB; bigger ones in 64 KiB blocks plus the rest.
  [ "$1" -le 1048576 ] && { dd bs="$1" count=1 iflag=fullblock 2>/dev/null; return; }
  q=$(($1 / 65536)) r=$(($1 % 65536))
  dd bs=65536 count="$q" iflag=fullblock 2>/dev/null || return 1
  [ "$r" -eq 0 ] || dd bs="$r" count=1 iflag=fullblock 2>/dev/null
}
place() {
  r=\${1#"$W"/} a=$W
  while :; do
    case $r in */*) ;; *) break ;; esac
    a=$a/\${r%%/*} r=\${r#*/}
    [ -L "$a" ] && { st=link; return; }
    [ -d "$a" ] && continue
    [ -e "$a" ] && { st=notdir; return; }
    mkdir -- "$a" 2>/dev/null && continue
    if [ -L "$a" ]; then st=link; elif [ -d "$a" ]; then continue; else st=denied; fi
    return
  done
  if [ -d "$1" ] && [ ! -L "$1" ]; then st=isdir; else st=ok; fi
}
while [ $# -gt 2 ]; do
  p=$1 s=$2 L=$W/$3; shift 3
  if ! room "$s" 1 >/dev/null; then [ -n "$broken" ] || take "$s" >/dev/null || broken=1; echo quota; continue; fi
  [ "$UB" -lt 0 ] || UB=$((UB + s)) UF=$((UF + 1))
  [ -z "$broken" ] || { echo failed; continue; }
  place "$p"
  if [ "$st" = ok ]; then
    n=$((n + 1)) t=\${p%/*}/.strata-tmp-$$-$n
    # noclobber: the temporary is created with O_EXCL, never through a link that appears meanwhile.
    if { : >"$t"; } 2>/dev/null; then
      if take "$s" >>"$t" && [ "$(($(wc -c < "$t")))" -eq "$s" ]; then
        if lock 2>/dev/null; then
          if mv -f -T -- "$t" "$p" 2>/dev/null; then st=ok
          elif [ -d "$p" ] && [ ! -L "$p" ]; then st=isdir
          else st=denied; fi
          rmdir -- "$L" 2>/dev/null; locked=
        else
          st=busy
        fi
        [ "$st" = ok ] || rm -f -- "$t"
        t=; echo "$st"; continue
      fi
      rm -f -- "$t"; t=; broken=1; echo failed; continue
    fi
    t= st=denied
  fi
  take "$s" >/dev/null || broken=1
  echo "$st"
done`;

/**
 * `sh -c FETCH strata <path>...`, as the command user: a status line per
 * path (f file, d directory, m missing, s not a regular file, p unreadable),
 * ".", the sizes of the readable files, ".", then those files' bytes, raw
 * and concatenated. Paths resolve as the shell (and `cat`, and `read`)
 * resolves them: links are followed wherever they point inside the
 * container, as the user. While the loop runs, "$@" is rebuilt to hold only
 * the readable files (the loop's list was expanded before it began).
 */
const FETCH = `exec 2>/dev/null
for p do
  shift
  if [ -d "$p" ]; then echo d
  elif [ ! -e "$p" ]; then echo m
  elif [ ! -f "$p" ]; then echo s
  elif [ ! -r "$p" ]; then echo p
  else echo f; set -- "$@" "$p"
  fi
done
echo .
[ $# -gt 0 ] || exit 0
stat -L -c %s -- "$@"
echo .
cat -- "$@"`;

/** Bytes of arguments per exec of a batch script, well under Linux's argv limits. */
const ARGV_BATCH_BYTES = 512 * 1024;
/** Bytes of file content per upload exec: the batch is streamed, this only bounds what one failure costs. */
const UPLOAD_BATCH_BYTES = 256 * 1024 * 1024;
/** How long close() waits for the kills of running commands. */
const CLOSE_KILL_MS = 10_000;

/** What the prelude reported about one run. */
interface RunInfo {
  pipe?: string;
  since?: string;
}

/** A variable name sh can `export` as it is (anything else takes an exec of its own, whose Env takes any name). */
const SH_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export class DockerSandbox extends BaseSandbox {
  /** How far commands are contained: a container of their own. */
  readonly isolation: IsolationLevel = "container";
  /** The container's id. */
  readonly id: string;
  readonly workspace: string;
  /** The "uid:gid" commands and transfers run as. */
  readonly user: string;
  /** One upload at a time under a quota (see doUpload). */
  private readonly uploadTurns = new Slots(() => 1);
  /** The upload script measures the workspace and keeps the quota itself (UPLOAD): one request per batch, not two. */
  protected override uploadsKeepQuota = true;
  /**
   * Round trips, by kind: execs made (a session is one), requests run by a
   * session that was already running, archive transfers. What a test counts
   * to check that a batch is one transfer.
   */
  /**
   * Requests to the Engine API, counted by kind. `kills` counts the execs (among `execs`) that killed what a command left
   * holding its output: they follow a command by killGraceMs, later than its answer, and a loaded machine makes them more likely.
   */
  readonly stats = { execs: 0, sessionRequests: 0, putArchives: 0, getArchives: 0, kills: 0 };
  /** Kills in flight, so close() can wait until what ran is stopped. */
  private readonly kills = new Set<Promise<void>>();
  /** Reused exec sessions (docker-session.ts), per user. */
  private readonly pools = new Map<string, SessionPool>();
  /** Set once a root session reported it cannot drop to the user (neither setpriv --reuid nor nsenter -S): the user's work takes an exec each. */
  private dropUnsupported = false;
  /** The HOME the container's configuration sets ("" for none), looked up once, for dropped requests. */
  private imageHome: Promise<string> | undefined;

  private constructor(
    /** The Dockerode client: the escape hatch to anything this class does not cover. */
    readonly client: Docker,
    readonly container: Docker.Container,
    workspace: string,
    private readonly options: DockerSandboxOptions,
    /** A sandbox that removes the container owns it: it may kill any process in it. */
    private readonly removeOnClose: boolean,
  ) {
    super(options);
    this.id = container.id;
    this.workspace = workspace;
    this.user = options.user ?? DEFAULT_USER;
  }

  /**
   * Creates and starts a container from `image` (which must be present;
   * nothing is pulled). First removes containers whose `lifetimeSeconds` ran out
   * (`sweepExpired`), in case their first process could not stop them.
   */
  static async create(options: DockerSandboxOptions & { image: string }): Promise<DockerSandbox> {
    const workspace = checkOptions(options);
    if (workspace === "/") throw errors.invalidArgument("DockerSandbox workspace must be a directory below '/'");
    const lifetime = options.lifetimeSeconds === undefined ? undefined : timeoutSeconds(options.lifetimeSeconds, "lifetimeSeconds");
    const networkMode = networkModeOf(options);
    const docker = dockerClient(options.docker);
    const limits = resourceLimits(options);
    await DockerSandbox.sweepExpired(docker).catch(() => undefined);
    const deadline = lifetime === undefined ? undefined : Math.ceil(Date.now() / 1000 + lifetime);
    let container: Docker.Container;
    try {
      container = await docker.createContainer({
        Image: options.image,
        Entrypoint: ["/bin/sh", "-c", INIT, "strata-init", deadline === undefined ? "" : String(deadline)],
        Cmd: [],
        WorkingDir: "/",
        Labels: { "strata.sandbox": "docker", ...options.labels, ...(deadline === undefined ? {} : { [DEADLINE_LABEL]: String(deadline) }) },
        // An anonymous volume: writable under a read-only root, kept across restarts, removed with the container.
        Volumes: { [workspace]: {} },
        HostConfig: {
          NetworkMode: networkMode,
          SecurityOpt: ["no-new-privileges:true"],
          ReadonlyRootfs: options.readOnlyRoot ?? true,
          Tmpfs: { "/tmp": "rw,nosuid,nodev,mode=1777" },
          // When the first process exits at the deadline, the daemon removes the container and its volume.
          AutoRemove: deadline !== undefined,
          ...limits,
        },
      });
    } catch (error) {
      if (statusOf(error) === 404) throw new StrataError("unavailable", `Docker image '${options.image}' is not present; build or pull it first`);
      throw daemonError(error);
    }
    const sandbox = new DockerSandbox(docker, container, workspace, options, options.removeOnClose ?? true);
    try {
      await container.start();
      await sandbox.makeWorkspace(true);
    } catch (error) {
      await container.remove({ force: true, v: true }).catch(() => undefined);
      throw daemonError(error);
    }
    return sandbox;
  }

  /** Reattaches to an existing container by id (starting it if it stopped), e.g. after a restart of this process. */
  static async attach(containerId: string, options: DockerSandboxOptions = {}): Promise<DockerSandbox> {
    const workspace = checkOptions(options);
    const docker = dockerClient(options.docker);
    const container = docker.getContainer(containerId);
    try {
      const info = await container.inspect();
      if (!info.State.Running) await container.start();
      const sandbox = new DockerSandbox(docker, docker.getContainer(info.Id), workspace, options, options.removeOnClose ?? false);
      await sandbox.makeWorkspace(false);
      return sandbox;
    } catch (error) {
      if (statusOf(error) === 404) throw new StrataError("unavailable", `Docker container '${containerId}' does not exist`);
      throw daemonError(error);
    }
  }

  /**
   * Removes every container (running or not) whose `strata.deadline` label
   * lies in the past, with its volumes; returns how many. `create` runs it;
   * a provider may run it at start-up.
   */
  static async sweepExpired(docker?: Docker | string): Promise<number> {
    const client = dockerClient(docker);
    const now = Date.now() / 1000;
    let removed = 0;
    for (const info of await client.listContainers({ all: true, filters: { label: [DEADLINE_LABEL] } })) {
      const deadline = Number(info.Labels[DEADLINE_LABEL]);
      if (!(deadline < now)) continue;
      await client
        .getContainer(info.Id)
        .remove({ force: true, v: true })
        .then(() => removed++, () => undefined);
    }
    return removed;
  }

  protected async doExecute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    checkCommand(command, options.env);
    const timeout = options.timeout ?? this.settings.timeoutSeconds;
    const cwd = normalizePath(options.cwd ?? "/");
    const marker = newMarker();
    const stdin = options.stdin;
    const sandboxMax = this.settings.maxOutputBytes;
    const maxOutputBytes = options.maxOutputBytes ?? sandboxMax;

    // What the rules deny for reading is locked away from the command user first (files that appeared since the last command too).
    const hidden = this.hiddenFromCommand(options);
    if (hidden) await this.lockDenied(hidden);

    // The caller's environment reaches the command inside the container only (a session's request, or an exec's configuration), no host process.
    const env = { ...this.passedEnv, ...this.options.env, ...options.env, [MARKER_VARIABLE]: marker };
    const info: RunInfo = {};
    let abandon = () => undefined as void;
    const run = new RemoteRun({
      cwd,
      timeout,
      maxOutputBytes,
      // A caller streaming the raw output (spawn) keeps its own bound on what waits unread.
      killAfterBytes: options.onData ? Number.MAX_SAFE_INTEGER : Math.max(maxOutputBytes, sandboxMax * 64),
      onOutput: options.onOutput,
      onData: options.onData,
      // close() aborts this signal too: the command is killed and the call rejects with sandbox_closed.
      signal: this.commandSignal(options.signal),
      // A sweep (timeout, abort, close, endless output) kills everything of the run; after a normal exit only what holds its
      // output open (the group too only where the pipe is unknown): a background job writing elsewhere is the caller's, however
      // late a loaded machine brings the stream's end.
      kill: (pgid, sweep) =>
        this.kill([sweep || info.pipe === undefined ? pgid : undefined, sweep ? marker : undefined, info.pipe, sweep && this.removeOnClose ? info.since : undefined]),
      abandon: () => abandon(),
    });
    // The run may settle (an abort, close()) while the session or exec below is still being set up; the caller gets it as returned.
    run.result.catch(() => undefined);
    // Stdin given as bytes or text (not a stream) fits a session's request; a stream, or names sh cannot export, take an exec of their own.
    const inline = stdin === undefined ? new Uint8Array(0) : typeof stdin === "string" ? new TextEncoder().encode(stdin) : stdin instanceof Uint8Array ? stdin : undefined;
    const sessionable =
      this.sessionsFor(this.user) &&
      inline !== undefined &&
      inline.length <= SESSION_STDIN_BYTES &&
      Object.keys(env).every((name) => SH_NAME.test(name)) &&
      (reusesSessions(this.user) || Buffer.byteLength(environmentLine(env)) <= DROPPED_ENV_BYTES);
    // Aborted (or closed) before it could start: it never starts.
    if (run.finished) return run.result;
    if (sessionable) {
      const started = await this.executeInSession(command, cwd, env, inline, run, info, (fn) => (abandon = fn), this.isOwnScript(options));
      if (started) return run.result;
    }
    let exec: Docker.Exec;
    let stream: Duplex;
    try {
      this.stats.execs++;
      exec = await this.container.exec({
        Cmd: ["/bin/sh", "-c", PRELUDE + WRAPPER, "strata", this.sandboxPath(cwd), command],
        Env: Object.entries(env).map(([name, value]) => `${name}=${value}`),
        User: this.user,
        AttachStdin: stdin !== undefined,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
      stream = await exec.start({ hijack: true, stdin: stdin !== undefined });
    } catch (error) {
      run.fail(this.containerError(error));
      return run.result;
    }
    abandon = () => stream.destroy();
    // Aborted while the exec was being set up: the kill's mark stops the wrapper, if it is not stopped already.
    if (run.finished) {
      stream.destroy();
      return run.result;
    }
    let prelude = "";
    let preludeDone = false;
    this.client.modem.demuxStream(
      stream,
      sink((chunk) => run.stdout(chunk)),
      sink((chunk) => {
        if (preludeDone) return run.stderr(chunk);
        prelude += Buffer.from(chunk).toString("latin1");
        const end = prelude.indexOf("\n");
        if (end === -1) return;
        preludeDone = true;
        const ours = readPrelude(prelude.slice(0, end), info);
        const rest = Buffer.from(ours ? prelude.slice(end + 1) : prelude, "latin1");
        if (rest.length > 0) run.stderr(rest);
      }),
    );
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      run.end(async () => (await exec.inspect()).ExitCode ?? null);
    };
    stream.on("end", end).on("close", end).on("error", (error) => run.fail(this.containerError(error)));
    if (stdin !== undefined) {
      // Half-closing the hijacked connection is what gives the command end-of-file on its stdin.
      feedStdin(stdin, stream);
    }
    return run.result;
  }

  /**
   * Runs a command through a reused session (docker-session.ts): the same
   * prelude and WRAPPER as an exec of its own, started under setsid so it
   * leads a process group, its stdin (if any) read by dd from the session.
   * False when no session can run here (the caller takes an exec); a
   * session that ends before the command started is replaced once. Returns
   * once the request is sent: `run` settles as it ends.
   */
  private async executeInSession(
    command: string,
    cwd: string,
    env: Record<string, string>,
    stdin: Uint8Array,
    run: RemoteRun,
    info: RunInfo,
    setAbandon: (abandon: () => void) => void,
    own: boolean,
  ): Promise<boolean> {
    const ids = dropIds(this.user);
    const pool = this.pool(ids ? ROOT : this.user);
    const input = stdin.length > 0 ? `dd bs=${stdin.length} count=1 iflag=fullblock 2>/dev/null | ` : "";
    const start = async (attempt: number): Promise<boolean> => {
      let session: ExecSession | undefined;
      try {
        session = await pool.acquire();
      } catch (error) {
        if (attempt === 0) return false;
        run.fail(this.containerError(error));
        return true;
      }
      if (!session) {
        if (attempt > 0) run.end(async () => null);
        return attempt > 0;
      }
      let body: (token: string) => string;
      if (ids) {
        const drop = await this.userDrop(session);
        if (drop === undefined) {
          // The image cannot drop to the user (neither setpriv with --reuid nor nsenter -S): its commands take an exec each from now on.
          this.dropUnsupported = true;
          pool.release(session);
          if (attempt > 0) run.end(async () => null);
          return attempt > 0;
        }
        // HOME first, so the caller's own HOME (if any) wins, as in an exec's Env.
        const environment = environmentLine({ HOME: drop.home, ...env });
        body = droppedBody(ids, drop.prefix, command, this.sandboxPath(cwd), environment, input, own);
      } else {
        const exports = Object.entries(env).map(([name, value]) => `${name}=${lineQuote(value)}`).join(" ");
        // The shells around the command write nothing on stderr (a job-kill notice would pass for output): the wrapper's reports and
        // the status go to the session's stderr through fd 3, which the supervisor opened on it.
        body = (token: string) =>
          `{ { ${input}{ ( export ${exports}; exec setsid /bin/sh -c "$WRAP" strata ${lineQuote(this.sandboxPath(cwd))} ${lineQuote(command)} 2>&3 )${input ? "" : " </dev/null"}; ` +
          `s=$?; ${input ? "cat >/dev/null; " : ""}echo "strata-status $s" >&3; } | cat; } 2>/dev/null; ${endMarker(token)}; ${doneLine(token)}; }`;
      }
      const current = session;
      // Aborted while a session was found: the request is not sent.
      if (run.finished) {
        pool.release(current);
        return true;
      }
      setAbandon(() => current.destroy());
      this.stats.sessionRequests++;
      let prelude = true;
      current.send(
        body,
        {
          stdout: (chunk) => run.stdout(chunk),
          stderrLine: (line) => {
            if (prelude) {
              prelude = false;
              if (readPrelude(line, info)) return;
            }
            run.stderr(Buffer.from(`${line}\n`));
          },
          end: ({ status, received }) => {
            // Stdin not known to be read whole (the drain did not finish): the session's input may be out of step.
            if (stdin.length > 0 && status === undefined) current.retire();
            pool.release(current);
            // The session ended before the command started (a command killed it while idle): once more on a new one.
            if (!received && attempt === 0) {
              void start(1);
              return;
            }
            run.end(async () => status ?? null);
          },
        },
        stdin,
      );
      return true;
    };
    return start(0);
  }

  /**
   * The session pool of one user. Root's sessions of a sandbox whose user
   * can be dropped to (dropIds) run as dropUser and also look up how to drop
   * to the user, for the user's work; root's own work shares them.
   */
  private pool(user: string): SessionPool {
    const ids = user === ROOT ? dropIds(this.user) : undefined;
    const as = ids ? dropUser(ids) : user;
    let pool = this.pools.get(as);
    if (!pool) {
      pool = new SessionPool(async () => {
        this.stats.execs++;
        return ExecSession.open(this.client, this.container, as, PRELUDE + WRAPPER, ids);
      });
      this.pools.set(as, pool);
    }
    return pool;
  }

  /** Whether work as `user` may ride a session: root's always, an unprivileged user's on a root session dropping to it (until the image turns out unable to). */
  private sessionsFor(user: string): boolean {
    if (reusesSessions(user)) return true;
    return user === this.user && dropIds(user) !== undefined && !this.dropUnsupported;
  }

  /**
   * How a dropped request of this session becomes the user: the command
   * prefix that drops (dropPrefix), and the HOME an exec as the user gets,
   * which the request sets (the drop keeps root's): the image's HOME when
   * its configuration sets one, else the home of the uid's /etc/passwd
   * entry, else "/" (what runc does). Undefined when the session cannot drop.
   */
  private async userDrop(session: ExecSession): Promise<{ prefix: string; home: string } | undefined> {
    const ids = dropIds(this.user);
    if (session.drop === undefined || ids === undefined) return undefined;
    this.imageHome ??= this.container.inspect().then(
      (info) => (info.Config.Env ?? []).filter((entry) => entry.startsWith("HOME=")).map((entry) => entry.slice(5)).pop() ?? "",
      () => "",
    );
    return { prefix: dropPrefix(session.drop.via, ids), home: (await this.imageHome) || session.drop.home };
  }

  /**
   * Files go in through one request per batch (paths in argv, bytes on
   * stdin: a session's up to 1 MiB, else an exec), run as the command user. A link in the way is refused (permission_denied),
   * a link at the path itself is replaced; see UPLOAD.
   */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    const responses: UploadAnswer[] = [];
    const pending: { index: number; path: string; target: string; content: Uint8Array }[] = [];
    for (const item of files) {
      const rawPath: unknown = Array.isArray(item) ? item[0] : item;
      const index = responses.length;
      try {
        if (this.closed) throw errors.sandboxClosed(`Sandbox '${this.id}'`);
        const path = normalizePath(rawPath as string);
        const content: unknown = Array.isArray(item) ? item[1] : undefined;
        if (!(content instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        responses.push({ path: rawPath as string, error: path === "/" ? "is_directory" : null });
        if (path !== "/") pending.push({ index, path, target: this.sandboxPath(path), content });
      } catch (error) {
        responses.push({ path: String(rawPath), error: fileError(error) });
      }
    }
    // Each upload measures the workspace before it places its files: under a quota, uploads of this sandbox take turns, or
    // several starting together would each measure before the others land and together pass the limit.
    if (this.quota) await this.uploadTurns.acquire();
    try {
      await this.uploadBatches(pending, responses);
    } finally {
      if (this.quota) this.uploadTurns.release();
    }
    return responses;
  }

  private async uploadBatches(pending: { index: number; path: string; target: string; content: Uint8Array }[], responses: UploadAnswer[]): Promise<void> {
    for (const batch of argvBatches(pending, (file) => file.target, (file) => file.content.length, UPLOAD_BATCH_BYTES)) {
      let statuses: string[];
      try {
        const args = batch.flatMap((file) => [file.target, String(file.content.length), lockName(file.path)]);
        const limits = [this.quota?.maxBytes ?? -1, this.quota?.maxFiles ?? -1].map(String);
        const { output } = await this.run(["/bin/sh", "-c", UPLOAD, "strata", this.workspace, ...limits, ...args], {
          user: this.user,
          stdin: batch.map((file) => file.content),
        });
        statuses = output.split("\n");
      } catch {
        statuses = [];
      }
      batch.forEach((file, i) => {
        responses[file.index]!.error = uploadError(statuses[i]);
      });
    }
  }

  /**
   * Files come out through one exec per batch, raw bytes on its stdout,
   * streamed into one buffer per file (never one string or buffer for the
   * batch). A path resolves as `cat` resolves it in the container; see FETCH.
   */
  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    const responses: DownloadAnswer[] = [];
    const wanted: { index: number; target: string }[] = [];
    for (const rawPath of paths) {
      try {
        if (this.closed) throw errors.sandboxClosed(`Sandbox '${this.id}'`);
        const path = normalizePath(rawPath);
        if (path === "/") throw errors.isDirectory(path);
        wanted.push({ index: responses.length, target: this.sandboxPath(path) });
        responses.push({ path: rawPath, content: null, error: null });
      } catch (error) {
        responses.push({ path: String(rawPath), content: null, error: fileError(error) });
      }
    }
    for (const batch of argvBatches(wanted, (file) => file.target, () => 0, 0)) {
      let results = await this.fetch(batch.map((file) => file.target)).catch(() => undefined);
      if (results === undefined && batch.length > 1) {
        // A file changed size between stat and cat: the offsets are off, so each is read on its own.
        results = [];
        for (const file of batch) results.push((await this.fetch([file.target]).catch(() => undefined))?.[0] ?? { content: null, error: "permission_denied" });
      }
      batch.forEach((file, i) => Object.assign(responses[file.index]!, results?.[i] ?? { content: null, error: "permission_denied" }));
    }
    return responses;
  }

  /**
   * Stops every running command (their calls reject with `sandbox_closed`)
   * and detaches; a container this sandbox created (or was told to own) is
   * removed, which also stops whatever else runs in it.
   */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    for (const pool of this.pools.values()) pool.destroyAll();
    if (this.removeOnClose) {
      await this.container.remove({ force: true, v: true }).catch(() => undefined);
      return;
    }
    // The abort above started a kill per running command; an attached sandbox waits until they are done.
    const pending = Promise.allSettled([...this.kills]);
    await Promise.race([pending, new Promise((resolve) => setTimeout(resolve, CLOSE_KILL_MS).unref())]);
  }

  // ---- internals ----

  /** Creates the workspace as root and hands it to the user: always for a created container, only when missing for an attached one. */
  private async makeWorkspace(own: boolean): Promise<void> {
    const script = own
      ? `mkdir -p -- "$1" && chown "$2" "$1"`
      : `[ -d "$1" ] || { mkdir -p -- "$1" && chown "$2" "$1"; }`;
    const { exitCode } = await this.run(["/bin/sh", "-c", script, "strata", this.workspace, this.user], { user: ROOT });
    if (exitCode !== 0) throw new StrataError("permission_denied", "Cannot create the workspace directory in the container");
  }

  /**
   * Hides what the rules deny for reading from the command user: as root,
   * finds the paths they match that are not locked yet and makes each owned
   * by root with no access for anyone else (a directory: nothing under it can
   * be reached). The user cannot read, chmod or hard-link them (Linux's
   * protected_hardlinks), and a symlink it plants leads to a locked file.
   * Runs before every command, so a secret that appeared since the last one
   * is locked before the next starts: a request on the root session (two
   * when something new must be locked), not an exec. Needs a non-root `user`: root reads
   * everything (docs/permissions.md).
   */
  private async lockDenied(policy: PermissionPolicy): Promise<void> {
    if (this.user.split(":")[0] === "0") return;
    const find = denialFindScript(policy.rules);
    if (find === undefined) return;
    let found: { output: string; exitCode: number | null };
    try {
      found = await this.run(["/bin/sh", "-c", `W=$1\n${find}`, "strata", this.workspace], { user: ROOT });
    } catch (error) {
      throw this.containerError(error);
    }
    // Without find nothing could be found, so nothing hidden: the command is refused rather than run unprotected.
    if (found.exitCode === 126 || found.exitCode === 127) {
      throw new StrataError("unavailable", "The image has no usable find, which the sandbox needs to hide the files its permission rules deny from commands");
    }
    const denied = new Set(
      found.output
        .split("\0")
        .filter((p) => p.startsWith("./"))
        .map((p) => p.slice(2))
        .filter((p) => policy.denies("read", joinPath(this.workspace, p))),
    );
    // A locked directory hides what is under it: only the topmost paths are locked.
    const top = [...denied].filter((p) => !ancestorsOf(`/${p}`).some((a) => denied.has(a.slice(1))));
    for (let i = 0; i < top.length; i += 500) {
      const batch = top.slice(i, i + 500);
      const { exitCode } = await this.run(["/bin/sh", "-c", LOCK, "strata", this.workspace, ...batch], { user: ROOT });
      if (exitCode !== 0) throw new StrataError("permission_denied", "The sandbox could not hide a file its permission rules deny from the command, so the command was not run");
    }
  }

  /**
   * Runs argv in the container, feeding `stdin` (then end-of-file) and
   * handing stdout to `stdout` (default: collected as text); for the
   * sandbox's own commands. With stdin up to SESSION_STDIN_BYTES (or none)
   * it goes through a session (root's, dropped to the user for the user's
   * scripts; its stderr dropped, as here); with more, an exec of its own.
   */
  private async run(
    argv: string[],
    options: { user: string; stdin?: readonly Uint8Array[]; stdout?: Writable },
  ): Promise<{ output: string; exitCode: number | null }> {
    // Stdin up to SESSION_STDIN_BYTES travels on the session after the request, read by root's dd (exactly its length).
    const stdin = inlineStdin(options.stdin);
    if (stdin !== undefined && this.sessionsFor(options.user)) {
      const ids = reusesSessions(options.user) ? undefined : dropIds(options.user);
      const input = stdin.length > 0 ? `dd bs=${stdin.length} count=1 iflag=fullblock 2>/dev/null | ` : "";
      // After the script, the rest of its stdin is drained, so the session's input stays in step whatever the script read.
      const [redirect, drain] = stdin.length > 0 ? ["", "cat >/dev/null; "] : ["</dev/null", ""];
      const command = argv.map(lineQuote).join(" ");
      for (let attempt = 0; attempt < 2; attempt++) {
        const pool = this.pool(ids ? ROOT : options.user);
        const session = await pool.acquire().catch(() => undefined);
        if (!session) break;
        let script = `{ ${input}{ ${command} ${redirect} 2>/dev/null; s=$?; ${drain}echo "strata-status $s" >&3; }; }`;
        if (ids) {
          const drop = await this.userDrop(session);
          if (drop === undefined) {
            this.dropUnsupported = true;
            pool.release(session);
            break;
          }
          // The user's process gets none of the session's descriptors: stdin its bytes (a pipe from root's dd) or /dev/null,
          // stdout a pipe of its own (copied by root's cat), no stderr, no fd 3; its status comes from root's wait.
          script =
            `{ { ${input}{ HOME=${lineQuote(drop.home)} ${drop.prefix} ${command} ${redirect} 2>/dev/null 3>&-; s=$?; ${drain}` +
            `echo "strata-status $s" >&3; } | cat; } 2>/dev/null; }`;
        }
        const answer = await this.runInSession(pool, session, script, options.stdout, stdin);
        if (answer) return answer;
      }
    }
    return this.runExec(argv, options);
  }

  /** One request of `run` on a session; undefined when the session ended before the script started. */
  private runInSession(
    pool: SessionPool,
    session: ExecSession,
    script: string,
    stdout: Writable | undefined,
    stdin: Uint8Array,
  ): Promise<{ output: string; exitCode: number | null } | undefined> {
    this.stats.sessionRequests++;
    const chunks: Buffer[] = [];
    return new Promise((resolve, reject) => {
      session.send(
        (token) => `{ ${script}; ${endMarker(token)}; ${doneLine(token)}; }`,
        {
          stdout: (chunk) => (stdout ? stdout.write(chunk) : chunks.push(Buffer.from(chunk))),
          stderrLine: () => undefined,
          end: ({ status, received, sessionEnded }) => {
            // Stdin not known to be read whole: the session's input may be out of step.
            if (stdin.length > 0 && status === undefined) session.retire();
            pool.release(session);
            if (!received) return resolve(undefined);
            if (sessionEnded && status === undefined) return reject(new Error("the session ended during the script"));
            stdout?.end();
            resolve({ output: Buffer.concat(chunks).toString("utf8"), exitCode: status ?? null });
          },
        },
        stdin,
      );
    });
  }

  /** Runs argv through an exec of its own (see `run`). */
  private async runExec(
    argv: string[],
    options: { user: string; stdin?: readonly Uint8Array[]; stdout?: Writable },
  ): Promise<{ output: string; exitCode: number | null }> {
    this.stats.execs++;
    const withStdin = options.stdin !== undefined;
    const exec = await this.container.exec({ Cmd: argv, User: options.user, AttachStdin: withStdin, AttachStdout: true, AttachStderr: true, Tty: false });
    const stream = await exec.start({ hijack: true, stdin: withStdin });
    const chunks: Buffer[] = [];
    this.client.modem.demuxStream(stream, options.stdout ?? sink((chunk) => chunks.push(Buffer.from(chunk))), sink(() => undefined));
    const done = new Promise<void>((resolve, reject) => {
      stream.on("end", resolve).on("close", resolve).on("error", reject);
    });
    if (withStdin) {
      try {
        for (const part of options.stdin!) {
          if (part.length > 0 && !stream.write(part)) await Promise.race([once(stream, "drain"), done]);
        }
      } finally {
        stream.end();
      }
    }
    await done;
    options.stdout?.end();
    return { output: Buffer.concat(chunks).toString("utf8"), exitCode: (await exec.inspect()).ExitCode ?? null };
  }

  /**
   * KILL from a second exec. When a fork bomb holds every process
   * slot the exec itself cannot start; after a few tries the container is
   * restarted, which kills everything in it (the files stay).
   */
  private kill(args: (string | number | undefined)[]): Promise<void> {
    const argv = ["/bin/sh", "-c", KILL, "strata", ...args.map((arg) => (arg === undefined ? "" : String(arg)))];
    const attempt = async () => {
      for (let tries = 0; tries < 5; tries++) {
        try {
          // As the command user: root in a container lacks CAP_SYS_PTRACE, so it cannot see another user's open files.
          this.stats.kills++;
          const { exitCode } = await this.runExec(argv, { user: this.user });
          if (exitCode === 0) return;
        } catch {
          // The exec could not start; try again.
        }
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      await this.container.restart({ t: 0 }).catch(() => undefined);
    };
    const kill = attempt();
    this.kills.add(kill);
    void kill.finally(() => this.kills.delete(kill));
    return kill;
  }

  /** One FETCH exec. Rejects when the bytes received do not match the sizes reported (a file changed meanwhile). */
  private async fetch(targets: string[]): Promise<Pick<DownloadAnswer, "content" | "error">[]> {
    const parser = new FetchParser(targets.length);
    await this.run(["/bin/sh", "-c", FETCH, "strata", ...targets], { user: this.user, stdout: parser });
    return parser.results();
  }

  /** Maps a failure to reach or use the container to a typed error. */
  private containerError(error: unknown): StrataError {
    if (isStrataError(error)) return error;
    const status = statusOf(error);
    if (status === 404) return new StrataError("unavailable", `Docker container '${this.id.slice(0, 12)}' no longer exists`, { cause: error });
    if (status === 409) return new StrataError("unavailable", `Docker container '${this.id.slice(0, 12)}' is not running`, { cause: error });
    return daemonError(error);
  }
}

/**
 * Reads FETCH's output as it streams: the status and size lines, then the
 * body, copied straight into one buffer per file (exact sizes, so no batch
 * ever needs one buffer or string for all its files).
 */
class FetchParser extends Writable {
  private stage: "status" | "size" | "body" = "status";
  private partial = "";
  private readonly statuses: string[] = [];
  private readonly sizes: number[] = [];
  private buffers: Uint8Array[] = [];
  /** A single file takes whatever cat sends, even if it changed size since stat. */
  private readonly single: Buffer[] = [];
  private file = 0;
  private offset = 0;
  private overflow = false;

  constructor(private readonly count: number) {
    super();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: () => void): void {
    let data = chunk;
    while (this.stage !== "body" && data.length > 0) {
      const newline = data.indexOf(10);
      if (newline === -1) {
        this.partial += data.toString("latin1");
        return done();
      }
      this.line(this.partial + data.subarray(0, newline).toString("latin1"));
      this.partial = "";
      data = data.subarray(newline + 1);
    }
    if (data.length > 0) this.body(data);
    done();
  }

  private line(line: string): void {
    if (this.stage === "status") {
      if (line !== ".") this.statuses.push(line);
      else this.stage = this.statuses.includes("f") ? "size" : "body";
    } else if (line !== ".") {
      this.sizes.push(Number(line));
    } else {
      this.stage = "body";
      if (this.sizes.length > 1) this.buffers = this.sizes.map((size) => new Uint8Array(size));
    }
  }

  private body(data: Buffer): void {
    if (this.sizes.length === 1) {
      this.single.push(Buffer.from(data));
      return;
    }
    while (data.length > 0) {
      const buffer = this.buffers[this.file];
      if (!buffer) {
        this.overflow = true;
        return;
      }
      const n = Math.min(buffer.length - this.offset, data.length);
      buffer.set(data.subarray(0, n), this.offset);
      this.offset += n;
      data = data.subarray(n);
      if (this.offset === buffer.length) {
        this.file++;
        this.offset = 0;
      }
    }
  }

  /** The answer per path; throws when the output does not add up (a file changed between stat and cat). */
  results(): Pick<DownloadAnswer, "content" | "error">[] {
    const files = this.statuses.filter((status) => status === "f").length;
    if (this.statuses.length !== this.count || this.sizes.length !== files) throw new Error("incomplete listing");
    if (files > 1) {
      while (this.file < this.buffers.length && this.buffers[this.file]!.length === 0) this.file++;
      if (this.overflow || this.file !== this.buffers.length || this.offset !== 0) throw new Error("sizes changed");
    }
    if (files === 1) {
      const whole = Buffer.concat(this.single);
      // A plain Uint8Array, as every backend returns (a Buffer compares unequal to one).
      this.buffers = [new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength)];
    }
    let next = 0;
    return this.statuses.map((status) => {
      if (status === "f") return { content: this.buffers[next++]!, error: null };
      return { content: null, error: status === "d" ? "is_directory" : status === "m" ? "file_not_found" : "permission_denied" };
    });
  }
}

/** Splits items into groups small enough for one exec's argv and, given a limit, for one exec's stdin. */
function* argvBatches<T>(items: T[], name: (item: T) => string, size: (item: T) => number, maxBytes: number): Generator<T[]> {
  for (let start = 0; start < items.length; ) {
    let end = start;
    let args = 0;
    let bytes = 0;
    while (
      end < items.length &&
      (end === start || (args + Buffer.byteLength(name(items[end]!)) < ARGV_BATCH_BYTES && (maxBytes === 0 || bytes + size(items[end]!) <= maxBytes)))
    ) {
      args += Buffer.byteLength(name(items[end]!)) + 24;
      bytes += size(items[end++]!);
    }
    yield items.slice(start, end);
    start = end;
  }
}

/** Validates what create and attach share, before either reaches the daemon; returns the workspace. */
function checkOptions(options: DockerSandboxOptions): string {
  sandboxLimits(options);
  if (options.user !== undefined && (typeof options.user !== "string" || !USER_PATTERN.test(options.user))) {
    throw errors.invalidArgument(`user must be a numeric "uid:gid", got ${JSON.stringify(options.user)}`);
  }
  if (options.workspace !== undefined && typeof options.workspace !== "string") throw errors.invalidArgument("DockerSandbox workspace must be a path");
  return normalizePath(options.workspace ?? "/workspace");
}

function uploadError(status: string | undefined): ErrorCode | null {
  switch (status) {
    case "ok":
      return null;
    case "isdir":
      return "is_directory";
    case "notdir":
      return "not_a_directory";
    case "quota":
      return "quota_exceeded";
    case "failed":
      return "io_error";
    default:
      // "link": a link in the way is refused like an unwritable directory; "denied", or no answer at all.
      return "permission_denied";
  }
}

function dockerClient(docker: Docker | string | undefined): Docker {
  // A client the caller made is used as it is (even one made by another copy of dockerode).
  if (typeof docker === "object" && docker !== null) return docker;
  const Client = dockerode();
  if (typeof docker === "string") return new Client({ socketPath: docker.replace(/^unix:\/\//, "") });
  return new Client();
}

/** A created container's memory, process and CPU limits (memoryMb and maxProcesses checked by sandboxLimits). */
function resourceLimits(options: DockerSandboxOptions): Docker.HostConfig {
  const { memoryMb, maxProcesses } = sandboxLimits(options);
  if (options.cpus !== undefined && !(typeof options.cpus === "number" && options.cpus > 0 && Number.isFinite(options.cpus))) {
    throw errors.invalidArgument(`cpus must be a positive number, got ${String(options.cpus)}`);
  }
  const memory = memoryMb * 1024 * 1024;
  return {
    Memory: memory,
    MemorySwap: memory,
    PidsLimit: maxProcesses,
    ...(options.cpus === undefined ? {} : { NanoCpus: Math.round(options.cpus * 1e9) }),
  };
}

/** A created container's NetworkMode: "none" unless `network` is true or `dockerNetwork` names one. */
function networkModeOf(options: DockerSandboxOptions): string {
  const { network, dockerNetwork } = options;
  if (network !== undefined && typeof network !== "boolean") {
    throw errors.invalidArgument("network must be true or false; name a Docker network with dockerNetwork");
  }
  if (dockerNetwork !== undefined && (typeof dockerNetwork !== "string" || dockerNetwork === "")) {
    throw errors.invalidArgument("dockerNetwork must be the name of a Docker network");
  }
  if (network === false && dockerNetwork !== undefined) {
    throw errors.invalidArgument("network: false gives no network; dockerNetwork names one: give one or the other");
  }
  if (dockerNetwork !== undefined) return dockerNetwork;
  return network === true ? "bridge" : "none";
}

/** Reads the prelude's "strata-run <pipe> <start>" line into `info`; false when the line is not the prelude's. */
function readPrelude(line: string, info: RunInfo): boolean {
  const [word, pipe, since] = line.split(" ");
  if (word !== "strata-run") return false;
  if (/^\d+$/.test(pipe ?? "")) info.pipe = pipe;
  if (/^\d+$/.test(since ?? "")) info.since = since;
  return true;
}

/** A Writable that hands each chunk to `write`. */
function sink(write: (chunk: Uint8Array) => void): Writable {
  return new Writable({
    write(chunk: Uint8Array, _encoding, done) {
      write(chunk);
      done();
    },
  });
}

function fileError(error: unknown): ErrorCode {
  if (isStrataError(error)) return error.code;
  return "permission_denied";
}

function statusOf(error: unknown): number | undefined {
  const status = (error as { statusCode?: unknown } | null)?.statusCode;
  return typeof status === "number" ? status : undefined;
}

function isConnectionError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === "ECONNREFUSED" || code === "ENOENT" || code === "EACCES" || code === "ECONNRESET" || code === "EPIPE";
}

/** The daemon's own messages can name host paths (its data root), so none is passed on. */
function daemonError(error: unknown): StrataError {
  if (isStrataError(error)) return error;
  if (isConnectionError(error)) return new StrataError("unavailable", "Cannot reach the Docker daemon", { cause: error });
  const status = statusOf(error);
  return new StrataError("unavailable", `The Docker daemon refused the request${status ? ` (HTTP ${status})` : ""}`, { cause: error });
}

/**
 * Whether work as `user` may run on a session OF THAT USER. Root only: a
 * session's shell runs as the user it serves, and any process of that user
 * (a command's leftover) can open the shell's stdin through /proc/PID/fd/0
 * and write requests it would run as its own, outside every command's group
 * and timeout, forging later answers. Root's sessions are out of an
 * unprivileged command's reach (another user's /proc fds), and a command
 * that runs as root owns the container anyway. An unprivileged user's work
 * rides root's sessions, dropped per request (dropIds, dropUser), or takes an exec each.
 */
function reusesSessions(user: string): boolean {
  const name = user.split(":")[0];
  return name === "0" || name === "root";
}

/** A numeric "uid:gid" (uid not 0) that root can drop to per request; "uid" alone takes Docker's passwd lookup (group, supplementary groups), so an exec. */
function dropIds(user: string): { uid: string; gid: string } | undefined {
  const match = /^(\d+):(\d+)$/.exec(user);
  if (!match) return undefined;
  const [uid, gid] = [Number(match[1]), Number(match[2])];
  if (uid === 0 || uid > 0xfffffffe || gid > 0xfffffffe) return undefined;
  return { uid: String(uid), gid: String(gid) };
}

/**
 * The user a root session that drops to `ids` runs as: "0:<gid>", so Docker
 * gives it the user's group and groups as it gives an exec of "uid:gid"
 * (BusyBox has no way to set supplementary groups but to clear them).
 * Root's own work on it is unchanged: root's capabilities go with uid 0, it
 * sets owners explicitly (LOCK: 0:0, the workspace: the user), and the user
 * can do nothing more to a process of uid 0 with its group (signals and
 * ptrace go by uid; no /proc/PID entry opens wider to the group than to
 * others).
 */
function dropUser(ids: { uid: string; gid: string }): string {
  return `0:${ids.gid}`;
}

/**
 * Drops to the ids as Docker's exec of "uid:gid" sets them: real, effective
 * and saved ids, the group as the only supplementary one (capabilities go
 * with uid 0). setpriv sets all of them; BusyBox's nsenter -S sets the uids
 * only, the session (dropUser) having the group and groups already. Neither
 * forks (nsenter -F: it would only to enter a PID namespace), so no
 * root-owned process stays between root's shell and the command.
 */
function dropPrefix(via: DropTool, ids: { uid: string; gid: string }): string {
  return via === "setpriv" ? `setpriv --reuid=${ids.uid} --regid=${ids.gid} --groups=${ids.gid} --` : `nsenter -F -S ${ids.uid} --`;
}

/**
 * `sh -c USER_START strata <cwd> <command>`, fd 4 a pipe holding one line:
 * the first thing that runs as the user in a dropped request. It reads the
 * environment line (`export NAME='value' ...`, newlines in values as
 * "$NL") and evaluates it, so the caller's variables are interpreted by
 * the user's shell only, never set on a process that runs as root
 * (setsid and the drop would honour PATH, LD_PRELOAD, LD_LIBRARY_PATH, ...).
 * It reads the pipe from its descriptor (reopening it through /proc is
 * refused: the pipe is root's). Then it enters the cwd as the user (so a
 * directory the user may not enter is refused as with an exec) and
 * becomes the command's shell (same PID, so the process group root
 * started). Status 200 makes root check, as the user, whether the cwd was
 * the reason.
 */
const USER_START = `NL='
'
IFS= read -r l <&4; exec 4<&-; eval "$l"
${UNLESS_STOPPED}
cd -- "$1" 2>/dev/null || exit 200
exec /bin/sh -c "$2"`;

/**
 * USER_START for a derived operation's own script (BaseSandbox.runScript),
 * which is plain sh that sets what it uses: it runs in this shell, with no
 * positional parameters, rather than in a shell of its own (an exec less
 * per file operation).
 */
const OWN_START = USER_START.replace(`exec /bin/sh -c "$2"`, `strata_script=$2; set --; eval "$strata_script"`);

/** Longest environment line a dropped request carries (the user's shell reads it a byte per call); longer takes an exec. */
const DROPPED_ENV_BYTES = 32 * 1024;

/** The environment line USER_START evaluates: one `export`, every value quoted for the user's shell. */
function environmentLine(env: Record<string, string>): string {
  return `export ${Object.entries(env).map(([name, value]) => `${name}=${lineQuote(value)}`).join(" ")}`;
}

/**
 * A command of the unprivileged user as a request on a root session. Root
 * does what the wrapper does for an exec, so that what the host trusts
 * comes from root: it reports the request's output pipe (its inode from
 * fdinfo, Linux 5.14+, else readlink) and start time (for the kill),
 * starts the command under setsid, dropped to the user by `drop`, reports
 * its process group, waits for it and reports its status, then (once the
 * pipe's last holder closed it) the end marker and done line. The user's
 * process holds none of the session's descriptors: its stdin is its own
 * bytes (read from the session by root's dd) or /dev/null, its stdout and
 * stderr the request's pipe (both pipes handed to the user, as runc hands
 * an exec's stdio), fd 3 closed, fd 4 the environment line's pipe
 * (closed once read). The caller's text (command, cwd, env values) is
 * quoted, never evaluated by root, and no process running as root gets the
 * caller's environment: the line travels on a pipe to the user's shell.
 */
function droppedBody(
  ids: { uid: string; gid: string },
  drop: string,
  command: string,
  cwd: string,
  environment: string,
  input: string,
  own = false,
): (token: string) => string {
  return (token) =>
    `{ { ${input}{ ${input ? "exec 5<&0; " : ""}read -r p _ </proc/self/stat; i=; while read -r k v; do [ "$k" != ino: ] || i=$v; done </proc/$p/fdinfo/1; ` +
    `[ -n "$i" ] || { i=$(readlink /proc/$p/fd/1); i=\${i#pipe:[}; i=\${i%]}; }; ` +
    `read -r l </proc/$p/stat; set -f; set -- \${l##*) }; set +f; echo "strata-run \${i:-none} \${20}" >&3; ` +
    // The command's pipes become the user's, as runc makes an exec's stdio (uid only), so /dev/stdout, /dev/stderr and
    // /dev/stdin open for it as they do in an exec (a pipe is reopened through /proc with its inode's permissions).
    // Own scripts never reopen their stdio: no chown process for them.
    (own ? "" : `chown ${ids.uid} /proc/self/fd/1${input ? " /proc/self/fd/0" : ""} 2>/dev/null; `) +
    // `\\n` reaches the shell as the two characters printf reads as a newline: a raw newline would make the request a multi-line one,
    // which the supervisor must read with a dd of its own.
    `printf '%s\\n' ${lineQuote(environment)} | { exec 4<&0 </dev/null; ` +
    `setsid ${drop} /bin/sh -c ${lineQuote(own ? OWN_START : USER_START)} strata ${lineQuote(cwd)} ${lineQuote(command)} ${input ? "0<&5 5<&-" : "</dev/null"} 3>&- 2>&1 & ` +
    `c=$!; exec 4<&-; echo "strata-pgid $c" >&3; wait $c; s=$?; ` +
    `[ $s != 200 ] || ${drop} /bin/sh -c 'cd -- "$1"' strata ${lineQuote(cwd)} </dev/null >/dev/null 2>&1 3>&- || echo strata-nocwd >&3; ` +
    // The rest of the command's stdin is drained before its exit is reported (dd has read it whole from the session, so the
    // session's input is in step): from the exit report to the end, only exits remain, well inside the kill's grace period.
    `${input ? "cat <&5 >/dev/null; exec 5<&-; " : ""}echo "strata-exit $s" >&3; echo "strata-status $s" >&3; }; ${input ? "exec 5<&-; " : ""}} | cat; } 2>/dev/null; ` +
    `${endMarker(token)}; ${doneLine(token)}; }`;
}

/** A script's stdin as one buffer when it is small enough to ride a session (none: empty), else undefined (an exec of its own). */
function inlineStdin(parts: readonly Uint8Array[] | undefined): Uint8Array | undefined {
  if (parts === undefined) return new Uint8Array(0);
  let total = 0;
  for (const part of parts) total += part.length;
  if (total > SESSION_STDIN_BYTES) return undefined;
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
}
