/**
 * BaseSandbox: a sandbox is a place that can run a shell. Every file
 * operation here is derived from `execute` (a POSIX sh script, GNU coreutils
 * or BusyBox, nothing else: no python, no node inside), so a new sandbox only
 * implements `execute`, `uploadFiles` and `downloadFiles`.
 *
 * Rules every derived operation keeps:
 * - one `execute` round trip per operation; `edit` takes two (read, then
 *   compare-and-swap write; see `edit`) unless the sandbox holds the file's
 *   bytes from its last read or write; a first `read` of a file over 1 MiB
 *   or not UTF-8 takes two (see readWholeText);
 * - virtual paths map to `workspace + path` after `normalizePath`, so nothing
 *   escapes through `..`; paths are single-quoted with `shellQuote`;
 * - file content and grep patterns never travel in argv: content goes through
 *   stdin, patterns through the environment, results come back as base64;
 * - the formatting, edit, glob and grep semantics are core's (`formatRead`,
 *   `applyEdit`, `compileGlob`, `grepText`, …): the shell only moves bytes.
 */
import { BaseBackend, checkOffset, deletesUnlessDirectory, failure, readOptions, textWindow, type DownloadAnswer, type TextWindow, type UploadAnswer } from "../core/base.js";
import { Slots } from "../core/concurrency.js";
import { applyEdit } from "../core/edit.js";
import { type ErrorCode, StrataError, asStrataError, errors, isStrataError, printable, toErrorInfo } from "../core/errors.js";
import { decodeText, fileDataFromBytes, fileDataSize, fileDataText } from "../core/filedata.js";
import { splitLines } from "../core/format.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { type Quota, type Usage, byteCount, checkQuota, timeoutSeconds } from "../core/limits.js";
import { baseName, isWithin, joinPath, normalizePath, sortByPath } from "../core/paths.js";
import type { Sandbox } from "../core/protocol.js";
import { PermissionPolicy, SECRETS_PRESET, looksSecret, type PermissionOptions, type PermissionRule } from "../core/permissions.js";
import { guarded } from "../backends/permissions.js";
import { checkSpawn, spawnFromExecute } from "./spawn.js";
import type {
  DeleteResult,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileDataV2,
  FilesUpdate,
  Result,
  SpawnOptions,
  SpawnedProcess,
  FileInfo,
  GrepMatch,
  GrepResult,
  WriteResult,
} from "../core/types.js";
import {
  MAX_TRANSFER_BYTES,
  WHOLE_FILE_BYTES,
  RESERVED_NAME,
  statusError,
  int,
  CHECK_REGULAR_FILE,
  QUOTA_FN,
  LINKED_FN,
  READ_THROUGH_LINK,
  LOCK_FN,
  WRITE_FROM_STDIN,
  PLACE_FN,
  PUT_FN,
  SIZE_FN,
  lockName,
  GET_FN,
  STAT_BATCH,
  GREP_EMIT,
  GREP_RIPGREP,
  GREP_BATCH,
  GREP_GNU,
  GREP_GNU_WHOLE,
  parseWholeRecords,
  GREP_POSIX,
  grepFlavor,
  FIND_PRINTF,
  findFlavor,
  parseListing,
  fileInfo,
  parseGrepLines,
  fromBase64,
  tempName,
  batches,
  shellQuote,
} from "./shell.js";
import { type ExecuteStream, TIMEOUT_EXIT_CODE, streamExecute } from "./output.js";
import { type SandboxLimits, sandboxLimits } from "./defaults.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

// Names that lived here before output.ts and shell.ts took them; `strata-workspace/sandboxes/base` keeps exporting them.
export { MAX_TRANSFER_BYTES, shellQuote };
export { OutputCollector, TIMEOUT_EXIT_CODE, timeoutMessage, type ExecuteStream } from "./output.js";

/** Thrown by grepOnce when GNU grep's raw answer may have come back altered by decoding: grep runs again with base64. */
const NOT_TEXT = new Error("grep's raw answer was not UTF-8");

/** Thrown by runScript for a read that READ_THROUGH_LINK stopped at a link: `target` is where it leads ("" when unknown). */
class ViaLink {
  constructor(readonly target: string) {}
}

/** Output limit of the derived file operations: base64 of MAX_TRANSFER_BYTES plus listing overhead. */
const FILE_OP_OUTPUT_BYTES = Math.ceil((MAX_TRANSFER_BYTES * 4) / 3) + 16 * 1024 * 1024;
/** Largest window of a big file `read` returns, in bytes. */
const MAX_WINDOW_BYTES = 16 * 1024 * 1024;
/** Largest file whose bytes a sandbox keeps after reading or writing it, for the one-round-trip edit. */
const KNOWN_FILE_BYTES = 1024 * 1024;
/** Bytes of such copies a sandbox keeps in all. */
const KNOWN_TOTAL_BYTES = 4 * 1024 * 1024;
/** Attempts of an edit whose compare-and-swap keeps losing to other writers before it answers `conflict`. */
const EDIT_ATTEMPTS = 32;
/**
 * How far a sandbox's commands are kept from the host: a separate process
 * (local), Linux namespaces (bubblewrap), a container (docker), another
 * machine's account (ssh). Every sandbox reports it as `isolation`, and the
 * runtime's providers as `capabilities().isolation`.
 */
export type IsolationLevel = "process" | "namespace" | "container" | "remote";

/**
 * Whether a sandbox's commands reach a network: false (the default wherever
 * a sandbox can cut it) gives them none, only their own loopback; true gives
 * them the network of the environment they run in (the host's for
 * bubblewrap; Docker's default bridge, where `dockerNetwork` names another).
 */
export type NetworkAccess = boolean;

/**
 * Options every sandbox takes. `workspace` is each sandbox's own option: the
 * directory holding the files, named as the environment that owns them
 * names it (a host directory for local and bubblewrap, a directory inside
 * the container for docker, a directory on the remote machine for ssh).
 */
export interface BaseSandboxOptions {
  /**
   * Limits on the workspace (default SANDBOX_DEFAULTS.quota; a given field
   * replaces its default; `false` for none). Writes, edits and uploads that
   * would pass it answer `quota_exceeded`; commands are not limited by it.
   */
  quota?: Quota | false;
  /** Seconds a command may run when its call gives no timeout (default SANDBOX_DEFAULTS.timeoutSeconds, 300). */
  timeout?: number;
  /** Output bytes kept per command (default SANDBOX_DEFAULTS.maxOutputBytes, 1 MiB); past 64 times that, the command is killed. */
  maxOutputBytes?: number;
  /**
   * Permission rules on every file operation and command (docs/permissions.md).
   * Default `{ rules: SECRETS_PRESET }`. `{ rules, ask }` replaces it; false
   * turns rules off. Bubblewrap and Docker also hide what the rules deny for
   * reading from commands; Local and SSH cannot.
   */
  permissions?: PermissionOptions | false;
  /**
   * Host environment variables every command receives, by name, read from
   * this process's environment when the sandbox is made (an unset one is
   * left out). Commands get no other host variable. A name that looks
   * secret (containing KEY, SECRET, TOKEN or PASSWORD, any case) is refused
   * unless `allowSecretEnv` names it too. The `env` option's values win over these.
   */
  passEnv?: readonly string[];
  /** The secret-looking names of `passEnv` that are meant to pass: the explicit opt-in. */
  allowSecretEnv?: readonly string[];
}

/**
 * The host variables `passEnv` names, as they are now. Throws
 * `invalid_argument` for a secret-looking name not in `allowSecretEnv`, so
 * the mistake stops the constructor instead of leaking a credential.
 */
