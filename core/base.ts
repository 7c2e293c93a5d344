import type { BackendProtocol } from "./protocol.js";
import { type StrataError, asStrataError, errors, toFileOperationError } from "./errors.js";
import { errorString, formatRead, DEFAULT_READ_LIMIT } from "./format.js";
import { fileDataBytes, fileDataSize, fileDataText } from "./filedata.js";
import { normalizePath } from "./paths.js";
import type {
  DeleteResult,
  EditResult,
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

/** The error part of a result object, from any thrown value. */
export function failure(error: unknown, path: string): { error: string; code: StrataError["code"] } {
  const e = asStrataError(error, path);
  return { error: e.message, code: e.code };
}

/**
 * Rejects a batch argument that is not an array: a string would otherwise be
 * iterated character by character, and anything else throws a raw TypeError.
 */
export function checkBatch(items: unknown, method: "uploadFiles" | "downloadFiles"): void {
  if (!Array.isArray(items)) {
    const what = method === "uploadFiles" ? "an array of [path, bytes] pairs" : "an array of paths";
    throw errors.invalidArgument(`${method} takes ${what}, got ${items === null ? "null" : typeof items}`);
  }
}

/**
 * What every backend derives the same way: `read` from `readRaw` plus the
 * shared formatter, and the seeds' `grepRaw` from the structured `grep`.
 * Backends with a faster path (streaming disk reads, a shell) override `read`.
 */
export abstract class BaseBackend implements BackendProtocol {
  abstract lsInfo(path: string): Promise<FileInfo[]>;
  abstract readRaw(filePath: string): Promise<FileData>;
  abstract write(filePath: string, content: string, options?: WriteOptions): Promise<WriteResult>;
  abstract edit(filePath: string, oldString: string, newString: string, replaceAll?: boolean): Promise<EditResult>;
  abstract delete(filePath: string): Promise<DeleteResult>;
  abstract grep(pattern: string, path?: string | null, glob?: string | null, options?: GrepOptions): Promise<GrepResult>;
  abstract globInfo(pattern: string, path?: string): Promise<FileInfo[]>;
  abstract uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]>;

  async read(filePath: string, offset = 0, limit = DEFAULT_READ_LIMIT): Promise<string> {
    try {
      const path = normalizePath(filePath);
      const data = await this.readRaw(path);
      const text = fileDataText(data);
      if (text === null) throw errors.binary(path, fileDataSize(data));
      return formatRead(text, path, offset, limit);
    } catch (error) {
      return errorString(error);
    }
  }

  /** Downloads through `readRaw`, one file after another; backends with a batch channel override it. */
  async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    checkBatch(paths, "downloadFiles");
    const responses: FileDownloadResponse[] = [];
    for (const filePath of paths) {
      try {
        responses.push({ path: filePath, content: fileDataBytes(await this.readRaw(filePath)), error: null });
      } catch (error) {
        responses.push({ path: filePath, content: null, error: toFileOperationError(failure(error, filePath).code) });
      }
    }
    return responses;
  }

  async grepRaw(pattern: string, path?: string | null, glob?: string | null, options?: GrepOptions): Promise<GrepMatch[] | string> {
    try {
      return (await this.grep(pattern, path, glob, options)).matches;
    } catch (error) {
      return errorString(error);
    }
  }
}
