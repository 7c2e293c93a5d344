/**
 * Plain OpenAI-style function tools, for code that calls a model's API
 * directly (the `openai` package, or any server speaking its wire format):
 * the `tools` array for Chat Completions and for the Responses API, and a
 * dispatcher that runs a model's tool call and answers the message to send
 * back. No package is needed: these are the wire shapes.
 *
 * Strict mode (the default) follows OpenAI's rules for strict function
 * schemas: every object closes with `additionalProperties: false` and lists
 * all its properties in `required`, an optional property becomes nullable
 * (the model sends `null` for "absent", which the dispatcher drops), and the
 * keywords strict mode rejects are left out (the tools still enforce them).
 */
import type { Backend } from "../core/protocol.js";
import { createTools, type BoundTool, type CreateToolsOptions, type ToolOutput } from "../tools/index.js";

type JsonSchema = Record<string, unknown>;

/** A function definition: what both APIs describe a tool with. */
export interface OpenAiFunction {
  name: string;
  description: string;
  parameters: JsonSchema;
  strict: boolean;
}

/** One entry of Chat Completions' `tools`. */
export interface ChatCompletionsTool {
  type: "function";
  function: OpenAiFunction;
}

/** One entry of the Responses API's `tools`. */
export type ResponsesTool = { type: "function" } & OpenAiFunction;

/** A tool call from a Chat Completions assistant message (`message.tool_calls[i]`). */
export interface ChatToolCall {
  id: string;
  type?: "function";
  function: { name: string; arguments: string };
}

/** The message answering a Chat Completions tool call. */
export interface ChatToolMessage {
  role: "tool";
  tool_call_id: string;
  content: string;
}

/** An image as a Chat Completions user content part. */
export interface ChatImagePart {
  type: "image_url";
  image_url: { url: string };
}

/** A `function_call` item of a Responses API output. */
export interface ResponsesFunctionCall {
  type: "function_call";
  call_id: string;
  name: string;
  arguments: string;
}

/** The input item answering it; images travel in the output itself. */
export interface ResponsesFunctionCallOutput {
  type: "function_call_output";
  call_id: string;
  output: string | Array<{ type: "input_text"; text: string } | { type: "input_image"; image_url: string }>;
}

export interface OpenAiToolsOptions extends CreateToolsOptions {
  /** Strict function schemas (OpenAI's structured outputs for tool arguments). Default true. */
  strict?: boolean;
}

/** The tools over one backend, for the OpenAI wire format. */
export interface OpenAiTools {
  /** `tools` for `chat.completions.create`. */
  readonly chatCompletions: ChatCompletionsTool[];
  /** `tools` for `responses.create`. */
  readonly responses: ResponsesTool[];
  /**
   * Runs one Chat Completions tool call. `message` goes back as is; a tool
   * message carries text only, so an image read_file returned is in `images`,
   * to send in a user message after the tool messages. Never throws: bad
   * JSON, an unknown tool or wrong arguments answer an error the model reads.
   */
  runChatToolCall(call: ChatToolCall): Promise<{ message: ChatToolMessage; images: ChatImagePart[] }>;
  /** Runs one Responses API function call; never throws. */
  runResponsesCall(call: ResponsesFunctionCall): Promise<ResponsesFunctionCallOutput>;
  /** Runs a tool by name on its JSON arguments (a string, as the model sent them, or parsed); never throws. */
  run(name: string, args: unknown): Promise<ToolOutput>;
}

/**
 * The tools over `backend` (or tools already made by `createTools`) in
 * OpenAI's function-calling format, with a dispatcher for the calls a model
 * makes.
 */
