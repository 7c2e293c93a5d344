/**
 * A backend seen from one of its directories: `/x` in the view is
 * `${root}/x` in the backend, and every path that comes back is shown the
 * same way. The suite uses it to run the same tests, with the same literal
 * paths, over backends whose path space starts elsewhere: a sandbox's files
 * live under its workspace (`/workspace`), where its commands see them.
 */
import { printable, type ErrorInfo } from "../core/errors.js";
import { isWithin, normalizePath } from "../core/paths.js";
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import type { FileInfo, FilesUpdate, Result } from "../core/types.js";

export function rooted<B extends Backend>(backend: B, root: string): B {
  if (root === "/") return backend;
  const inward = (path: unknown): unknown => (typeof path === "string" && path.startsWith("/") ? (path === "/" ? root : root + path) : path);
  const outward = (path: string): string => {
    if (!path.startsWith("/")) return path;
    const bare = path.endsWith("/") && path !== "/" ? path.slice(0, -1) : path;
    let normal: string;
    try {
      normal = normalizePath(bare);
    } catch {
      return path;
    }
    if (!isWithin(root, normal)) return path;
    const inner = normal === root ? "/" : normal.slice(root.length);
    return path.endsWith("/") && inner !== "/" ? `${inner}/` : inner;
  };
  const error = (info: ErrorInfo): ErrorInfo => {
    let message = info.message.split(`'${printable(root)}'`).join("'/'");
    message = message.split(`'${printable(root)}/`).join("'/");
    return info.path === undefined ? { ...info, message } : { ...info, message, path: outward(info.path) };
  };
  const info = (entry: FileInfo): FileInfo => ({ ...entry, path: outward(entry.path) });
  const update = (files: FilesUpdate): FilesUpdate => (files ? Object.fromEntries(Object.entries(files).map(([p, v]) => [outward(p), v])) : files);
  const options = (value: unknown, ...names: string[]): unknown => {
    if (typeof value !== "object" || value === null || Array.isArray(value)) return value;
    const copy: Record<string, unknown> = { ...(value as Record<string, unknown>) };
    for (const name of names) if (name in copy) copy[name] = inward(copy[name]);
    return copy;
  };
  function answer<T extends object>(result: Result<T>, map: (value: T) => T): Result<T> {
    return result.error ? { error: error(result.error) } : map(result as T);
  }
  const b = backend as unknown as Record<string, (...args: unknown[]) => Promise<Result<Record<string, unknown>>>>;
  const call = (name: string, args: unknown[]) => b[name]!.apply(backend, args);
  const view: Record<string, unknown> = {
    ls: async (path: unknown = "/", o?: unknown) => answer(await call("ls", [inward(path), o]), (v) => ({ entries: (v.entries as FileInfo[]).map(info) })),
    read: async (path: unknown, o?: unknown) => answer(await call("read", [inward(path), o]), (v) => ({ ...v, path: outward(v.path as string) })),
    readRaw: async (path: unknown, o?: unknown) => answer(await call("readRaw", [inward(path), o]), (v) => ({ ...v, path: outward(v.path as string) })),
    write: async (path: unknown, content: unknown, o?: unknown) => answer(await call("write", [inward(path), content, o]), changed),
    edit: async (path: unknown, a: unknown, c: unknown, o?: unknown) => answer(await call("edit", [inward(path), a, c, o]), changed),
    delete: async (path: unknown, o?: unknown) => answer(await call("delete", [inward(path), o]), changed),
    grep: async (pattern: unknown, o?: unknown) =>
      answer(await call("grep", [pattern, options(o, "path", "glob")]), (v) => ({
        ...v,
        matches: (v.matches as { path: string }[]).map((m) => ({ ...m, path: outward(m.path) })),
      })),
    glob: async (pattern: unknown, o?: unknown) =>
      answer(await call("glob", [inward(pattern), options(o, "path")]), (v) => ({ entries: (v.entries as FileInfo[]).map(info) })),
    stat: async (path: unknown, o?: unknown) => answer(await call("stat", [inward(path), o]), (v) => info(v as unknown as FileInfo) as unknown as Record<string, unknown>),
    mkdir: async (path: unknown, o?: unknown) => answer(await call("mkdir", [inward(path), o]), changed),
    move: async (from: unknown, to: unknown, o?: unknown) => answer(await call("move", [inward(from), inward(to), o]), moved),
    copy: async (from: unknown, to: unknown, o?: unknown) => answer(await call("copy", [inward(from), inward(to), o]), moved),
    uploadFiles: async (files: unknown, o?: unknown) => {
      const given = Array.isArray(files) ? files.map((item: unknown) => (Array.isArray(item) ? [inward(item[0]), ...item.slice(1)] : item)) : files;
      return answer(await call("uploadFiles", [given, o]), (v) => ({ files: items(v.files, files) }));
    },
    downloadFiles: async (paths: unknown, o?: unknown) => {
      const given = Array.isArray(paths) ? paths.map(inward) : paths;
      return answer(await call("downloadFiles", [given, o]), (v) => ({ files: items(v.files, paths) }));
    },
  };
  function changed(v: Record<string, unknown>) {
    return { ...v, path: outward(v.path as string), filesUpdate: update(v.filesUpdate as FilesUpdate) };
  }
  function moved(v: Record<string, unknown>) {
    return { ...v, from: outward(v.from as string), to: outward(v.to as string), filesUpdate: update(v.filesUpdate as FilesUpdate) };
  }
  /** Item answers echo the view's own paths, as the caller gave them. */
  function items(answers: unknown, given: unknown): unknown[] {
    return (answers as { path: string; error: ErrorInfo | null }[]).map((item, i) => {
      const original = Array.isArray(given) ? (Array.isArray(given[i]) ? (given[i] as unknown[])[0] : given[i]) : item.path;
      return { ...item, path: original as string, error: item.error ? error(item.error) : null };
    });
  }
  if (isSandbox(backend)) {
    const sandbox = backend as Sandbox;
    Object.assign(view, {
      get id() {
        return sandbox.id;
      },
      execute: async (command: string, o?: unknown) => {
        const result = await (sandbox.execute as (c: string, o?: unknown) => Promise<Result<object>>)(command, options(o, "cwd"));
        return result.error ? { error: error(result.error) } : result;
      },
      spawn: async (command: string, o?: unknown) => {
        const result = await (sandbox.spawn as (c: string, o?: unknown) => Promise<Result<object>>)(command, options(o, "cwd"));
        return result.error ? { error: error(result.error) } : result;
      },
      close: () => sandbox.close(),
    });
  }
  return view as unknown as B;
}
