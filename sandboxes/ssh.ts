/**
 * SshSandbox: a workspace directory on a machine reached over SSH. One
 * connection carries everything: each command runs on an exec channel under
 * the shared wrapper (remote-command.ts), files move over one SFTP session,
 * many at a time. A dropped connection fails what was in flight with
 * `unavailable`, and the next call connects again.
 *
 * The remote account is the isolation boundary: a command can do whatever
 * that user can on that machine. Use a dedicated, unprivileged user. The
 * user's login shell must be POSIX-compatible (sh, dash, bash, zsh): it
 * parses the command line this class sends.
 *
 * What another user of the machine can see: `ps` shows every process's
 * argv, so the exec line is a fixed text; the environment, the working
 * directory and the command travel over the channel's stdin (see EXEC_LINE).
 */
import { readFileSync } from "node:fs";
import type ssh2 from "ssh2";
import type { ClientChannel, ConnectConfig, SFTPWrapper, Stats } from "ssh2";
import { Slots, mapLimit } from "../core/concurrency.js";
import { StrataError, errors, isStrataError, type ErrorCode } from "../core/errors.js";
import type { DownloadAnswer, UploadAnswer } from "../core/base.js";
import { timeoutSeconds } from "../core/limits.js";
import { baseName, normalizePath, parentOf } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import { BaseSandbox, type BaseSandboxOptions, type IsolationLevel } from "./base.js";
import { sandboxLimits } from "./defaults.js";
import { KILL_SCRIPT, MARKER_VARIABLE, RemoteRun, WRAPPER, checkCommand, newMarker } from "./remote-command.js";
import { feedStdin } from "./process.js";
import { LOCK_FN, int, shellQuote, statusError, tempName } from "./shell.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";
import { optionalPackage } from "../stores/optional-package.js";

/** The ssh2 package, loaded when an SshSandbox first connects (an optional peer dependency). */
const loadSsh2 = optionalPackage<typeof ssh2>("ssh2", "SshSandbox");

/**
 * `fin TEMP TARGET SIZE LOCK` per uploaded file, after SFTP wrote TEMP:
 * checks TEMP holds SIZE bytes, then renames it over TARGET (`mv -T`: a
 * link there is replaced, a directory refuses it) holding the path's lock
 * directory LOCK (LOCK_FN). Prints ok, isdir, denied, busy or failed; a
 * TEMP that does not land is removed.
 */
/** The last line of FINISH_UPLOADS's list of calls (a comment to the shell). */
const END_OF_CALLS = "# strata: end of calls";
const FINISH_UPLOADS = `locked=
trap '[ -z "$locked" ] || rmdir -- "$L"' EXIT
fin() {
  L=$4
  [ "$(($(wc -c < "$1")))" -eq "$3" ] || { rm -f -- "$1"; echo failed; return; }
  lock || { rm -f -- "$1"; echo busy; return; }
  if mv -f -T -- "$1" "$2"; then st=ok; elif [ -d "$2" ] && [ ! -L "$2" ]; then st=isdir; else st=denied; fi
  rmdir -- "$L"; locked=
  [ "$st" = ok ] || rm -f -- "$1"
  echo "$st"
}`;

/**
 * `quota`, `timeout` and `maxOutputBytes`: BaseSandboxOptions (defaults in
 * SANDBOX_DEFAULTS). Commands have the remote machine's network: this
 * sandbox cannot cut it.
 */
export interface SshSandboxOptions extends BaseSandboxOptions {
  host: string;
  /** Default 22. */
  port?: number;
  username: string;
  /** Private key (OpenSSH or PEM), the usual way in. */
  privateKey?: string | Buffer;
  passphrase?: string;
  password?: string;
  /** An SSH agent's socket (usually `process.env.SSH_AUTH_SOCK`): its keys are tried after `privateKey`. */
  agent?: string;
  /**
   * The server's public key ("ssh-ed25519 AAAA…", as in known_hosts or a
   * .pub file). A server presenting another key is refused before any
   * credential is sent. One of `hostKey`, `knownHosts` or
   * `insecureAcceptAnyHostKey` is required.
   */
  hostKey?: string;
  /** Path of an OpenSSH known_hosts file (plain or hashed entries) that must list the server's key. */
  knownHosts?: string;
  /**
   * Accepts whatever key the server presents: anyone who can intercept the
   * connection can impersonate the server and read every file and secret
   * sent. For throwaway test machines only.
   */
  insecureAcceptAnyHostKey?: true;
  /** The workspace: an absolute directory on the remote machine; created if missing. */
  workspace: string;
  /** Environment of every command, on top of the login environment. */
  env?: Record<string, string>;
  /** Seconds to wait for the connection. Default 20. */
  connectTimeoutSeconds?: number;
  /**
   * Seconds between keepalive probes (default 10); after 3 unanswered, the
   * connection counts as lost and what is in flight fails with `unavailable`.
   */
  keepaliveIntervalSeconds?: number;
}

