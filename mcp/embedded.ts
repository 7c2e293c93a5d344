/**
 * The embedded default workspace of `strata mcp`: a host directory, confined
 * (FilesystemBackend's descriptor walk, so no `..` or symlink leads out),
 * with `/memories/` on SQLite under the directory's `.strata/`, and a shell
 * in bubblewrap when bubblewrap works here. Without bubblewrap no shell is
 * offered, unless `unsafeLocal` asks for commands run as plain local
 * processes (they can reach everything this user can).
 */
import { mkdirSync, statSync } from "node:fs";
import nodePath from "node:path";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StoreBackend } from "../backends/store.js";
import type { Backend, Sandbox } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SqliteStore } from "../stores/sqlite.js";
import type { AllowedRoot } from "./fs-tools.js";
import type { Workspace } from "./server.js";

export interface EmbeddedWorkspaceOptions {
  /** Run commands as local processes when bubblewrap is not available (no isolation). Default false. */
  unsafeLocal?: boolean;
  /** Offer a shell at all. Default true (in bubblewrap, or locally with `unsafeLocal`). */
  execute?: boolean;
  /** Mount `/memories/` on SQLite at `<directory>/.strata/memories.db`. Default true. */
  memories?: boolean;
}

/** How commands run in an embedded workspace. */
export type ShellKind = "bubblewrap" | "local" | "none";

/** Which shell the embedded default gets here: bubblewrap when it works, else local with `unsafeLocal`, else none. */
export async function embeddedShell(options: EmbeddedWorkspaceOptions = {}): Promise<ShellKind> {
  if (options.execute === false) return "none";
  if (await BubblewrapSandbox.isAvailable()) return "bubblewrap";
  return options.unsafeLocal ? "local" : "none";
}

export async function openEmbeddedWorkspace(directory: string, options: EmbeddedWorkspaceOptions = {}): Promise<Workspace & { shell: ShellKind }> {
  const dir = nodePath.resolve(directory);
  if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) throw new Error(`The workspace directory '${nodePath.basename(dir)}' does not exist`);
  const shell = await embeddedShell(options);
  let files: Backend;
  let sandbox: Sandbox | undefined;
  if (shell === "bubblewrap") files = sandbox = new BubblewrapSandbox({ workspace: dir });
  else if (shell === "local") files = sandbox = new LocalSandbox({ workspace: dir });
  else files = new FilesystemBackend({ workspace: dir });
  const root = (files as { root?: string }).root ?? "/";
  const rootDescription = `the workspace: the folder '${nodePath.basename(dir)}'${shell === "bubblewrap" ? " (commands see it at this path too)" : ""}`;
  if (options.memories === false) {
    return { backend: files, shell, execute: shell !== "none", roots: [{ path: root, description: rootDescription }], close: async () => sandbox?.close() };
  }
  mkdirSync(nodePath.join(dir, ".strata"), { recursive: true });
  const store = new SqliteStore({ path: nodePath.join(dir, ".strata", "memories.db") });
  const memories = new StoreBackend({ store, namespace: ["memories"] });
  const roots: AllowedRoot[] = [
    { path: root, description: rootDescription },
    { path: "/memories", description: "memories kept across sessions (SQLite); not visible to commands" },
  ];
  return {
    backend: new CompositeBackend({ default: files, routes: { "/memories": memories } }),
    shell,
    execute: shell !== "none",
    roots,
    close: async () => {
      await sandbox?.close();
      await store.close();
    },
  };
}
