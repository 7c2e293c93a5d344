import type {
  Changed,
  DownloadItem,
  Edited,
  EditOptions,
  ExecuteOptions,
  ExecuteResponse,
  FileData,
  FileInfo,
  GlobOptions,
  GrepOptions,
  GrepResult,
  Listing,
  LsOptions,
  MkdirOptions,
  Moved,
  OperationOptions,
  ReadContent,
  ReadOptions,
  Result,
  SpawnOptions,
  SpawnedProcess,
  TransferOptions,
  UploadItem,
  WriteOptions,
} from "./types.js";

/**
 * A place where files live: the native API (docs/contract.md).
 *
 * Every operation answers a result object and never throws, not even for
 * arguments of the wrong type: a failure is `{ error: { code, message, path? } }`.
 * Paths are virtual, absolute and POSIX. The seeds' string-returning protocol
 * is `toSeedProtocol(backend)`.
 */
export interface Backend {
  /** Non-recursive listing, sorted by path; directories end in `/`. A missing directory lists as empty. */
  ls(path?: string, options?: LsOptions): Promise<Result<Listing>>;
  /** A window of a text file's lines (with the total), or a binary file's bytes. */
  read(path: string, options?: ReadOptions): Promise<Result<ReadContent>>;
  /** The stored record (FileData v2). */
  readRaw(path: string, options?: OperationOptions): Promise<Result<{ path: string; data: FileData }>>;
  /** Creates a file; `already_exists` unless `overwrite` is set. Parents are created as needed. */
  write(path: string, content: string, options?: WriteOptions): Promise<Result<Changed>>;
  /** Replaces an exact string; more than one occurrence needs `replaceAll`. */
  edit(path: string, oldString: string, newString: string, options?: EditOptions): Promise<Result<Edited>>;
  /** Removes a file, or a directory and everything under it. */
  delete(path: string, options?: OperationOptions): Promise<Result<Changed>>;
  /** Literal search: matches sorted by path then line, `truncated` when `maxCount` cut them. */
  grep(pattern: string, options?: GrepOptions): Promise<Result<GrepResult>>;
  /** Files under `options.path` matching the glob (and directories with `includeDirectories`), sorted by path. */
  glob(pattern: string, options?: GlobOptions): Promise<Result<Listing>>;
  /** What is at a path: a file (size, modification time) or a directory (path ending in `/`). */
  stat(path: string, options?: OperationOptions): Promise<Result<FileInfo>>;
  /** Creates a directory (and its parents with `recursive`). */
  mkdir(path: string, options?: MkdirOptions): Promise<Result<Changed>>;
  /** Moves a file or a directory tree: all of it or, on failure, none of it. */
  move(from: string, to: string, options?: TransferOptions): Promise<Result<Moved>>;
  /** Copies a file or a directory tree: all of it or, on failure, none of it. */
  copy(from: string, to: string, options?: TransferOptions): Promise<Result<Moved>>;
  /** Writes bytes (overwriting); one item per input, in input order. */
  uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>, options?: OperationOptions): Promise<Result<{ files: UploadItem[] }>>;
  /** Reads bytes; one item per input, in input order. */
  downloadFiles(paths: readonly string[], options?: OperationOptions): Promise<Result<{ files: DownloadItem[] }>>;
}

/** A backend that also runs commands, in the same path space as its files. */
export interface Sandbox extends Backend {
  readonly id: string;
  /** Where the sandbox's path space starts: its workspace (e.g. "/workspace"), the commands' working directory. */
  readonly root: string;
  /** Runs a shell command to completion: combined output, exit code (124 on timeout), `truncated`. */
  execute(command: string, options?: ExecuteOptions): Promise<Result<ExecuteResponse>>;
  /** Starts a command and hands back its streams: write stdin, read stdout and stderr as they come, `wait`, `kill`. */
  spawn(command: string, options?: SpawnOptions): Promise<Result<SpawnedProcess>>;
  /** Stops what runs and releases the sandbox; afterwards every operation answers `sandbox_closed`. */
  close(): Promise<void>;
}

export function isSandbox(backend: unknown): backend is Sandbox {
  return (
    typeof backend === "object" &&
    backend !== null &&
    typeof (backend as Sandbox).execute === "function" &&
    typeof (backend as Sandbox).id === "string"
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
export type BackendFactory<B extends Backend = Backend> = (runtime: BackendRuntime) => B;

/** A ready backend or a factory for one (the seeds' BACKEND_TYPES). */
export type BackendSpec<B extends Backend = Backend> = B | BackendFactory<B>;

export function resolveBackend<B extends Backend>(spec: BackendSpec<B>, runtime: BackendRuntime): B {
  return typeof spec === "function" ? spec(runtime) : spec;
}
