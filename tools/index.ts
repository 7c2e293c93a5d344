/**
 * strata/tools — what an agent is handed: ls, read_file, write_file,
 * edit_file, glob, grep and (over a sandbox) execute, each with a zod input
 * schema, its JSON Schema, a description written for a model, and output
 * formatted for a model, all sharing one ToolSession (stale-file guard,
 * output budgets, and its reference to a sandbox handle). docs/tools.md
 * describes them. Framework-neutral: adapters/ renders them per framework.
 */
import type { Backend } from "../core/protocol.js";
import type { SandboxHandle } from "../runtime/handle.js";
import type { ToolDefinition, ToolOutput } from "./define.js";
import { editFile } from "./edit-file.js";
import { execute } from "./execute.js";
import { glob } from "./glob.js";
import { grep } from "./grep.js";
import { ls } from "./ls.js";
import { readFile } from "./read-file.js";
import { isSandboxHandle, ToolSession, type ToolSessionOptions } from "./session.js";
import { writeFile } from "./write-file.js";

export { defineTool, type ContentBlock, type FileBlock, type ImageBlock, type ToolDefinition, type ToolOutput } from "./define.js";
export {
  DEFAULT_MAX_OUTPUT_CHARS,
  EVICTED_DIR,
  MAX_HELD_CHARS,
  ToolSession,
  hashOf,
  isSandboxHandle,
  type ForkOptions,
  type ToolSessionOptions,
} from "./session.js";
export { editFile, editFileSchema, unifiedDiff } from "./edit-file.js";
export { execute, executeSchema, runsCommands } from "./execute.js";
export { glob, globSchema } from "./glob.js";
export { DEFAULT_HEAD_LIMIT, grep, grepSchema } from "./grep.js";
export { ls, lsSchema } from "./ls.js";
export { MAX_IMAGE_BYTES, MAX_PDF_BYTES, readFile, readFileSchema } from "./read-file.js";
export { writeFile, writeFileSchema } from "./write-file.js";

/** Every tool definition, in the order they are offered. */
export const toolDefinitions: readonly ToolDefinition[] = [ls, readFile, writeFile, editFile, glob, grep, execute];

/** A definition bound to one session: `call(input)` runs it there. */
export type BoundTool = ToolDefinition & {
  readonly session: ToolSession;
  call(input: unknown): Promise<ToolOutput>;
};

export interface CreateToolsOptions extends ToolSessionOptions {
  /** Share an existing session (its guard, budget and sandbox reference) instead of starting one. */
  session?: ToolSession;
}

/**
 * The tools for one agent run over `target`: every definition the backend
 * supports (execute only over a sandbox), bound to one shared ToolSession.
 * Given a SandboxHandle, the new session holds one reference to it: end it
 * with `tools[0].session.end()` (the last session to end closes the sandbox).
 */
export function createTools(target: Backend | SandboxHandle, options: CreateToolsOptions = {}): BoundTool[] {
  const { session: given, ...sessionOptions } = options;
  const session = given ?? new ToolSession(target, sessionOptions);
  const belongs = isSandboxHandle(target) ? session.handle === target : session.backend === target;
  if (!belongs) throw new Error("createTools: the session belongs to another backend");
  const backend = session.backend;
  return toolDefinitions
    .filter((tool) => tool.available(backend))
    .map((tool) => ({
      ...tool,
      session,
      call: (input: unknown) => tool.run(session, input as never),
    }));
}
