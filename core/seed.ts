import type { Backend, Sandbox } from "./protocol.js";
import { isSandbox } from "./protocol.js";
import { EMPTY_FILE_REMINDER, renderLines, DEFAULT_READ_LIMIT } from "./format.js";
import { errors, type ErrorInfo } from "./errors.js";
import { type ReadsNow, readRawNow, unwrap, writeNow } from "./base.js";
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
  GrepResult,
  Result,
  WriteResult,
} from "./types.js";

/**
 * The seeds' BackendProtocol (docs/contract.md, "The seed protocol"): the
 * deepagents-family interface, asynchronous. Its failure shapes are mixed by
 * design of the original: `read` and `grepRaw` answer an `Error: …` string,
 * `write`/`edit`/`delete` an `{ error, code }` object, upload/download one of
 * four codes per item, and `readRaw`, `grep`, `lsInfo`, `globInfo` and
 * `execute` reject with a StrataError.
 */
export interface BackendProtocol {
  lsInfo(path: string): Promise<FileInfo[]>;
  /** `cat -n` style text of lines [offset, offset+limit), or an `Error: …` string. */
  read(filePath: string, offset?: number, limit?: number): Promise<string>;
  readRaw(filePath: string): Promise<FileData>;
  write(filePath: string, content: string, options?: { overwrite?: boolean }): Promise<WriteResult>;
  edit(filePath: string, oldString: string, newString: string, replaceAll?: boolean): Promise<EditResult>;
  delete(filePath: string): Promise<DeleteResult>;
  grep(pattern: string, path?: string | null, glob?: string | null, options?: { maxCount?: number }): Promise<GrepResult>;
  grepRaw(pattern: string, path?: string | null, glob?: string | null, options?: { maxCount?: number }): Promise<GrepMatch[] | string>;
  globInfo(pattern: string, path?: string): Promise<FileInfo[]>;
  uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]>;
  downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]>;
}

/** The seeds' SandboxBackendProtocol: `execute(command, timeout)` as the seeds call it, or with options. */
export interface SandboxBackendProtocol extends BackendProtocol {
  readonly id: string;
  execute(command: string, options?: ExecuteOptions | number): Promise<ExecuteResponse>;
  /** The seeds' DockerSandbox.stop(): the same as `close()`. */
  stop(): Promise<void>;
  close(): Promise<void>;
}

export function isSandboxBackend(backend: unknown): backend is SandboxBackendProtocol {
  return isSandbox(backend);
}

const adapters = new WeakMap<Backend, BackendProtocol>();

/**
 * The seeds' protocol over any native backend: a thin translation of shapes,
 * nothing re-implemented. One adapter per backend (cached), so it can be
 * asked for freely.
 */
export function toSeedProtocol(backend: Sandbox): SandboxBackendProtocol;
export function toSeedProtocol(backend: Backend): BackendProtocol;
export function toSeedProtocol(backend: Backend): BackendProtocol {
  let adapter = adapters.get(backend);
  if (!adapter) {
    adapter = isSandbox(backend) ? sandboxAdapter(backend) : backendAdapter(backend);
    adapters.set(backend, adapter);
  }
  return adapter;
}

function backendAdapter(backend: Backend): BackendProtocol {
  const write = async (filePath: string, content: string, options?: { overwrite?: boolean }) => changeResult(await backend.write(filePath, content, options));
  return {
    lsInfo: async (path) => value(await backend.ls(path)).entries,
    read: async (filePath, offset = 0, limit = DEFAULT_READ_LIMIT) => {
      const result = await backend.read(filePath, { offset, limit });
      if (result.error) return `Error: ${result.error.message}`;
      if (result.encoding === "binary") return `Error: ${errors.binary(result.path, result.size).message}`;
      if (result.totalLines === 0) return EMPTY_FILE_REMINDER;
      return renderLines(result.content.split("\n"), result.offset + 1);
    },
    // An in-process backend's record is taken at once: no promise but the answer's, a good part of a small read's cost.
    readRaw: (filePath) => {
      const now = typeof filePath === "string" ? (backend as ReadsNow)[readRawNow]?.(filePath) : undefined;
      return now ? Promise.resolve(now.data) : backend.readRaw(filePath).then(dataOf);
    },
    // A plain create likewise: one promise, the answer's.
    write: (filePath, content, options) => {
      const now =
        options === undefined && typeof filePath === "string" && typeof content === "string" ? (backend as ReadsNow)[writeNow]?.(filePath, content) : undefined;
      // A fresh `{ path, filesUpdate }`: already the seed's WriteResult.
      return now ? Promise.resolve(now as WriteResult) : write(filePath, content, options);
    },
    edit: async (filePath, oldString, newString, replaceAll = false) => {
      const result = await backend.edit(filePath, oldString, newString, { replaceAll });
      return result.error ? failed(result.error) : { path: result.path, filesUpdate: result.filesUpdate as EditResult["filesUpdate"], occurrences: result.occurrences };
    },
    delete: async (filePath) => changeResult(await backend.delete(filePath)) as DeleteResult,
    grep: async (pattern, path, glob, options) => value(await backend.grep(pattern, { path, glob, maxCount: options?.maxCount })),
    grepRaw: async (pattern, path, glob, options) => {
      const result = await backend.grep(pattern, { path, glob, maxCount: options?.maxCount });
      return result.error ? `Error: ${result.error.message}` : result.matches;
    },
    globInfo: async (pattern, path) => value(await backend.glob(pattern, { path })).entries,
    uploadFiles: async (files) => value(await backend.uploadFiles(files)).files.map((item) => ({ path: item.path, error: item.seedError })),
    downloadFiles: async (paths) =>
      value(await backend.downloadFiles(paths)).files.map((item) => ({ path: item.path, content: item.content, error: item.seedError })),
  };
}

function sandboxAdapter(sandbox: Sandbox): SandboxBackendProtocol {
  return {
    ...backendAdapter(sandbox),
    get id() {
      return sandbox.id;
    },
    execute: async (command, options) => value(await sandbox.execute(command, typeof options === "number" ? { timeout: options } : options)),
    stop: () => sandbox.close(),
    close: () => sandbox.close(),
  };
}

/** The seeds' rejecting form of a failed result. */
const value = unwrap;

const dataOf = (result: Result<{ data: FileData }>): FileData => value(result).data;

function failed(error: ErrorInfo): { error: string; code: ErrorInfo["code"] } {
  return { error: error.message, code: error.code };
}

function changeResult(result: Awaited<ReturnType<Backend["write"]>>): WriteResult {
  return result.error ? failed(result.error) : { path: result.path, filesUpdate: result.filesUpdate as WriteResult["filesUpdate"] };
}
