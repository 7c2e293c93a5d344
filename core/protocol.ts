import type {
  DeleteResult,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileData,
  FileDownloadResponse,
  FileInfo,
  FileUploadResponse,
  GrepMatch,
  GrepOptions,
  GrepResult,
  WriteOptions,
  WriteResult,
} from "./types.js";

/**
 * A place where files live: the seeds' BackendProtocol, asynchronous.
 *
 * Conventions shared by every implementation (see docs/contract.md):
 * - results with an `error` field (write, edit, delete, upload, download) never throw for bad input;
 * - `read` and `grepRaw` return an error string, as the seeds do;
 * - `readRaw`, `grep`, `lsInfo` and `globInfo` throw a `StrataError` with a code.
 */
export interface BackendProtocol {
  /** Non-recursive listing, sorted by path; directories end in `/`. A missing directory lists as empty. */
  lsInfo(path: string): Promise<FileInfo[]>;
  /** `cat -n` style text of lines [offset, offset+limit), or an `Error: …` string. */
  read(filePath: string, offset?: number, limit?: number): Promise<string>;
  /** The stored record (v2). Throws `file_not_found`, `is_directory`, `invalid_path`. */
  readRaw(filePath: string): Promise<FileData>;
  /** Creates a file; fails with `already_exists` unless `overwrite` is set. */
  write(filePath: string, content: string, options?: WriteOptions): Promise<WriteResult>;
  /** Replaces an exact string; more than one occurrence needs `replaceAll`. */
  edit(filePath: string, oldString: string, newString: string, replaceAll?: boolean): Promise<EditResult>;
  /** Removes a file, or a directory and everything under it. */
  delete(filePath: string): Promise<DeleteResult>;
  /** Literal search, structured: matches sorted by path then line, `truncated` when capped. */
  grep(pattern: string, path?: string | null, glob?: string | null, options?: GrepOptions): Promise<GrepResult>;
  /** The seeds' grep: matches, or an error string. */
  grepRaw(pattern: string, path?: string | null, glob?: string | null, options?: GrepOptions): Promise<GrepMatch[] | string>;
  /** Files (not directories) under `path` matching the glob, sorted by path. */
  globInfo(pattern: string, path?: string): Promise<FileInfo[]>;
  /** Writes bytes (overwriting); one response per input, in input order. */
  uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]>;
  /** Reads bytes; one response per input, in input order. */
  downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]>;
}

/** A backend that can also run commands: the seeds' SandboxBackendProtocol. */
export interface SandboxBackendProtocol extends BackendProtocol {
  readonly id: string;
  execute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse>;
}

export function isSandboxBackend(backend: unknown): backend is SandboxBackendProtocol {
  return (
    typeof backend === "object" &&
    backend !== null &&
    typeof (backend as SandboxBackendProtocol).execute === "function" &&
    typeof (backend as SandboxBackendProtocol).id === "string"
  );
}

/** Anything a persistent backend needs from an agent runtime's long-term store; see `stores/`. */
export type RuntimeStore = object;

/**
 * What a backend may see of the agent that runs it: mutable state,
 * read-only configuration and an optional persistent store.
 */
export class BackendRuntime<State extends Record<string, unknown> = Record<string, unknown>> {
  constructor(
    public state: State = {} as State,
    readonly config: Readonly<Record<string, unknown>> = {},
    readonly store?: RuntimeStore,
  ) {}

  getState<T = unknown>(key: string, fallback?: T): T {
    return (key in this.state ? this.state[key] : fallback) as T;
  }

  setState(key: string, value: unknown): void {
    (this.state as Record<string, unknown>)[key] = value;
  }
}

/** Builds a backend from the runtime of the current call (per user, per thread, …). */
export type BackendFactory<B extends BackendProtocol = BackendProtocol> = (runtime: BackendRuntime) => B;

/** The seeds' BACKEND_TYPES: a ready backend or a factory for one. */
export type BackendSpec<B extends BackendProtocol = BackendProtocol> = B | BackendFactory<B>;

export function resolveBackend<B extends BackendProtocol>(spec: BackendSpec<B>, runtime: BackendRuntime): B {
  return typeof spec === "function" ? spec(runtime) : spec;
}
