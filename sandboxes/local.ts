/**
 * LocalSandbox: commands run as plain child processes of this one
 * (`/bin/sh -c`) in a workspace directory on the host. There is NO
 * isolation: a command can read, write and reach anything this process can,
 * and the network. Use it for trusted code and for tests; use
 * BubblewrapSandbox, DockerSandbox or SshSandbox for anything else.
 *
 * What it does guarantee: a timeout kills the command's whole process group
 * (exit code 124), output is capped, the file operations address only the
 * workspace (virtual paths), and uploads and downloads never follow a
 * symlink out of it (they go through FilesystemBackend's fd-relative walk).
 */
import { mkdtempSync, realpathSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { errors } from "../core/errors.js";
import { normalizePath } from "../core/paths.js";
import type { ExecuteOptions, ExecuteResponse, FileDownloadResponse, FileUploadResponse } from "../core/types.js";
import { BaseSandbox, DEFAULT_MAX_OUTPUT_BYTES } from "./base.js";
import { checkTimeout, runProcess } from "./process.js";

export interface LocalSandboxOptions {
  /** Host directory the workspace lives in. Default: a fresh temporary directory, removed by `close()`. */
  workspace?: string;
  /** Seconds a command may run when the call gives no timeout (default 300). */
  timeout?: number;
  /** Output bytes kept per command (default 1 MiB); past 64 times that, the command is killed. */
  maxOutputBytes?: number;
  /**
   * Environment of every command. Default: PATH from this process, HOME set
   * to the workspace, LANG=C.UTF-8; nothing else leaks from this process's
   * environment (API keys included) unless given here.
   */
  env?: Record<string, string>;
}

let counter = 0;

export class LocalSandbox extends BaseSandbox {
  /** How far commands are contained: a separate process, nothing more. */
  readonly isolation = "process" as const;
  readonly id: string;
  /** The workspace directory on the host (symlinks resolved); virtual "/" maps here. */
  readonly workspace: string;
  private readonly ownsWorkspace: boolean;
  private readonly files: FilesystemBackend;
  private readonly env: Record<string, string>;

  constructor(private readonly options: LocalSandboxOptions = {}) {
    super();
    checkTimeout(options.timeout);
    this.ownsWorkspace = options.workspace === undefined;
    const dir = options.workspace ?? mkdtempSync(nodePath.join(tmpdir(), "strata-local-"));
    if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.invalidArgument("LocalSandbox workspace must be an existing directory");
    }
    this.workspace = realpathSync(dir);
    this.id = `local-${process.pid}-${++counter}`;
    this.files = new FilesystemBackend({ rootDir: this.workspace });
    this.env = options.env ?? { PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin", HOME: this.workspace, LANG: "C.UTF-8" };
  }

  async execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    this.assertOpen();
    if (typeof command !== "string") throw errors.invalidArgument("command must be a string");
    checkTimeout(options.timeout);
    const cwd = this.sandboxPath(normalizePath(options.cwd ?? "/"));
    if (!statSync(cwd, { throwIfNoEntry: false })?.isDirectory()) {
      throw errors.notFound(normalizePath(options.cwd ?? "/"));
    }
    const maxOutputBytes = options.maxOutputBytes ?? this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    return runProcess({
      file: "/bin/sh",
      args: ["-c", command],
      cwd,
      env: { ...this.env, ...options.env },
      stdin: options.stdin,
      timeout: options.timeout ?? this.options.timeout ?? 300,
      maxOutputBytes,
      killAfterBytes: Math.max(maxOutputBytes, (this.options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES) * 64),
      onOutput: options.onOutput,
      signal: this.commandSignal(options.signal),
    });
  }

  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    this.assertOpen();
    return this.files.uploadFiles(files);
  }

  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    this.assertOpen();
    return this.files.downloadFiles(paths);
  }

  /** Closes the sandbox; a workspace it created itself is deleted. */
  override async close(): Promise<void> {
    if (this.closed) return;
    await super.close();
    if (this.ownsWorkspace) rmSync(this.workspace, { recursive: true, force: true });
  }
}
