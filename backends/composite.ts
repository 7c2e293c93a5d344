import { BaseBackend, checkBatch, failure } from "../core/base.js";
import { errors, printable, StrataError, toFileOperationError } from "../core/errors.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { isWithin, joinPath, normalizePath, relativeTo, sortByPath } from "../core/paths.js";
import { isSandboxBackend, type BackendProtocol, type SandboxBackendProtocol } from "../core/protocol.js";
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
} from "../core/types.js";

export interface CompositeBackendOptions {
  /** Serves every path no route claims. */
  default: BackendProtocol;
  /** Path prefix → backend. `/mem` claims `/mem` and `/mem/…`, never `/memo`. */
  routes: Record<string, BackendProtocol>;
}

interface Route {
  prefix: string;
  backend: BackendProtocol;
}

interface Target {
  backend: BackendProtocol;
  /** The route prefix, or undefined for the default backend. */
  prefix: string | undefined;
  /** The path as the target backend sees it. */
  inner: string;
}

/**
 * Routes each path to a backend by its longest matching prefix. Searches
 * fan out in parallel to every backend under the search path and merge
 * under one global cap. Paths and messages are translated both ways, so a
 * caller never sees a routed backend's inner paths.
 */
export class CompositeBackend extends BaseBackend implements SandboxBackendProtocol {
  readonly default: BackendProtocol;
  private readonly routes: Route[];

  constructor(options: CompositeBackendOptions) {
    super();
    this.default = options.default;
    this.routes = Object.entries(options.routes)
      .map(([prefix, backend]) => {
        const normalized = normalizePath(prefix);
        if (normalized === "/") throw errors.invalidArgument("a route cannot be '/'; that is the default backend");
        return { prefix: normalized, backend };
      })
      .sort((a, b) => b.prefix.length - a.prefix.length);
  }

  get id(): string {
    return isSandboxBackend(this.default) ? this.default.id : "composite";
  }

  private target(path: string): Target {
    for (const route of this.routes) {
      if (isWithin(route.prefix, path)) return { backend: route.backend, prefix: route.prefix, inner: `/${relativeTo(route.prefix, path)}` };
    }
    return { backend: this.default, prefix: undefined, inner: path };
  }

  /** A path of the default backend that is a mount point's ancestor: a directory, whatever the default holds. */
  private isMountDirectory(t: Target): boolean {
    return t.prefix === undefined && this.routes.some((route) => isWithin(t.inner, route.prefix));
  }

  /** Whether an outer path belongs to the target's backend rather than to a longer route under it. */
  private owns(t: Target, path: string): boolean {
    return this.target(path).prefix === t.prefix;
  }

  async lsInfo(dirPath: string): Promise<FileInfo[]> {
    const dir = normalizePath(dirPath);
    const t = this.target(dir);
    const listed = await this.translate(t, () => t.backend.lsInfo(t.inner));
    const entries = new Map<string, FileInfo>();
    for (const info of listed) {
      const path = outer(t.prefix, info.path);
      if (this.owns(t, path.replace(/\/$/, ""))) entries.set(path, { ...info, path });
    }
    for (const { prefix } of this.routes) {
      if (prefix === dir || !isWithin(dir, prefix)) continue;
      const child = joinPath(dir, relativeTo(dir, prefix).split("/")[0]!);
      entries.set(`${child}/`, { path: `${child}/`, is_dir: true });
    }
    return sortByPath([...entries.values()]);
  }

  async readRaw(filePath: string): Promise<FileData> {
    const t = this.target(normalizePath(filePath));
    return this.translate(t, () => t.backend.readRaw(t.inner));
  }

  override async read(filePath: string, offset?: number, limit?: number): Promise<string> {
    let t: Target;
    try {
      t = this.target(normalizePath(filePath));
    } catch (error) {
      return `Error: ${failure(error, filePath).error}`;
    }
    const text = await t.backend.read(t.inner, offset, limit);
    return text.startsWith("Error: ") ? this.message(t, text) : text;
  }

  write(filePath: string, content: string, options?: WriteOptions): Promise<WriteResult> {
    return this.routed(filePath, (t) => (this.isMountDirectory(t) ? Promise.reject(errors.isDirectory(filePath)) : t.backend.write(t.inner, content, options)));
  }

  edit(filePath: string, oldString: string, newString: string, replaceAll?: boolean): Promise<EditResult> {
    return this.routed(filePath, (t) => t.backend.edit(t.inner, oldString, newString, replaceAll));
  }