/**
 * Exec channels open at once. OpenSSH allows 10 sessions per connection by
 * default (MaxSessions); the SFTP session and timeout kills need room too.
 */
const MAX_COMMANDS = 6;
/** SFTP requests in flight at once (SFTP pipelines them on its one channel). */
const SFTP_CONCURRENCY = 64;
/** Attempts at a kill's channel, 200 ms apart. */
const KILL_TRIES = 25;
/** How long `close()` waits for the kills of running commands to reach the server: longer than a kill's retries. */
const CLOSE_KILL_WAIT_MS = KILL_TRIES * 200 + 2_000;
const KEEPALIVE_COUNT = 3;
/** `connectTimeoutSeconds` unless the options say otherwise. */
const CONNECT_TIMEOUT_SECONDS = 20;
/** `keepaliveIntervalSeconds` unless the options say otherwise. */
const KEEPALIVE_INTERVAL_SECONDS = 10;

/** SFTP status codes (RFC draft-ietf-secsh-filexfer-02). */
const NO_SUCH_FILE = 2;
const PERMISSION_DENIED = 3;

/**
 * The whole exec request, the same for every command, so `ps` shows nothing
 * of the caller's. Its first stdin line is a shell text of one line (set by
 * `header`) exporting the environment and setting the wrapper's arguments;
 * `read` takes exactly that line (it reads a byte at a time from a pipe), so
 * the rest of stdin is the command's. The wrapper then runs in a shell of
 * its own (same PID) rather than in this one: a variable exported by `eval`
 * is not in this process's /proc environ, and the kill's sweep finds a
 * process by the marker there. Exec'd, the wrapper carries the marker from
 * before its stopped-mark check, so a start the check let through is one
 * the sweep sees.
 */
const EXEC_LINE = `IFS= read -r strata_h || exit 1
strata_nl='
'
eval "$strata_h"
unset strata_h strata_nl
exec /bin/sh -c ${shellQuote(WRAPPER)} strata "$@"`;

/** One SSH connection; a new one replaces it when it is lost. */
interface Connection {
  client: ssh2.Client;
  alive: boolean;
  /** Called once when the connection is lost: every wait on the server listens here, so none outlives it. */
  readonly onLost: Set<(error: StrataError) => void>;
  sftp?: Promise<SFTPWrapper>;
}

export class SshSandbox extends BaseSandbox {
  /** How far commands are contained: the remote user's account. */
  readonly isolation: IsolationLevel = "remote";
  readonly id: string;
  readonly workspace: string;
  /** Channels and connections opened, by kind: what a test counts to check that a batch is one transfer. */
  readonly stats = { execs: 0, sftpSessions: 0, connections: 0 };
  private current: Connection | undefined;
  private connecting: Promise<Connection> | undefined;
  /** The workspace with symlinks resolved, as the server sees it: uploads stay below it. */
  private realWorkspace: string | undefined;
  /** Exec channels of commands (MAX_COMMANDS at once); the others wait their turn. */
  private readonly channels = new Slots(() => MAX_COMMANDS);
  private readonly pendingKills = new Set<Promise<void>>();

  private constructor(
    private readonly options: SshSandboxOptions,
    private readonly config: ConnectConfig,
    workspace: string,
  ) {
    super(options);
    this.workspace = workspace;
    // The same account and workspace give the same id; the id names no remote path (it shows up in messages).
    const place = `${options.username}@${options.host}:${options.port ?? 22}:${workspace}`;
    this.id = `ssh-${nodeCrypto().createHash("sha256").update(place).digest("hex").slice(0, 16)}`;
  }

