/**
 * adapters/ai-sdk.ts through the AI SDK's own loop: `generateText` with the
 * SDK's mock language model, scripted to call our tools, over a real
 * StateBackend and a real bubblewrap sandbox; what reaches the model is read
 * from the prompts the mock recorded. `ai` 6 (the `ai-v6` alias, the newest
 * major that runs on Node 20) runs everywhere; `ai` 7 needs Node >= 22 and
 * runs in the Node 24 pass of `npm test` (scripts/test.sh), which sets
 * STRATA_NODE24_RUN so that pass fails rather than skips on an older Node.
 */
import type * as Ai7 from "ai";
import * as ai6 from "ai-v6";
import { MockLanguageModelV3 } from "ai-v6/test";
import { afterEach, describe, expect, it } from "vitest";
import { aiSdkSandbox, aiSdkTools, type AiSdkSandboxSession } from "../adapters/ai-sdk.js";
import { StateBackend } from "../backends/state.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";

const NODE_MAJOR = Number(process.versions.node.split(".")[0]);
const AI7_RUNS = NODE_MAJOR >= 22;

const PNG = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1]);
const PNG_BASE64 = Buffer.from(PNG).toString("base64");

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0)) await step();
});

function bubblewrap(): BubblewrapSandbox {
  const sandbox = new BubblewrapSandbox();
  cleanup.push(() => sandbox.close());
  return sandbox;
}

type Call = { toolName: string; input: string };

/** What the SDK's mock models answer: each step's tool calls (raw JSON text, as a provider sends it), then "done". */
function script(steps: Call[][]) {
  let step = 0;
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 1, text: 1, reasoning: undefined },
  };
  return async () => {
    const calls = steps[step++];
    if (!calls) return { content: [{ type: "text" as const, text: "done" }], finishReason: { unified: "stop" as const, raw: "stop" }, usage, warnings: [] };
    return {
      content: calls.map((call, i) => ({ type: "tool-call" as const, toolCallId: `call-${step}-${i}`, toolName: call.toolName, input: call.input })),
      finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
      usage,
      warnings: [],
    };
  };
}

/** The tool results the model was shown in its second call, by tool call id. */
function toolResults(prompt: ReadonlyArray<{ role: string; content: unknown }>): Record<string, { toolName: string; output: { type: string; value: unknown } }> {
  const found: Record<string, { toolName: string; output: { type: string; value: unknown } }> = {};
  for (const message of prompt) {
    if (message.role !== "tool" || !Array.isArray(message.content)) continue;
    for (const part of message.content as Array<{ type: string; toolCallId: string; toolName: string; output: { type: string; value: unknown } }>) {
      if (part.type === "tool-result") found[part.toolCallId] = { toolName: part.toolName, output: part.output };
    }
  }
  return found;
}

const HOSTILE_AND_NORMAL: Call[] = [
  { toolName: "write_file", input: JSON.stringify({ file_path: "/notes.txt", content: "hello\n" }) },
  { toolName: "read_file", input: JSON.stringify({ file_path: "/pic.png" }) },
  { toolName: "read_file", input: JSON.stringify({ file_path: 42 }) },
  { toolName: "edit_file", input: '{"file_path": "/notes.txt", "old_string": ' },
  { toolName: "grep", input: JSON.stringify({ pattern: "seed", output_mode: "content", head_limit: null }) },
];