  /**
   * Deleting a directory removes everything under it across routes: the
   * owning backend's part, then the contents of every mount point inside it
   * (a mount point itself stays, as configuration, and lists as an empty
   * directory). A mount point named directly has its contents removed. If
   * one part fails after another succeeded, the error says what was removed.
   */
  async delete(filePath: string): Promise<DeleteResult> {
    let path: string;
    try {
      path = normalizePath(filePath);
    } catch (error) {
      return failure(error, filePath);
    }
    const mounts = this.routes.filter((route) => path !== "/" && isWithin(path, route.prefix));
    if (mounts.length === 0) return this.routed(filePath, (t) => t.backend.delete(t.inner));
    const t = this.target(path);
    const filesUpdate: Record<string, null> = {};
    const done: string[] = [];
    const merge = (result: DeleteResult) => Object.assign(filesUpdate, result.filesUpdate ?? {});
    // The owning backend's part; a mount point's own root is "/" there, which is cleared instead of deleted.
    if (t.inner !== "/") {
      const own = await this.routed(path, (target) => target.backend.delete(target.inner));
      if (own.error !== undefined && own.code !== "file_not_found") return own;
      if (own.error === undefined) {
        merge(own);
        done.push(path);
      }
    }
    for (const route of mounts) {
      const cleared = await this.clearRoute(route);
      if (cleared.error !== undefined) {
        const removed = done.length > 0 ? `; already removed: ${done.map((p) => `'${printable(p)}'`).join(", ")}` : "";
        return { error: `${cleared.error} (deleting '${printable(path)}'${removed})`, code: cleared.code };
      }
      merge(cleared);
      done.push(route.prefix);
    }
    return { path, filesUpdate: Object.keys(filesUpdate).length > 0 ? filesUpdate : null };
  }

  /** Deletes every entry at the root of a route's backend (what lies under its mount point). */
  private async clearRoute(route: Route): Promise<DeleteResult> {
    const t: Target = { backend: route.backend, prefix: route.prefix, inner: "/" };
    let entries: FileInfo[];
    try {
      entries = await this.translate(t, () => route.backend.lsInfo("/"));
    } catch (error) {
      return failure(error, route.prefix);
    }
    const filesUpdate: Record<string, null> = {};
    for (const entry of entries) {
      const inner = entry.path.replace(/\/$/, "");
      const result = await this.routed(outer(route.prefix, inner), (target) => target.backend.delete(target.inner));
      if (result.error !== undefined && result.code !== "file_not_found") return result;
      Object.assign(filesUpdate, result.filesUpdate ?? {});
    }
    return { path: route.prefix, filesUpdate };
  }

  async grep(pattern: string, path?: string | null, glob?: string | null, options: GrepOptions = {}): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(options.maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const results = await Promise.all(
      this.fanOut(root).map(async (t) => {
        const passGlob = !!glob && globMeansTheSame(glob, t, root);
        // A cap spent on matches under a longer route (dropped below) would hide real ones: such a search runs uncapped.
        const shadowed = this.routes.some((route) => route.prefix !== t.prefix && isWithin(outer(t.prefix, t.inner), route.prefix));
        const inner = await this.translate(t, () =>
          t.backend.grep(pattern, t.inner, passGlob ? glob : null, (passGlob || !glob) && !shadowed ? options : {}),
        );
        const matches = inner.matches
          .map((m): GrepMatch => ({ ...m, path: outer(t.prefix, m.path) }))
          .filter((m) => this.owns(t, m.path) && (!matcher || matcher(m.path)));
        return { matches, truncated: inner.truncated };
      }),
    );
    const merged = capMatches(sortMatches(results.flatMap((r) => r.matches)), options.maxCount);
    // A backend that hit the cap on its own had more than maxCount matches, so the whole result is cut.
    return { matches: merged.matches, truncated: merged.truncated || results.some((r) => r.truncated) };
  }

  async globInfo(pattern: string, path?: string): Promise<FileInfo[]> {
    const root = searchRoot(path);
    const matcher = compileGlob(pattern, root);
    const results = await Promise.all(
      this.fanOut(matcher.root).map(async (t) => {
        const innerPattern = globMeansTheSame(pattern, t, root) ? pattern : "**";
        const found = await this.translate(t, () => t.backend.globInfo(innerPattern, t.inner));
        return found
          .map((info) => ({ ...info, path: outer(t.prefix, info.path) }))
          .filter((info) => this.owns(t, info.path) && matcher(info.path));
      }),
    );
    return sortByPath(results.flat());
  }

  /** Responses echo each path exactly as the caller gave it (seed 000). */
  async uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<FileUploadResponse[]> {
    checkBatch(files, "uploadFiles");
    return this.batched(
      files.map((item) => (Array.isArray(item) ? (item[0] as string) : (item as unknown as string))),
      (t, indices) => t.backend.uploadFiles(indices.map((i) => [this.target(normalizePath(files[i]![0])).inner, files[i]![1]] as const)),
      (t) => this.isMountDirectory(t),
      (path, error) => ({ path, error }),
    );
  }

