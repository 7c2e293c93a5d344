/**
 * The workspace `strata mcp` serves for a host directory. The embedded
 * default: the directory, confined (FilesystemBackend's descriptor walk, so
 * no `..` or symlink leads out), with `/memories/` on SQLite under the
 * directory's `.strata/`, and a shell in bubblewrap when bubblewrap works
 * here. Without bubblewrap no shell is offered, unless `unsafeLocal` asks for
 * commands run as plain local processes (they can reach everything this user
 * can). `sandbox` and `routes` choose otherwise (see routes.ts for the URLs).
 */
import { statSync } from "node:fs";
import nodePath from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { baseName, normalizePath } from "../core/paths.js";
import type { Backend, Sandbox } from "../core/protocol.js";
import type { SshSandbox } from "../sandboxes/ssh.js";
import type { AllowedRoot } from "./fs-tools.js";
import type { OpenedOverlay } from "./overlay.js";
import { openRoute, type OpenedRoute } from "./routes.js";
import type { Workspace } from "./server.js";
import type { SshCredentials } from "./ssh-target.js";

/** Where commands run: "auto" (bubblewrap when it works, else local with `unsafeLocal`, else none), or one named. */
export type SandboxChoice = "auto" | "none" | "local" | "bwrap" | `docker:${string}` | `ssh://${string}`;

export interface EmbeddedWorkspaceOptions {
  /**
   * Default "auto". `docker:IMAGE` works in a fresh container (its own /workspace, not the directory);
   * `ssh://user@host[:port]/dir` in that directory on that machine (ssh-target.ts), `ssh` credentials.
   */
  sandbox?: SandboxChoice;
  /** The key and known_hosts file of an `ssh://` sandbox (defaults: ~/.ssh's, and the agent). */
  ssh?: SshCredentials;
  /** With "auto": run commands as local processes when bubblewrap is not available (no isolation). Default false. */
  unsafeLocal?: boolean;
  /** Offer a shell at all. Default true; false is `sandbox: "none"`. */
  execute?: boolean;
  /** Path prefix → route URL (routes.ts). Default `{ "/memories": "sqlite:.strata/memories.db" }`. */
  routes?: Record<string, string>;
  /** Mount the default `/memories` route. Default true; ignored when `routes` is given. */
  memories?: boolean;
  /**
   * Serve the directory through an overlay (mcp/overlay.ts): changes wait in
   * `.strata/overlay.db` for `strata commit` or `strata discard`. Commands
   * (bubblewrap, or local with `unsafeLocal`) run on a scratch copy of the
   * overlay's view and their changes land in the layer too (OverlaySandbox);
   * docker and ssh sandboxes are refused: their files are not the directory.
   */
  overlay?: boolean;
  /**
   * fsync each file written in the directory before it replaces the old one
   * (default true). false: writes and edits stay atomic for readers (a temp
   * file renamed into place) but a power cut may lose the newest; they are
   * faster. Routes and remote sandboxes keep their own durability.
   */
  fsync?: boolean;
}

/** How commands run in a workspace. */
export type ShellKind = "bubblewrap" | "local" | "docker" | "ssh" | "none";

export const DEFAULT_ROUTES: Readonly<Record<string, string>> = { "/memories": "sqlite:.strata/memories.db" };

/** Which shell `auto` (or the choice given) comes to here. */
export async function embeddedShell(options: EmbeddedWorkspaceOptions = {}): Promise<ShellKind> {
  const choice = options.execute === false ? "none" : (options.sandbox ?? "auto");
  if (choice === "none") return "none";
  if (choice === "local") return "local";
  if (choice === "bwrap") return "bubblewrap";
  if (choice.startsWith("docker:")) return "docker";
  if (choice.startsWith("ssh://")) return "ssh";
  // The sandboxes are loaded when a workspace uses one (a server without a shell never loads them).
  const { BubblewrapSandbox } = await import("../sandboxes/bubblewrap.js");
  if (await BubblewrapSandbox.isAvailable()) return "bubblewrap";
  return options.unsafeLocal ? "local" : "none";
}

