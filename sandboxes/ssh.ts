/**
 * SshSandbox: a workspace directory on a machine reached over SSH. One
 * connection carries everything: each command runs on an exec channel under
 * the shared wrapper (remote-command.ts), files move over one SFTP session,
 * many at a time.
 *
 * The remote account is the isolation boundary: a command can do whatever
 * that user can on that machine. Use a dedicated, unprivileged user. The
 * user's login shell must be POSIX-compatible (sh, dash, bash, zsh): it
 * parses the command line this class sends.
 */
import { createHash } from "node:crypto";
import ssh2 from "ssh2";
import type { ClientChannel, ConnectConfig, SFTPWrapper, Stats } from "ssh2";
import { StrataError, errors, isStrataError, toFileOperationError } from "../core/errors.js";
import { normalizePath, parentOf } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse, FileDownloadResponse, FileOperationError, FileUploadResponse } from "../core/types.js";
import { BaseSandbox, DEFAULT_MAX_OUTPUT_BYTES, shellQuote } from "./base.js";
import { checkTimeout } from "./process.js";
import { KILL_SCRIPT, MARKER_VARIABLE, RemoteRun, WRAPPER, checkCommand, newMarker } from "./remote-command.js";

export interface SshSandboxOptions {
  host: string;
  /** Default 22. */
  port?: number;
  username: string;
  /** Private key (OpenSSH or PEM), the usual way in. */
  privateKey?: string | Buffer;
  passphrase?: string;
  password?: string;
  /**
   * The server's public key ("ssh-ed25519 AAAA…", as in known_hosts or a
   * .pub file). When given, a server presenting another key is refused;
   * without it any host key is accepted.
   */
  hostKey?: string;
  /** Absolute path of the workspace on the remote machine; created if missing. */
  workspace: string;
  /** Output bytes kept per command (default 1 MiB); past 64 times that, the command is killed. */
  maxOutputBytes?: number;
  /** Seconds a command may run when the call gives no timeout. Default 300. */
  timeout?: number;
  /** Environment of every command, on top of the login environment. */
  env?: Record<string, string>;
  /** Seconds to wait for the connection. Default 20. */
  connectTimeout?: number;
}

/**
 * Exec channels open at once. OpenSSH allows 10 sessions per connection by
 * default (MaxSessions); the SFTP session and timeout kills need room too.
 */
const MAX_COMMANDS = 6;
/** SFTP requests in flight at once (SFTP pipelines them on its one channel). */
const SFTP_CONCURRENCY = 64;

/** SFTP status codes (RFC draft-ietf-secsh-filexfer-02). */
const NO_SUCH_FILE = 2;
const PERMISSION_DENIED = 3;

export class SshSandbox extends BaseSandbox {
  /** How far commands are contained: the remote user's account. */
  readonly isolation = "remote" as const;
  readonly id: string;
  readonly workspace: string;
  /** Channels opened, by kind: what a test counts to check that a batch is one transfer. */
  readonly stats = { execs: 0, sftpSessions: 0 };
  private sftpSession: Promise<SFTPWrapper> | undefined;
  private running = 0;
  private readonly queue: (() => void)[] = [];

  private constructor(
    /** The ssh2 client: the escape hatch to anything this class does not cover. */
    readonly client: ssh2.Client,
    private readonly options: SshSandboxOptions,
    workspace: string,
  ) {
    super();
    this.workspace = workspace;
    // The same account and workspace give the same id; the id names no remote path (it shows up in messages).
    const place = `${options.username}@${options.host}:${options.port ?? 22}:${workspace}`;
    this.id = `ssh-${createHash("sha256").update(place).digest("hex").slice(0, 16)}`;
  }

  /** Connects, and creates the workspace if it is missing. */
  static async connect(options: SshSandboxOptions): Promise<SshSandbox> {
    checkTimeout(options.timeout);
    if (typeof options.workspace !== "string" || !options.workspace.startsWith("/")) {
      throw errors.invalidArgument("SshSandbox workspace must be an absolute path");
    }
    const workspace = normalizePath(options.workspace);
    checkCommand("", options.env);
    const client = new ssh2.Client();
    const config: ConnectConfig = {
      host: options.host,
      port: options.port ?? 22,
      username: options.username,
      privateKey: options.privateKey,
      passphrase: options.passphrase,
      password: options.password,
      readyTimeout: (options.connectTimeout ?? 20) * 1000,
      keepaliveInterval: 15_000,
    };
    if (options.hostKey !== undefined) {
      const expected = publicKeyBlob(options.hostKey);
      config.hostVerifier = (key: Buffer) => key.equals(expected);
    }
    try {
      await new Promise<void>((resolve, reject) => {
        client.once("ready", resolve).once("error", reject).connect(config);
      });
    } catch (error) {
      client.end();
      throw connectionError(error);
    }
    // Commands are small request/response exchanges: Nagle's algorithm would add ~40 ms to each.
    client.setNoDelay(true);
    // Errors after connecting surface on the operation in flight; an unhandled 'error' event would crash the process.
    client.on("error", () => undefined);
    const sandbox = new SshSandbox(client, options, workspace);
    try {
      const { exitCode } = await sandbox.run(`mkdir -p -- ${shellQuote(workspace)}`);
      if (exitCode !== 0) throw new StrataError("permission_denied", "Cannot create the workspace directory on the remote machine");
    } catch (error) {
      client.end();
      throw error;
    }
    return sandbox;
  }