  override async downloadFiles(paths: readonly string[]): Promise<FileDownloadResponse[]> {
    checkBatch(paths, "downloadFiles");
    return this.batched(
      paths,
      (t, indices) => t.backend.downloadFiles(indices.map((i) => this.target(normalizePath(paths[i]!)).inner)),
      (t) => this.isMountDirectory(t),
      (path, error) => ({ path, content: null, error }),
    );
  }

  async execute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse> {
    if (!isSandboxBackend(this.default)) {
      throw new StrataError("unsupported", "This workspace cannot run commands: its default backend is not a sandbox");
    }
    return this.default.execute(command, options);
  }

  /** The backends a search under `root` must visit, each with its inner search path. */
  private fanOut(root: string): Target[] {
    const t = this.target(root);
    const targets: Target[] = [t];
    for (const route of this.routes) {
      if (route.prefix !== t.prefix && isWithin(root, route.prefix)) targets.push({ backend: route.backend, prefix: route.prefix, inner: "/" });
    }
    return targets;
  }

  /** Groups items per backend (one call each, in parallel) and answers in input order. */
  private async batched<R extends { path: string }>(
    paths: readonly string[],
    call: (t: Target, indices: number[]) => Promise<R[]>,
    isDirectory: (t: Target) => boolean,
    failed: (path: string, error: ReturnType<typeof toFileOperationError>) => R,
  ): Promise<R[]> {
    const out = new Array<R>(paths.length);
    const groups = new Map<BackendProtocol, { t: Target; indices: number[] }>();
    paths.forEach((path, i) => {
      try {
        const t = this.target(normalizePath(path));
        if (isDirectory(t)) throw errors.isDirectory(path);
        const group = groups.get(t.backend) ?? { t, indices: [] };
        group.indices.push(i);
        groups.set(t.backend, group);
      } catch (error) {
        out[i] = failed(path, toFileOperationError(failure(error, path).code));
      }
    });
    await Promise.all(
      [...groups.values()].map(async ({ t, indices }) => {
        const responses = await call(t, indices);
        indices.forEach((i, k) => {
          out[i] = { ...responses[k]!, path: paths[i]! };
        });
      }),
    );
    return out;
  }

  private async routed<R extends { error?: string; path?: string; filesUpdate?: Record<string, unknown> | null }>(
    filePath: string,
    call: (t: Target) => Promise<R>,
  ): Promise<R> {
    let t: Target;
    try {
      t = this.target(normalizePath(filePath));
    } catch (error) {
      return failure(error, filePath) as unknown as R;
    }
    let result: R;
    try {
      result = await call(t);
    } catch (error) {
      return failure(error, filePath) as unknown as R;
    }
    if (t.prefix === undefined) return result;
    const translated = { ...result };
    if (result.error !== undefined) translated.error = this.message(t, result.error);
    if (result.path !== undefined) translated.path = outer(t.prefix, result.path);
    if (result.filesUpdate) {
      translated.filesUpdate = Object.fromEntries(Object.entries(result.filesUpdate).map(([p, v]) => [outer(t.prefix, p), v]));
    }
    return translated;
  }

  /** Runs a call against a target, rewriting a thrown error's inner paths to outer ones. */
  private async translate<T>(t: Target, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (t.prefix !== undefined && error instanceof StrataError) throw new StrataError(error.code, this.message(t, error.message), { cause: error });
      throw error;
    }
  }

  /** Rewrites quoted inner paths in a routed backend's message to the caller's paths. */
  private message(t: Target, message: string): string {
    if (t.prefix === undefined) return message;
    return message.replace(/'(\/[^']*)'/g, (_, inner: string) => `'${outer(t.prefix, inner)}'`);
  }
}

/**
 * Whether a glob can be handed to a target unchanged: a basename glob means the
 * same everywhere, and a relative one does when the target searches from the
 * caller's own search path. Otherwise it is applied to outer paths afterwards.
 */
function globMeansTheSame(glob: string, t: Target, root: string): boolean {
  if (glob.startsWith("/")) return t.prefix === undefined;
  return !glob.includes("/") || outer(t.prefix, t.inner) === root;
}

/** An inner path of a routed backend as the caller sees it (keeps a directory's trailing `/`). */
function outer(prefix: string | undefined, inner: string): string {
  if (prefix === undefined) return inner;
  if (inner === "/") return prefix;
  return prefix + inner;
}

