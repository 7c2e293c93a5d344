import { joinPath, normalizePath } from "../core/paths.js";
import type { ToolSession } from "./session.js";

/**
 * A path as the backend will answer it, and the key this session serialises a path's changes under: the path as the
 * backend will answer it (relative paths start at the backend's root). An
 * invalid path is left as given; the backend refuses it.
 */
export function canonicalPath(session: ToolSession, path: string): string {
  try {
    const normal = normalizePath(path);
    return path.startsWith("/") ? normal : joinPath(session.root, normal.slice(1));
  } catch {
    return path;
  }
}