  async execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    checkCommand(command, options.env);
    checkTimeout(options.timeout);
    const cwd = normalizePath(options.cwd ?? "/");
    const marker = newMarker();
    const sandboxMax = this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const maxOutputBytes = options.maxOutputBytes ?? sandboxMax;
    const env = { ...this.options.env, ...options.env, [MARKER_VARIABLE]: marker };
    // The login shell runs the wrapper itself (no `env`, no `exec sh`): two programs fewer to start per command.
    const assignments = Object.entries(env).map(([name, value]) => shellQuote(`${name}=${value}`));
    const line = `export ${assignments.join(" ")}; set -- ${shellQuote(this.sandboxPath(cwd))} ${shellQuote(command)}\n${WRAPPER}`;

    await this.acquire();
    let channel: ClientChannel;
    let exit: ExitStatus;
    try {
      ({ channel, exit } = await this.openExec(line));
    } catch (error) {
      this.release();
      throw error;
    }
    const run = new RemoteRun({
      cwd,
      timeout: options.timeout ?? this.options.timeout ?? 300,
      maxOutputBytes,
      killAfterBytes: Math.max(maxOutputBytes, sandboxMax * 64),
      onOutput: options.onOutput,
      signal: options.signal,
      kill: (pgid, sweep) => this.kill(pgid, sweep ? marker : undefined),
      abandon: () => channel.close(),
    });
    channel.on("data", (chunk: Buffer) => run.stdout(chunk));
    channel.stderr.on("data", (chunk: Buffer) => run.stderr(chunk));
    channel.on("close", () => {
      this.release();
      run.end(async () => exit.code);
    });
    channel.on("error", (error: unknown) => run.fail(connectionError(error)));
    if (options.stdin !== undefined) channel.write(typeof options.stdin === "string" ? Buffer.from(options.stdin) : options.stdin);
    channel.end();
    return run.result;
  }

  /** Over the one SFTP session, many files in flight; missing parent directories are made first, each once. */
  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    this.assertOpen();
    const sftp = await this.sftp();
    const directories = new Map<string, Promise<void>>();
    const ensureDirectory = (dir: string): Promise<void> => {
      let made = directories.get(dir);
      if (!made) {
        const parent = dir === "/" ? Promise.resolve() : ensureDirectory(parentOf(dir));
        made = parent.then(() => this.makeDirectory(sftp, dir));
        directories.set(dir, made);
      }
      return made;
    };
    return mapConcurrently(files, SFTP_CONCURRENCY, async ([rawPath, content]) => {
      let path = String(rawPath);
      try {
        path = normalizePath(rawPath);
        if (!(content instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        if (path === "/") throw errors.isDirectory(path);
        await ensureDirectory(parentOf(path));
        const target = this.sandboxPath(path);
        await sftpCall<void>((done) => sftp.writeFile(target, Buffer.from(content.buffer, content.byteOffset, content.byteLength), done)).catch(
          async (error: unknown) => {
            throw await this.classify(sftp, error, target, path);
          },
        );
        return { path, error: null };
      } catch (error) {
        return { path, error: fileError(error) };
      }
    });
  }

  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    this.assertOpen();
    const sftp = await this.sftp();
    return mapConcurrently(paths, SFTP_CONCURRENCY, async (rawPath) => {
      let path = String(rawPath);
      try {
        path = normalizePath(rawPath);
        if (path === "/") throw errors.isDirectory(path);
        const target = this.sandboxPath(path);
        const content = await sftpCall<Buffer>((done) => sftp.readFile(target, done)).catch(async (error: unknown) => {
          throw await this.classify(sftp, error, target, path);
        });
        return { path, content: new Uint8Array(content.buffer, content.byteOffset, content.byteLength), error: null };
      } catch (error) {
        return { path, content: null, error: fileError(error) };
      }
    });
  }

  /** Ends the connection; commands still running on it lose their channel and sshd hangs them up. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    this.client.end();
  }

  // ---- internals ----

  private sftp(): Promise<SFTPWrapper> {
    if (!this.sftpSession) {
      this.stats.sftpSessions++;
      const session = new Promise<SFTPWrapper>((resolve, reject) => {
        this.client.sftp((error, sftp) => (error ? reject(connectionError(error)) : resolve(sftp)));
      });
      this.sftpSession = session;
      session.then(
        (sftp) => sftp.on("close", () => (this.sftpSession = undefined)),
        () => (this.sftpSession = undefined),
      );
    }
    return this.sftpSession;
  }

  /** mkdir, where an existing directory is success and an existing file is `not_a_directory`. */
  private async makeDirectory(sftp: SFTPWrapper, dir: string): Promise<void> {
    const target = this.sandboxPath(dir);
    try {
      await sftpCall<void>((done) => sftp.mkdir(target, done));
    } catch (error) {
      if (sftpStatus(error) === PERMISSION_DENIED) throw errors.permissionDenied(dir);
      const stats = await sftpCall<Stats>((done) => sftp.stat(target, done)).catch(() => undefined);
      if (!stats?.isDirectory()) throw errors.notADirectory(dir);
    }
  }

  /** Names the failure of an SFTP read or write: the status code alone cannot tell a directory from other failures. */
  private async classify(sftp: SFTPWrapper, error: unknown, target: string, path: string): Promise<StrataError> {
    const status = sftpStatus(error);
    if (status === NO_SUCH_FILE) return errors.notFound(path);
    if (status === PERMISSION_DENIED) return errors.permissionDenied(path);
    if (status === undefined) return connectionError(error);
    const stats = await sftpCall<Stats>((done) => sftp.stat(target, done)).catch(() => undefined);
    return stats?.isDirectory() ? errors.isDirectory(path) : errors.permissionDenied(path);
  }

  private openExec(line: string): Promise<{ channel: ClientChannel; exit: ExitStatus }> {
    this.stats.execs++;
    return new Promise((resolve, reject) => {
      this.client.exec(line, (error, channel) => {
        if (error) return reject(connectionError(error));
        // ssh2 emits 'exit' synchronously, and a fast command's exit status can arrive in the same read as
        // the channel's confirmation: a listener added after this callback (after an await) would miss it.
        const exit: ExitStatus = { code: null };
        channel.on("exit", (code: number | null) => (exit.code = code));
        resolve({ channel, exit });
      });
    });
  }

  /** Runs a command line and collects its output; for the sandbox's own small commands. */
  private async run(line: string): Promise<{ output: string; exitCode: number | null }> {
    const { channel, exit } = await this.openExec(line);
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      channel.on("data", (chunk: Buffer) => chunks.push(chunk));
      channel.stderr.on("data", (chunk: Buffer) => chunks.push(chunk));
      channel.on("close", () => resolve({ output: Buffer.concat(chunks).toString("utf8"), exitCode: exit.code }));
      channel.on("error", reject);
      channel.end();
    });
  }

  /** KILL_SCRIPT on a channel of its own (outside the command limit, so it is never queued behind what it kills). */
  private async kill(pgid: number | undefined, marker: string | undefined): Promise<void> {
    const line = `exec /bin/sh -c ${shellQuote(KILL_SCRIPT)} strata ${shellQuote(pgid === undefined ? "" : String(pgid))} ${shellQuote(marker ?? "")}`;
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        if ((await this.run(line)).exitCode === 0) return;
      } catch {
        // The channel could not open (the server is busy); try again.
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  private async acquire(): Promise<void> {
    if (this.running < MAX_COMMANDS) {
      this.running++;
      return;
    }
    await new Promise<void>((resolve) => this.queue.push(resolve));
  }

  private release(): void {
    const next = this.queue.shift();
    if (next) next();
    else this.running--;
  }
}

