/**
 * A route of `strata mcp` by URL: where the files under a path prefix live.
 *
 *   memory:                 StateBackend (gone when the session ends)
 *   sqlite:PATH             StoreBackend over SQLite (PATH relative to the workspace directory)
 *   postgres://…            StoreBackend over PostgreSQL (postgresql:// too)
 *   redis://…               StoreBackend over Redis (rediss:// too)
 *   file:DIR                FilesystemBackend over DIR (relative to the workspace directory), confined
 *
 * A store's namespace is the route's prefix (`/memories` → ["memories"]), so
 * two routes can share one database; a route at `/` (the CLI's `--backend`)
 * uses StoreBackend's default namespace. `?namespace=a/b` on a store URL
 * names it instead (["a","b"]): the part of a shared database a route is
 * confined to, since a namespace sees no other's files (not even a longer
 * one's). A file: route's part of the disk is its directory (`file:DIR/sub`).
 */
import nodePath from "node:path";
import { normalizePath } from "../core/paths.js";
import { StrataError } from "../core/errors.js";
import type { Backend } from "../core/protocol.js";
import type { Store } from "../stores/store.js";

export interface OpenedRoute {
  backend: Backend;
  /** What list_allowed_roots says it holds (never a host path or a password). */
  description: string;
  close(): Promise<void>;
}

/** The URL schemes a route may use. */
export const ROUTE_SCHEMES = ["memory:", "sqlite:", "postgres://", "postgresql://", "redis://", "rediss://", "file:"] as const;

export async function openRoute(prefix: string, url: string, directory: string): Promise<OpenedRoute> {
  const named = url.startsWith("sqlite:") || /^(postgres|postgresql|redis|rediss):\/\//.test(url) ? takeNamespace(prefix, url) : undefined;
  if (named) url = named.url;
  const namespace = named?.namespace ?? normalizePath(prefix).split("/").filter(Boolean);
  // Each kind's modules load when a route uses it (`strata mcp` reads this module at start).
  const store = async (open: () => Promise<Store>, description: string): Promise<OpenedRoute> => {
    const { StoreBackend } = await import("../backends/store.js");
    const opened = await open();
    return { backend: new StoreBackend({ store: opened, ...(namespace.length > 0 ? { namespace } : {}) }), description, close: () => opened.close() };
  };
  if (url === "memory:") {
    const { StateBackend } = await import("../backends/state.js");
    return { backend: new StateBackend(), description: "scratch files in memory, gone when the session ends", close: async () => {} };
  }
  if (url.startsWith("sqlite:")) {
    const path = nodePath.resolve(directory, url.slice("sqlite:".length));
    const { mkdirSync } = await import("node:fs");
    try {
      mkdirSync(nodePath.dirname(path), { recursive: true });
    } catch (error) {
      // Node's message names the host path; the caller (an MCP client) sees only the file's name.
      throw new StrataError("io_error", `Cannot create the folder of '${nodePath.basename(path)}' (${(error as NodeJS.ErrnoException).code ?? "error"})`);
    }
    const { SqliteStore } = await import("../stores/sqlite.js");
    return store(async () => new SqliteStore({ path }), "files kept in SQLite across sessions");
  }
  if (url.startsWith("postgres://") || url.startsWith("postgresql://")) {
    const { PostgresStore } = await import("../stores/postgres.js");
    return store(async () => new PostgresStore({ connectionString: url }), "files kept in PostgreSQL");
  }
  if (url.startsWith("redis://") || url.startsWith("rediss://")) {
    const { RedisStore } = await import("../stores/redis.js");
    return store(async () => new RedisStore({ url }), "files kept in Redis");
  }
  if (url.startsWith("file:")) {
    const dir = nodePath.resolve(directory, url.slice("file:".length));
    const { FilesystemBackend } = await import("../backends/filesystem.js");
    return { backend: new FilesystemBackend({ workspace: dir }), description: `the folder '${nodePath.basename(dir)}'`, close: async () => {} };
  }
  throw new StrataError("invalid_argument", `Route '${prefix}': unknown URL '${redacted(url)}'; use one of ${ROUTE_SCHEMES.join(" ")}`);
}

/** A URL with its password left out, fit for a message. */
function redacted(url: string): string {
  return url.replace(/\/\/[^@/]*@/, "//…@");
}

/**
 * A store URL's `namespace` query parameter taken out (the drivers would read it as one of
 * theirs): its `/`-separated parts, percent-decoded, and the URL without it.
 */
function takeNamespace(prefix: string, url: string): { url: string; namespace: string[] | undefined } {
  const at = url.indexOf("?");
  if (at < 0) return { url, namespace: undefined };
  let namespace: string[] | undefined;
  const kept: string[] = [];
  for (const param of url.slice(at + 1).split("&")) {
    if (!param.startsWith("namespace=")) {
      kept.push(param);
      continue;
    }
    let value: string;
    try {
      value = decodeURIComponent(param.slice("namespace=".length).replace(/\+/g, " "));
    } catch {
      value = "";
    }
    namespace = value.split("/").filter(Boolean);
    if (namespace.length === 0 || value.includes("\0")) {
      throw new StrataError("invalid_argument", `Route '${prefix}': '${redacted(url)}' names an empty namespace; use ?namespace=a or ?namespace=a/b`);
    }
  }
  return { url: kept.length > 0 ? `${url.slice(0, at)}?${kept.join("&")}` : url.slice(0, at), namespace };
}
