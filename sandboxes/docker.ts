/**
 * DockerSandbox: a long-lived container (no network by default, memory,
 * CPU and process limits) with the workspace in a directory inside it.
 * Commands run through the exec API under the shared wrapper
 * (remote-command.ts); files move through the archive API, many files in
 * one tar per call, built and read in memory.
 *
 * The container is the isolation boundary. Inside it commands run as root
 * (Docker's default capabilities, no-new-privileges), but by default the
 * root filesystem is read-only: only the workspace (a volume of the
 * container's own) and /tmp (a tmpfs) are writable.
 */
import { type Duplex, Readable, Writable } from "node:stream";
import Docker from "dockerode";
import { createTarDecoder, packTar, type ParsedTarEntry, type TarEntry } from "modern-tar";
import { StrataError, errors, isStrataError, toFileOperationError } from "../core/errors.js";
import { normalizePath, parentOf } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse, FileDownloadResponse, FileOperationError, FileUploadResponse } from "../core/types.js";
import { BaseSandbox, DEFAULT_MAX_OUTPUT_BYTES } from "./base.js";
import { checkTimeout } from "./process.js";
import { KILL_SCRIPT, MARKER_VARIABLE, RemoteRun, WRAPPER, checkCommand, newMarker } from "./remote-command.js";

export interface DockerSandboxOptions {
  /**
   * Workspace directory inside the container; virtual "/" maps here. Default "/workspace".
   * `create` mounts a volume there; `attach` creates it if missing (under a writable path).
   */
  workDir?: string;
  /** A Dockerode client, or the daemon's unix socket path. Default: DOCKER_HOST, else /var/run/docker.sock. */
  docker?: Docker | string;
  /** Network mode of a created container. Default "none": no network at all. */
  network?: string;
  /** Memory limit of a created container, in MiB (swap included). Default 1024. */
  memoryMb?: number;
  /** CPU limit of a created container, in CPUs (1.5 = one and a half). Default: none. */
  cpus?: number;
  /** Most processes a created container may hold at once (stops fork bombs). Default 256. */
  pidsLimit?: number;
  /** Output bytes kept per command (default 1 MiB); past 64 times that, the command is killed. */
  maxOutputBytes?: number;
  /** Seconds a command may run when the call gives no timeout. Default 300. */
  timeout?: number;
  /** Environment of every command, on top of the image's. */
  env?: Record<string, string>;
  /** Labels of a created container. */
  labels?: Record<string, string>;
  /**
   * Mount the image read-only, so a command can write only to the workspace
   * and /tmp (default true). Set false for work that installs into the image
   * (apt, pip into the system).
   */
  readOnlyRoot?: boolean;
  /** Remove the container (and its workspace volume) on close(). Default: true for create, false for attach. */
  removeOnClose?: boolean;
}

/** Long-lived PID 1 that works with any sh (BusyBox or GNU) and reaps orphans while it waits. */
const KEEP_ALIVE = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done";
/** Bytes of paths per exec of a batch script, well under Linux's argv limits. */
const ARGV_BATCH_BYTES = 512 * 1024;

/**
 * Classifies upload targets after a failed archive: one line per argument:
 * d (a directory is there), n (an ancestor is not a directory), p (no write
 * permission), o (fine).
 */
const CLASSIFY_SCRIPT = `for p do
  if [ -d "$p" ]; then echo d; continue; fi
  a=\${p%/*}
  while [ -n "$a" ] && ! { [ -e "$a" ] || [ -L "$a" ]; }; do a=\${a%/*}; done
  a=\${a:-/}
  if [ ! -d "$a" ]; then echo n; elif [ ! -w "$a" ]; then echo p; else echo o; fi
done`;

/**
 * Sends the arguments' files with three processes, whatever their number: a
 * status line per argument (f file, d directory, m missing, s not a regular
 * file, p unreadable), ".", the sizes of the files (stat), ".", then all of
 * them concatenated, as base64. While the loop runs, "$@" is rebuilt to hold
 * only the readable files (the loop's list was expanded before it began).
 */