describe("ai 6 (Node 20 and up): aiSdkTools through generateText", () => {
  it("runs the tools, sends images as image parts and failures as error output, never throws", async () => {
    const backend = new StateBackend();
    await backend.uploadFiles([["/pic.png", PNG]]);
    await backend.write("/seed.txt", "a seed\n");
    const model = new MockLanguageModelV3({ doGenerate: script([HOSTILE_AND_NORMAL]) });
    const tools = aiSdkTools(ai6, backend);
    expect(Object.keys(tools)).toEqual(["ls", "read_file", "write_file", "edit_file", "glob", "grep"]);
    const typed: ai6.ToolSet = tools;

    const result = await ai6.generateText({ model, tools: typed, prompt: "work", stopWhen: ai6.stepCountIs(3) });
    expect(result.text).toBe("done");
    expect(model.doGenerateCalls).toHaveLength(2);
    // The tool definitions the model was offered carry our JSON Schema and description.
    const offered = (model.doGenerateCalls[0]!.tools ?? []).find((tool) => tool.name === "read_file");
    expect(offered).toMatchObject({ type: "function", inputSchema: { type: "object", required: ["file_path"] }, description: expect.stringMatching(/\S/) });

    const seen = toolResults(model.doGenerateCalls[1]!.prompt);
    expect(seen["call-1-0"]!.output).toEqual({ type: "text", value: "Created '/notes.txt' (1 line, 6 bytes)." });
    expect(seen["call-1-1"]!.output.type).toBe("content");
    expect(seen["call-1-1"]!.output.value).toContainEqual({ type: "image-data", data: PNG_BASE64, mediaType: "image/png" });
    expect(seen["call-1-2"]!.output).toEqual({ type: "error-text", value: expect.stringMatching(/^Invalid arguments for read_file: file_path: /) });
    // Unparseable JSON never reaches execute: the SDK itself answers the model with an error.
    expect(seen["call-1-3"]!.output.type).toBe("error-text");
    expect(seen["call-1-4"]!.output).toEqual({ type: "text", value: "/seed.txt:1:a seed" });
    expect(await backend.read("/notes.txt")).toMatchObject({ content: "hello" });
  });
});

describe("aiSdkSandbox: a Strata sandbox as the SDK's Experimental_SandboxSession", () => {
  it("reads and writes text and binary files, relative to the workspace", async () => {
    const session: AiSdkSandboxSession = aiSdkSandbox(bubblewrap());
    expect(session.description).toContain("/workspace");
    await session.writeTextFile({ path: "a/crlf.txt", content: "one\r\ntwo\r\nthree" });
    expect(await session.readTextFile({ path: "/workspace/a/crlf.txt" })).toBe("one\r\ntwo\r\nthree");
    expect(await session.readTextFile({ path: "a/crlf.txt", startLine: 2, endLine: 9 })).toBe("two\r\nthree");
    await session.writeBinaryFile({ path: "pic.png", content: PNG });
    expect(await session.readBinaryFile({ path: "pic.png" })).toEqual(PNG);
    const stream = await session.readFile({ path: "pic.png" });
    expect(new Uint8Array(await new Response(stream).arrayBuffer())).toEqual(PNG);
    await session.writeFile({ path: "streamed.bin", content: new Blob([PNG]).stream() });
    expect(await session.readBinaryFile({ path: "streamed.bin" })).toEqual(PNG);

    expect(await session.stat({ path: "pic.png" })).toEqual({ type: "file", size: PNG.length });
    expect(await session.stat({ path: "a" })).toMatchObject({ type: "directory" });
    expect(await session.stat({ path: "missing" })).toBeNull();
    expect(await session.readTextFile({ path: "missing.txt" })).toBeNull();
    expect(await session.readFile({ path: "missing.txt" })).toBeNull();
    expect((await session.listDirectory({ path: "." }))?.sort((x, y) => x.name.localeCompare(y.name))).toEqual([
      { name: "a", type: "directory" },
      { name: "pic.png", type: "file" },
      { name: "streamed.bin", type: "file" },
    ]);
    expect(await session.listDirectory({ path: "nowhere" })).toBeNull();
    await expect(session.listDirectory({ path: "pic.png" })).rejects.toThrow(/not a directory/);
    await expect(session.deleteFile({ path: "a" })).rejects.toThrow(/is a directory/);
    expect(await session.deleteFile({ path: "pic.png" })).toBe(true);
    expect(await session.deleteFile({ path: "pic.png" })).toBe(false);
    // The sandbox's containment holds, and the message names no host path.
    await expect(session.readTextFile({ path: "/etc/hostname" })).rejects.toThrow(/outside the workspace/);
  });

  it("runs commands with separate streams, env and working directory; spawns with stdin and kills", async () => {
    const session = aiSdkSandbox(bubblewrap());
    await session.writeTextFile({ path: "sub/x.txt", content: "x" });
    expect(await session.run({ command: 'echo "$GREETING"; ls; echo oops >&2; exit 3', workingDirectory: "sub", env: { GREETING: "hi" } })).toEqual({
      exitCode: 3,
      stdout: "hi\nx.txt\n",
      stderr: "oops\n",
    });

    const cat = await session.spawn({ command: "tr a-z A-Z", stdin: true });
    const writer = cat.stdin.getWriter();
    await writer.write(new TextEncoder().encode("shout\n"));
    await writer.close();
    expect(await new Response(cat.stdout).text()).toBe("SHOUT\n");
    expect(await cat.wait()).toEqual({ exitCode: 0 });

    // Without stdin the command reads end-of-file at once, and the handle has no stdin.
    const eof = await session.spawn({ command: "cat; echo end" });
    expect("stdin" in eof).toBe(false);
    expect(await new Response(eof.stdout).text()).toBe("end\n");

    const sleeper = await session.spawn({ command: "sleep 30" });
    const started = Date.now();
    await sleeper.kill();
    await sleeper.kill();
    expect(await sleeper.wait()).toEqual({ exitCode: 137 });
    // An abort signal kills the command too, and its wait rejects with the reason, as the SDK says.
    const controller = new AbortController();
    const aborted = await session.spawn({ command: "sleep 30", abortSignal: controller.signal });
    controller.abort(new Error("stop now"));
    await expect(aborted.wait()).rejects.toThrow("stop now");
    expect(Date.now() - started).toBeLessThan(10_000);
  });
});

