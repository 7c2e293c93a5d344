import { BaseBackend, failure, type DownloadAnswer, type TextWindow, type UploadAnswer } from "../core/base.js";
import { errors, printable, StrataError, type ErrorCode, type ErrorInfo } from "../core/errors.js";
import { compileGlob, searchRoot } from "../core/glob.js";
import { capMatches, sortMatches, validateGrepPattern, validateMaxCount } from "../core/grep.js";
import { isWithin, joinPath, normalizePath, parentOf, relativeTo, sortByPath } from "../core/paths.js";
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import type {
  DeleteResult,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileData,
  FileInfo,
  FilesUpdate,
  GrepMatch,
  GrepResult,
  Result,
  SpawnOptions,
  SpawnedProcess,
  WriteResult,
} from "../core/types.js";

export interface CompositeBackendOptions {
  /** Serves every path no route claims. */
  default: Backend;
  /** Path prefix → backend. `/mem` claims `/mem` and `/mem/…`, never `/memo`. */
  routes: Record<string, Backend>;
}

interface Route {
  prefix: string;
  backend: Backend;
}

interface Target {
  backend: Backend;
  /** The route prefix, or undefined for the default backend. */
  prefix: string | undefined;
  /** The path as the target backend sees it. */
  inner: string;
}

/**
 * Routes each path to a backend by its longest matching prefix. Searches
 * fan out in parallel to every backend under the search path and merge
 * under one global cap. Paths are translated both ways (an error's path is a
 * field, and the message names it in quotes), so a caller never sees a
 * routed backend's inner paths. Commands run in the default backend when it
 * is a sandbox.
 */
export class CompositeBackend extends BaseBackend implements Sandbox {
  readonly default: Backend;
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
    return isSandbox(this.default) ? this.default.id : "composite";
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

  /**
   * Where the default backend's path space starts: a sandbox's workspace
   * (e.g. /workspace). Its ancestors are directories here, leading to it, as
   * a route's mount point's are; a search from above starts there.
   */
  private get defaultRoot(): string {
    const root = (this.default as { root?: unknown }).root;
    return typeof root === "string" ? root : "/";
  }

  /** A path above the default's root (never "/" of a default rooted at "/"). */
  private aboveDefault(path: string): boolean {
    const root = this.defaultRoot;
    return root !== "/" && path !== root && isWithin(path, root);
  }

  /** Whether an outer path belongs to the target's backend rather than to a longer route under it. */
  private owns(t: Target, path: string): boolean {
    return this.target(path).prefix === t.prefix;
  }