const FETCH_SCRIPT = `exec 2>/dev/null
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
cat -- "$@" | base64`;

export class DockerSandbox extends BaseSandbox {
  /** How far commands are contained: a container of their own. */
  readonly isolation = "container" as const;
  /** The container's id. */
  readonly id: string;
  readonly workspace: string;
  /** Requests made to the daemon, by kind: what a test counts to check that a batch is one transfer. */
  readonly stats = { execs: 0, putArchives: 0, getArchives: 0 };

  private constructor(
    /** The Dockerode client: the escape hatch to anything this class does not cover. */
    readonly docker: Docker,
    readonly container: Docker.Container,
    workspace: string,
    private readonly options: DockerSandboxOptions,
    private readonly removeOnClose: boolean,
  ) {
    super();
    this.id = container.id;
    this.workspace = workspace;
  }

  /** Creates and starts a container from `image` (which must be present; nothing is pulled). */
  static async create(options: DockerSandboxOptions & { image: string }): Promise<DockerSandbox> {
    checkTimeout(options.timeout);
    const workspace = normalizePath(options.workDir ?? "/workspace");
    if (workspace === "/") throw errors.invalidArgument("DockerSandbox workDir must be a directory below '/'");
    const docker = dockerClient(options.docker);
    const limits = resourceLimits(options);
    let container: Docker.Container;
    try {
      container = await docker.createContainer({
        Image: options.image,
        Entrypoint: ["/bin/sh", "-c", KEEP_ALIVE],
        Cmd: [],
        WorkingDir: "/",
        Labels: { "strata.sandbox": "docker", ...options.labels },
        // An anonymous volume: writable under a read-only root, kept across restarts, removed with the container.
        Volumes: { [workspace]: {} },
        HostConfig: {
          NetworkMode: options.network ?? "none",
          SecurityOpt: ["no-new-privileges:true"],
          ReadonlyRootfs: options.readOnlyRoot ?? true,
          Tmpfs: { "/tmp": "rw,nosuid,nodev,mode=1777" },
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
      await sandbox.makeWorkspace();
    } catch (error) {
      await container.remove({ force: true, v: true }).catch(() => undefined);
      throw daemonError(error);
    }
    return sandbox;
  }

  /** Reattaches to an existing container by id (starting it if it stopped), e.g. after a restart of this process. */
  static async attach(containerId: string, options: DockerSandboxOptions = {}): Promise<DockerSandbox> {
    checkTimeout(options.timeout);
    const workspace = normalizePath(options.workDir ?? "/workspace");
    const docker = dockerClient(options.docker);
    const container = docker.getContainer(containerId);
    try {
      const info = await container.inspect();
      if (!info.State.Running) await container.start();
      const sandbox = new DockerSandbox(docker, docker.getContainer(info.Id), workspace, options, options.removeOnClose ?? false);
      await sandbox.makeWorkspace();
      return sandbox;
    } catch (error) {
      if (statusOf(error) === 404) throw new StrataError("unavailable", `Docker container '${containerId}' does not exist`);
      throw daemonError(error);
    }
  }

  async execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    checkCommand(command, options.env);
    checkTimeout(options.timeout);
    const cwd = normalizePath(options.cwd ?? "/");
    const marker = newMarker();
    const stdin = options.stdin === undefined ? undefined : typeof options.stdin === "string" ? Buffer.from(options.stdin) : options.stdin;
    const sandboxMax = this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const maxOutputBytes = options.maxOutputBytes ?? sandboxMax;

    const env = { ...this.options.env, ...options.env, [MARKER_VARIABLE]: marker };
    let exec: Docker.Exec;
    let stream: Duplex;
    try {
      this.stats.execs++;
      exec = await this.container.exec({
        Cmd: ["/bin/sh", "-c", WRAPPER, "strata", this.sandboxPath(cwd), command],
        Env: Object.entries(env).map(([name, value]) => `${name}=${value}`),
        AttachStdin: stdin !== undefined,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
      stream = await exec.start({ hijack: true, stdin: stdin !== undefined });
    } catch (error) {
      throw this.containerError(error);
    }

    const run = new RemoteRun({
      cwd,
      timeout: options.timeout ?? this.options.timeout ?? 300,
      maxOutputBytes,
      killAfterBytes: Math.max(maxOutputBytes, sandboxMax * 64),
      onOutput: options.onOutput,
      signal: options.signal,
      kill: (pgid, sweep) => this.kill(pgid, sweep ? marker : undefined),
      abandon: () => stream.destroy(),
    });
    this.docker.modem.demuxStream(stream, sink((chunk) => run.stdout(chunk)), sink((chunk) => run.stderr(chunk)));
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      run.end(async () => (await exec.inspect()).ExitCode ?? null);
    };
    stream.on("end", end).on("close", end).on("error", (error) => run.fail(this.containerError(error)));
    if (stdin !== undefined) {
      // Half-closing the hijacked connection is what gives the command end-of-file on its stdin.
      stream.write(stdin);
      stream.end();
    }
    return run.result;
  }

  /**
   * All files go in one tar through one archive request. Docker unpacks with
   * `noOverwriteDirNonDir`, so a file never replaces a directory; if the
   * batch fails anyway (such a path, or a parent that is a file), one exec
   * tells which paths are at fault and the rest go in a second archive.
   */
  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    this.assertOpen();
    const responses: FileUploadResponse[] = [];
    const pending: { index: number; path: string; content: Uint8Array }[] = [];
    for (const [rawPath, content] of files) {
      const index = responses.length;
      try {
        const path = normalizePath(rawPath);
        if (!(content instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        responses.push({ path, error: path === "/" ? "is_directory" : null });
        if (path !== "/") pending.push({ index, path, content });
      } catch (error) {
        responses.push({ path: String(rawPath), error: fileError(error) });
      }
    }
    if (pending.length === 0) return responses;
    if (await this.putFiles(pending)) return responses;

    await this.makeWorkspace().catch(() => undefined); // In case a command removed it.
    const verdicts = await this.classify(pending.map((file) => this.sandboxPath(file.path)));
    const retry = pending.filter((file, i) => {
      const verdict = verdicts[i];
      const error: FileOperationError | null =
        verdict === "d" ? "is_directory" : verdict === "n" ? "invalid_path" : verdict === "p" ? "permission_denied" : null;
      responses[file.index]!.error = error;
      return error === null;
    });
    if (retry.length > 0 && !(await this.putFiles(retry))) {
      for (const file of retry) responses[file.index]!.error = "permission_denied";
    }
    return responses;
  }

  /**
   * One file comes through the archive API. The daemon serves archive
   * requests one at a time (about 60 ms each here), so a batch instead
   * comes through one exec that sends every file as base64.
   */
  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    this.assertOpen();
    const responses: FileDownloadResponse[] = [];
    const wanted: { index: number; path: string }[] = [];
    for (const rawPath of paths) {
      try {
        const path = normalizePath(rawPath);
        if (path === "/") throw errors.isDirectory(path);
        wanted.push({ index: responses.length, path });
        responses.push({ path, content: null, error: null });
      } catch (error) {
        responses.push({ path: String(rawPath), content: null, error: fileError(error) });
      }
    }
    if (wanted.length === 1) {
      const { index, path } = wanted[0]!;
      try {
        responses[index]!.content = await this.readFromArchive(this.sandboxPath(path), path);
      } catch (error) {
        responses[index]!.error = fileError(error);
      }
      return responses;
    }
    const results = await this.fetchMany(wanted.map(({ path }) => this.sandboxPath(path)));
    wanted.forEach(({ index }, i) => Object.assign(responses[index]!, results[i]));
    return responses;
  }

  /** Detaches; a container this sandbox created (or was told to own) is removed. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    if (this.removeOnClose) await this.container.remove({ force: true, v: true }).catch(() => undefined);
  }

  // ---- internals ----

  private async makeWorkspace(): Promise<void> {
    const { exitCode } = await this.run(["mkdir", "-p", "--", this.workspace]);
    if (exitCode !== 0) throw new StrataError("permission_denied", "Cannot create the workspace directory in the container");
  }

  /** Runs argv in the container and collects its output; for the sandbox's own small commands. */
  private async run(argv: string[]): Promise<{ output: string; exitCode: number | null }> {
    this.stats.execs++;
    const exec = await this.container.exec({ Cmd: argv, AttachStdout: true, AttachStderr: true, Tty: false });
    const stream = await exec.start({ hijack: true, stdin: false });
    const chunks: Buffer[] = [];
    const collect = sink((chunk) => chunks.push(Buffer.from(chunk)));
    this.docker.modem.demuxStream(stream, collect, collect);
    await new Promise<void>((resolve, reject) => {
      stream.on("end", resolve).on("close", resolve).on("error", reject);
    });
    return { output: Buffer.concat(chunks).toString("utf8"), exitCode: (await exec.inspect()).ExitCode ?? null };
  }

  /**
   * KILL_SCRIPT from a second exec. When a fork bomb holds every process
   * slot the exec itself cannot start; after a few tries the container is
   * restarted, which kills everything in it (the files stay).
   */
  private async kill(pgid: number | undefined, marker: string | undefined): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const { exitCode } = await this.run(["/bin/sh", "-c", KILL_SCRIPT, "strata", pgid === undefined ? "" : String(pgid), marker ?? ""]);
        if (exitCode === 0) return;
      } catch {
        // The exec could not start; try again.
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    await this.container.restart({ t: 0 }).catch(() => undefined);
  }

  private async putFiles(files: readonly { path: string; content: Uint8Array }[]): Promise<boolean> {
    const entries: TarEntry[] = files.map(({ path, content }) => ({
      header: { name: path.slice(1), size: content.length, type: "file", mode: 0o644, mtime: new Date() },
      body: content,
    }));
    try {
      this.stats.putArchives++;
      // Unpacked at the workspace itself: under a read-only root Docker accepts archives only into a volume.
      await this.container.putArchive(Buffer.from(await packTar(entries)), { path: this.workspace, noOverwriteDirNonDir: true });
      return true;
    } catch (error) {
      if (isConnectionError(error)) throw daemonError(error);
      return false;
    }
  }

  private async classify(paths: string[]): Promise<string[]> {
    const verdicts: string[] = [];
    for (const batch of argvBatches(paths)) {
      const { output } = await this.run(["/bin/sh", "-c", CLASSIFY_SCRIPT, "strata", ...batch]);
      const lines = output.split("\n");
      batch.forEach((_, i) => verdicts.push(lines[i] ?? "p"));
    }
    return verdicts;
  }

  private async fetchMany(paths: string[]): Promise<Pick<FileDownloadResponse, "content" | "error">[]> {
    const results: Pick<FileDownloadResponse, "content" | "error">[] = [];
    for (const batch of argvBatches(paths)) {
      const { output } = await this.run(["/bin/sh", "-c", FETCH_SCRIPT, "strata", ...batch]);
      const [statuses = "", sizes = "", body = ""] = output.split("\n.\n");
      const found = statuses.split("\n");
      const lengths = sizes.split("\n").map(Number);
      const all = Buffer.from(body.replace(/\s+/g, ""), "base64");
      // A file that changed size between stat and cat leaves the total off; those files are then read one by one.
      const consistent = lengths.reduce((sum, n) => sum + n, 0) === all.length;
      let file = 0;
      let offset = 0;
      for (let i = 0; i < batch.length; i++) {
        const status = found[i];
        if (status !== "f") {
          results.push({ content: null, error: status === "d" ? "is_directory" : status === "m" ? "file_not_found" : "permission_denied" });
          continue;
        }
        const length = lengths[file++] ?? 0;
        if (consistent) {
          results.push({ content: new Uint8Array(all.subarray(offset, offset + length)), error: null });
          offset += length;
          continue;
        }
        const target = batch[i] ?? "";
        try {
          results.push({ content: await this.readFromArchive(target, this.virtualPath(target)), error: null });
        } catch (error) {
          results.push({ content: null, error: fileError(error) });
        }
      }
    }
    return results;
  }

  /** Reads one file through the archive API, following symlinks (inside the container) a few hops. */
  private async readFromArchive(target: string, virtual: string): Promise<Uint8Array> {
    let current = target;
    for (let hop = 0; hop < 16; hop++) {
      let archive: NodeJS.ReadableStream;
      try {
        this.stats.getArchives++;
        archive = await this.container.getArchive({ path: current });
      } catch (error) {
        if (isConnectionError(error)) throw daemonError(error);
        const status = statusOf(error);
        // 404: nothing there; 500 "not a directory": a parent is a file. Both mean there is no such file.
        throw status === 404 || status === 500 ? errors.notFound(virtual) : errors.permissionDenied(virtual);
      }
      const node = archive as Readable;
      const reader = (Readable.toWeb(node) as ReadableStream<Uint8Array>).pipeThrough(createTarDecoder()).getReader();
      try {
        const { value: entry } = await reader.read();
        if (!entry) throw errors.notFound(virtual);
        const { type, linkname } = entry.header;
        if (type === "file") return await readBody(entry);
        if (type === "directory") throw errors.isDirectory(virtual);
        if (type === "symlink" && linkname) {
          current = linkname.startsWith("/") ? linkname : `${parentOf(current)}/${linkname}`;
          continue;
        }
        throw new StrataError("permission_denied", `'${virtual}' is not a regular file`);
      } finally {
        await reader.cancel().catch(() => undefined);
        node.destroy();
      }
    }
    throw new StrataError("permission_denied", `'${virtual}': too many levels of symbolic links`);
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

/** Splits paths into groups small enough for one exec's argv. */
function* argvBatches(paths: string[]): Generator<string[]> {
  for (let start = 0; start < paths.length; ) {
    let end = start;
    let bytes = 0;
    while (end < paths.length && (end === start || bytes + Buffer.byteLength(paths[end]!) < ARGV_BATCH_BYTES)) {
      bytes += Buffer.byteLength(paths[end++]!) + 1;
    }
    yield paths.slice(start, end);
    start = end;
  }
}

function dockerClient(docker: Docker | string | undefined): Docker {
  if (docker instanceof Docker) return docker;
  if (typeof docker === "string") return new Docker({ socketPath: docker.replace(/^unix:\/\//, "") });
  return new Docker();
}

function resourceLimits(options: DockerSandboxOptions): Docker.HostConfig {
  const positive = (name: string, value: number | undefined) => {
    if (value !== undefined && !(typeof value === "number" && value > 0 && Number.isFinite(value))) {
      throw errors.invalidArgument(`${name} must be a positive number, got ${String(value)}`);
    }
  };
  positive("memoryMb", options.memoryMb);
  positive("cpus", options.cpus);
  positive("pidsLimit", options.pidsLimit);
  const memory = Math.round((options.memoryMb ?? 1024) * 1024 * 1024);
  return {
    Memory: memory,
    MemorySwap: memory,
    PidsLimit: Math.round(options.pidsLimit ?? 256),
    ...(options.cpus === undefined ? {} : { NanoCpus: Math.round(options.cpus * 1e9) }),
  };
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

async function readBody(entry: ParsedTarEntry): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  const reader = entry.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
  }
  // A plain Uint8Array, as every backend returns (a Buffer compares unequal to one).
  const whole = Buffer.concat(chunks);
  return new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength);
}

function fileError(error: unknown): FileOperationError {
  if (isStrataError(error)) return toFileOperationError(error.code);
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