/** A command's exit code as the server reported it (null: killed by a signal, or not reported). */
interface ExitStatus {
  code: number | null;
}

/** The key blob of an OpenSSH public key line ("type base64 [comment]"). */
function publicKeyBlob(line: string): Buffer {
  const field = line.trim().split(/\s+/)[1];
  if (!field) throw errors.invalidArgument("hostKey must be an OpenSSH public key line ('ssh-ed25519 AAAA…')");
  return Buffer.from(field, "base64");
}

function sftpCall<T>(start: (done: (error: Error | null | undefined, value?: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => start((error, value) => (error ? reject(error) : resolve(value as T))));
}

function sftpStatus(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : undefined;
}

/** Runs `work` over `items` with at most `limit` at once; results keep the input order. */
async function mapConcurrently<T, R>(items: readonly T[], limit: number, work: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

function fileError(error: unknown): FileOperationError {
  return isStrataError(error) ? toFileOperationError(error.code) : "permission_denied";
}

function connectionError(error: unknown): StrataError {
  if (isStrataError(error)) return error;
  const level = (error as { level?: unknown } | null)?.level;
  if (level === "client-authentication") return new StrataError("permission_denied", "The SSH server refused the credentials", { cause: error });
  if (level === "client-timeout") return new StrataError("timeout", "The SSH server did not answer in time", { cause: error });
  const message = error instanceof Error ? error.message : "";
  if (/^Cannot parse privateKey/.test(message)) return new StrataError("invalid_argument", "The private key cannot be parsed", { cause: error });
  if (/verification failed/i.test(message)) {
    return new StrataError("permission_denied", "The SSH server's host key does not match the expected one", { cause: error });
  }
  return new StrataError("unavailable", "The SSH connection failed", { cause: error });
}