  /**
   * The ssh2 client of the live connection, or undefined when there is none
   * (not connected yet, lost, or closed): the escape hatch to anything this
   * class does not cover. A lost connection is replaced by a new client at
   * the next call, so read this each time rather than keeping it.
   */
  get client(): ssh2.Client | undefined {
    return this.current?.alive ? this.current.client : undefined;
  }

  /** Connects, and creates the workspace if it is missing. */
  static async connect(options: SshSandboxOptions): Promise<SshSandbox> {
    sandboxLimits(options);
    const connectTimeout =
      options.connectTimeoutSeconds === undefined ? CONNECT_TIMEOUT_SECONDS : timeoutSeconds(options.connectTimeoutSeconds, "connectTimeoutSeconds");
    const keepalive =
      options.keepaliveIntervalSeconds === undefined ? KEEPALIVE_INTERVAL_SECONDS : timeoutSeconds(options.keepaliveIntervalSeconds, "keepaliveIntervalSeconds");
    if (typeof options.workspace !== "string" || !options.workspace.startsWith("/")) {
      throw errors.invalidArgument("SshSandbox workspace must be an absolute path");
    }
    const workspace = normalizePath(options.workspace);
    checkCommand("", options.env);
    const port = options.port ?? 22;
    const config: ConnectConfig = {
      host: options.host,
      port,
      username: options.username,
      privateKey: options.privateKey,
      passphrase: options.passphrase,
      password: options.password,
      agent: options.agent,
      readyTimeout: connectTimeout * 1000,
      keepaliveInterval: keepalive * 1000,
      keepaliveCountMax: KEEPALIVE_COUNT,
    };
    const accepted = acceptedHostKeys(options, port);
    if (accepted) config.hostVerifier = (key: Buffer) => accepted.some((expected) => expected.equals(key));
    const sandbox = new SshSandbox(options, config, workspace);
    try {
      const connection = await sandbox.connection();
      const { exitCode } = await sandbox.run(connection, `mkdir -p -- ${shellQuote(workspace)}`);
      if (exitCode !== 0) throw new StrataError("permission_denied", "Cannot create the workspace directory on the remote machine");
    } catch (error) {
      await sandbox.close();
      throw error;
    }
    return sandbox;
  }

  protected async doExecute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    checkCommand(command, options.env);
    const timeout = options.timeout ?? this.settings.timeoutSeconds;
    const cwd = normalizePath(options.cwd ?? "/");
    const marker = newMarker();
    const sandboxMax = this.settings.maxOutputBytes;
    const maxOutputBytes = options.maxOutputBytes ?? sandboxMax;
    const env = { ...this.passedEnv, ...this.options.env, ...options.env, [MARKER_VARIABLE]: marker };
    const assignments = Object.entries(env).map(([name, value]) => oneLine(`${name}=${value}`));
    const header = `export ${assignments.join(" ")}; set -- ${oneLine(this.sandboxPath(cwd))} ${oneLine(command)}\n`;