export function passedHostEnv(options: Pick<BaseSandboxOptions, "passEnv" | "allowSecretEnv">): Record<string, string> {
  const names = options.passEnv ?? [];
  const allowed = options.allowSecretEnv ?? [];
  if (!Array.isArray(names) || names.some((n) => typeof n !== "string" || !ENV_NAME.test(n))) throw errors.invalidArgument("passEnv must be an array of environment variable names");
  if (!Array.isArray(allowed) || allowed.some((n) => typeof n !== "string")) throw errors.invalidArgument("allowSecretEnv must be an array of environment variable names");
  const env: Record<string, string> = {};
  for (const name of names as string[]) {
    if (looksSecret(name) && !(allowed as string[]).includes(name)) {
      throw errors.invalidArgument(`passEnv names '${printable(name)}', which looks secret (KEY, SECRET, TOKEN or PASSWORD); list it in allowSecretEnv too to pass it`);
    }
    const value = process.env[name];
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** Limits on a sandbox's processes together, for the sandboxes that can set them (bubblewrap, docker). */
export interface ResourceLimitOptions {
  /** Memory for all of the sandbox's processes together, in MiB (default SANDBOX_DEFAULTS.memoryMb, 1024). */
  memoryMb?: number;
  /** Processes (and threads) the sandbox may hold at once (default SANDBOX_DEFAULTS.maxProcesses, 256; stops fork bombs). */
  maxProcesses?: number;
}

/** An environment variable name a process can receive: not empty, no `=`, no NUL. */
const ENV_NAME = /^[^=\0]+$/;

/** Checks `execute`'s arguments once for every sandbox: a wrong type or value is `invalid_argument`, never a raw TypeError. */
function checkExecute(command: unknown, options: unknown): ExecuteOptions {
  if (typeof command !== "string") throw errors.invalidArgument(`command must be a string, got ${typeof command}`);
  if (command.includes("\0")) throw errors.invalidArgument("the command contains a NUL byte");
  if (options === undefined) return {};
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw errors.invalidArgument(`execute options must be an object such as { timeout: 30 }, got ${options === null ? "null" : typeof options}`);
  }
  const checked = { ...(options as ExecuteOptions) };
  if (checked.timeout !== undefined) timeoutSeconds(checked.timeout);
  if (checked.maxOutputBytes !== undefined) checked.maxOutputBytes = byteCount(checked.maxOutputBytes, "maxOutputBytes");
  if (checked.cwd !== undefined && (typeof checked.cwd !== "string" || checked.cwd.includes("\0"))) {
    throw errors.invalidArgument("cwd must be a path without NUL bytes");
  }
  if (checked.env !== undefined) {
    if (typeof checked.env !== "object" || checked.env === null || Array.isArray(checked.env)) throw errors.invalidArgument("env must be an object of strings");
    for (const [name, value] of Object.entries(checked.env)) {
      if (!ENV_NAME.test(name)) throw errors.invalidArgument(`'${printable(name)}' is not a valid environment variable name`);
      if (typeof value !== "string" || value.includes("\0")) {
        throw errors.invalidArgument(`environment variable '${printable(name)}' must be a string without NUL bytes`);
      }
    }
  }
  if (checked.stdin !== undefined && typeof checked.stdin !== "string" && !(checked.stdin instanceof Uint8Array) && !(checked.stdin instanceof ReadableStream)) {
    throw errors.invalidArgument("stdin must be a string, bytes or a ReadableStream of bytes");
  }
  if (checked.onData !== undefined && typeof checked.onData !== "function") throw errors.invalidArgument("onData must be a function");
  if (checked.signal !== undefined && !(checked.signal instanceof AbortSignal)) throw errors.invalidArgument("signal must be an AbortSignal");
  if (checked.onOutput !== undefined && typeof checked.onOutput !== "function") throw errors.invalidArgument("onOutput must be a function");
  return checked;
}


/** A command stopped by its caller's signal answers `aborted`, with the reason the caller gave. */
function abortedBy(signal: AbortSignal | undefined, error: unknown): unknown {
  if (!signal?.aborted || error !== signal.reason || error instanceof StrataError) return error;
  const reason = error instanceof Error ? error.message : typeof error === "string" ? error : "";
  return new StrataError("aborted", `The command was aborted by its signal${reason ? `: ${printable(reason)}` : ""}`, { cause: error });
}

/**
 * A sandbox: a workspace directory inside an isolated environment plus a
 * shell. Subclasses implement `execute`, `uploadFiles` and `downloadFiles`
 * (virtual paths), and may override `close` (call `super.close()` first).
 */
export abstract class BaseSandbox extends BaseBackend implements Sandbox {
  abstract readonly id: string;
  /** How far commands are kept from the host. */
  abstract readonly isolation: IsolationLevel;
  /** Absolute path of the workspace inside the sandbox; virtual "/" maps here. Commands run here by default. */
  abstract readonly workspace: string;
  /** Runs `command` with `/bin/sh -c` in the workspace (or `options.cwd`, a virtual path); may throw a StrataError. */
  protected abstract doExecute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse>;
  protected abstract override doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]>;
  protected abstract override doDownload(paths: readonly string[]): Promise<DownloadAnswer[]>;

  /** Seconds a derived file operation may run before it is killed. */
  protected fileOperationTimeout = 300;
  /**
   * Derived file operations' scripts running at once; more wait their turn
   * here. Each script is a shell plus a few short-lived tools (more on
   * Bubblewrap: its own processes), so dozens of concurrent operations
   * could exhaust the sandbox's process limit, and a shell that cannot fork
   * dies mid-script without a status.
   */
  protected fileOperationConcurrency = 8;
  /**
   * The subclass's own upload channel keeps the quota exactly (LocalSandbox: its FilesystemBackend; DockerSandbox: its upload
   * script, in the same request), so uploads are not measured here too.
   */
  protected uploadsKeepQuota = false;
  /** The turns of the derived operations' scripts (fileOperationConcurrency at once, read as each script starts). */
  private readonly scriptSlots = new Slots(() => this.fileOperationConcurrency);
  /** The workspace quota, undefined for none. */
  readonly quota: Quota | undefined;
  /** The sandbox's limit options, checked and with SANDBOX_DEFAULTS filled in. */
  protected readonly settings: SandboxLimits;
  private isClosed = false;
  /** One controller per running command, so close() stops each without a listener on a shared signal. */
  private readonly liveCommands = new Set<AbortController>();
  private readonly commandSignals = new WeakSet<AbortSignal>();
  /** Option objects of the derived operations' own scripts (they do not make the usage stale). */
  private readonly ownScripts = new WeakSet<object>();
  /** The options objects of derived operations' scripts as a subclass's doExecute receives them (they see every file; commands may not). */
  private readonly ownRuns = new WeakSet<object>();
  /** The host variables `passEnv` named, read when the sandbox was made; each subclass hands them to every command. */
  protected readonly passedEnv: Readonly<Record<string, string>>;
  /** The permission rules this sandbox was made with; undefined when they are off. */
  private readonly permissionRules: readonly PermissionRule[] | undefined;
  private rulePolicy: PermissionPolicy | undefined;
  /** Workspace usage as last measured plus the deltas of our own writes; undefined once a command may have changed it. */
  private usage: Usage | undefined;
  /**
   * Files this sandbox last read whole or wrote, with their md5: an edit
   * applies to that copy and sends the compare-and-swap at once (one round
   * trip). The swap compares with the file as it is, so a stale copy costs
   * only the usual fetch afterwards, never a lost write.
   */
  private readonly known = new KnownContent();
  /** Whether the sandbox's find has GNU's -printf (see findFlavor): undefined until a script reported it. */
  private findPrintf: boolean | undefined;
  /** Paths whose last read was not UTF-8 text up to 1 MiB (the quick read did not do): their next read skips it. */
  private readonly notText = new Set<string>();
  /** How grep's candidates are found here (see grepFlavor): undefined until a script reported it. */
  private grepKind: string | undefined;

  constructor(options: BaseSandboxOptions & ResourceLimitOptions = {}) {
    super();
    this.settings = sandboxLimits(options);
    this.quota = this.settings.quota;
    this.guardEntryPoints();
    this.passedEnv = passedHostEnv(options);
    this.permissionRules = options.permissions === false ? undefined : (options.permissions?.rules ?? SECRETS_PRESET);
    // The caller gets the instance behind its permission rules (the instance itself, guarded; see guarded()).
    return guarded(this, options.permissions);
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /**
   * Releases the sandbox. Idempotent; commands still running are stopped
   * (their calls reject with `sandbox_closed`), and afterwards every
   * operation fails with `sandbox_closed`.
   */
  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    const reason = new StrataError("sandbox_closed", `Sandbox '${this.id}' was closed while the command ran`);
    for (const controller of this.liveCommands) controller.abort(reason);
  }

  /** The signal a subclass hands to a running command: stopped by the call's own signal or by `close()`. */
  protected commandSignal(signal?: AbortSignal): AbortSignal {
    if (signal && this.commandSignals.has(signal)) return signal;
    // Only reached by a command that bypassed the guarded execute; close() cannot reach it, so it is tied to the caller's signal alone.
    return signal ?? new AbortController().signal;
  }

  /**
   * What a command must not see: the rules, when one of them denies reading,
   * for a caller's command (a derived operation's own script sees every file;
   * the permission wrapper has already decided what it may touch). Bubblewrap
   * and Docker hide the paths these rules deny from the command.
   */
  protected hiddenFromCommand(options: ExecuteOptions): PermissionPolicy | undefined {
    if (this.permissionRules === undefined || this.ownRuns.has(options)) return undefined;
    this.rulePolicy ??= new PermissionPolicy(this.permissionRules, this.workspace);
    return this.rulePolicy.hasDenials("read") ? this.rulePolicy : undefined;
  }

  /** Whether a subclass's doExecute runs one of the derived operations' own scripts (runScript), not a caller's command. */
  protected isOwnScript(options: ExecuteOptions): boolean {
    return this.ownRuns.has(options);
  }

  private closedSandboxError(): StrataError {
    return errors.sandboxClosed(`Sandbox '${this.id}'`);
  }

  /**
   * A call cut short by close() answers sandbox_closed, whatever the transport
   * saw as the sandbox went away (a dropped SSH connection, a killed process).
   */
  private closedIfClosing(error: unknown): unknown {
    if (!this.isClosed || (error instanceof StrataError && error.code === "sandbox_closed")) return error;
    return new StrataError("sandbox_closed", `Sandbox '${this.id}' was closed while the call ran`, { cause: error });
  }

  /**
   * Wraps the three methods a subclass implements, once for every sandbox:
   * argument checks, the closed state, a per-command abort signal, the quota
   * on uploads, per-item answers instead of throws, and paths echoed exactly
   * as requested. (Reading the subclass's methods here, not in the
   * constructor body, keeps TypeScript's abstract-member rule satisfied.)
   */
  private guardEntryPoints(): void {
    const execute = this.doExecute;
    const upload = this.doUpload;
    const download = this.doDownload;
    this.doExecute = (command, options) => this.guardedExecute(execute, command, options);
    this.doUpload = (files) => this.guardedUpload(upload, files);
    this.doDownload = (paths) => this.guardedDownload(download, paths);
  }

  /** The native `execute`: a bare number where the options belong is `invalid_argument` (`toSeedProtocol` takes the seeds' `execute(cmd, timeout)`). */
  async execute(command: string, options?: ExecuteOptions): Promise<Result<ExecuteResponse>> {
    let copy: ExecuteOptions | undefined;
    let driverOptions: ExecuteOptions;
    try {
      copy = readOptions(options);
      // Checked before the cwd is translated, so a bad cwd is invalid_argument as every other bad option is.
      driverOptions = this.driverOptions(checkExecute(command, copy));
    } catch (error) {
      return { error: toErrorInfo(error) }; // refused before the sandbox saw it: it names the caller's own paths
    }
    try {
      return await this.doExecute(command, driverOptions);
    } catch (error) {
      return { error: this.callerError(toErrorInfo(this.closedIfClosing(abortedBy(copy?.signal, error)))) };
    }
  }

  /**
   * Files and commands share one path space: the workspace's absolute paths
   * (`/workspace/app.py` is the same file for `read` and for `python3`), and
   * a relative path starts in the workspace, the commands' working directory.
   */
  protected override get pathRoot(): string {
    return this.workspace;
  }

  /** A command's options with its `cwd` as the driver names it. */
  private driverOptions<T>(options: T): T {
    if (typeof options !== "object" || options === null || typeof (options as ExecuteOptions).cwd !== "string") return options;
    return { ...options, cwd: this.toDriverPath((options as ExecuteOptions).cwd!) };
  }

  /** Starts a command with live streams; see `SpawnedProcess`. */
  async spawn(command: string, options: SpawnOptions = {}): Promise<Result<SpawnedProcess>> {
    try {
      let checked: SpawnOptions;
      try {
        const read = checkSpawn(readOptions(options));
        checkExecute(command, read);
        checked = this.driverOptions(read);
      } catch (error) {
        return { error: toErrorInfo(error) }; // refused before the sandbox saw it: it names the caller's own paths
      }
      this.assertOpen();
      return spawnFromExecute((run) => this.doExecute(command, { ...checked, ...run }), checked.signal, (error) => this.callerError(error));
    } catch (error) {
      return { error: this.callerError(toErrorInfo(error)) };
    }
  }

  private async guardedExecute(inner: BaseSandbox["doExecute"], command: unknown, options: unknown): Promise<ExecuteResponse> {
    const checked = checkExecute(command, options);
    if (this.isClosed) throw this.closedSandboxError();
    const own = typeof options === "object" && options !== null && this.ownScripts.has(options);
    if (!own) {
      this.usage = undefined;
      this.known.clear();
    }
    const controller = new AbortController();
    const signal = checked.signal ? AbortSignal.any([checked.signal, controller.signal]) : controller.signal;
    this.commandSignals.add(signal);
    this.liveCommands.add(controller);
    const run = { ...checked, signal };
    if (own) this.ownRuns.add(run);
    try {
      return await inner.call(this, command as string, run);
    } catch (error) {
      throw this.closedIfClosing(error);
    } finally {
      this.liveCommands.delete(controller);
      if (!own) this.usage = undefined;
    }
  }

  private async guardedUpload(inner: BaseSandbox["doUpload"], files: unknown): Promise<UploadAnswer[]> {
    const items = files as unknown[];
    // Paths are echoed as given, never String()ed: an agent's JSON object can carry a `toString` that is not a function.
    const responses: UploadAnswer[] = items.map((item) => ({ path: (Array.isArray(item) ? item[0] : item) as string, error: null }));
    const pending: { index: number; item: readonly [string, Uint8Array] }[] = [];
    items.forEach((item, index) => {
      if (!Array.isArray(item) || typeof item[0] !== "string") responses[index]!.error = "invalid_path";
      else pending.push({ index, item: item as unknown as readonly [string, Uint8Array] });
    });
    if (this.isClosed) {
      for (const { index } of pending) responses[index]!.error = "sandbox_closed";
      return responses;
    }
    try {
      let accepted = pending;
      if (this.quota && !this.uploadsKeepQuota) {
        // Every item counted as a new file of its full size: an overwrite is over-counted, never under.
        const usage = { ...(await this.currentUsage()) };
        accepted = pending.filter(({ index, item: [path, content] }) => {
          const delta = { bytes: content instanceof Uint8Array ? content.length : 0, files: 1 };
          try {
            checkQuota(this.quota, usage, delta, path);
          } catch (error) {
            responses[index]!.error = (asStrataError(error, path).code);
            return false;
          }
          usage.bytes += delta.bytes;
          usage.files += delta.files;
          return true;
        });
      }
      for (const { item } of accepted) this.known.forgetPath(item[0]);
      if (accepted.length > 0) {
        const answers = await inner.call(this, accepted.map(({ item }) => item));
        accepted.forEach(({ index }, i) => (responses[index]!.error = answers[i] ? answers[i].error : "io_error"));
      }
    } catch (error) {
      const code = (asStrataError(this.closedIfClosing(error), "/").code);
      for (const { index } of pending) responses[index]!.error ??= code;
    } finally {
      this.usage = undefined;
    }
    return responses;
  }

  private async guardedDownload(inner: BaseSandbox["doDownload"], paths: unknown): Promise<DownloadAnswer[]> {
    const items = paths as unknown[];
    const responses: DownloadAnswer[] = items.map((path) => ({ path: path as string, content: null, error: null }));
    const pending: { index: number; path: string }[] = [];
    items.forEach((path, index) => {
      if (typeof path !== "string") responses[index]!.error = "invalid_path";
      else pending.push({ index, path });
    });
    if (this.isClosed) {
      for (const { index } of pending) responses[index]!.error = "sandbox_closed";
      return responses;
    }
    try {
      const answers = pending.length === 0 ? [] : await inner.call(this, pending.map(({ path }) => path));
      pending.forEach(({ index }, i) => {
        const answer = answers[i];
        responses[index]!.content = answer?.content ?? null;
        responses[index]!.error = answer ? answer.error : "io_error";
      });
    } catch (error) {
      const code = (asStrataError(this.closedIfClosing(error), "/").code);
      for (const { index } of pending) {
        responses[index]!.content = null;
        responses[index]!.error = code;
      }
    }
    return responses;
  }

  /** The workspace usage, measured inside the sandbox when a command may have changed it (one round trip). */
  private async currentUsage(): Promise<Usage> {
    if (this.usage) return this.usage;
    const { fields } = await this.runScript("/", `${QUOTA_FN}\nmeasure\necho "usage $UB $UF"`);
    this.usage = { bytes: Number(fields[0]) || 0, files: Number(fields[1]) || 0 };
    return this.usage;
  }

  /** Shell variables for QUOTA_FN: the limits, and the cached usage or -1 to measure in the same script. */
  private quotaVariables(): { script: string; measured: boolean } {
    if (!this.quota) return { script: "QB=-1 QF=-1 UB=0 UF=0", measured: false };
    const usage = this.usage;
    const limit = (value: number | undefined) => (value === undefined ? "-1" : int(value));
    return {
      script: `QB=${limit(this.quota.maxBytes)} QF=${limit(this.quota.maxFiles)} UB=${usage ? int(usage.bytes) : "-1"} UF=${usage ? int(usage.files) : "-1"}`,
      measured: usage === undefined,
    };
  }

  /** Takes a write's `ok UB UF DB DF` line into the cached usage. */
  private recordWrite(fields: string[], measured: boolean): void {
    if (!this.quota) return;
    const [bytes, files, addBytes, addFiles] = fields.map(Number) as [number, number, number, number];
    if (![bytes, files, addBytes, addFiles].every(Number.isFinite)) {
      this.usage = undefined;
    } else if (measured) {
      this.usage = { bytes: bytes + addBytes, files: files + addFiles };
    } else if (this.usage) {
      this.usage = { bytes: this.usage.bytes + addBytes, files: this.usage.files + addFiles };
    }
  }

  /**
   * `execute`, as an async iterable of output chunks as they arrive, and the
   * final response in `result`. Leaving the loop early stops the command.
   */
  executeStream(command: string, options: Omit<ExecuteOptions, "onOutput"> = {}): ExecuteStream {
    return streamExecute((line, run) => this.execute(line, run), command, options);
  }

  protected assertOpen(): void {
    if (this.isClosed) throw this.closedSandboxError();
  }

  /** Where a normalised virtual path lives inside the sandbox. */
  protected sandboxPath(path: string): string {
    if (path === "/") return this.workspace;
    return this.workspace === "/" ? path : this.workspace + path;
  }

  /** The virtual path of a path inside the sandbox's workspace (throws `invalid_path` for a name no virtual path can address). */
  protected virtualPath(sandboxPath: string): string {
    return normalizePath(this.workspace === "/" ? sandboxPath : sandboxPath.slice(this.workspace.length) || "/");
  }

  /** Like virtualPath, but undefined for a name no virtual path can address (a command may create `a\\b`); listings leave those out. */
  private addressable(sandboxPath: string): string | undefined {
    try {
      return this.virtualPath(sandboxPath);
    } catch {
      return undefined;
    }
  }

  /**
   * Runs a derived operation's script: stderr silenced, byte-oriented locale,
   * generous output limit. The script's first output line is a status word.
   */
  protected async runScript(
    path: string,
    body: string,
    options: { stdin?: Uint8Array; env?: Record<string, string>; exitCodes?: readonly number[] } = {},
  ): Promise<{ status: string; fields: string[]; payload: string }> {
    this.assertOpen();
    // Every script ends in `exit 0`: a run that did not reach the end is told apart by its exit code. A script whose
    // last step is `exec tool` ends with the tool's code instead; `exitCodes` lists the ones that still mean the end.
    const { exitCodes = [0], ...given } = options;
    const script = `exec 2>/dev/null\nexport LC_ALL=C\nW=${shellQuote(this.workspace)}\n${body}\nexit 0`;
    const run = { ...given, cwd: "/", timeout: this.fileOperationTimeout, maxOutputBytes: FILE_OP_OUTPUT_BYTES };
    this.ownScripts.add(run);
    await this.scriptSlots.acquire(); // A waiting script gets the slot of the script that ends.
    let response: ExecuteResponse;
    try {
      response = await this.doExecute(script, run);
    } finally {
      this.scriptSlots.release();
    }
    if (response.truncated) {
      throw new StrataError("too_large", `The result for '${path}' is over ${FILE_OP_OUTPUT_BYTES} bytes; narrow the request`);
    }
    const newline = response.output.indexOf("\n");
    const [status = "", ...fields] = (newline === -1 ? "" : response.output.slice(0, newline)).split(" ");
    if (status === "" || response.exitCode === null || !exitCodes.includes(response.exitCode)) {
      throw new StrataError(
        response.exitCode === TIMEOUT_EXIT_CODE ? "timeout" : "io_error",
        `The sandbox could not complete the operation on '${path}' (exit code ${String(response.exitCode)})`,
      );
    }
    const error = statusError(status, path, fields);
    if (error) throw error;
    const payload = response.output.slice(newline + 1);
    // A target holding a newline runs past the status line: not a path to trust.
    if (status === "via") throw new ViaLink(payload === "" ? fields.join(" ") : "");
    return { status, fields, payload };
  }

  /**
   * Uploads through the shell, for sandboxes without a side channel: file
   * bytes go concatenated through stdin and `dd` cuts them apart, so a batch
   * is one round trip (more only past ~64 MiB or very many long paths).
   * Paths resolve inside the sandbox, so a symlink there cannot reach the host.
   */
  protected async uploadThroughShell(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    this.assertOpen();
    const responses: UploadAnswer[] = files.map(([path]) => ({ path, error: null }));
    const pending: { index: number; path: string; bytes: Uint8Array }[] = [];
    files.forEach(([filePath, bytes], index) => {
      try {
        const path = normalizePath(filePath);
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        if (path === "/") throw errors.isDirectory(path);
        responses[index] = { path, error: null };
        pending.push({ index, path, bytes });
      } catch (error) {
        responses[index] = { path: filePath, error: failure(error, filePath).code };
      }
    });
    for (const batch of batches(pending, (item) => item.bytes.length, (item) => item.path.length)) {
      const calls = batch.map((item) => `put ${shellQuote(this.sandboxPath(item.path))} ${item.bytes.length} ${tempName()} ${shellQuote(this.lockPath(item.path))}`);
      const stdin = new Uint8Array(batch.reduce((sum, item) => sum + item.bytes.length, 0));
      let offset = 0;
      for (const item of batch) {
        stdin.set(item.bytes, offset);
        offset += item.bytes.length;
      }
      let codes: (ErrorCode | null)[];
      try {
        const { payload } = await this.runScript(batch[0]!.path, `${PLACE_FN}\n${LOCK_FN}\n${SIZE_FN}\n${PUT_FN}\necho ok\n${calls.join("\n")}`, { stdin });
        const statuses = payload.split("\n");
        codes = batch.map((item, i) => {
          const status = statuses[i] ?? "failed";
          return status === "ok" ? null : (statusError(status, item.path, [])?.code ?? "io_error");
        });
      } catch (error) {
        const code = failure(error, batch[0]!.path).code;
        codes = batch.map(() => code);
      }
      batch.forEach((item, i) => {
        const code = codes[i]!;
        responses[item.index] = { path: item.path, error: code === null ? null : (code) };
      });
    }
    return responses;
  }

  /** Downloads through the shell as base64: one round trip per ~64 MiB of content. */
  protected async downloadThroughShell(paths: readonly string[]): Promise<DownloadAnswer[]> {
    this.assertOpen();
    const responses: DownloadAnswer[] = paths.map((path) => ({ path, content: null, error: null }));
    let pending: { index: number; path: string }[] = [];
    paths.forEach((filePath, index) => {
      try {
        pending.push({ index, path: normalizePath(filePath) });
      } catch (error) {
        responses[index]!.error = failure(error, filePath).code;
      }
    });
    while (pending.length > 0) {
      const later: typeof pending = [];
      for (const batch of batches(pending, () => 0, (item) => item.path.length)) {
        const calls = batch.map((item) => `get ${shellQuote(this.sandboxPath(item.path))}`);
        let payload = "";
        try {
          payload = (await this.runScript(batch[0]!.path, `${GET_FN}\necho ok\n${calls.join("\n")}`)).payload;
        } catch (error) {
          for (const item of batch) responses[item.index]!.error = failure(error, item.path).code;
          continue;
        }
        let at = 0;
        for (const item of batch) {
          const end = payload.indexOf("\0", at);
          const record = end === -1 ? "failed\n" : payload.slice(at, end);
          at = end + 1;
          const newline = record.indexOf("\n");
          const [status = "failed", ...fields] = record.slice(0, newline).split(" ");
          if (status === "ok") responses[item.index]!.content = fromBase64(record.slice(newline + 1));
          else if (status === "later") later.push(item);
          else responses[item.index]!.error = (statusError(status, item.path, fields)?.code ?? "io_error");
        }
      }
      pending = later;
    }
    return responses;
  }

  /**
   * One find over the directory. Where find has -printf (G=1), it prints
   * every entry but links itself (no process per batch) and hands the links
   * to STAT_BATCH: ls follows links, and find -L would leave out a link that
   * loops (to its own directory, to an ancestor), so a link's target is
   * stat -L's to read, which names the link either way.
   */
  protected async doLs(dirPath: string): Promise<FileInfo[]> {
    this.assertOpen();
    const dir = normalizePath(dirPath);
    return this.readThrough(dir, (target) => this.lsAt(dir, target), []);
  }

  /** doLs on `target`, the path in the sandbox of `dir` or of the directory a link there leads to (see readThrough). */
  private async lsAt(dir: string, target: string): Promise<FileInfo[]> {
    // Reached by a link: an entry the rules do not let be read by its own path is left out.
    const via = target === this.sandboxPath(dir) ? undefined : target;
    const batch = `-exec sh -c ${shellQuote(STAT_BATCH)} sh {} +`;
    const printf = `exec find . -mindepth 1 -maxdepth 1 \\( -type l ${batch} \\) -o ${FIND_PRINTF}`;
    const stat = `find . -mindepth 1 -maxdepth 1 ${batch}`;
    // Once the sandbox said which find it has, only that find's shell is sent.
    const known = this.findPrintf;
    const { status, fields, payload } = await this.runScript(
      dir,
      `P=${shellQuote(target)}
${this.readGuard}if [ -d "$P" ]; then
  cd -- "$P" || { echo denied; exit 0; }
  ${findFlavor(known)}
  echo "dir $G"
  ${known === undefined ? `if [ "$G" = 1 ]; then ${printf}; fi\n  ${stat}` : known ? printf : stat}
elif [ -e "$P" ]; then
  echo file
  ${known ? `exec find -H "$P" -maxdepth 0 ${FIND_PRINTF}` : `set -- "$P"; ${STAT_BATCH}`}
else
  echo absent
fi`,
      // find, exec'd, answers 1 for a directory it could not read.
      { exitCodes: [0, 1] },
    );
    if (status === "absent") return [];
    if (status === "dir") this.learnFindFlavor(fields[0]);
    const entries: FileInfo[] = [];
    for (const entry of parseListing(payload)) {
      if (status === "file") {
        entries.push(fileInfo(dir, entry));
        continue;
      }
      const name = entry.name.slice(2); // find prints "./name"
      if (name.includes("\\") || RESERVED_NAME.test(name)) continue; // No virtual path can address it, or an operation in flight owns it.
      if (via !== undefined && this.rulePolicy!.check("read", joinPath(via, name)).action !== "allow") continue;
      const path = joinPath(dir, name);
      entries.push(entry.isDir ? { path: `${path}/`, is_dir: true } : fileInfo(path, entry));
    }
    return sortByPath(entries);
  }

  /** Takes a script's report of its find (G: "1" GNU -printf, "0" not), so later scripts send only that find's shell. */
  private learnFindFlavor(reported: string | undefined): void {
    if (reported === "1" || reported === "0") this.findPrintf = reported === "1";
  }

  protected override async doRead(filePath: string, offset: number, limit: number): Promise<TextWindow> {
    this.assertOpen();
    const path = normalizePath(filePath);
    return this.readThrough(path, (target) => this.readAt(path, target, offset, limit));
  }

  /**
   * The rules' guard for a read's script (READ_THROUGH_LINK) where they deny
   * or ask for some reads; nothing where they do not.
   */
  private get readGuard(): string {
    if (this.permissionRules === undefined) return "";
    this.rulePolicy ??= new PermissionPolicy(this.permissionRules, this.workspace);
    return this.rulePolicy.hasRestrictions("read") ? `${LINKED_FN}\n${READ_THROUGH_LINK}\n` : "";
  }

  /**
   * Runs a read's script on `path` (`run` takes its path in the sandbox).
   * Where readGuard stopped it at a link, the file the link leads to is
   * checked against the rules, and only a file they allow outright is read,
   * by its own path (no link left to swap but by a command racing the read).
   */
  private async readThrough<T>(path: string, run: (target: string) => Promise<T>, missing?: T): Promise<T> {
    let target: string;
    try {
      return await run(this.sandboxPath(path));
    } catch (error) {
      if (!(error instanceof ViaLink)) throw error;
      target = error.target;
    }
    // readlink -f found nothing to resolve to (a loop, a missing directory): nothing to read there.
    if (!target.startsWith("/")) {
      if (missing !== undefined) return missing;
      throw errors.notFound(path);
    }
    if (this.rulePolicy!.check("read", target).action !== "allow") {
      throw new StrataError("permission_denied", `'${printable(path)}' leads by a symbolic link to a path the permission rules do not let be read`, { path });
    }
    try {
      return await run(target);
    } catch (error) {
      if (error instanceof ViaLink) throw new StrataError("permission_denied", `'${printable(path)}' changed links while it was read`, { path });
      throw error;
    }
  }

  /** doRead on `target`, the path in the sandbox of virtual `path`, or of the file a link there leads to. */
  private async readAt(path: string, target: string, offset: number, limit: number): Promise<TextWindow> {
    {
      const whole = this.notText.has(path) ? undefined : await this.readWholeText(path, target);
      if (!whole) this.remember(this.notText, path);
      if (whole) {
        this.known.remember(path, whole);
        const text = decodeText(whole);
        if (text === null) throw errors.binary(path, whole.length);
        return textWindow(text, path, offset, limit);
      }
      // limit is clamped to 2^53-1 and offset is at most that, so the sum stays exact and prints without an exponent.
      const last = Math.min(offset + limit, Number.MAX_SAFE_INTEGER);
      const { status, fields, payload } = await this.runScript(
        path,
        `P=${shellQuote(target)}
${this.readGuard}${CHECK_REGULAR_FILE}
s=$(($(wc -c < "$P")))
# exec: the shell's last step needs no process of its own.
if [ "$s" -le ${WHOLE_FILE_BYTES} ]; then echo "whole $s"; exec base64 < "$P"; fi
n=$(($(wc -l < "$P")))
[ "$(tail -c 1 < "$P" | wc -l)" -eq 0 ] && n=$((n + 1))
z=$(($(tr -d '\\000' < "$P" | wc -c)))
echo "window $s $n $z"
sed -n '${int(offset + 1)},${int(last)}p;${int(last)}q' < "$P" | head -c ${MAX_WINDOW_BYTES + 1} | base64`,
      );
      const size = Number(fields[0]);
      const bytes = fromBase64(payload);
      if (status === "whole") {
        this.known.remember(path, bytes);
        const text = decodeText(bytes);
        if (text === null) throw errors.binary(path, size);
        if (!text.includes("\uFFFD")) this.notText.delete(path); // text the quick read can take again
        return textWindow(text, path, offset, limit);
      }
      // A big file: the shell sent the window, the line count and the size without NUL bytes.
      if (bytes.length > MAX_WINDOW_BYTES) throw errors.tooLarge(path, bytes.length, MAX_WINDOW_BYTES);
      const text = decodeText(bytes);
      if (text === null || Number(fields[2]) !== size) throw errors.binary(path, size);
      const totalLines = Number(fields[1]);
      checkOffset(offset, totalLines, path);
      return { lines: splitLines(text), totalLines };
    }
  }

  /** Adds to a small set of paths, emptied when it grows past 256 (a hint only: losing it costs a round trip). */
  private remember(set: Set<string>, path: string): void {
    if (set.size >= 256) set.clear();
    set.add(path);
  }

  /**
   * The usual read, in one process: the file's first 1 MiB + 1 byte as they
   * are (`exec head`: no base64, no size count first). Undefined (the caller
   * runs the full script) when the file is bigger, or when its bytes did not
   * come back unchanged: the sandbox's output is taken as UTF-8, so only text
   * without a replaced sequence is known to be the file's own bytes.
   */
  private async readWholeText(path: string, target: string): Promise<Uint8Array | undefined> {
    let payload: string;
    try {
      ({ payload } = await this.runScript(path, `P=${shellQuote(target)}\n${this.readGuard}${CHECK_REGULAR_FILE}\necho raw\nexec head -c ${WHOLE_FILE_BYTES + 1} -- "$P"`));
    } catch (error) {
      // head failed (the file went or changed between the checks and the read): the full script answers.
      if (isStrataError(error, "io_error")) return undefined;
      throw error;
    }
    if (payload.includes("\uFFFD")) return undefined;
    const bytes = new TextEncoder().encode(payload);
    return bytes.length > WHOLE_FILE_BYTES ? undefined : bytes;
  }

  protected async doReadRaw(filePath: string): Promise<FileDataV2> {
    this.assertOpen();
    const path = normalizePath(filePath);
    return (await this.fetchFile(path)).data;
  }

  /** The whole file, its modification time and a checksum the shell can recompute (for edit's swap). */
  private async fetchFile(path: string): Promise<{ data: FileDataV2; checksum: string }> {
    // The shell checks, hashes and sends the file in separate reads: a writer or a delete between them tears the answer
    // (conflict), or fails a step once the file or its directory is gone (io_error); fetch again, which then answers what is there.
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.readThrough(path, (target) => this.fetchFileOnce(path, target));
      } catch (error) {
        if (!(isStrataError(error, "conflict") || isStrataError(error, "io_error")) || attempt >= 3) throw error;
      }
    }
  }

  private async fetchFileOnce(path: string, target: string): Promise<{ data: FileDataV2; checksum: string }> {
    const { fields, payload } = await this.runScript(
      path,
      `P=${shellQuote(target)}
${this.readGuard}${CHECK_REGULAR_FILE}
s=$(($(wc -c < "$P")))
[ "$s" -le ${MAX_TRANSFER_BYTES} ] || { echo "toolarge $s ${MAX_TRANSFER_BYTES}"; exit 0; }
m=$(stat -L -c %Y -- "$P")
h=$(md5sum < "$P")
echo "ok $s \${m:-0} \${h%% *}"
base64 < "$P"`,
    );
    const modified = new Date(Number(fields[1]) * 1000);
    const timestamp = Number.isFinite(modified.getTime()) && modified.getTime() > 0 ? modified.toISOString() : undefined;
    const bytes = fromBase64(payload);
    const checksum = fields[2] ?? "";
    if (nodeCrypto().createHash("md5").update(bytes).digest("hex") !== checksum) throw errors.conflict(path, "it changed while it was read");
    this.known.remember(path, bytes, checksum);
    const data = fileDataFromBytes(bytes, timestamp);
    if (timestamp) data.modified_at = timestamp;
    return { data, checksum };
  }

  protected async doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    let path = filePath;
    try {
      this.assertOpen();
      path = normalizePath(filePath);
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      if (path === "/") throw errors.isDirectory(path);
      await this.putText(path, content, overwrite ? "replace" : "create");
      return { path, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  /** One write's script (see WRITE_FROM_STDIN); throws the status's error. */
  private async putText(path: string, text: string, mode: "create" | "replace" | "swap", checksum = ""): Promise<void> {
    const stdin = new TextEncoder().encode(text);
    const quota = this.quotaVariables();
    const { fields } = await this.runScript(
      path,
      `P=${shellQuote(this.sandboxPath(path))}
N=${int(stdin.length)} H=${shellQuote(checksum)} ${quota.script}
L=${shellQuote(this.lockPath(path))}
${QUOTA_FN}
${LOCK_FN}
${WRITE_FROM_STDIN(tempName(), mode)}`,
      { stdin },
    );
    this.recordWrite(fields, quota.measured);
    this.known.remember(path, stdin);
  }

  /** The lock directory of a virtual path (LOCK_FN, lockName), in the workspace's top directory; a sandbox's upload takes it too. */
  protected lockPath(path: string): string {
    return `${this.workspace === "/" ? "" : this.workspace}/${lockName(path)}`;
  }

  /**
   * Fetches the file, applies core's `applyEdit` here, and writes back with
   * a compare-and-swap: under the path's lock inside the sandbox, only if
   * the file still has the checksum it had when fetched. Losing the swap to
   * another writer re-reads and re-applies the edit, so concurrent edits of
   * different parts all land; only an edit that keeps losing answers
   * `conflict`. Two round trips when nobody races: one trip would need the
   * replacement done by the shell, which cannot match applyEdit's CRLF and
   * UTF-8 rules with POSIX tools alone. One when the sandbox still holds
   * the bytes it last read or wrote there (`editKnown`).
   */
  protected async doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    let path = filePath;
    try {
      this.assertOpen();
      path = normalizePath(filePath);
      const quick = await this.editKnown(path, oldString, newString, replaceAll);
      if (quick) return quick;
      for (let attempt = 1; ; attempt++) {
        try {
          const { data, checksum } = await this.fetchFile(path);
          const text = fileDataText(data);
          if (text === null) throw errors.binary(path, fileDataSize(data));
          const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, path);
          await this.putText(path, updated, "swap", checksum);
          return { path, occurrences, filesUpdate: null };
        } catch (error) {
          if (!isStrataError(error, "conflict") || attempt >= EDIT_ATTEMPTS) throw error;
          // Back off a little, with jitter, so racing editors do not retry in lockstep.
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 10 * Math.min(attempt, 10)));
        }
      }
    } catch (error) {
      return failure(error, path);
    }
  }

  /**
   * The one-round-trip edit: applied to the copy this sandbox last read or
   * wrote, swapped in only if the file still has that copy's md5. Undefined
   * (the caller fetches) when there is no copy, the edit does not apply to
   * it, or the swap finds the file changed or gone: only the file as it is
   * now may answer those.
   */
  private async editKnown(path: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult | undefined> {
    const copy = this.known.take(path);
    if (!copy) return undefined;
    const text = fileDataText(fileDataFromBytes(copy.bytes));
    if (text === null) return undefined;
    let edited: { text: string; occurrences: number };
    try {
      edited = applyEdit(text, oldString, newString, replaceAll, path);
    } catch {
      return undefined;
    }
    try {
      await this.putText(path, edited.text, "swap", copy.checksum);
    } catch (error) {
      if (isStrataError(error, "conflict") || isStrataError(error, "file_not_found")) return undefined;
      throw error;
    }
    return { path, occurrences: edited.occurrences, filesUpdate: null };
  }

  protected async doDelete(filePath: string): Promise<DeleteResult> {
    return this.deleteInShell(filePath, false) as Promise<DeleteResult>;
  }

  /**
   * A file or link in one script; a directory stays, and its files come back instead, unless no entry below it bears one of
   * `names` (see deleteUnlessDirectory): then it goes in the same script.
   */
  protected override doDeleteUnlessDirectory(filePath: string, names?: readonly string[]): Promise<DeleteResult | FileInfo[]> {
    if (!this[deletesUnlessDirectory]) return super.doDeleteUnlessDirectory(filePath);
    return this.deleteInShell(filePath, true, names);
  }

  /**
   * Only where delete itself is the shell's: a sandbox that deletes another way (LocalSandbox, through FilesystemBackend,
   * which never follows a link) must not gain a shell-side delete, which resolves links as the shell does.
   */
  override get [deletesUnlessDirectory](): boolean {
    return this.doDelete === BaseSandbox.prototype.doDelete;
  }

  /**
   * Under the path's lock, so an edit's compare-and-swap cannot put back a
   * file deleted after its compare. A file or link is one unlink (`rm`
   * without -r or -f: unlink(2) refuses a directory, and of concurrent
   * deletes only one finds the name; the others answer missing). A
   * directory is first renamed to a fresh hidden name beside it (rename(2):
   * one winner again), then removed there, out of every listing's sight;
   * `unlessDirectory` lists its files instead (glob's "**"), unless find,
   * as the user, went through the whole tree without an error and met no
   * entry named as one of `names` (find's -name is looser than the rules'
   * globs, never stricter; an entry it could not see refuses).
   */
  private async deleteInShell(filePath: string, unlessDirectory: boolean, names?: readonly string[]): Promise<DeleteResult | FileInfo[]> {
    let path = filePath;
    try {
      this.assertOpen();
      path = normalizePath(filePath);
      if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
      const target = this.sandboxPath(path);
      const nameTests = names?.map((name) => `-name ${shellQuote(name)}`).join(" -o ");
      const whole = `T=${shellQuote(`${target.slice(0, target.lastIndexOf("/"))}/${tempName()}`)}
whole() {
  if mv -f -T -- "$P" "$T"; then
    if rm -rf -- "$T"; then echo ok; else mv -f -T -- "$T" "$P"; echo denied; fi
  elif [ -e "$P" ] || [ -L "$P" ]; then
    # It cannot be renamed (a directory we may not write): remove it in place.
    if rm -rf -- "$P"; then echo ok; else echo denied; fi
  else
    echo missing
  fi
}`;
      const clean = nameTests === undefined ? "" : nameTests === "" ? "return 0" : `m=$(find "$P" -mindepth 1 \\( ${nameTests} \\) -print 2>/dev/null) && [ -z "$m" ]`;
      const tree = unlessDirectory
        ? `${clean === "" ? "" : whole}
clean() { ${clean || "return 1"}; }
tree() {
  if clean; then whole; return; fi
  ${findFlavor(this.findPrintf)}
  echo "tree $G"
  ${this.listTree(target, false, false)}
}`
        : `${whole}
tree() { whole; }`;
      const { status, fields, payload } = await this.runScript(
        path,
        `P=${shellQuote(target)} L=${shellQuote(this.lockPath(path))} locked=
${LOCK_FN}
${LINKED_FN}
${tree}
trap '[ -z "$locked" ] || rmdir -- "$L"' EXIT
[ -e "$P" ] || [ -L "$P" ] || { echo missing; exit 0; }
linked "$P" && { echo link; exit 0; }
lock || { echo busy; exit 0; }
if [ -d "$P" ] && [ ! -L "$P" ]; then tree
elif rm -- "$P" </dev/null; then
  echo ok; exec rmdir -- "$L"
elif [ -d "$P" ] && [ ! -L "$P" ]; then tree
elif [ -e "$P" ] || [ -L "$P" ]; then echo denied
else echo missing
fi`,
        // The lock's release is the last step: exec'd, no process of its own (the trap does not run then). rmdir answers 1
        // only for a lock broken meanwhile as stale: the file is gone all the same.
        { exitCodes: [0, 1] },
      );
      if (status === "tree") return this.treeEntries(fields[0], payload, compileGlob("**", searchRoot(path)));
      this.known.forgetTree(path);
      return { path, filesUpdate: null };
    } catch (error) {
      this.known.forgetTree(path);
      return failure(error, path);
    }
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transferInShell(from, to, overwrite, "move");
  }

  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.transferInShell(from, to, overwrite, "copy");
  }

  /**
   * A move is one `mv` (a rename: atomic, modes, links and empty directories
   * kept); a copy is `cp -RPp` into a temporary name beside the target, then
   * one rename into place. Both hold the two paths' locks (taken in path
   * order, so crossing moves cannot deadlock), and a copy is held to the
   * quota. A directory goes only where nothing is, or onto an empty directory.
   */
  private async transferInShell(from: string, to: string, overwrite: boolean, kind: "move" | "copy"): Promise<FilesUpdate> {
    this.assertOpen();
    const source = normalizePath(from);
    const target = normalizePath(to);
    const [first, second] = source < target ? [source, target] : [target, source];
    this.known.forgetTree(source);
    this.known.forgetTree(target);
    const quota = this.quotaVariables();
    const T = this.sandboxPath(target);
    const { status } = await this.runScript(
      source,
      `S=${shellQuote(this.sandboxPath(source))} T=${shellQuote(T)} D=${shellQuote(T.slice(0, T.lastIndexOf("/")) || "/")}
X=${shellQuote(`${T.slice(0, T.lastIndexOf("/"))}/${tempName()}`)}
L1=${shellQuote(this.lockPath(first))} L2=${shellQuote(this.lockPath(second))} h1= h2= locked= ${quota.script}
${LOCK_FN}
${QUOTA_FN}
${LINKED_FN}
{ linked "$S" || linked "$T"; } && { echo link; exit 0; }
trap '[ -z "$h1" ] || rmdir -- "$h1"; [ -z "$h2" ] || rmdir -- "$h2"; rm -rf -- "$X"' EXIT
L=$L1; lock || { echo busy; exit 0; }; h1=$L1
L=$L2; locked=; lock || { echo busy; exit 0; }; h2=$L2
[ -e "$S" ] || [ -L "$S" ] || { echo missing; exit 0; }
if [ -e "$T" ] || [ -L "$T" ]; then
  if [ -d "$S" ] && [ ! -L "$S" ]; then
    { [ -d "$T" ] && [ ! -L "$T" ]; } || { echo tnotdir; exit 0; }
    [ -z "$(ls -A -- "$T")" ] || { echo tnotempty; exit 0; }
  elif [ -d "$T" ] && [ ! -L "$T" ]; then echo tisdir; exit 0
  fi
  ${overwrite ? ":" : "echo texists; exit 0"}
fi
mkdir -p -- "$D" && [ -d "$D" ] || { echo tnotdir; exit 0; }
${
  kind === "move"
    ? `if mv -f -T -- "$S" "$T"; then echo ok; else echo failed; fi`
    : `set -- $(du -sk -- "$S"); DB=$((\${1:-0} * 1024)); DF=$(find "$S" -type f | wc -l)
room "$DB" "$DF" || exit 0
if cp -R -P -p -- "$S" "$X" && mv -f -T -- "$X" "$T"; then echo ok; else echo failed; fi`
}`,
    );
    if (kind === "copy") this.usage = undefined;
    switch (status) {
      case "ok":
        return null;
      case "texists":
        throw errors.alreadyExists(target);
      case "tisdir":
        throw errors.isDirectory(target);
      case "tnotdir":
        throw errors.notADirectory(target);
      case "tnotempty":
        throw errors.notEmpty(target);
      default:
        throw errors.io(source);
    }
  }

  /** `mkdir` in the sandbox's shell; a failure is told apart by looking at the ancestors. */
  protected override async doMkdir(filePath: string, recursive: boolean): Promise<FilesUpdate> {
    this.assertOpen();
    const path = normalizePath(filePath);
    if (path === "/") return super.doMkdir(path, recursive);
    const { status } = await this.runScript(
      path,
      `P=${shellQuote(this.sandboxPath(path))}
${LINKED_FN}
linked "$P" && { echo link; exit 0; }
if [ -d "$P" ] && [ ! -L "$P" ]; then echo ${recursive ? "ok" : "direxists"}; exit 0; fi
if [ -e "$P" ] || [ -L "$P" ]; then echo exists; exit 0; fi
if mkdir ${recursive ? "-p " : ""}-- "$P"; then echo ok; else echo mkdirfailed; fi`,
    );
    if (status === "direxists") throw new StrataError("already_exists", `Directory '${printable(path)}' already exists`, { path });
    // mkdir failed: a file in the way of a parent, a missing parent, or no permission; the default checks tell which.
    if (status === "mkdirfailed") await super.doMkdir(path, recursive).then(() => Promise.reject(errors.permissionDenied(path)));
    return null;
  }

  /**
   * The shell finds the files under the search directory that contain the
   * pattern and sends them whole, so core's `grepText` decides lines and
   * binary-ness exactly: with GNU grep, one `grep -z` prints them raw (see
   * GREP_GNU_WHOLE); else the candidates come from one `rg -l -F` where the
   * sandbox has ripgrep (GREP_RIPGREP), or `grep -F -l` batched by `find`
   * (GREP_POSIX), and files up to 1 MiB are sent as base64 (one `wc -c` and
   * one `cat` per batch, not a process per file), bigger ones as `grep -n`
   * lines after a NUL check. GNU grep's raw answer, when it may not be the
   * files' own bytes (U+FFFD) or is too large, is asked again from `grep -rlIF`
   * (GREP_GNU), sent as the other paths send. The glob filter, sorting and
   * the cap are core's, applied here.
   */
  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    // A file replaced between the shell's size count and its read is a torn batch: search again (a writer's rename is quick).
    let whole = true;
    // Where readGuard stopped the search at a linked root: the directory it leads to (see grepOnce's `via`).
    let via: string | undefined;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.grepOnce(pattern, path, glob, maxCount, whole, via);
      } catch (error) {
        if (error instanceof ViaLink) {
          const shown = searchRoot(path);
          if (via !== undefined) throw new StrataError("permission_denied", `'${printable(shown)}' changed links while it was searched`, { path: shown });
          if (!error.target.startsWith("/")) return { matches: [], truncated: false };
          via = error.target;
          attempt--;
        } else if (whole && (error === NOT_TEXT || isStrataError(error, "too_large"))) whole = false;
        else if (!isStrataError(error, "conflict") || attempt >= 3) throw error;
      }
    }
  }

  /**
   * `via`: where the rules deny some reads and the search's root is reached
   * through a link, the directory it leads to. grep runs there; a file the
   * rules do not let be read by its own path is left out, and the others are
   * named under the root as given.
   */
  private async grepOnce(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined, whole: boolean, via?: string): Promise<GrepResult> {
    this.assertOpen();
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    // A pattern with NUL can only match binary files, which grep skips.
    if (pattern.includes("\0")) return { matches: [], truncated: false };
    const kind = this.grepKind;
    // Once the sandbox said which way it finds candidates, only that way's shell is sent.
    const gnuPath = whole ? GREP_GNU_WHOLE : GREP_GNU;
    const gnu = kind === undefined ? `if [ "$F" = gnu ]; then\n${gnuPath}\nexit 0\nfi` : kind === "gnu" ? gnuPath : "";
    const rg = kind === undefined || kind === "rg" ? `if [ "$F" = rg ]; then\n${GREP_RIPGREP}\n[ -n "$rg_done" ] && exit 0\nfi` : "";
    const batches = kind === "gnu" && whole ? "" : `NL='\n'\n${GREP_EMIT}\n${GREP_BATCH}\n`;
    const given = this.sandboxPath(matcher ? matcher.root : root);
    const { fields, payload } = await this.runScript(
      root,
      `R=${shellQuote(via ?? given)}
P=$R
${this.readGuard}${batches}${grepFlavor(kind)}
echo "ok $F"
${gnu}
${rg}
${kind === "gnu" ? "" : GREP_POSIX}`,
      // GNU grep, exec'd, answers 1 for no match and 2 for a file it could not read.
      { env: { STRATA_PATTERN: pattern }, exitCodes: whole ? [0, 1, 2] : [0] },
    );
    if (fields[0] === "rg" || fields[0] === "gnu" || fields[0] === "posix") this.grepKind = fields[0];
    const matches: GrepMatch[] = [];
    const search = (found: string, text: string | null, lines?: { body: Uint8Array; unterminated: number }) => {
      const sandboxFile = via === undefined ? found : this.underLink({ via, given }, found);
      if (sandboxFile === undefined) return;
      const file = this.addressable(sandboxFile);
      if (file === undefined || !isWithin(root, file) || RESERVED_NAME.test(baseName(file)) || (matcher && !matcher(file))) return;
      if (lines) for (const match of parseGrepLines(file, lines.body, lines.unterminated)) matches.push(match);
      else if (text !== null) grepText(file, text, pattern, matches);
    };
    if (whole && fields[0] === "gnu") {
      if (payload.includes("\uFFFD")) throw NOT_TEXT;
      const files = parseWholeRecords(payload);
      if (!files) throw new StrataError("io_error", `The sandbox sent a malformed grep result for '${root}'`);
      for (const [name, text] of files) search(name, text);
      return capMatches(sortMatches(matches), maxCount);
    }
    let at = 0;
    const field = () => {
      const end = payload.indexOf("\0", at);
      if (end === -1) throw new StrataError("io_error", `The sandbox sent a malformed grep result for '${root}'`);
      const value = payload.slice(at, end);
      at = end + 1;
      return value;
    };
    while (at < payload.length) {
      const kind = payload[at++];
      if (kind === "B") {
        // Names one per line, `wc -c` lines in the same order (then a total), the files concatenated as base64.
        const names = field().split("\n").slice(0, -1);
        const sizes = field()
          .split("\n")
          .slice(0, names.length)
          .map((line) => Number(/^\s*(\d+)/.exec(line)?.[1] ?? NaN));
        const body = fromBase64(field());
        if (sizes.reduce((sum, size) => sum + size, 0) !== body.length) {
          throw new StrataError("conflict", `Files under '${root}' changed while grep read them; run it again`);
        }
        let offset = 0;
        names.forEach((name, i) => {
          search(name, decodeText(body.subarray(offset, offset + sizes[i]!)));
          offset += sizes[i]!;
        });
      } else if (kind === "W") {
        const name = field();
        search(name, decodeText(fromBase64(field())));
      } else if (kind === "L") {
        const name = field();
        const unterminated = Number(field());
        search(name, null, { body: fromBase64(field()), unterminated });
      } else {
        throw new StrataError("io_error", `The sandbox sent a malformed grep result for '${root}'`);
      }
    }
    return capMatches(sortMatches(matches), maxCount);
  }

  /** One `find` for files and, with `includeDirectories`, directories: one round trip either way. */
  protected async doGlob(pattern: string, path: string | null, includeDirectories = false): Promise<FileInfo[]> {
    this.assertOpen();
    const matcher = compileGlob(pattern, searchRoot(path));
    const given = this.sandboxPath(matcher.root);
    return this.readThrough(matcher.root, async (root) => {
      const { fields, payload } = await this.runScript(
        matcher.root,
        `P=${shellQuote(root)}\n${this.readGuard}${findFlavor(this.findPrintf)}\necho "ok $G"\n${this.listTree(root, includeDirectories, true)}`,
        { exitCodes: [0, 1] },
      );
      return this.treeEntries(fields[0], payload, matcher, root === given ? undefined : { via: root, given });
    }, []);
  }

  /**
   * The shell that lists a tree for glob (G set by findFlavor): one find, the
   * internal names pruned; only files and directories themselves (-type, no
   * -L), so a link's own size and time are never printed. `last`: the
   * script's last step, so -printf's find may replace the shell (exec: no
   * process of its own; it answers 1 for a directory it could not read, as
   * the batches go on past one).
   */
  private listTree(root: string, includeDirectories: boolean, last: boolean): string {
    const types = includeDirectories ? "\\( -type f -o -type d \\)" : "-type f";
    const printf = `${last ? "exec " : ""}find "$@" ${FIND_PRINTF}`;
    const stat = `find "$@" -exec sh -c ${shellQuote(STAT_BATCH)} sh {} +`;
    // Once the sandbox said which find it has, only that find's shell is sent.
    const list = this.findPrintf === undefined ? `if [ "$G" = 1 ]; then ${printf}; else ${stat}; fi` : this.findPrintf ? printf : stat;
    return `set -- -H ${shellQuote(root)} \\( -name '.strata-tmp-*' -o -name '.strata-lock-*' \\) -prune -o ${types}\n${list}`;
  }

  /**
   * A path found at `via`, where a link at `given` leads (see readThrough),
   * named under `given`; undefined when it lies outside `via` or the rules do
   * not let it be read by its own path. Shared by grep and glob.
   */
  private underLink(link: { via: string; given: string }, found: string): string | undefined {
    if (!isWithin(link.via, found) || this.rulePolicy!.check("read", found).action !== "allow") return undefined;
    return link.given + (link.via === "/" ? found : found.slice(link.via.length));
  }

  /**
   * What listTree printed, as glob's sorted entries; `flavor` is the G the
   * script reported. `link`: the tree was listed at `via`, where a link at
   * `given` leads (see readThrough): what the rules do not let be read by its
   * own path is left out, the rest named under `given`.
   */
  private treeEntries(flavor: string | undefined, payload: string, matcher: ReturnType<typeof compileGlob>, link?: { via: string; given: string }): FileInfo[] {
    const found: FileInfo[] = [];
    this.learnFindFlavor(flavor);
    for (const entry of parseListing(payload)) {
      const name = link ? this.underLink(link, entry.name) : entry.name;
      if (name === undefined) continue;
      const file = this.addressable(name);
      if (file === undefined || RESERVED_NAME.test(baseName(file))) continue;
      if (entry.isDir) {
        if (matcher.matchesDirectory(file)) found.push({ path: `${file}/`, is_dir: true });
      } else if (matcher(file)) {
        found.push(fileInfo(file, entry));
      }
    }
    return sortByPath(found);
  }
}

