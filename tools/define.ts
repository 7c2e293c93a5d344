/**
 * The shape of one tool: a name, a description written for a model, a zod
 * input schema (snake_case parameters, the names models know) and `run`,
 * which validates its input, calls the native API through a `ToolSession`
 * and answers text formatted for a model. Framework-neutral: adapters render
 * these definitions for each framework.
 */
import { z } from "zod";
import { isStrataError } from "../core/errors.js";
import type { Backend } from "../core/protocol.js";
import type { Result } from "../core/types.js";
import type { ToolSession } from "./session.js";

/** An image a framework can show the model (read_file of a PNG, JPEG, GIF or WebP). */
export interface ImageBlock {
  type: "image";
  mimeType: string;
  /** Base64, no data: prefix. */
  data: string;
}

/**
 * A document a framework can hand the model as a file (read_file of a PDF):
 * Anthropic's document block, OpenAI's file input, the AI SDK's file part.
 */
export interface FileBlock {
  type: "file";
  /** application/pdf (the one type models read as a document today). */
  mimeType: string;
  /** Base64, no data: prefix. */
  data: string;
  /** The file's base name, for frameworks that want one (OpenAI's filename). */
  name: string;
}

/** A content block beside a tool's text. Adapters switch on `type`; more kinds may be added. */
export type ContentBlock = ImageBlock | FileBlock;

/** What every tool answers: text for the model, whether it is an error, and content blocks where there are any. */
export interface ToolOutput {
  text: string;
  isError: boolean;
  blocks?: ContentBlock[];
}

export interface ToolDefinition<S extends z.ZodObject = z.ZodObject> {
  readonly name: string;
  /** Written for a model: what the tool does, when to use it, what it answers. */
  readonly description: string;
  readonly inputSchema: S;
  /** Whether the tool is offered over this backend (execute: only a sandbox). Default: always. */
  available(backend: Backend): boolean;
  /** The input schema as JSON Schema (draft 2020-12), for frameworks that take plain JSON Schema. */
  jsonSchema(): Record<string, unknown>;
  /**
   * Runs the tool. The input is validated here (a model's arguments are
   * untrusted JSON); this never throws: every failure is `{ isError: true }`
   * with one line the model can act on. The text is held to the session's
   * output budget. A call on an ended session (or one whose sandbox was
   * closed) answers an error saying so; `session.end()` waits for the calls
   * in flight.
   */
  run(session: ToolSession, input: z.input<S>): Promise<ToolOutput>;
}

/** A successful answer. */
export function ok(text: string, blocks?: ContentBlock[]): ToolOutput {
  return blocks && blocks.length > 0 ? { text, isError: false, blocks } : { text, isError: false };
}

/** A failed answer: one line (newlines in a native message are folded). */
export function fail(message: string): ToolOutput {
  return { text: message.replace(/\s*\r?\n\s*/g, " ").trim(), isError: true };
}

/** Thrown inside a tool body to answer `fail(message)` (kept out of the public API). */
export class ToolFailure extends Error {}

/** Turns a native `{ error }` into a thrown ToolFailure carrying its message. */
export function orFail<T extends object>(result: Result<T>): T {
  if (result.error) throw new ToolFailure(result.error.message);
  return result as T;
}

interface ToolSpec<S extends z.ZodObject> {
  name: string;
  description: string;
  inputSchema: S;
  available?: (backend: Backend) => boolean;
  /** The body: input already validated; may throw ToolFailure. */
  execute(session: ToolSession, input: z.output<S>): Promise<ToolOutput>;
  /** Whether the session's budget applies by eviction (default) or the tool keeps to it itself (read_file pages). */
  selfBudgeted?: boolean;
}

export function defineTool<S extends z.ZodObject>(spec: ToolSpec<S>): ToolDefinition<S> {
  let schema: Record<string, unknown> | undefined;
  return {
    name: spec.name,
    description: spec.description,
    inputSchema: spec.inputSchema,
    available: spec.available ?? (() => true),
    jsonSchema() {
      schema ??= z.toJSONSchema(spec.inputSchema, { io: "input" }) as Record<string, unknown>;
      return structuredClone(schema);
    },
    async run(session, input) {
      // Refused before anything runs: the session ended, or its sandbox was closed under it.
      const unusable = session.unusableReason();
      if (unusable) return fail(unusable);
      return session.track(() => runChecked(session, input));
    },
  };

  async function runChecked(session: ToolSession, input: z.input<S>): Promise<ToolOutput> {
    const parsed = spec.inputSchema.safeParse(withoutNulls(input));
    if (!parsed.success) return fail(`Invalid arguments for ${spec.name}: ${describeIssues(parsed.error)}`);
    try {
      const output = await spec.execute(session, parsed.data);
      // Inside the try: a backend that throws while an evicted result is saved is still an answer, not a throw.
      return spec.selfBudgeted ? output : await session.budget(spec.name, output);
    } catch (error) {
      // ToolFailure and StrataError messages are written for the reader (and name no host path).
      if (error instanceof ToolFailure || isStrataError(error)) return fail(error.message);
      // Anything else is a bug below the tools (backends answer errors, never throw); its message may
      // carry a host path, so only its kind is told.
      const kind = error instanceof Error ? error.name : typeof error;
      return fail(`${spec.name} failed unexpectedly (${kind} in the workspace backend); retrying may help, or report it`);
    }
  }
}

/**
 * Models (and OpenAI's strict mode) send null for an omitted optional
 * parameter, at any depth (edit_file's edits[].replace_all): it means absent.
 */
function withoutNulls(input: unknown): unknown {
  if (Array.isArray(input)) return input.map((item) => (typeof item === "object" && item !== null ? withoutNulls(item) : item));
  if (typeof input !== "object" || input === null) return input;
  return Object.fromEntries(
    Object.entries(input)
      .filter(([, value]) => value !== null)
      .map(([key, value]) => [key, typeof value === "object" ? withoutNulls(value) : value]),
  );
}

function describeIssues(error: z.ZodError): string {
  return error.issues
    .slice(0, 3)
    .map((issue) => (issue.path.length > 0 ? `${issue.path.join(".")}: ${issue.message}` : issue.message))
    .join("; ");
}