export async function openEmbeddedWorkspace(directory: string, options: EmbeddedWorkspaceOptions = {}): Promise<Workspace & { shell: ShellKind }> {
  const dir = nodePath.resolve(directory);
  if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) throw new Error(`The workspace directory '${nodePath.basename(dir)}' does not exist`);
  const shell = await embeddedShell(options);
  let files: Backend;
  let sandbox: Sandbox | undefined;
  let layer: OpenedOverlay | undefined;
  if (options.overlay) {
    if (shell === "docker" || shell === "ssh") throw new Error("--overlay lies over the local directory: its commands run in bubblewrap (or locally with --unsafe-local), not in docker or over ssh");
    const { BubblewrapSandbox } = await import("../sandboxes/bubblewrap.js");
    const { LocalSandbox } = await import("../sandboxes/local.js");
    if (shell === "bubblewrap") {
      const why = await BubblewrapSandbox.unavailableReason();
      if (why) throw new Error(`bubblewrap cannot run here: ${why}`);
    }
    const { openOverlay } = await import("./overlay.js");
    layer = openOverlay(dir, { fsync: options.fsync });
    if (shell === "none") files = layer.overlay;
    else {
      // The overlay's permission rules decide what reaches the scratch copy; the sandbox's own would only repeat them.
      const make = shell === "bubblewrap" ? (scratch: string) => new BubblewrapSandbox({ workspace: scratch, permissions: false }) : (scratch: string) => new LocalSandbox({ workspace: scratch, permissions: false });
      try {
        const { OverlaySandbox } = await import("../sandboxes/overlay.js");
        files = sandbox = await OverlaySandbox.open({ overlay: layer.overlay, sandbox: make });
      } catch (error) {
        await layer.close();
        throw error;
      }
    }
  } else if (shell === "bubblewrap") {
    const { BubblewrapSandbox } = await import("../sandboxes/bubblewrap.js");
    const why = await BubblewrapSandbox.unavailableReason();
    if (why) throw new Error(`bubblewrap cannot run here: ${why}`);
    files = sandbox = new BubblewrapSandbox({ workspace: dir, fsync: options.fsync });
  } else if (shell === "local") {
    const { LocalSandbox } = await import("../sandboxes/local.js");
    files = sandbox = new LocalSandbox({ workspace: dir, fsync: options.fsync });
  } else if (shell === "docker") {
    const { DockerSandbox } = await import("../sandboxes/docker.js");
    files = sandbox = await DockerSandbox.create({ image: (options.sandbox ?? "").slice("docker:".length) });
  } else if (shell === "ssh") {
    const { SshSandbox } = await import("../sandboxes/ssh.js");
    const { sshSandboxOptions } = await import("./ssh-target.js");
    files = sandbox = await SshSandbox.connect(await sshSandboxOptions(options.sandbox ?? "", options.ssh));
  } else {
    files = new FilesystemBackend({ workspace: dir, fsync: options.fsync });
  }
  const root = (files as { root?: string }).root ?? "/";
  const what =
    shell === "docker"
      ? "the container's workspace"
      : shell === "ssh"
        ? `the remote folder '${baseName((sandbox as SshSandbox).workspace)}' over SSH`
        : `the folder '${nodePath.basename(dir)}'${layer ? " through an overlay: changes wait for review (strata diff, strata commit)" : ""}`;
  const roots: AllowedRoot[] = [{ path: root, description: `the workspace: ${what}${shell === "bubblewrap" ? " (commands see it at this path too)" : ""}` }];
  const routeUrls = options.routes ?? (options.memories === false ? {} : DEFAULT_ROUTES);
  const opened: Array<[string, OpenedRoute]> = [];
  const closeAll = async () => {
    await Promise.all(opened.map(([, route]) => route.close().catch(() => undefined)));
    await sandbox?.close();
    await layer?.close();
  };
  try {
    for (const [prefix, url] of Object.entries(routeUrls)) opened.push([prefix, await openRoute(prefix, url, dir)]);
  } catch (error) {
    await closeAll();
    throw error;
  }
  for (const [prefix, route] of opened) roots.push({ path: normalizePath(prefix), description: `${route.description}${sandbox ? "; not visible to commands" : ""}` });
  const { CompositeBackend } = opened.length === 0 ? { CompositeBackend: undefined } : await import("../backends/composite.js");
  const backend = CompositeBackend === undefined ? files : new CompositeBackend({ default: files, routes: Object.fromEntries(opened.map(([prefix, route]) => [prefix, route.backend])) });
  return { backend, shell, execute: shell !== "none", roots, close: closeAll };
}