describe.skipIf(!AI7_RUNS && process.env.STRATA_NODE24_RUN !== "1")(`ai 7 (Node >= 22; this is Node ${NODE_MAJOR})`, () => {
  it("runs on the Node the suite was asked to test", () => {
    expect(NODE_MAJOR, "the Node 24 pass of npm test ran on an older Node").toBeGreaterThanOrEqual(22);
  });

  it("runs the tools and hands our sandbox to tools through experimental_sandbox", async () => {
    const ai: typeof Ai7 = await import("ai");
    const { MockLanguageModelV4 } = await import("ai/test");
    const sandbox = bubblewrap();
    await sandbox.uploadFiles([["/workspace/pic.png", PNG]]);
    const tools = aiSdkTools(ai, sandbox);
    expect(Object.keys(tools)).toContain("execute");
    // A tool of the caller's that uses the SDK's sandbox slot, which our session fills.
    const probe = ai.tool({
      description: "Runs a command in the sandbox the SDK hands to tools",
      inputSchema: ai.jsonSchema<{ command: string }>({ type: "object", properties: { command: { type: "string" } }, required: ["command"] }),
      execute: async ({ command }, { experimental_sandbox }) => {
        const answer = await experimental_sandbox!.run({ command });
        const text = await experimental_sandbox!.readTextFile({ path: "notes.txt" });
        return `${answer.exitCode}:${answer.stdout}:${text}`;
      },
    });
    const slot: Ai7.Experimental_SandboxSession = aiSdkSandbox(sandbox);
    const model = new MockLanguageModelV4({
      doGenerate: script([
        [
          { toolName: "write_file", input: JSON.stringify({ file_path: "notes.txt", content: "hello\n" }) },
          { toolName: "read_file", input: JSON.stringify({ file_path: "/workspace/pic.png" }) },
          { toolName: "read_file", input: JSON.stringify({ file_path: ["x"], offset: "one" }) },
          { toolName: "execute", input: '{"command": "echo hi' },
        ],
        [
          { toolName: "execute", input: JSON.stringify({ command: "cat notes.txt" }) },
          { toolName: "probe", input: JSON.stringify({ command: "pwd" }) },
        ],
      ]),
    });
    const typed: Ai7.ToolSet = { ...tools, probe };
    const result = await ai.generateText({ model, tools: typed, prompt: "work", stopWhen: ai.stepCountIs(4), experimental_sandbox: slot });
    expect(result.text).toBe("done");
    expect(model.doGenerateCalls).toHaveLength(3);

    const first = toolResults(model.doGenerateCalls[1]!.prompt);
    expect(first["call-1-0"]!.output).toEqual({ type: "text", value: "Created '/workspace/notes.txt' (1 line, 6 bytes)." });
    expect(first["call-1-1"]!.output.type).toBe("content");
    expect(first["call-1-1"]!.output.value).toContainEqual({ type: "file", mediaType: "image/png", data: { type: "data", data: PNG_BASE64 } });
    expect(first["call-1-2"]!.output).toEqual({ type: "error-text", value: expect.stringMatching(/^Invalid arguments for read_file: /) });
    expect(first["call-1-3"]!.output.type).toBe("error-text");

    const second = toolResults(model.doGenerateCalls[2]!.prompt);
    expect(second["call-2-0"]!.output).toEqual({ type: "text", value: "hello\n[exit code 0]" });
    expect(second["call-2-1"]!.output).toEqual({ type: "text", value: "0:/workspace\n:hello\n" });
  });
});
