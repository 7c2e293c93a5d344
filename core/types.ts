/**
 * Data records. Field names follow the seeds (and the deepagents JS package)
 * so values move between the two unchanged: snake_case inside records,
 * camelCase on result objects.
 */
import type { ErrorCode, ErrorInfo, FileOperationError } from "./errors.js";

export type { ErrorCode, ErrorInfo, FileOperationError };

/** One entry of a listing. Directories end in `/` and have `is_dir: true`. */
export interface FileInfo {
  path: string;
  is_dir?: boolean;
  size?: number;
  modified_at?: string;
}

/** One grep hit: 1-based line number and the whole line (without its line ending). */
export interface GrepMatch {
  path: string;
  line: number;
  text: string;
}

/** Legacy file record: content as a list of lines split on `\n`. Read, never written. */
export interface FileDataV1 {
  content: string[];
  created_at: string;
  modified_at: string;
}

export type FileEncoding = "utf-8" | "base64";

/** Current file record: UTF-8 text, or binary as base64. */
export interface FileDataV2 {
  content: string;
  encoding: FileEncoding;
  created_at: string;
  modified_at: string;
}

export type FileData = FileDataV1 | FileDataV2;

export interface WriteResult {
  error?: string;
  code?: ErrorCode;
  path?: string;
  /** State update for checkpoint backends; null for external storage. */
  filesUpdate?: Record<string, FileData> | null;
}

export interface EditResult {
  error?: string;
  code?: ErrorCode;
  path?: string;
  filesUpdate?: Record<string, FileData> | null;
  /** Replacements made. */
  occurrences?: number;
  /** The file's text after the edit, when the driver has it (see Edited.content). */
  content?: string;
}

export interface DeleteResult {
  error?: string;
  code?: ErrorCode;
  path?: string;
  /** Deleted paths map to null, as in the deepagents package. */
  filesUpdate?: Record<string, null> | null;
}

export interface GrepResult {
  matches: GrepMatch[];
  /** True when `maxCount` cut the result short. */
  truncated: boolean;
}

export interface ExecuteResponse {
  /** stdout and stderr combined, in arrival order. */
  output: string;
  exitCode: number | null;
  truncated: boolean;
}

export interface FileUploadResponse {
  path: string;
  error: FileOperationError | null;
}

export interface FileDownloadResponse {
  path: string;
  content: Uint8Array | null;
  error: FileOperationError | null;
}

export interface WriteOptions {
  /** Replace an existing file instead of failing with `already_exists`. */
  overwrite?: boolean;
  signal?: AbortSignal;
}

export interface ExecuteOptions {
  /** Seconds before the whole process group is killed (exit code 124). */
  timeout?: number;
  env?: Record<string, string>;
  /** Working directory, a virtual path inside the workspace. */
  cwd?: string;
  /** Bytes or text fed to the command's standard input, or a stream it reads as it is written. */
  stdin?: string | Uint8Array | ReadableStream<Uint8Array>;
  /** Receives output chunks as they arrive, for long commands. */
  onOutput?: (chunk: string) => void;
  /** Receives raw output bytes per stream as they arrive (before any cap). */
  onData?: (chunk: Uint8Array, stream: "stdout" | "stderr") => void;
  signal?: AbortSignal;
  /** Bytes of output kept before `truncated` is set (the head is kept); default is the sandbox's own limit. */
  maxOutputBytes?: number;
}

// ---- The native API's results -------------------------------------------------

/** A failed operation: the one failure shape of the native API. */
export interface Failure {
  error: ErrorInfo;
}

/**
 * What every native operation answers: its value, or `{ error }`. Narrow
 * with `if (result.error)`; without narrowing, the value's fields read as
 * possibly undefined (`result.entries?.length`).
 */
export type Result<T extends object> = (T & { error?: undefined }) | (Failure & { [K in Exclude<keyof T, "error">]?: undefined });

/** Options every native operation takes. */
export interface OperationOptions {
  /** Aborting answers `aborted`. A read stops waiting at once; a change is only refused before it starts. */
  signal?: AbortSignal;
}