export function openAiTools(backend: Backend | readonly BoundTool[], options: OpenAiToolsOptions = {}): OpenAiTools {
  const { strict = true, ...toolOptions } = options;
  const tools = Array.isArray(backend) ? (backend as readonly BoundTool[]) : createTools(backend as Backend, toolOptions);
  const byName = new Map(tools.map((tool) => [tool.name, tool]));
  const functions: OpenAiFunction[] = tools.map((tool) => ({
    name: tool.name,
    description: tool.description,
    parameters: strict ? strictSchema(tool.jsonSchema()) : looseSchema(tool.jsonSchema()),
    strict,
  }));

  async function run(name: string, args: unknown): Promise<ToolOutput> {
    const tool = byName.get(name);
    if (!tool) return failure(`There is no tool named '${String(name).slice(0, 100)}'; the tools are: ${[...byName.keys()].join(", ")}`);
    let input = args;
    if (typeof args === "string") {
      try {
        input = args.trim() === "" ? {} : JSON.parse(args);
      } catch (error) {
        const why = error instanceof Error ? error.message : String(error);
        return failure(`The arguments for ${name} are not valid JSON (${why}); send one JSON object with the tool's parameters`);
      }
    }
    return tool.call(withoutNulls(input));
  }

  return {
    chatCompletions: functions.map((fn) => ({ type: "function", function: fn })),
    responses: functions.map((fn) => ({ type: "function", ...fn })),
    run,
    async runChatToolCall(call) {
      const output = await run(call?.function?.name, call?.function?.arguments);
      return {
        message: { role: "tool", tool_call_id: call?.id, content: textOf(output) },
        images: (output.blocks ?? []).map((block) => ({ type: "image_url", image_url: { url: `data:${block.mimeType};base64,${block.data}` } })),
      };
    },
    async runResponsesCall(call) {
      const output = await run(call?.name, call?.arguments);
      const images = output.blocks ?? [];
      return {
        type: "function_call_output",
        call_id: call?.call_id,
        output:
          images.length === 0
            ? textOf(output)
            : [
                { type: "input_text", text: textOf(output) },
                ...images.map((block) => ({ type: "input_image" as const, image_url: `data:${block.mimeType};base64,${block.data}` })),
              ],
      };
    },
  };
}

/** The wire formats have no error flag: an error's text says so itself. */
function textOf(output: ToolOutput): string {
  return output.isError ? `Error: ${output.text}` : output.text;
}

function failure(text: string): ToolOutput {
  return { text, isError: true };
}

/** Strict mode's `null` for an absent optional field, at any depth (edit_file's edits too). */
function withoutNulls(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutNulls);
  if (typeof value !== "object" || value === null) return value;
  return Object.fromEntries(
    Object.entries(value)
      .filter(([, field]) => field !== null)
      .map(([key, field]) => [key, withoutNulls(field)]),
  );
}

/** Keywords a strict function schema may use; the others are refused by the API. */
const STRICT_KEYWORDS = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "enum",
  "const",
  "anyOf",
  "description",
  "title",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "multipleOf",
  "minItems",
  "maxItems",
  "$defs",
  "$ref",
]);

/** The schema under OpenAI's strict rules (see the module comment). */
export function strictSchema(schema: JsonSchema): JsonSchema {
  const out: JsonSchema = {};
  for (const [key, value] of Object.entries(schema)) if (STRICT_KEYWORDS.has(key)) out[key] = value;
  if (out.type === "object" && isRecord(out.properties)) {
    const required = new Set(Array.isArray(schema.required) ? (schema.required as string[]) : []);
    const properties: Record<string, JsonSchema> = {};
    for (const [name, property] of Object.entries(out.properties)) {
      const strict = strictSchema(isRecord(property) ? property : {});
      properties[name] = required.has(name) ? strict : nullable(strict);
    }
    out.properties = properties;
    out.required = Object.keys(properties);
    out.additionalProperties = false;
  }
  if (out.type === "array" && isRecord(out.items)) out.items = strictSchema(out.items);
  return out;
}

/** The schema as plain JSON Schema for non-strict use: only `$schema` goes, which some servers refuse. */
function looseSchema(schema: JsonSchema): JsonSchema {
  const { $schema: _drop, ...rest } = schema;
  return rest;
}

function nullable(schema: JsonSchema): JsonSchema {
  const out = { ...schema };
  if (typeof out.type === "string") out.type = [out.type, "null"];
  if (Array.isArray(out.enum)) out.enum = [...(out.enum as unknown[]), null];
  return out;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