  protected async doLs(dirPath: string, sizes = true): Promise<FileInfo[]> {
    const dir = normalizePath(dirPath);
    const t = this.target(dir);
    const listed =
      t.prefix === undefined && this.aboveDefault(dir)
        ? [{ path: `${joinPath(dir, relativeTo(dir, this.defaultRoot).split("/")[0]!)}/`, is_dir: true }]
        : this.unwrap(t, await t.backend.ls(t.inner, sizes ? undefined : { sizes })).entries;
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

  protected async doReadRaw(filePath: string): Promise<FileData> {
    const t = this.target(normalizePath(filePath));
    return this.unwrap(t, await t.backend.readRaw(t.inner)).data;
  }

  protected override async doRead(filePath: string, offset: number, limit: number): Promise<TextWindow> {
    const t = this.target(normalizePath(filePath));
    const read = this.unwrap(t, await t.backend.read(t.inner, { offset, limit }));
    if (read.encoding === "binary") throw errors.binary(normalizePath(filePath), read.size);
    return { lines: read.lineCount === 0 ? [] : read.content.split("\n"), totalLines: read.totalLines };
  }

  protected doWrite(filePath: string, content: string, overwrite: boolean): Promise<WriteResult> {
    return this.routed(filePath, (t) => (this.isMountDirectory(t) ? Promise.reject(errors.isDirectory(filePath)) : t.backend.write(t.inner, content, { overwrite })));
  }

  protected doEdit(filePath: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    return this.routed(filePath, (t) => t.backend.edit(t.inner, oldString, newString, { replaceAll }));
  }

  protected override async doStat(filePath: string): Promise<FileInfo> {
    const path = normalizePath(filePath);
    const t = this.target(path);
    const directory = path === "/" || this.isMountDirectory(t) || (t.prefix !== undefined && t.inner === "/") || (t.prefix === undefined && this.aboveDefault(path));
    if (directory) return { path: path === "/" ? "/" : `${path}/`, is_dir: true };
    const info = this.unwrap(t, await t.backend.stat(t.inner));
    return { ...info, path: outer(t.prefix, info.path) };
  }

  protected override async doMkdir(filePath: string, recursive: boolean): Promise<FilesUpdate> {
    const path = normalizePath(filePath);
    const t = this.target(path);
    if (path === "/" || this.isMountDirectory(t) || (t.prefix !== undefined && t.inner === "/")) return super.doMkdir(filePath, recursive);
    return this.outerUpdate(t, this.unwrap(t, await t.backend.mkdir(t.inner, { recursive })).filesUpdate);
  }

  /** Within one backend its own move (atomic where it can be); across backends, copy then delete. */
  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    const source = this.target(normalizePath(from));
    const target = this.target(normalizePath(to));
    if (source.backend !== target.backend || this.spansRoutes(source) || this.spansRoutes(target)) return super.doMove(from, to, overwrite);
    return this.outerUpdate(source, this.unwrap(source, await source.backend.move(source.inner, target.inner, { overwrite })).filesUpdate);
  }

  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    const source = this.target(normalizePath(from));
    const target = this.target(normalizePath(to));
    if (source.backend !== target.backend || this.spansRoutes(source) || this.spansRoutes(target)) return super.doCopy(from, to, overwrite);
    return this.outerUpdate(source, this.unwrap(source, await source.backend.copy(source.inner, target.inner, { overwrite })).filesUpdate);
  }

  /** Whether a path holds a mount point beneath it (so one backend alone cannot move it). */
  private spansRoutes(t: Target): boolean {
    const path = outer(t.prefix, t.inner);
    return this.routes.some((route) => route.prefix !== t.prefix && isWithin(path, route.prefix));
  }

  /**
   * Deleting a directory removes everything under it across routes: the
   * owning backend's part, then the contents of every mount point inside it
   * (a mount point itself stays, as configuration, and lists as an empty
   * directory). A mount point named directly has its contents removed. If
   * one part fails after another succeeded, the error says what was removed.
   */
  protected async doDelete(filePath: string): Promise<DeleteResult> {
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
    const listed = await route.backend.ls("/");
    if (listed.error) return { error: this.message(t, listed.error), code: listed.error.code };
    const entries = listed.entries;
    const filesUpdate: Record<string, null> = {};
    for (const entry of entries) {
      const inner = entry.path.replace(/\/$/, "");
      const result = await this.routed(outer(route.prefix, inner), (target) => target.backend.delete(target.inner));
      if (result.error !== undefined && result.code !== "file_not_found") return result;
      Object.assign(filesUpdate, result.filesUpdate ?? {});
    }
    return { path: route.prefix, filesUpdate };
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    validateGrepPattern(pattern);
    validateMaxCount(maxCount);
    const root = searchRoot(path);
    const matcher = glob ? compileGlob(glob, root) : undefined;
    const results = await Promise.all(
      this.fanOut(root).map(async (t) => {
        const passGlob = !!glob && globMeansTheSame(glob, t, root);
        // A cap spent on matches under a longer route (dropped below) would hide real ones: such a search runs uncapped.
        const shadowed = this.routes.some((route) => route.prefix !== t.prefix && isWithin(outer(t.prefix, t.inner), route.prefix));
        const capped = (passGlob || !glob) && !shadowed;
        const inner = this.unwrap(t, await t.backend.grep(pattern, { path: t.inner, glob: passGlob ? glob : null, maxCount: capped ? maxCount : undefined }));
        const matches = inner.matches
          .map((m): GrepMatch => ({ ...m, path: outer(t.prefix, m.path) }))
          .filter((m) => this.owns(t, m.path) && (!matcher || matcher(m.path)));
        return { matches, truncated: inner.truncated };
      }),
    );
    const merged = capMatches(sortMatches(results.flatMap((r) => r.matches)), maxCount);
    // A backend that hit the cap on its own had more than maxCount matches, so the whole result is cut.
    return { matches: merged.matches, truncated: merged.truncated || results.some((r) => r.truncated) };
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    const root = searchRoot(path);
    const matcher = compileGlob(pattern, root);
    const results = await Promise.all(
      this.fanOut(matcher.root).map(async (t) => {
        const innerPattern = globMeansTheSame(pattern, t, root) ? pattern : "**";
        const found = this.unwrap(t, await t.backend.glob(innerPattern, { path: t.inner, includeDirectories, sizes })).entries;
        return found
          .map((info) => ({ ...info, path: outer(t.prefix, info.path) }))
          .filter((info) => {
            const at = info.path.replace(/\/$/, "");
            return this.owns(t, at) && (info.is_dir ? matcher.matchesDirectory(at) : matcher(at));
          });
      }),
    );
    const entries = new Map(results.flat().map((info) => [info.path, info]));
    // Mount points and the directories above them are directories, as ls shows them, even while empty.
    if (includeDirectories) {
      for (const { prefix } of this.routes) {
        for (let dir = prefix; dir !== "/" && isWithin(matcher.root, dir); dir = parentOf(dir)) {
          if (matcher.matchesDirectory(dir)) entries.set(`${dir}/`, { path: `${dir}/`, is_dir: true });
        }
      }
    }
    return sortByPath([...entries.values()]);
  }

  /** Answers echo each path exactly as the caller gave it (seed 000). */
  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    return this.batched(
      files.map((item) => item[0]),
      async (t, indices) => {
        const result = await t.backend.uploadFiles(indices.map((i) => [this.target(normalizePath(files[i]![0])).inner, files[i]![1]] as const));
        return result.error ? indices.map(() => ({ path: "", error: result.error.code })) : result.files.map((f) => ({ path: f.path, error: f.error?.code ?? null }));
      },
      (path, error) => ({ path, error }),
    );
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    return this.batched(
      paths,
      async (t, indices) => {
        const result = await t.backend.downloadFiles(indices.map((i) => this.target(normalizePath(paths[i]!)).inner));
        return result.error
          ? indices.map(() => ({ path: "", content: null, error: result.error.code }))
          : result.files.map((f) => ({ path: f.path, content: f.content, error: f.error?.code ?? null }));
      },
      (path, error) => ({ path, content: null, error }),
    );
  }

  async execute(command: string, options?: ExecuteOptions): Promise<Result<ExecuteResponse>> {
    if (!isSandbox(this.default)) return { error: notASandbox() };
    return this.default.execute(command, options);
  }

  async spawn(command: string, options?: SpawnOptions): Promise<Result<SpawnedProcess>> {
    if (!isSandbox(this.default)) return { error: notASandbox() };
    return this.default.spawn(command, options);
  }

  /** The composite owns none of its backends: closing it closes nothing (close them yourself). */
  async close(): Promise<void> {}

  /** The backends a search under `root` must visit, each with its inner search path. */
  private fanOut(root: string): Target[] {
    const found = this.target(root);
    const t = found.prefix === undefined && this.aboveDefault(root) ? { ...found, inner: this.defaultRoot } : found;
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
    failed: (path: string, error: ErrorCode) => R,
  ): Promise<R[]> {
    const out = new Array<R>(paths.length);
    const groups = new Map<Backend, { t: Target; indices: number[] }>();
    paths.forEach((path, i) => {
      try {
        const t = this.target(normalizePath(path));
        if (this.isMountDirectory(t)) throw errors.isDirectory(path);
        const group = groups.get(t.backend) ?? { t, indices: [] };
        group.indices.push(i);
        groups.set(t.backend, group);
      } catch (error) {
        out[i] = failed(path, failure(error, path).code);
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

  /** A change routed to one backend, answered in the seed result shape the driver contract uses, with outer paths. */
  private async routed<R extends { path: string; filesUpdate: FilesUpdate; occurrences?: number; content?: string }>(
    filePath: string,
    call: (t: Target) => Promise<Result<R>>,
  ): Promise<WriteResult & EditResult & DeleteResult> {
    let t: Target;
    try {
      t = this.target(normalizePath(filePath));
    } catch (error) {
      return failure(error, filePath);
    }
    let result: Result<R>;
    try {
      result = await call(t);
    } catch (error) {
      return failure(error, filePath);
    }
    if (result.error) return { error: this.message(t, result.error), code: result.error.code };
    const answer: WriteResult & EditResult & DeleteResult = {
      path: outer(t.prefix, result.path),
      filesUpdate: this.outerUpdate(t, result.filesUpdate) as never,
    };
    if (result.occurrences !== undefined) answer.occurrences = result.occurrences;
    if (result.content !== undefined) answer.content = result.content;
    return answer;
  }

  private outerUpdate(t: Target, update: FilesUpdate): FilesUpdate {
    if (!update || t.prefix === undefined) return update;
    return Object.fromEntries(Object.entries(update).map(([p, v]) => [outer(t.prefix, p), v]));
  }

  /** A routed backend's value, or its failure rethrown with the caller's path. */
  private unwrap<T extends object>(t: Target, result: Result<T>): T {
    if (!result.error) return result as T;
    const path = result.error.path === undefined ? undefined : outer(t.prefix, result.error.path);
    throw new StrataError(result.error.code, this.message(t, result.error), path === undefined ? undefined : { path });
  }

  /** A routed backend's message with its path (quoted, as every message quotes it) swapped for the caller's. */
  private message(t: Target, error: ErrorInfo): string {
    if (t.prefix === undefined || error.path === undefined) return error.message;
    return error.message.split(`'${printable(error.path)}'`).join(`'${printable(outer(t.prefix, error.path))}'`);
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
function notASandbox(): ErrorInfo {
  return { code: "unsupported", message: "This workspace cannot run commands: its default backend is not a sandbox" };
}

function outer(prefix: string | undefined, inner: string): string {
  if (prefix === undefined) return inner;
  if (inner === "/") return prefix;
  return prefix + inner;
}