export interface LsOptions extends OperationOptions {
  /**
   * false: each entry's name and kind only. A backend that learns sizes and
   * times with one stat per entry (FilesystemBackend) then leaves them out,
   * a directory of thousands listed for the price of reading it; one that
   * has them at hand may still answer them. Default true.
   */
  sizes?: boolean;
}

export interface ReadOptions extends OperationOptions {
  /** 0-based first line. */
  offset?: number;
  /** Lines to return; default 2000. */
  limit?: number;
}

/** A window of a text file. `content` holds the window's lines, each without its line ending, joined by `\n`. */
export interface TextContent {
  path: string;
  encoding: "utf-8";
  content: string;
  mimeType: string;
  /** Lines in the whole file. */
  totalLines: number;
  /** The window: its first line (0-based) and how many lines it holds. */
  offset: number;
  lineCount: number;
}

/** A binary file (NUL or invalid UTF-8), whole. */
export interface BinaryContent {
  path: string;
  encoding: "binary";
  content: Uint8Array;
  mimeType: string;
  size: number;
}

export type ReadContent = TextContent | BinaryContent;

export interface EditOptions extends OperationOptions {
  /** Replace every occurrence; without it, more than one occurrence is `ambiguous_match`. */
  replaceAll?: boolean;
}

export interface SearchOptions extends OperationOptions {
  /** The directory (or file) searched; default `/`. */
  path?: string | null;
}

export interface GlobOptions extends SearchOptions {
  /** Match directories too; they come back as `ls` shows them (path ending in `/`, `is_dir: true`). Default false: files only. */
  includeDirectories?: boolean;
  /**
   * false: each match's path and kind only, as with `ls` (see LsOptions):
   * FilesystemBackend then finds matches from directory entries alone, with
   * no stat per match. The glob tool asks for this. Default true.
   */
  sizes?: boolean;
}

export interface GrepOptions extends SearchOptions {
  /** Only files matching this glob (the same dialect as `glob`). */
  glob?: string | null;
  /** Stop after this many matches in total and mark the result truncated. */
  maxCount?: number;
}

export interface MkdirOptions extends OperationOptions {
  /** Create missing parents too, and succeed when the directory exists (`mkdir -p`). */
  recursive?: boolean;
}

export interface TransferOptions extends OperationOptions {
  /** Replace an existing file at the destination. */
  overwrite?: boolean;
}

/** Changes that a state-held backend reports for its agent runtime's checkpoint; null elsewhere. */
export type FilesUpdate = Record<string, FileData | null> | null;

export interface Changed {
  path: string;
  filesUpdate: FilesUpdate;
}

export interface Edited extends Changed {
  occurrences: number;
  /**
   * The file's text as the edit left it, from a backend that has it at hand
   * (FilesystemBackend): a caller that needs it (edit_file's stale-file
   * guard) need not read the file again. Absent elsewhere.
   */
  content?: string;
}

export interface Moved {
  from: string;
  to: string;
  filesUpdate: FilesUpdate;
}

export interface Listing {
  entries: FileInfo[];
}

/** One upload's answer: `error` carries the full code; `seedError` the seeds' four-code form of it. */
export interface UploadItem {
  path: string;
  error: ErrorInfo | null;
  seedError: FileOperationError | null;
}

export interface DownloadItem extends UploadItem {
  content: Uint8Array | null;
}

export interface SpawnOptions {
  /** Seconds before the whole process group is killed (exit code 124). */
  timeout?: number;
  env?: Record<string, string>;
  /** Working directory, a path in the sandbox's path space. */
  cwd?: string;
  signal?: AbortSignal;
}

/** A command started by `spawn`: its streams, and its end. */
export interface SpawnedProcess {
  /** Standard input; close it to send end-of-file. */
  readonly stdin: WritableStream<Uint8Array>;
  readonly stdout: ReadableStream<Uint8Array>;
  readonly stderr: ReadableStream<Uint8Array>;
  /** Settles when the command ends: its exit code (124 on timeout, null when killed by a signal). */
  wait(): Promise<Result<{ exitCode: number | null }>>;
  /** Kills the whole process group; `wait` then answers. */
  kill(): Promise<void>;
}
