/**
 * Data records. Field names follow the seeds (and the deepagents JS package)
 * so values move between the two unchanged: snake_case inside records,
 * camelCase on result objects.
 */
import type { ErrorCode, FileOperationError } from "./errors.js";

export type { ErrorCode, FileOperationError };

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
}

export interface GrepOptions {
  /** Stop after this many matches in total and mark the result truncated. */
  maxCount?: number;
}

export interface ExecuteOptions {
  /** Seconds before the whole process group is killed (exit code 124). */
  timeout?: number;
  env?: Record<string, string>;
  /** Working directory, a virtual path inside the workspace. */
  cwd?: string;
  /** Bytes or text fed to the command's standard input. */
  stdin?: string | Uint8Array;
  /** Receives output chunks as they arrive, for long commands. */
  onOutput?: (chunk: string) => void;
  signal?: AbortSignal;
  /** Bytes of output kept before `truncated` is set (the head is kept); default is the sandbox's own limit. */
  maxOutputBytes?: number;
}
