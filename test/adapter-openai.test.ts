/**
 * adapters/openai.ts: the function definitions checked against OpenAI's rules
 * for strict function schemas, and the dispatcher driven with tool calls as
 * the Chat Completions and Responses APIs deliver them (arguments as JSON
 * text), including hostile ones, over a real StateBackend and a real
 * bubblewrap sandbox.
 */
import { afterEach, describe, expect, it } from "vitest";
import { openAiTools, type ChatToolCall } from "../adapters/openai.js";
import { StateBackend } from "../backends/state.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { toolDefinitions } from "../tools/index.js";

const PNG = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1]);

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0)) await step();
});

/** The keywords OpenAI documents for strict schemas. */
const ALLOWED = new Set(["type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "description", "title", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "$defs", "$ref"]);

/** Every rule of a strict function schema that `schema` breaks, by JSON pointer. */
function strictViolations(schema: Record<string, unknown>, at = ""): string[] {
  const found: string[] = [];
  for (const key of Object.keys(schema)) if (!ALLOWED.has(key)) found.push(`${at}: keyword ${key}`);
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.includes("object")) {
    if (schema.additionalProperties !== false) found.push(`${at}: additionalProperties is not false`);
    const properties = (schema.properties ?? {}) as Record<string, Record<string, unknown>>;
    const required = (schema.required ?? []) as string[];
    if ([...required].sort().join() !== Object.keys(properties).sort().join()) found.push(`${at}: required does not list every property`);
    for (const [name, property] of Object.entries(properties)) found.push(...strictViolations(property, `${at}/properties/${name}`));
  }
  if (types.includes("array") && schema.items) found.push(...strictViolations(schema.items as Record<string, unknown>, `${at}/items`));
  return found;
}

function chatCall(name: string, args: string, id = "call_1"): ChatToolCall {
  return { id, type: "function", function: { name, arguments: args } };
}

describe("openAiTools: the definitions", () => {
  it("are strict function schemas by OpenAI's rules, for both APIs", async () => {
    const sandbox = new BubblewrapSandbox();
    cleanup.push(() => sandbox.close());
    const tools = openAiTools(sandbox);
    expect(tools.chatCompletions.map((tool) => tool.function.name)).toEqual(toolDefinitions.map((tool) => tool.name));
    for (const { type, function: fn } of tools.chatCompletions) {
      expect(type).toBe("function");
      expect(fn.strict).toBe(true);
      expect(fn.name).toMatch(/^[a-zA-Z0-9_-]{1,64}$/);
      expect(fn.description.length).toBeGreaterThan(20);
      expect(strictViolations(fn.parameters), fn.name).toEqual([]);
    }
    expect(tools.responses[1]).toEqual({ type: "function", ...tools.chatCompletions[1]!.function });
    // An optional parameter becomes nullable (strict mode's way to leave it out); a required one does not.
    const read = tools.chatCompletions.find((tool) => tool.function.name === "read_file")!.function.parameters as { properties: Record<string, { type: unknown }> };
    expect(read.properties.file_path!.type).toBe("string");
    expect(read.properties.offset!.type).toEqual(["integer", "null"]);
    const grep = tools.chatCompletions.find((tool) => tool.function.name === "grep")!.function.parameters as { properties: Record<string, { enum?: unknown[] }> };
    expect(grep.properties.output_mode!.enum).toContain(null);
  });

  it("can be plain (non-strict) JSON Schema", () => {
    const tools = openAiTools(new StateBackend(), { strict: false });
    const read = tools.responses.find((tool) => tool.name === "read_file")!;
    expect(read.strict).toBe(false);
    expect(read.parameters).not.toHaveProperty("$schema");
    expect(read.parameters).toMatchObject({ type: "object", required: ["file_path"] });
  });
});

describe("openAiTools: the dispatcher", () => {
  it("runs Chat Completions tool calls, with strict mode's nulls at any depth", async () => {
    const backend = new StateBackend();
    const tools = openAiTools(backend);
    const created = await tools.runChatToolCall(chatCall("write_file", '{"file_path":"/a.txt","content":"one\\ntwo\\n"}'));
    expect(created).toEqual({ message: { role: "tool", tool_call_id: "call_1", content: "Created '/a.txt' (2 lines, 8 bytes)." }, images: [] });
    const edited = await tools.runChatToolCall(
      chatCall(
        "edit_file",
        JSON.stringify({ file_path: "/a.txt", old_string: null, new_string: null, replace_all: null, dry_run: null, edits: [{ old_string: "one", new_string: "1", replace_all: null }] }),
        "call_2",
      ),
    );
    expect(edited.message.tool_call_id).toBe("call_2");
    expect(edited.message.content).not.toMatch(/^Error/);
    expect(await backend.read("/a.txt")).toMatchObject({ content: "1\ntwo" });
    const read = await tools.runChatToolCall(chatCall("read_file", '{"file_path":"/a.txt","offset":null,"limit":null}'));
    expect(read.message.content).toContain("two");
  });

  it("hands images over: as image_url parts for Chat Completions, inside the output for Responses", async () => {
    const backend = new StateBackend();
    await backend.uploadFiles([["/pic.png", PNG]]);
    const tools = openAiTools(backend);
    const url = `data:image/png;base64,${Buffer.from(PNG).toString("base64")}`;
    const chat = await tools.runChatToolCall(chatCall("read_file", '{"file_path":"/pic.png"}'));
    expect(chat.images).toEqual([{ type: "image_url", image_url: { url } }]);
    expect(chat.message.content).toContain("image/png");
    const responses = await tools.runResponsesCall({ type: "function_call", call_id: "fc_1", name: "read_file", arguments: '{"file_path":"/pic.png"}' });
    expect(responses).toMatchObject({ type: "function_call_output", call_id: "fc_1" });
    expect(responses.output).toContainEqual({ type: "input_image", image_url: url });
  });

  it("answers hostile calls with an error the model can read, never a throw", async () => {
    const sandbox = new BubblewrapSandbox();
    cleanup.push(() => sandbox.close());
    const tools = openAiTools(sandbox);
    const cases: Array<[ChatToolCall, RegExp]> = [
      [chatCall("read_file", '{"file_path": "/x.txt", '), /^Error: The arguments for read_file are not valid JSON/],
      [chatCall("read_file", '{"file_path": 42}'), /^Error: Invalid arguments for read_file: file_path: /],
      [chatCall("read_file", "[1, 2]"), /^Error: Invalid arguments for read_file/],
      [chatCall("read_file", '"just a string"'), /^Error: Invalid arguments for read_file/],
      [chatCall("execute", '{"command": ""}'), /^Error: Invalid arguments for execute: command: /],
      [chatCall("execute", '{"command": "true", "timeout": "soon"}'), /^Error: Invalid arguments for execute: timeout: /],
      [chatCall("rm_rf", "{}"), /^Error: There is no tool named 'rm_rf'; the tools are: ls, read_file/],
      [chatCall("read_file", '{"file_path": "/etc/passwd"}'), /^Error: .*outside the workspace/],
      [{ id: "x" } as unknown as ChatToolCall, /^Error: There is no tool named 'undefined'/],
    ];
    for (const [call, expected] of cases) {
      const { message } = await tools.runChatToolCall(call);
      expect(message.content, call.function?.arguments).toMatch(expected);
      expect(message.content).not.toContain("\n");
    }
    // Empty arguments mean no arguments (some servers send "" for a parameterless call).
    expect((await tools.runChatToolCall(chatCall("ls", ""))).message.content).not.toMatch(/^Error/);
    const ran = await tools.runResponsesCall({ type: "function_call", call_id: "fc", name: "execute", arguments: '{"command":"echo hi","timeout":null}' });
    expect(ran.output).toBe("hi\n[exit code 0]");
  });
});