    const connection = await this.connection();
    await this.channels.acquire();
    let channel: ClientChannel;
    let exit: ExitStatus;
    try {
      if (this.closed) throw closedError(this.id);
      ({ channel, exit } = await this.openExec(connection, EXEC_LINE));
    } catch (error) {
      this.channels.release();
      throw error;
    }
    const run = new RemoteRun({
      cwd,
      timeout,
      maxOutputBytes,
      // A caller streaming the raw output (spawn) keeps its own bound on what waits unread.
      killAfterBytes: options.onData ? Number.MAX_SAFE_INTEGER : Math.max(maxOutputBytes, sandboxMax * 64),
      onOutput: options.onOutput,
      onData: options.onData,
      // close() aborts this too: the command is killed and the call answers sandbox_closed.
      signal: this.commandSignal(options.signal),
      kill: (pgid, sweep) => this.kill(connection, pgid, sweep ? marker : undefined),
      abandon: () => channel.close(),
    });
    const onLost = (error: StrataError) => run.fail(error);
    connection.onLost.add(onLost);
    const done = () => connection.onLost.delete(onLost);
    run.result.then(done, done);
    channel.on("data", (chunk: Buffer) => run.stdout(chunk));
    channel.stderr.on("data", (chunk: Buffer) => run.stderr(chunk));
    channel.on("close", () => {
      this.channels.release();
      run.end(async () => {
        // No exit status at all: the channel died with the connection, so whether the command ran is unknown.
        if (!exit.received) throw lostError();
        return exit.code;
      });
    });
    channel.on("error", (error: unknown) => run.fail(connectionError(error)));
    // Aborted (or closed) while the channel opened: the command is never sent.
    if (run.finished) return run.result;
    channel.write(header);
    feedStdin(options.stdin, channel);
    return run.result;
  }

  /**
   * Over the one SFTP session, many files in flight, each written under a
   * temporary name beside its target; then one shell round trip for the
   * whole batch (FINISH_UPLOADS) renames each over its target holding the path's lock
   * directory, the lock the shell's overwrite, edit's compare-and-swap and
   * delete take, so an edit cannot put back content an acknowledged upload
   * replaced. (SFTP could make the lock directory too, but breaking a stale
   * one needs the server's clock, which only the shell has.) A reader sees
   * the old content or the new, and a symlink at the target is replaced,
   * never written through. Missing parent directories are made first, each
   * once; a parent that is a symlink (a command may plant one) is refused
   * with `permission_denied`, wherever it leads. Uploads of one path in a
   * batch land in input order.
   */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    if (!Array.isArray(files)) throw errors.invalidArgument("uploadFiles takes an array of [path, bytes] pairs");
    let connection: Connection;
    let sftp: SFTPWrapper;
    let root: string;
    try {
      this.assertOpen();
      connection = await this.connection();
      sftp = await this.sftp(connection);
      root = await this.resolveWorkspace(connection, sftp);
    } catch (error) {
      const code = fileError(error);
      return files.map((item) => ({ path: echo(Array.isArray(item) ? item[0] : item), error: code }));
    }
    const call = <T>(start: (done: (error: Error | null | undefined, value?: T) => void) => void) => guard(connection, sftpCall(start));
    const directories = new Map<string, Promise<string>>();
    /** The real (symlink-free) remote path of a virtual directory, made if missing. */
    const realDirectory = (dir: string): Promise<string> => {
      let real = directories.get(dir);
      if (!real) {
        real = dir === "/" ? Promise.resolve(root) : realDirectory(parentOf(dir)).then((parent) => this.enterDirectory(sftp, call, `${parent}/${baseName(dir)}`, dir));
        directories.set(dir, real);
      }
      return real;
    };
    const responses: UploadAnswer[] = files.map((item) => ({ path: echo(Array.isArray(item) ? item[0] : item), error: null }));
    const staged: { index: number; path: string; temp: string; target: string; size: number }[] = [];
    await mapLimit(files, SFTP_CONCURRENCY, async (item, index) => {
      const rawPath: unknown = Array.isArray(item) ? item[0] : item;
      try {
        const path = normalizePath(rawPath as string);
        const content: unknown = Array.isArray(item) ? item[1] : undefined;
        if (!(content instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        if (path === "/") throw errors.isDirectory(path);
        const parent = await realDirectory(parentOf(path));
        const target = `${parent}/${baseName(path)}`;
        const existing = await call<Stats>((done) => sftp.lstat(target, done)).catch((error: unknown) => {
          if (sftpStatus(error) === NO_SUCH_FILE) return undefined;
          throw error;
        });
        if (existing?.isDirectory()) throw errors.isDirectory(path);
        // The shared temporary-name convention: listings, grep and glob leave such names out.
        const temp = `${parent}/${tempName()}`;
        try {
          // Created private; an overwritten regular file's mode is kept, a new file gets the usual 0666 & ~umask.
          await call<void>((done) => sftp.writeFile(temp, Buffer.from(content.buffer, content.byteOffset, content.byteLength), { mode: 0o600 }, done));
          if (existing?.isFile()) await call<void>((done) => sftp.chmod(temp, existing.mode & 0o7777, done));
          else await call<void>((done) => sftp.chmod(temp, 0o666 & ~(this.umask ?? 0o022), done));
        } catch (error) {
          if (connection.alive) sftp.unlink(temp, () => undefined);
          throw error;
        }
        staged.push({ index, path, temp, target, size: content.length });
      } catch (error) {
        responses[index]!.error = uploadError(error);
      }
    });
    staged.sort((a, b) => a.index - b.index);
    if (staged.length > 0) {
      const batch = staged;
      // The calls travel on stdin, not in the script text (one argv string holds at most 128 KiB), so a batch of any size is one round trip.
      const calls = batch.map((item) => `fin ${shellQuote(item.temp)} ${shellQuote(item.target)} ${int(item.size)} ${shellQuote(this.lockPath(item.path))}\n`);
      try {
        // Run only a list that arrived whole (a stdin cut short could end inside a quoted path): it ends with the marker comment.
        const script = `${LOCK_FN}\n${FINISH_UPLOADS}\nc=$(cat)\ncase $c in *'${END_OF_CALLS}') ;; *) echo failed; exit 0 ;; esac\necho ok\neval "$c"`;
        const { payload } = await this.runScript(batch[0]!.path, script, { stdin: new TextEncoder().encode(`${calls.join("")}${END_OF_CALLS}\n`) });
        const statuses = payload.split("\n");
        batch.forEach((item, i) => {
          const status = statuses[i] ?? "failed";
          responses[item.index]!.error = status === "ok" ? null : statusError(status, item.path, [])?.code ?? "io_error";
        });
      } catch (error) {
        const code = fileError(error);
        for (const item of batch) {
          responses[item.index]!.error = code;
          // Not renamed, or the outcome is unknown: a temporary still there is removed (the target is untouched by it).
          if (connection.alive) sftp.unlink(item.temp, () => undefined);
        }
      }
    }
    return responses;
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    if (!Array.isArray(paths)) throw errors.invalidArgument("downloadFiles takes an array of paths");
    let connection: Connection;
    let sftp: SFTPWrapper;
    try {
      this.assertOpen();
      connection = await this.connection();
      sftp = await this.sftp(connection);
    } catch (error) {
      const code = fileError(error);
      return paths.map((path) => ({ path: echo(path), content: null, error: code }));
    }
    return mapLimit(paths, SFTP_CONCURRENCY, async (rawPath) => {
      try {
        const path = normalizePath(rawPath);
        if (path === "/") throw errors.isDirectory(path);
        const target = this.sandboxPath(path);
        const content = await guard(
          connection,
          sftpCall<Buffer>((done) => sftp.readFile(target, done)),
        ).catch(async (error: unknown) => {
          throw await this.classify(connection, sftp, error, target, path);
        });
        return { path: echo(rawPath), content: new Uint8Array(content.buffer, content.byteOffset, content.byteLength), error: null };
      } catch (error) {
        return { path: echo(rawPath), content: null, error: fileError(error) };
      }
    });
  }

  /**
   * Kills what runs (each running command's process group and every process
   * carrying its marker), fails the pending calls with `sandbox_closed`,
   * then ends the connection.
   */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    // Commands waiting for a channel wake up, see the sandbox closed, and answer sandbox_closed.
    this.channels.wakeAll();
    if (this.pendingKills.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([Promise.allSettled([...this.pendingKills]), new Promise((resolve) => (timer = setTimeout(resolve, CLOSE_KILL_WAIT_MS)))]);
      clearTimeout(timer);
    }
    this.current?.client.end();
    void this.connecting?.then((connection) => connection.client.end(), () => undefined);
  }

  // ---- internals ----

  /** The umask of the remote account, learnt at the first upload that creates a file. */
  private umask: number | undefined;

  /** The live connection, or a new one when there is none (the first call, or the last one was lost). */
  private connection(): Promise<Connection> {
    if (this.closed) return Promise.reject(closedError(this.id));
    if (this.current?.alive) return Promise.resolve(this.current);
    this.connecting ??= this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async open(): Promise<Connection> {
    const client = new (loadSsh2().Client)();
    this.stats.connections++;
    try {
      await new Promise<void>((resolve, reject) => {
        client.once("ready", resolve).once("error", reject).connect(this.config);
      });
    } catch (error) {
      client.end();
      throw connectionError(error);
    }
    if (this.closed) {
      client.end();
      throw closedError(this.id);
    }
    // Commands are small request/response exchanges: Nagle's algorithm would add ~40 ms to each.
    client.setNoDelay(true);
    const connection: Connection = { client, alive: true, onLost: new Set() };
    const lost = (cause?: unknown) => {
      if (!connection.alive) return;
      connection.alive = false;
      if (this.current === connection) this.current = undefined;
      const error = lostError(cause);
      for (const listener of [...connection.onLost]) listener(error);
      connection.onLost.clear();
    };
    // An unhandled 'error' event would crash the process; errors reach the operations through `lost`.
    client.on("error", lost).on("end", () => lost()).on("close", () => lost());
    this.current = connection;
    if (this.umask === undefined) {
      const { output, exitCode } = await this.run(connection, "umask");
      if (exitCode === 0 && /^[0-7]{3,4}\s*$/.test(output)) this.umask = parseInt(output, 8);
    }
    return connection;
  }

  private sftp(connection: Connection): Promise<SFTPWrapper> {
    if (!connection.sftp) {
      this.stats.sftpSessions++;
      const session = guard(
        connection,
        new Promise<SFTPWrapper>((resolve, reject) => {
          try {
            connection.client.sftp((error, sftp) => (error ? reject(connectionError(error)) : resolve(sftp)));
          } catch (error) {
            reject(connectionError(error));
          }
        }),
      );
      connection.sftp = session;
      session.then(
        (sftp) => sftp.on("close", () => (connection.sftp = undefined)),
        () => (connection.sftp = undefined),
      );
    }
    return connection.sftp;
  }

  private async resolveWorkspace(connection: Connection, sftp: SFTPWrapper): Promise<string> {
    this.realWorkspace ??= await guard(
      connection,
      sftpCall<string>((done) => sftp.realpath(this.workspace, done)),
    ).catch((error: unknown) => {
      throw sftpStatus(error) === undefined ? connectionError(error) : new StrataError("file_not_found", "The workspace directory is missing");
    });
    return this.realWorkspace;
  }

  /**
   * mkdir `target` (its parent already entered), or find it there as a
   * directory; returns `target`. A symlink there is refused.
   */
  private async enterDirectory(sftp: SFTPWrapper, call: SftpCaller, target: string, dir: string): Promise<string> {
    try {
      await call<void>((done) => sftp.mkdir(target, done));
      return target;
    } catch (error) {
      if (sftpStatus(error) === undefined) throw error;
    }
    const stats = await call<Stats>((done) => sftp.lstat(target, done)).catch(() => undefined);
    if (!stats) throw errors.permissionDenied(dir);
    if (stats.isDirectory()) return target;
    // A link among the parents is refused wherever it leads, as in every sandbox's changes (sandboxes/shell.ts, LINKED_FN).
    if (stats.isSymbolicLink()) throw errors.permissionDenied(dir);
    throw errors.notADirectory(dir);
  }

  /** Names the failure of an SFTP read: the status code alone cannot tell a directory from other failures. */
  private async classify(connection: Connection, sftp: SFTPWrapper, error: unknown, target: string, path: string): Promise<StrataError> {
    if (isStrataError(error)) return error;
    const status = sftpStatus(error);
    if (status === NO_SUCH_FILE) return errors.notFound(path);
    if (status === PERMISSION_DENIED) return errors.permissionDenied(path);
    if (status === undefined) return connectionError(error);
    const stats = await guard(
      connection,
      sftpCall<Stats>((done) => sftp.stat(target, done)),
    ).catch(() => undefined);
    return stats?.isDirectory() ? errors.isDirectory(path) : errors.permissionDenied(path);
  }

  private openExec(connection: Connection, line: string): Promise<{ channel: ClientChannel; exit: ExitStatus }> {
    this.stats.execs++;
    const opened = new Promise<{ channel: ClientChannel; exit: ExitStatus }>((resolve, reject) => {
      try {
        connection.client.exec(line, (error, channel) => {
          if (error) return reject(connectionError(error));
          // ssh2 emits 'exit' synchronously, and a fast command's exit status can arrive in the same read as
          // the channel's confirmation: a listener added after this callback (after an await) would miss it.
          const exit: ExitStatus = { code: null, received: false };
          channel.on("exit", (code: number | null) => {
            exit.code = code;
            exit.received = true;
          });
          resolve({ channel, exit });
        });
      } catch (error) {
        // ssh2 throws "Not connected" synchronously on a connection that just went away.
        reject(connectionError(error));
      }
    });
    return guard(connection, opened);
  }

  /** Runs a fixed command line and collects its output; for the sandbox's own small commands. */
  private async run(connection: Connection, line: string): Promise<{ output: string; exitCode: number | null }> {
    const { channel, exit } = await this.openExec(connection, line);
    const finished = new Promise<{ output: string; exitCode: number | null }>((resolve, reject) => {
      const chunks: Buffer[] = [];
      channel.on("data", (chunk: Buffer) => chunks.push(chunk));
      channel.stderr.on("data", (chunk: Buffer) => chunks.push(chunk));
      channel.on("close", () => (exit.received ? resolve({ output: Buffer.concat(chunks).toString("utf8"), exitCode: exit.code }) : reject(lostError())));
      channel.on("error", (error: unknown) => reject(connectionError(error)));
      channel.end();
    });
    return guard(connection, finished);
  }

  /** KILL_SCRIPT on a channel of its own (outside the command limit, so it is never queued behind what it kills). */
  private kill(connection: Connection, pgid: number | undefined, marker: string | undefined): Promise<void> {
    const killing = this.killOn(connection, pgid, marker);
    this.pendingKills.add(killing);
    void killing.finally(() => this.pendingKills.delete(killing));
    return killing;
  }

  private async killOn(connection: Connection, pgid: number | undefined, marker: string | undefined): Promise<void> {
    // The arguments are a process group number and a random marker: nothing of the caller's.
    const line = `exec /bin/sh -c ${shellQuote(KILL_SCRIPT)} strata ${shellQuote(pgid === undefined ? "" : String(pgid))} ${shellQuote(marker ?? "")}`;
    // Up to KILL_TRIES: a kill that never lands leaves the command running, so it outlasts a busy spell of the
    // server (every session of MaxSessions taken by commands still closing).
    for (let attempt = 0; attempt < KILL_TRIES && connection.alive; attempt++) {
      try {
        if ((await this.run(connection, line)).exitCode === 0) return;
      } catch {
        // The channel could not open; try again.
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

}

type SftpCaller = <T>(start: (done: (error: Error | null | undefined, value?: T) => void) => void) => Promise<T>;

/** A command's exit status as the server reported it (code null: killed by a signal). */
interface ExitStatus {
  code: number | null;
  /** Whether the server reported any exit at all; a channel cut by a lost connection reports none. */
  received: boolean;
}

/** Settles with `promise`, or rejects with `unavailable` as soon as the connection is lost. */
function guard<T>(connection: Connection, promise: Promise<T>): Promise<T> {
  if (!connection.alive) {
    promise.catch(() => undefined);
    return Promise.reject(lostError());
  }
  return new Promise<T>((resolve, reject) => {
    const onLost = (error: StrataError) => reject(error);
    connection.onLost.add(onLost);
    promise.then(
      (value) => {
        connection.onLost.delete(onLost);
        resolve(value);
      },
      (error: unknown) => {
        connection.onLost.delete(onLost);
        reject(error);
      },
    );
  });
}

function closedError(id: string): StrataError {
  return errors.sandboxClosed(`Sandbox '${id}'`);
}

function lostError(cause?: unknown): StrataError {
  return new StrataError("unavailable", "The SSH connection was lost; the next call connects again", cause === undefined ? undefined : { cause });
}

/** A shell word on one line: single-quoted, each newline spliced in from `$strata_nl` (EXEC_LINE reads one line). */
function oneLine(value: string): string {
  return shellQuote(value).replace(/\n/g, `'"$strata_nl"'`);
}

/** The path as the caller gave it, for the response. */
function echo(path: unknown): string {
  return typeof path === "string" ? path : String(path);
}

/** The host keys a server may present, or undefined for the explicit opt-out. */
function acceptedHostKeys(options: SshSandboxOptions, port: number): Buffer[] | undefined {
  const keys: Buffer[] = [];
  if (options.hostKey !== undefined) keys.push(publicKeyBlob(options.hostKey));
  if (options.knownHosts !== undefined) keys.push(...knownHostsKeys(options.knownHosts, options.host, port));
  if (options.hostKey === undefined && options.knownHosts === undefined) {
    if (options.insecureAcceptAnyHostKey === true) return undefined;
    throw errors.invalidArgument(
      "SshSandbox needs the server's identity: give hostKey or knownHosts (or, for a throwaway test machine only, insecureAcceptAnyHostKey: true)",
    );
  }
  return keys;
}

/** The key blob of an OpenSSH public key line ("type base64 [comment]"). */
function publicKeyBlob(line: string): Buffer {
  const field = typeof line === "string" ? line.trim().split(/\s+/)[1] : undefined;
  if (!field) throw errors.invalidArgument("hostKey must be an OpenSSH public key line ('ssh-ed25519 AAAA…')");
  return Buffer.from(field, "base64");
}

/**
 * The keys a known_hosts file lists for host:port (plain or hashed names,
 * `*`/`?` wildcards and `!` negations; `@revoked` keys are taken out,
 * `@cert-authority` lines are not supported and skipped).
 */
function knownHostsKeys(file: string, host: string, port: number): Buffer[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    // The message names no host path: it may end up in a model's context.
    throw errors.invalidArgument("The knownHosts file cannot be read");
  }
  const name = port === 22 ? host : `[${host}]:${port}`;
  const keys: Buffer[] = [];
  const revoked: Buffer[] = [];
  for (const raw of text.split("\n")) {
    const fields = raw.trim().split(/\s+/);
    if (fields[0] === undefined || fields[0] === "" || fields[0].startsWith("#")) continue;
    const marker = fields[0].startsWith("@") ? fields.shift() : undefined;
    const [hosts, , blob] = fields;
    if (!hosts || !blob || marker === "@cert-authority" || !hostMatches(hosts, name)) continue;
    (marker === "@revoked" ? revoked : keys).push(Buffer.from(blob, "base64"));
  }
  const allowed = keys.filter((key) => !revoked.some((bad) => bad.equals(key)));
  if (allowed.length === 0) {
    throw new StrataError("permission_denied", "The knownHosts file lists no key for this SSH server; add it (ssh-keyscan) after checking it");
  }
  return allowed;
}

function hostMatches(patterns: string, name: string): boolean {
  if (patterns.startsWith("|1|")) {
    const [, , salt, hash] = patterns.split("|");
    if (!salt || !hash) return false;
    return nodeCrypto().createHmac("sha1", Buffer.from(salt, "base64")).update(name).digest("base64") === hash;
  }
  let matched = false;
  for (const pattern of patterns.split(",")) {
    const negated = pattern.startsWith("!");
    const glob = negated ? pattern.slice(1) : pattern;
    const regex = new RegExp(`^${glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`, "i");
    if (!regex.test(name)) continue;
    if (negated) return false;
    matched = true;
  }
  return matched;
}

function sftpCall<T>(start: (done: (error: Error | null | undefined, value?: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => {
    try {
      start((error, value) => (error ? reject(error) : resolve(value as T)));
    } catch (error) {
      reject(error);
    }
  });
}

function sftpStatus(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : undefined;
}

/** An upload's failure as one of the four codes (SFTP statuses and a lost connection are all `permission_denied`). */
function uploadError(error: unknown): ErrorCode {
  return fileError(isStrataError(error) || sftpStatus(error) !== undefined ? error : connectionError(error));
}

function fileError(error: unknown): ErrorCode {
  return isStrataError(error) ? error.code : "permission_denied";
}

function connectionError(error: unknown): StrataError {
  if (isStrataError(error)) return error;
  const level = (error as { level?: unknown } | null)?.level;
  if (level === "client-authentication") return new StrataError("permission_denied", "The SSH server refused the credentials", { cause: error });
  if (level === "client-timeout") return new StrataError("timeout", "The SSH server did not answer in time", { cause: error });
  const message = error instanceof Error ? error.message : "";
  if (/^Cannot parse privateKey/.test(message)) return new StrataError("invalid_argument", "The private key cannot be parsed", { cause: error });
  if (/verification failed/i.test(message)) {
    return new StrataError("permission_denied", "The SSH server's host key does not match the expected one; no command was run", { cause: error });
  }
  return new StrataError("unavailable", "The SSH connection failed", { cause: error });
}
