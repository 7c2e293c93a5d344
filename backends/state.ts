import { BaseBackend, failure } from "../core/base.js";
import { applyEdit } from "../core/edit.js";
import { errors, StrataError, toFileOperationError } from "../core/errors.js";
import { fileDataInfo, fileDataFromBytes, fileDataFromText, fileDataSize, fileDataText, toFileDataV2 } from "../core/filedata.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, grepText, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { ancestorsOf, isWithin, joinPath, normalizePath, sortByPath } from "../core/paths.js";
import { BackendRuntime } from "../core/protocol.js";
import { DirectoryIndex } from "../core/tree.js";
import type {
  DeleteResult,
  EditResult,
  FileData,
  FileDataV2,
  FileInfo,
  FileUploadResponse,
  GrepMatch,
  GrepOptions,
  GrepResult,
  WriteOptions,
  WriteResult,
} from "../core/types.js";

export type FilesState = Record<string, FileData>;

export interface StateBackendOptions {
  /** Largest file, in bytes, that write, edit and upload accept. */
  maxFileSize?: number;
}

/**
 * Files in the agent's state (`runtime.state.files`), or in a map of its own
 * when constructed without a runtime. Writes apply to that map and also
 * return `filesUpdate`, so a LangGraph reducer that merges them stays in step.
 */
export class StateBackend extends BaseBackend {
  private indexed: { files: FilesState; index: DirectoryIndex; entries?: Array<[string, FileData]> } | undefined;

  constructor(
    readonly runtime: BackendRuntime = new BackendRuntime({ files: {} }),
    private readonly options: StateBackendOptions = {},
  ) {
    super();
  }

  /** The live files map. Replacing `runtime.state.files` wholesale is noticed and re-indexed. */
  get files(): FilesState {
    let files = this.runtime.getState<FilesState | undefined>("files");
    if (typeof files !== "object" || files === null) {
      files = {};
      this.runtime.setState("files", files);
    }
    return files;
  }

  private get index(): DirectoryIndex {
    return this.indexes.index;
  }

  private get indexes(): { files: FilesState; index: DirectoryIndex; entries?: Array<[string, FileData]> } {
    const files = this.files;
    if (this.indexed?.files !== files) this.indexed = { files, index: DirectoryIndex.of(Object.keys(files)) };
    return this.indexed;
  }

  /**
   * Every file with its record, cached until the next change: scanning an
   * array is about three times faster than looking 100k keys up in a large
   * object, and searches run far more often than writes between them.
   */
  private get entries(): Array<[string, FileData]> {
    const indexes = this.indexes;
    return (indexes.entries ??= Object.entries(indexes.files));
  }

  private record(path: string): FileData | undefined {
    return Object.hasOwn(this.files, path) ? this.files[path] : undefined;
  }

  async lsInfo(dirPath: string): Promise<FileInfo[]> {
    const dir = normalizePath(dirPath);
    const file = this.record(dir);
    if (file) return [fileDataInfo(dir, file)];
    const entries: FileInfo[] = [];
    for (const name of this.index.list(dir)) {
      const path = joinPath(dir, name);
      const data = this.record(path);
      entries.push(data ? fileDataInfo(path, data) : { path: `${path}/`, is_dir: true });
    }
    return sortByPath(entries);
  }

  async readRaw(filePath: string): Promise<FileDataV2> {
    const path = normalizePath(filePath);
    const data = this.record(path);
    if (data) return toFileDataV2(data);
    throw this.index.isDirectory(path) ? errors.isDirectory(path) : errors.notFound(path);
  }

  async write(filePath: string, content: string, options: WriteOptions = {}): Promise<WriteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (typeof content !== "string") throw errors.invalidArgument("content must be a string");
      const existing = this.record(path);
      if (existing && !options.overwrite) throw errors.alreadyExists(path);
      const data = fileDataFromText(content, existing?.created_at);
      this.store(path, data);
      return { path, filesUpdate: { [path]: data } };
    } catch (error) {
      return failure(error, path);
    }
  }

  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      const current = await this.readRaw(path);
      const text = fileDataText(current);
      if (text === null) throw errors.binary(path, fileDataSize(current));
      const { text: updated, occurrences } = applyEdit(text, oldString, newString, replaceAll, path);
      const data = fileDataFromText(updated, current.created_at);
      this.store(path, data);
      return { path, occurrences, filesUpdate: { [path]: data } };
    } catch (error) {
      return failure(error, path);
    }
  }

  async delete(filePath: string): Promise<DeleteResult> {
    let path = filePath;
    try {
      path = normalizePath(filePath);
      if (path === "/") throw new StrataError("permission_denied", "Refusing to delete '/'");
      const removed: Record<string, null> = {};
      this.indexes.entries = undefined;
      if (this.record(path)) {
        delete this.files[path];
        this.index.removeFile(path);
        removed[path] = null;
      } else if (this.index.isDirectory(path)) {
        for (const key of Object.keys(this.files)) {
          if (isWithin(path, key)) {
            delete this.files[key];
            removed[key] = null;
          }
        }
        this.index.removeTree(path);
      } else {
        throw errors.notFound(path);
      }
      return { path, filesUpdate: removed };
    } catch (error) {
      return failure(error, path);
    }
  }

  async grep(pattern: string, path?: string | null, glob?: string | null, options: GrepOptions = {}): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(options.maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const matches: GrepMatch[] = [];
    for (const [key, data] of this.entries) {
      if (!isWithin(root, key) || (matcher && !matcher(key))) continue;
      const text = fileDataText(data);
      if (text !== null) grepText(key, text, pattern, matches);
    }
    return capMatches(sortMatches(matches), options.maxCount);
  }

  async globInfo(pattern: string, path?: string): Promise<FileInfo[]> {
    const matcher = compileGlob(pattern, searchRoot(path));
    const found: FileInfo[] = [];
    for (const [key, data] of this.entries) {
      if (isWithin(matcher.root, key) && matcher(key)) found.push(fileDataInfo(key, data));
    }
    return sortByPath(found);
  }

  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    return files.map(([filePath, bytes]) => {
      try {
        const path = normalizePath(filePath);
        if (!(bytes instanceof Uint8Array)) throw errors.invalidArgument("upload content must be bytes");
        this.store(path, fileDataFromBytes(bytes, this.record(path)?.created_at));
        return { path, error: null };
      } catch (error) {
        return { path: filePath, error: toFileOperationError(failure(error, filePath).code) };
      }
    });
  }


  /** Checks the place is free for a file, then stores it and indexes it. */
  private store(path: string, data: FileDataV2): void {
    if (path === "/" || this.index.isDirectory(path)) throw errors.isDirectory(path);
    for (const ancestor of ancestorsOf(path)) {
      if (ancestor !== "/" && this.record(ancestor)) throw errors.notADirectory(path);
    }
    const size = fileDataSize(data);
    if (this.options.maxFileSize !== undefined && size > this.options.maxFileSize) {
      throw errors.tooLarge(path, size, this.options.maxFileSize);
    }
    const isNew = !this.record(path);
    this.files[path] = data;
    this.indexes.entries = undefined;
    if (isNew) this.index.addFile(path);
  }
}


/** The seeds' helper: a StateBackend together with the runtime that holds its files. */
export function createStateBackend(options: StateBackendOptions = {}): { backend: StateBackend; runtime: BackendRuntime } {
  const runtime = new BackendRuntime({ files: {} });
  return { backend: new StateBackend(runtime, options), runtime };
}
