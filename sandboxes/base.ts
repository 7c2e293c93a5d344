/**
 * BaseSandbox: a sandbox is a place that can run a shell. Every file
 * operation here is derived from `execute` (a POSIX sh script, GNU coreutils
 * or BusyBox, nothing else: no python, no node inside), so a new sandbox only
 * implements `execute`, `uploadFiles` and `downloadFiles`.
 *
 * Rules every derived operation keeps:
 * - one `execute` round trip per operation; `edit` is the exception, with two
 *   (read, then compare-and-swap write; see `edit`);
 * - virtual paths map to `workspace + path` after `normalizePath`, so nothing
 *   escapes through `..`; paths are single-quoted with `shellQuote`;
 * - file content and grep patterns never travel in argv: content goes through
 *   stdin, patterns through the environment, results come back as base64;
 * - the formatting, edit, glob and grep semantics are core's (`formatRead`,
 *   `applyEdit`, `compileGlob`, `grepText`, …): the shell only moves bytes.
 */
import { BaseBackend, failure } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { type ErrorCode, StrataError, errors, toFileOperationError } from "../core/errors.js";
import { decodeText, fileDataFromBytes, fileDataSize, fileDataText } from "../core/filedata.js";
import { DEFAULT_READ_LIMIT, errorString, formatRead, renderWindow, splitLines, validateReadWindow } from "../core/format.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { isWithin, joinPath, normalizePath, sortByPath } from "../core/paths.js";
import type { SandboxBackendProtocol } from "../core/protocol.js";
import type {
  DeleteResult,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileDataV2,
  FileDownloadResponse,
  FileInfo,
  FileUploadResponse,
  GrepMatch,
  GrepOptions,
  GrepResult,
  WriteOptions,
  WriteResult,
} from "../core/types.js";
import { MAX_TRANSFER_BYTES, WHOLE_FILE_BYTES, statusError, CHECK_REGULAR_FILE, CHECK_PLACE_FOR_FILE, REPLACE_FROM_STDIN, PLACE_FN, PUT_FN, GET_FN, STAT_BATCH, GREP_SMALL_BATCH, GREP_EMIT, parseStatBatches, fileInfo, parseGrepLines, fromBase64, tempName, batches } from "./shell.js";

export { MAX_TRANSFER_BYTES };

/** Exit code of a command killed by its timeout (as GNU `timeout` reports it). */
export const TIMEOUT_EXIT_CODE = 124;
/** Output kept per command unless the sandbox or the call says otherwise. */
export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
/** Output limit of the derived file operations: base64 of MAX_TRANSFER_BYTES plus listing overhead. */
const FILE_OP_OUTPUT_BYTES = Math.ceil((MAX_TRANSFER_BYTES * 4) / 3) + 16 * 1024 * 1024;
/** Largest window of a big file `read` returns, in bytes. */
const MAX_WINDOW_BYTES = 16 * 1024 * 1024;

/** Quotes any string for POSIX sh: spaces, quotes, newlines and `$` survive as they are. */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** The message appended to a command's output when its timeout killed it. */
export function timeoutMessage(seconds: number): string {
  return `\n[Command timed out after ${seconds} s; its process group was killed]`;
}

/**
 * Collects a command's output: keeps the first `maxBytes` bytes, counts the
 * rest, decodes UTF-8 per source stream (a character split across chunks
 * stays whole) and forwards decoded text to `onOutput` as it arrives.
 */
export class OutputCollector {
  private readonly parts: string[] = [];
  private readonly decoders = new Map<string, TextDecoder>();
  private kept = 0;
  /** Bytes received in total, kept or not. */
  totalBytes = 0;

  constructor(
    readonly maxBytes: number = DEFAULT_MAX_OUTPUT_BYTES,
    private readonly onOutput?: (chunk: string) => void,
  ) {}

  get truncated(): boolean {
    return this.totalBytes > this.kept;
  }

  push(chunk: Uint8Array, source = "stdout"): void {
    this.totalBytes += chunk.length;
    const room = this.maxBytes - this.kept;
    if (room <= 0) return;
    const head = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.kept += head.length;
    let decoder = this.decoders.get(source);
    if (!decoder) this.decoders.set(source, (decoder = new TextDecoder("utf-8")));
    const text = decoder.decode(head, { stream: true });
    if (text === "") return;
    this.parts.push(text);
    this.onOutput?.(text);
  }

