/**
 * LocalSandbox: commands run as plain child processes of this one
 * (`/bin/sh -c`) in a workspace directory on the host. There is NO
 * isolation: a command can read, write and reach anything this process can,
 * and the network. Use it for trusted code and for tests; use
 * BubblewrapSandbox, DockerSandbox or SshSandbox for anything else.
 *
 * What it does guarantee: a timeout kills the command's whole process group
 * (exit code 124), output is capped, and every file operation (ls, read,
 * write, edit, delete, grep, glob, upload, download) is FilesystemBackend's
 * over the workspace: confined to it exactly as that backend is (an
 * fd-relative walk that never follows a symlink, even one a command planted),
 * serialized per path, and held to the workspace quota. `execute` is NOT
 * confined by any of this: a command runs as this process's user, anywhere.
 */
import { mkdtempSync, realpathSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { unwrap, type DownloadAnswer, type TextWindow, type UploadAnswer } from "../core/base.js";
import { errors } from "../core/errors.js";
import { toFileDataV2 } from "../core/filedata.js";
import { normalizePath } from "../core/paths.js";
import { toSeedProtocol as seed } from "../core/seed.js";
import type { DeleteResult, EditResult, ExecuteOptions, ExecuteResponse, FileDataV2, FileInfo, FilesUpdate, GrepResult, WriteResult } from "../core/types.js";
import { BaseSandbox, type BaseSandboxOptions, type IsolationLevel } from "./base.js";
import { checkTimeout, runProcess } from "./process.js";

/**
 * `quota`, `timeout` and `maxOutputBytes`: BaseSandboxOptions (defaults in
 * SANDBOX_DEFAULTS). `quota` limits write, edit and upload in the workspace.
 * Commands have the host's network, always: this sandbox cannot cut it.
 */
export interface LocalSandboxOptions extends BaseSandboxOptions {
  /** The workspace: a host directory. Default: a fresh temporary directory, removed by `close()`. */
  workspace?: string;
  /**
   * Environment of every command. Default: PATH from this process, HOME set
   * to the workspace, LANG=C.UTF-8; nothing else leaks from this process's
   * environment (API keys included) unless given here.
   */
  env?: Record<string, string>;
  /** fsync each file written before it replaces the old one (default true), as FilesystemBackend's option. */
  fsync?: boolean;
}

let counter = 0;

export class LocalSandbox extends BaseSandbox {
  /** How far commands are contained: a separate process, nothing more. */
  readonly isolation: IsolationLevel = "process";
  readonly id: string;
  /** The workspace directory on the host (symlinks resolved); virtual "/" maps here. */
  readonly workspace: string;
  private readonly ownsWorkspace: boolean;
  private readonly files: FilesystemBackend;
  private readonly env: Record<string, string>;
  protected override uploadsKeepQuota = true;

  constructor(options: LocalSandboxOptions = {}) {
    super(options);
    this.ownsWorkspace = options.workspace === undefined;
    const dir = options.workspace ?? mkdtempSync(nodePath.join(tmpdir(), "strata-local-"));
    if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.invalidArgument("LocalSandbox workspace must be an existing directory");
    }
    this.workspace = realpathSync(dir);
    this.id = `local-${process.pid}-${++counter}`;
    // The sandbox's quota (defaults applied by BaseSandbox), kept by the backend every file operation goes through.
    this.files = new FilesystemBackend({ workspace: this.workspace, quota: this.quota, permissions: false, fsync: options.fsync });
    // PATH is the one host variable passed unasked (a host process needs it to find programs); passEnv names any other.
    const defaults = { PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin", HOME: this.workspace, LANG: "C.UTF-8" };
    this.env = { ...(options.env === undefined ? defaults : {}), ...this.passedEnv, ...options.env };
  }

  /** Unconfined: the command runs as this process's user and can reach the whole host (see the module comment). */
  protected async doExecute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    if (typeof command !== "string") throw errors.invalidArgument("command must be a string");
    checkTimeout(options.timeout);
    const cwd = this.sandboxPath(normalizePath(options.cwd ?? "/"));
    if (!statSync(cwd, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.notFound(normalizePath(options.cwd ?? "/"));
    }
    const maxOutputBytes = options.maxOutputBytes ?? this.settings.maxOutputBytes;
    return runProcess({
      file: "/bin/sh",
      args: ["-c", command],
      cwd,
      env: { ...this.env, ...options.env },
      stdin: options.stdin,
      timeout: options.timeout ?? this.settings.timeoutSeconds,
      maxOutputBytes,
      // A caller streaming the raw output (spawn) keeps its own bound on what waits unread.
      killAfterBytes: options.onData ? Number.MAX_SAFE_INTEGER : Math.max(maxOutputBytes, this.settings.maxOutputBytes * 64),
      onOutput: options.onOutput,
      onData: options.onData,
      signal: this.commandSignal(options.signal),
    });
  }

  /**
   * Commands run on the host, where absolute paths are host paths, which no
   * answer may show. So file paths stay virtual: "/" is the workspace, which
   * is also every command's working directory, and relative paths mean the
   * same file to both (docs/sandboxes.md).
   */
  protected override get pathRoot(): string {
    return "/";
  }

  // Every file operation is the workspace FilesystemBackend's (real directories, atomic
  // renames, per-path locks); after close each answers `sandbox_closed`.

  protected override async doLs(path: string, sizes = true): Promise<FileInfo[]> {
    this.assertOpen();
    return unwrap(await this.files.ls(path, sizes ? undefined : { sizes })).entries;
  }

  protected override async doRead(filePath: string, offset: number, limit: number): Promise<TextWindow> {
    this.assertOpen();
    const read = unwrap(await this.files.read(filePath, { offset, limit }));
    if (read.encoding === "binary") throw errors.binary(read.path, read.size);
    return { lines: read.lineCount === 0 ? [] : read.content.split("\n"), totalLines: read.totalLines };
  }

  protected override async doReadRaw(filePath: string): Promise<FileDataV2> {
    this.assertOpen();
    return toFileDataV2(unwrap(await this.files.readRaw(filePath)).data);
  }

  protected override async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    this.assertOpen();
    return seed(this.files).write(filePath, content, { overwrite });
  }

  protected override async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    this.assertOpen();
    return seed(this.files).edit(filePath, oldString, newString, replaceAll);
  }

  protected override async doDelete(filePath: string): Promise<DeleteResult> {
    this.assertOpen();
    return seed(this.files).delete(filePath);
  }

  protected override async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    this.assertOpen();
    return unwrap(await this.files.grep(pattern, { path, glob, maxCount }));
  }

  protected override async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    this.assertOpen();
    return unwrap(await this.files.glob(pattern, { path, includeDirectories, sizes })).entries;
  }

  protected override async doStat(path: string): Promise<FileInfo> {
    this.assertOpen();
    return unwrap(await this.files.stat(path));
  }

  protected override async doMkdir(path: string, recursive: boolean): Promise<FilesUpdate> {
    this.assertOpen();
    return unwrap(await this.files.mkdir(path, { recursive })).filesUpdate;
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    this.assertOpen();
    return unwrap(await this.files.move(from, to, { overwrite })).filesUpdate;
  }

  // A copy is the shell's `cp -RPp` (BaseSandbox): modes and links are kept, as commands expect.

  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    this.assertOpen();
    return unwrap(await this.files.uploadFiles(files)).files.map((f) => ({ path: f.path, error: f.error?.code ?? null }));
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    this.assertOpen();
    return unwrap(await this.files.downloadFiles(paths)).files.map((f) => ({ path: f.path, content: f.content, error: f.error?.code ?? null }));
  }

  /** Closes the sandbox; a workspace it created itself is deleted. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    if (this.ownsWorkspace) rmSync(this.workspace, { recursive: true, force: true });
  }
}
