/**
 * What every `strata` file command shares: where its files live (the
 * workspace `strata mcp` serves, or one backend URL from mcp/routes.ts), how a
 * path typed by a person becomes a virtual path, and the one error shape
 * (`{ error: { code, message } }`) with its exit status.
 *
 * Exit statuses, one per kind of failure (README "Exit statuses"):
 *   0 success · 1 an unexpected failure · 2 usage (bad arguments, invalid path)
 *   3 not found (file_not_found, is_directory, not_a_directory) · 4 permission_denied
 *   5 the state forbids it (already_exists, conflict, no_match, ambiguous_match, busy)
 *   6 a limit (binary_file, too_large, quota_exceeded, unsupported)
 *   7 the backend failed (unavailable, timeout, sandbox_closed, aborted, io_error)
 * `strata exec` exits with the command's own status when the command ran.
 */
import type { Command } from "commander";
import type { ErrorCode, ErrorInfo } from "../core/errors.js";
import type { PermissionRule } from "../core/permissions.js";
import type { Backend } from "../core/protocol.js";
import type { Result } from "../core/types.js";
import { withPermissions } from "../backends/permissions.js";
import { ROUTE_SCHEMES } from "../mcp/routes.js";
import { PERMISSION_PRESETS, commandLineAsk, loadPermissions } from "./permissions.js";

export const EXIT_STATUS: Readonly<Record<ErrorCode, number>> = {
  invalid_argument: 2,
  invalid_path: 2,
  file_not_found: 3,
  is_directory: 3,
  not_a_directory: 3,
  permission_denied: 4,
  already_exists: 5,
  conflict: 5,
  no_match: 5,
  ambiguous_match: 5,
  busy: 5,
  binary_file: 6,
  too_large: 6,
  quota_exceeded: 6,
  unsupported: 6,
  unavailable: 7,
  timeout: 7,
  sandbox_closed: 7,
  aborted: 7,
  io_error: 7,
};

/** A failure the CLI reports: the native shape, thrown to the one place that prints it. */
export class CliFailure extends Error {
  constructor(readonly info: ErrorInfo) {
    super(info.message);
  }
}

export function fail(code: ErrorCode, message: string, path?: string): never {
  throw new CliFailure(path === undefined ? { code, message } : { code, message, path });
}

/** Answers a native result's value, or throws its error for the CLI to print. */
export function unwrap<T extends object>(result: Result<T>): T {
  if (result.error) throw new CliFailure(result.error);
  return result as T;
}

/** Prints an error: one line on stderr, and with --json the native shape on stdout. Answers the exit status. */
export function report(error: unknown, json: boolean): number {
  const info: ErrorInfo = error instanceof CliFailure ? error.info : { code: "io_error", message: error instanceof Error ? error.message : String(error) };
  if (json) process.stdout.write(`${JSON.stringify({ error: info })}\n`);
  // A failure with no code of its own (a bad config file, a server that cannot start) is said as it is.
  const line = error instanceof CliFailure ? `${info.code}: ${info.message}` : info.message;
  process.stderr.write(`strata: ${line.replace(/\s*\n\s*/g, " ")}\n`);
  return error instanceof CliFailure ? EXIT_STATUS[info.code] : 1;
}

/** A path as typed: relative ones start at the backend's root. */
export function virtualPath(path: string | undefined): string {
  if (path === undefined || path === "" || path === ".") return "/";
  return path.startsWith("/") ? path : `/${path}`;
}

export function isBackendUrl(value: string): boolean {
  return ROUTE_SCHEMES.some((scheme) => value.startsWith(scheme));
}

export interface TargetFlags {
  root?: string;
  backend?: string;
  memories?: boolean;
  json?: boolean;
  permissions?: string;
  yes?: boolean;
}

/** The options that choose where a file command's files live. */
export function targetOptions(command: Command): Command {
  command
    .option("-r, --root <dir>", "the workspace directory, as `strata mcp` serves it (default: the current directory)")
    .option("-b, --backend <url>", `one backend instead of the workspace: ${ROUTE_SCHEMES.join(" ")} (sqlite and file paths start at --root)`)
    .option("--no-memories", "do not mount /memories (SQLite under .strata/) in the workspace")
    .option("--json", "print the native result as JSON (errors too: {error:{code,message}})");
  return permissionOptions(command);
}

/** `--permissions` and `--yes`, as every command that reaches files takes them. */
export function permissionOptions(command: Command): Command {
  return command
    .option("--permissions <file|preset>", `permission rules, as strata mcp takes them: a JSON file or a preset (${Object.keys(PERMISSION_PRESETS).join(", ")})`)
    .option("-y, --yes", "approve what an 'ask' rule governs (without it, the command line asks no one and denies)");
}

/** `backend` under the rules `--permissions` names (unchanged without it); an `ask` is approved only with --yes. */
export function permitted(backend: Backend, flags: Pick<TargetFlags, "permissions" | "yes">): Backend {
  if (flags.permissions === undefined) return backend;
  let rules: PermissionRule[];
  try {
    rules = loadPermissions(flags.permissions);
  } catch (error) {
    return fail("invalid_argument", error instanceof Error ? error.message : String(error));
  }
  return withPermissions(backend, { rules, ask: commandLineAsk(flags.yes === true) });
}

export interface OpenedTarget {
  backend: Backend;
  close(): Promise<void>;
}

/** The workspace of `strata mcp` without a shell, or the one backend `--backend` names, at `/`. */
export async function openTarget(flags: TargetFlags): Promise<OpenedTarget> {
  const directory = flags.root ?? process.cwd();
  try {
    if (flags.backend !== undefined) {
      const { openRoute } = await import("../mcp/routes.js");
      const route = await openRoute("/", flags.backend, directory);
      return { backend: route.backend, close: () => route.close() };
    }
    const { openEmbeddedWorkspace } = await import("../mcp/embedded.js");
    const ws = await openEmbeddedWorkspace(directory, { execute: false, memories: flags.memories !== false });
    return { backend: ws.backend, close: async () => ws.close?.() };
  } catch (error) {
    return fail("invalid_argument", error instanceof Error ? error.message : String(error));
  }
}

/** Runs one command's body against its target, closing it whatever happens; errors go to `report`. */
export async function withTarget(flags: TargetFlags, body: (backend: Backend) => Promise<void>): Promise<void> {
  let status = 0;
  try {
    const target = await openTarget(flags);
    try {
      await body(permitted(target.backend, flags));
    } finally {
      await target.close();
    }
  } catch (error) {
    status = report(error, flags.json === true);
  }
  if (status !== 0) process.exitCode = status;
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, (_key, v: unknown) => (v instanceof Uint8Array ? Buffer.from(v).toString("base64") : v))}\n`);
}