/**
 * A small bounded cache of file bytes by virtual path, with their md5, for
 * BaseSandbox's one-round-trip edit. Oldest entries go first once the total
 * passes KNOWN_TOTAL_BYTES; bigger files are not kept.
 */
class KnownContent {
  private readonly entries = new Map<string, { bytes: Uint8Array; checksum: string }>();
  private total = 0;

  remember(path: string, bytes: Uint8Array, checksum?: string): void {
    this.forget(path);
    if (bytes.length > KNOWN_FILE_BYTES) return;
    this.entries.set(path, { bytes, checksum: checksum ?? nodeCrypto().createHash("md5").update(bytes).digest("hex") });
    this.total += bytes.length;
    for (const [oldest, entry] of this.entries) {
      if (this.total <= KNOWN_TOTAL_BYTES) break;
      this.entries.delete(oldest);
      this.total -= entry.bytes.length;
    }
  }

  /** The copy of `path`, removed from the cache (an edit puts back what it writes). */
  take(path: string): { bytes: Uint8Array; checksum: string } | undefined {
    const entry = this.entries.get(path);
    this.forget(path);
    return entry;
  }

  forget(path: string): void {
    const entry = this.entries.get(path);
    if (!entry) return;
    this.entries.delete(path);
    this.total -= entry.bytes.length;
  }

  /** Forgets a path given by a caller (not yet normalised; one that is not a path is ignored). */
  forgetPath(path: unknown): void {
    try {
      if (typeof path === "string") this.forget(normalizePath(path));
    } catch {
      // Not a path: nothing was cached under it.
    }
  }

  /** Forgets `path` and everything under it (a delete or move of a directory). */
  forgetTree(path: string): void {
    for (const key of [...this.entries.keys()]) if (isWithin(path, key)) this.forget(key);
  }

  clear(): void {
    this.entries.clear();
    this.total = 0;
  }
}