  /** The kept output; a character cut by the byte limit is dropped rather than garbled. */
  text(): string {
    if (!this.truncated) {
      for (const decoder of this.decoders.values()) {
        const rest = decoder.decode();
        if (rest !== "") this.parts.push(rest);
      }
    }
    return this.parts.join("");
  }
}

/** Output of `executeStream`: iterate for chunks as they arrive; `result` is the whole response. */
export interface ExecuteStream extends AsyncIterable<string> {
  readonly result: Promise<ExecuteResponse>;
}

/**
 * A sandbox: a workspace directory inside an isolated environment plus a
 * shell. Subclasses implement `execute`, `uploadFiles` and `downloadFiles`
 * (virtual paths), and may override `close` (call `super.close()` first).
 */
export abstract class BaseSandbox extends BaseBackend implements SandboxBackendProtocol {
  abstract readonly id: string;
  /** Absolute path of the workspace inside the sandbox; virtual "/" maps here. Commands run here by default. */
  abstract readonly workspace: string;
  /** Runs `command` with `/bin/sh -c` in the workspace (or `options.cwd`, a virtual path). */
  abstract execute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse>;
  abstract override uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]>;
  abstract override downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]>;

  /** Seconds a derived file operation may run before it is killed. */
  protected fileOperationTimeout = 300;
  private isClosed = false;
  private readonly closing = new AbortController();

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
    this.closing.abort(new StrataError("sandbox_closed", `Sandbox '${this.id}' was closed while the command ran`));
  }

  /** The signal a subclass hands to a running command: the call's own, or `close()`. */
  protected commandSignal(signal?: AbortSignal): AbortSignal {
    return signal ? AbortSignal.any([signal, this.closing.signal]) : this.closing.signal;
  }

  /**
   * `execute`, as an async iterable of output chunks as they arrive, and the
   * final response in `result`. Leaving the loop early stops the command.
   */
  executeStream(command: string, options: Omit<ExecuteOptions, "onOutput"> = {}): ExecuteStream {
    const chunks: string[] = [];
    let wake: (() => void) | undefined;
    let done = false;
    const stop = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, stop.signal]) : stop.signal;
    const result = this.execute(command, {
      ...options,
      signal,
      onOutput: (chunk) => {
        chunks.push(chunk);
        wake?.();
      },
    });
    const settle = () => {
      done = true;
      wake?.();
    };
    result.then(settle, settle); // Also marks a rejection handled; `result` still rejects for whoever awaits it.
    return {
      result,
      async *[Symbol.asyncIterator]() {
        try {
          for (;;) {
            while (chunks.length > 0) yield chunks.shift()!;
            if (done) {
              await result;
              return;
            }
            await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
          }
        } finally {
          if (!done) stop.abort(new DOMException("The output stream was closed before the command ended", "AbortError"));
        }
      },
    };
  }

  protected assertOpen(): void {
    if (this.isClosed) throw new StrataError("sandbox_closed", `Sandbox '${this.id}' is closed`);
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
  protected async runScript(path: string, body: string, options: { stdin?: Uint8Array; env?: Record<string, string> } = {}): Promise<{ status: string; fields: string[]; payload: string }> {
    this.assertOpen();
    // Every script ends in `exit 0`: a run that did not reach the end is told apart by its exit code.
    const script = `exec 2>/dev/null\nexport LC_ALL=C\nW=${shellQuote(this.workspace)}\n${body}\nexit 0`;
    const response = await this.execute(script, {
      ...options,
      cwd: "/",
      timeout: this.fileOperationTimeout,
      maxOutputBytes: FILE_OP_OUTPUT_BYTES,
    });
    if (response.truncated) {
      throw new StrataError("too_large", `The result for '${path}' is over ${FILE_OP_OUTPUT_BYTES} bytes; narrow the request`);
    }
    const newline = response.output.indexOf("\n");
    const [status = "", ...fields] = (newline === -1 ? "" : response.output.slice(0, newline)).split(" ");
    if (status === "" || response.exitCode !== 0) {
      throw new StrataError(
        response.exitCode === TIMEOUT_EXIT_CODE ? "timeout" : "io_error",
        `The sandbox could not complete the operation on '${path}' (exit code ${String(response.exitCode)})`,
      );
    }
    const error = statusError(status, path, fields);
    if (error) throw error;
    return { status, fields, payload: response.output.slice(newline + 1) };
  }

  /**
   * Uploads through the shell, for sandboxes without a side channel: file
   * bytes go concatenated through stdin and `dd` cuts them apart, so a batch
   * is one round trip (more only past ~64 MiB or very many long paths).
   * Paths resolve inside the sandbox, so a symlink there cannot reach the host.
   */
  protected async uploadThroughShell(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    this.assertOpen();
    const responses: FileUploadResponse[] = files.map(([path]) => ({ path, error: null }));
    const pending: { index: number; path: string; bytes: Uint8Array }[] = [];
    files.forEach(([filePath, bytes], index) => {
      try {
        const path = normalizePath(filePath);
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        if (path === "/") throw errors.isDirectory(path);
        responses[index] = { path, error: null };
        pending.push({ index, path, bytes });
      } catch (error) {
        responses[index] = { path: filePath, error: toFileOperationError(failure(error, filePath).code) };
      }
    });
    for (const batch of batches(pending, (item) => item.bytes.length, (item) => item.path.length)) {
      const calls = batch.map((item) => `put ${shellQuote(this.sandboxPath(item.path))} ${item.bytes.length} ${tempName()}`);
      const stdin = new Uint8Array(batch.reduce((sum, item) => sum + item.bytes.length, 0));
      let offset = 0;
      for (const item of batch) {
        stdin.set(item.bytes, offset);
        offset += item.bytes.length;
      }
      let codes: (ErrorCode | null)[];
      try {
        const { payload } = await this.runScript(batch[0]!.path, `${PLACE_FN}\n${PUT_FN}\necho ok\n${calls.join("\n")}`, { stdin });
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
        responses[item.index] = { path: item.path, error: code === null ? null : toFileOperationError(code) };
      });
    }
    return responses;
  }

  /** Downloads through the shell as base64: one round trip per ~64 MiB of content. */
  protected async downloadThroughShell(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    this.assertOpen();
    const responses: FileDownloadResponse[] = paths.map((path) => ({ path, content: null, error: null }));
    let pending: { index: number; path: string }[] = [];
    paths.forEach((filePath, index) => {
      try {
        pending.push({ index, path: normalizePath(filePath) });
      } catch (error) {
        responses[index]!.error = toFileOperationError(failure(error, filePath).code);
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
          for (const item of batch) responses[item.index]!.error = toFileOperationError(failure(error, item.path).code);
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
          else responses[item.index]!.error = toFileOperationError(statusError(status, item.path, fields)?.code ?? "io_error");
        }
      }
      pending = later;
    }
    return responses;
  }

  async lsInfo(dirPath: string): Promise<FileInfo[]> {
    this.assertOpen();
    const dir = normalizePath(dirPath);
    const { status, payload } = await this.runScript(
      dir,
      `P=${shellQuote(this.sandboxPath(dir))}
if [ -d "$P" ]; then
  cd -- "$P" || { echo denied; exit 0; }
  echo dir
  find . -mindepth 1 -maxdepth 1 -exec sh -c ${shellQuote(STAT_BATCH)} sh {} +
elif [ -e "$P" ]; then
  echo file
  set -- "$P"; ${STAT_BATCH}
else
  echo absent
fi`,
    );
    if (status === "absent") return [];
    const entries: FileInfo[] = [];
    for (const entry of parseStatBatches(payload)) {
      if (status === "file") {
        entries.push(fileInfo(dir, entry));
        continue;
      }
      const name = entry.name.slice(2); // find prints "./name"
      if (name.includes("\\")) continue; // No virtual path can address it.
      const path = joinPath(dir, name);
      entries.push(entry.isDir ? { path: `${path}/`, is_dir: true } : fileInfo(path, entry));
    }
    return sortByPath(entries);
  }

  override async read(filePath: string, offset = 0, limit = DEFAULT_READ_LIMIT): Promise<string> {
    this.assertOpen();
    try {
      const path = normalizePath(filePath);
      validateReadWindow(offset, limit);
      const last = offset + limit;
      const { status, fields, payload } = await this.runScript(
        path,
        `P=${shellQuote(this.sandboxPath(path))}
${CHECK_REGULAR_FILE}
s=$(($(wc -c < "$P")))
if [ "$s" -le ${WHOLE_FILE_BYTES} ]; then echo "whole $s"; base64 < "$P"; exit 0; fi
n=$(($(wc -l < "$P")))
[ "$(tail -c 1 < "$P" | wc -l)" -eq 0 ] && n=$((n + 1))
z=$(($(tr -d '\\000' < "$P" | wc -c)))
echo "window $s $n $z"
sed -n '${offset + 1},${last}p;${last}q' < "$P" | head -c ${MAX_WINDOW_BYTES + 1} | base64`,
      );
      const size = Number(fields[0]);
      const bytes = fromBase64(payload);
      if (status === "whole") {
        const text = decodeText(bytes);
        if (text === null) throw errors.binary(path, size);
        return formatRead(text, path, offset, limit);
      }
      // A big file: the shell sent the window, the line count and the size without NUL bytes.
      if (bytes.length > MAX_WINDOW_BYTES) throw errors.tooLarge(path, bytes.length, MAX_WINDOW_BYTES);
      const text = decodeText(bytes);
      if (text === null || Number(fields[2]) !== size) throw errors.binary(path, size);
      return renderWindow(splitLines(text), offset, Number(fields[1]), path);
    } catch (error) {
      return errorString(error);
    }
  }

  async readRaw(filePath: string): Promise<FileDataV2> {
    this.assertOpen();
    const path = normalizePath(filePath);
    return (await this.fetchFile(path)).data;
  }

  /** The whole file, its modification time and a checksum the shell can recompute (for edit's swap). */
  private async fetchFile(path: string): Promise<{ data: FileDataV2; checksum: string }> {
    const { fields, payload } = await this.runScript(
      path,
      `P=${shellQuote(this.sandboxPath(path))}
${CHECK_REGULAR_FILE}
s=$(($(wc -c < "$P")))
[ "$s" -le ${MAX_TRANSFER_BYTES} ] || { echo "toolarge $s ${MAX_TRANSFER_BYTES}"; exit 0; }
m=$(stat -L -c %Y -- "$P")
h=$(md5sum < "$P")
echo "ok $s \${m:-0} \${h%% *}"
base64 < "$P"`,
    );
    const modified = new Date(Number(fields[1]) * 1000);
    const timestamp = Number.isFinite(modified.getTime()) && modified.getTime() > 0 ? modified.toISOString() : undefined;
    const data = fileDataFromBytes(fromBase64(payload), timestamp);
    if (timestamp) data.modified_at = timestamp;
    return { data, checksum: fields[2] ?? "" };
  }

  async write(filePath: string, content: string, options: WriteOptions = {}): Promise<WriteResult> {
    this.assertOpen();
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      if (path === "/") throw errors.isDirectory(path);
      await this.runScript(
        path,
        `P=${shellQuote(this.sandboxPath(path))}
${CHECK_PLACE_FOR_FILE}
if [ -e "$P" ] || [ -L "$P" ]; then ${options.overwrite ? ":" : "echo exists; exit 0"}; fi
${REPLACE_FROM_STDIN(tempName())}`,
        { stdin: new TextEncoder().encode(content) },
      );
      return { path, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  /**
   * Two round trips: fetch the file, apply core's `applyEdit` here, then
   * write back only if the file still has the checksum it had when fetched
   * (compare-and-swap in the shell; a concurrent change fails with
   * `conflict` instead of being overwritten). A one-trip edit would need the
   * replacement done by the shell, which cannot match applyEdit's CRLF and
   * UTF-8 rules with POSIX tools alone.
   */
  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    this.assertOpen();
    let path = filePath;
    try {
      path = normalizePath(filePath);
      const { data, checksum } = await this.fetchFile(path);
      const text = fileDataText(data);
      if (text === null) throw errors.binary(path, fileDataSize(data));
      const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, path);
      await this.runScript(
        path,
        `P=${shellQuote(this.sandboxPath(path))}
${CHECK_REGULAR_FILE}
h=$(md5sum < "$P")
[ "\${h%% *}" = ${shellQuote(checksum)} ] || { echo conflict; exit 0; }
${REPLACE_FROM_STDIN(tempName())}`,
        { stdin: new TextEncoder().encode(updated) },
      );
      return { path, occurrences, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  async delete(filePath: string): Promise<DeleteResult> {
    this.assertOpen();
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
      await this.runScript(
        path,
        `P=${shellQuote(this.sandboxPath(path))}
[ -e "$P" ] || [ -L "$P" ] || { echo missing; exit 0; }
rm -rf -- "$P"
if [ -e "$P" ] || [ -L "$P" ]; then echo denied; else echo ok; fi`,
      );
      return { path, filesUpdate: null };
    } catch (error) {
      return failure(error, path);
    }
  }

  /**
   * The shell finds the files under the search directory that contain the
   * pattern (`grep -F -l`, batched by `find`) and sends them: files up to
   * 1 MiB whole (one `wc -c` and one `cat` per batch, not a process per
   * file), so core's `grepText` decides lines and binary-ness exactly; bigger
   * files as `grep -n` lines after a NUL check. The glob filter, sorting and
   * the cap are core's, applied here.
   */
  async grep(pattern: string, path?: string | null, glob?: string | null, options: GrepOptions = {}): Promise<GrepResult> {
    this.assertOpen();
    validateGrepPattern(pattern);
    validateMaxCount(options.maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    // A pattern with NUL can only match binary files, which grep skips.
    if (pattern.includes("\0")) return { matches: [], truncated: false };
    const { payload } = await this.runScript(
      root,
      `R=${shellQuote(this.sandboxPath(matcher ? matcher.root : root))}
NL='
'
${GREP_EMIT}
echo ok
find -H "$R" -type f -size -${WHOLE_FILE_BYTES / 1024 + 1}k ! -path "*$NL*" -exec sh -c ${shellQuote(GREP_SMALL_BATCH)} sh {} +
find -H "$R" -type f ! -size -${WHOLE_FILE_BYTES / 1024 + 1}k ! -path "*$NL*" -exec grep -l -F -e "$STRATA_PATTERN" -- {} + | while IFS= read -r f; do emit "$f"; done
find -H "$R" -type f -path "*$NL*" -exec sh -c ${shellQuote(`${GREP_EMIT}\nfor f do grep -q -F -e "$STRATA_PATTERN" -- "$f" && emit "$f"; done`)} sh {} +`,
      { env: { STRATA_PATTERN: pattern } },
    );
    const matches: GrepMatch[] = [];
    const search = (sandboxFile: string, body: Uint8Array, whole: boolean) => {
      const file = this.addressable(sandboxFile);
      if (file === undefined || !isWithin(root, file) || (matcher && !matcher(file))) return;
      if (whole) {
        const text = decodeText(body);
        if (text !== null) grepText(file, text, pattern, matches);
      } else {
        for (const match of parseGrepLines(file, body)) matches.push(match);
      }
    };
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
        // Names one per line, `wc -c` lines in the same order (then a total), the files concatenated.
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
          search(name, body.subarray(offset, offset + sizes[i]!), true);
          offset += sizes[i]!;
        });
      } else if (kind === "W" || kind === "L") {
        const name = field();
        search(name, fromBase64(field()), kind === "W");
      } else {
        throw new StrataError("io_error", `The sandbox sent a malformed grep result for '${root}'`);
      }
    }
    return capMatches(sortMatches(matches), options.maxCount);
  }

  async globInfo(pattern: string, path?: string): Promise<FileInfo[]> {
    this.assertOpen();
    const matcher = compileGlob(pattern, searchRoot(path));
    const { payload } = await this.runScript(
      matcher.root,
      `echo ok
find -H ${shellQuote(this.sandboxPath(matcher.root))} -type f -exec sh -c ${shellQuote(STAT_BATCH)} sh {} +`,
    );
    const found: FileInfo[] = [];
    for (const entry of parseStatBatches(payload)) {
      const file = this.addressable(entry.name);
      if (file !== undefined && matcher(file)) found.push(fileInfo(file, entry));
    }
    return sortByPath(found);
  }
}
