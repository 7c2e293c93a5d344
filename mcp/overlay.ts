/**
 * The overlay `strata mcp --overlay` serves and `strata diff`, `strata
 * commit` and `strata discard` act on: an OverlayBackend over the workspace
 * directory, its layer kept in SQLite at `.strata/overlay.db` so the server
 * and the commands (other processes, later) share it.
 */
import { existsSync } from "node:fs";
import nodePath from "node:path";
import { OverlayBackend } from "../backends/overlay.js";
import { SECRETS_PRESET } from "../core/permissions.js";
import { SqliteStore } from "../stores/sqlite.js";

/** Where the layer lives, relative to the workspace directory. */
export const OVERLAY_DB = ".strata/overlay.db";
const NAMESPACE = ["overlay"];

export interface OpenedOverlay {
  overlay: OverlayBackend;
  close(): Promise<void>;
}

/** Whether a workspace directory holds an overlay's layer. */
export function hasOverlay(directory: string): boolean {
  return existsSync(nodePath.join(nodePath.resolve(directory), OVERLAY_DB));
}

/**
 * The workspace's overlay, its layer opened (and created when missing). The
 * layer's own database is out of the agent's reach (a change to it through
 * the layer would be committed over the file the layer lives in).
 */
export function openOverlay(directory: string, options: { fsync?: boolean } = {}): OpenedOverlay {
  const dir = nodePath.resolve(directory);
  const store = new SqliteStore({ path: nodePath.join(dir, OVERLAY_DB) });
  const overlay = new OverlayBackend({
    workspace: dir,
    store,
    namespace: NAMESPACE,
    fsync: options.fsync,
    permissions: { rules: [...SECRETS_PRESET, { name: "the overlay's own layer", action: "deny", paths: [`/${OVERLAY_DB}*`] }] },
  });
  return { overlay, close: () => store.close() };
}
