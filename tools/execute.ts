import { z } from "zod";
import { CompositeBackend } from "../backends/composite.js";
import { PermissionedBackend } from "../backends/permissions.js";
import { isSandbox, type Backend } from "../core/protocol.js";
import { ToolFailure, defineTool, ok, orFail } from "./define.js";

export const executeSchema = z.object({
  command: z.string().min(1).describe("The shell command to run (sh -c), in the workspace directory"),
  timeout: z.number().positive().max(2_147_483).optional().describe("Seconds before the command and its children are killed (exit code 124). Default: the sandbox's"),
});

export const execute = defineTool({
  name: "execute",
  description: [
    "Runs a shell command in the sandbox, in the workspace directory, and answers its combined stdout and stderr",
    "and its exit code. Long output is cut. Use read_file, edit_file, grep and glob for files rather than cat, sed,",
    "grep or find. Commands that wait for input or never end are killed at the timeout (exit code 124).",
    "Files the workspace's permission rules deny (secrets such as .env and private keys) are off limits to commands",
    "too: bubblewrap and Docker sandboxes hide them from commands; local and SSH sandboxes cannot, so do not read them.",
  ].join(" "),
  inputSchema: executeSchema,
  available: runsCommands,
  async execute(session, input) {
    const sandbox = session.backend;
    if (!isSandbox(sandbox) || !runsCommands(sandbox)) throw new ToolFailure("This workspace cannot run commands");
    const ran = orFail(await sandbox.execute(input.command, input.timeout === undefined ? {} : { timeout: input.timeout }));
    const notes = [`exit code ${ran.exitCode ?? "none (killed by a signal)"}`];
    if (ran.exitCode === 124) notes.push("the command timed out and was killed");
    if (ran.truncated) notes.push("output truncated by the sandbox: only its head is shown");
    const output = ran.output.endsWith("\n") ? ran.output.slice(0, -1) : ran.output;
    return ok(`${output}${output === "" ? "" : "\n"}[${notes.join("; ")}]`);
  },
});

/**
 * Whether `backend` really runs commands: a composite (and a permission
 * wrapper around one) is a Sandbox by type whatever its default backend is.
 */
export function runsCommands(backend: Backend): boolean {
  if (backend instanceof CompositeBackend) return runsCommands(backend.default);
  if (backend instanceof PermissionedBackend) return runsCommands(backend.inner);
  return isSandbox(backend);
}
