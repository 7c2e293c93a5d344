/**
 * adapters/langchain.ts through LangChain's own code: `tool.invoke(toolCall)`
 * as LangChain's agents call it, and a whole LangGraph ReAct loop whose fake
 * scripted chat model (a BaseChatModel answering a fixed list of messages,
 * as LangChain's own fakes do) binds our tools and calls them over a real
 * bubblewrap sandbox.
 */
import { AIMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import { BaseChatModel } from "@langchain/core/language_models/chat_models";
import type { ChatResult } from "@langchain/core/outputs";
import { convertToOpenAITool } from "@langchain/core/utils/function_calling";
import { createReactAgent } from "@langchain/langgraph/prebuilt";
import { afterEach, describe, expect, it } from "vitest";
import { langChainTools, type StrataLangChainTool } from "../adapters/langchain.js";
import { StateBackend } from "../backends/state.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";

const PNG = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1]);

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0)) await step();
});

function byName(tools: StrataLangChainTool[]): Record<string, StrataLangChainTool> {
  return Object.fromEntries(tools.map((tool) => [tool.name, tool]));
}

describe("langChainTools: invoked with a ToolCall", () => {
  it("answers ToolMessages: success, image blocks, and errors with status error", async () => {
    const backend = new StateBackend();
    await backend.uploadFiles([["/pic.png", PNG]]);
    const tools = byName(langChainTools(backend));
    expect(Object.keys(tools)).toEqual(["ls", "read_file", "write_file", "edit_file", "glob", "grep"]);

    const written = await tools.write_file!.invoke({ type: "tool_call", id: "c1", name: "write_file", args: { file_path: "/a.txt", content: "one\n" } });
    expect(written).toBeInstanceOf(ToolMessage);
    expect(written).toMatchObject({ tool_call_id: "c1", status: "success", content: "Created '/a.txt' (1 line, 4 bytes)." });

    const image = await tools.read_file!.invoke({ type: "tool_call", id: "c2", name: "read_file", args: { file_path: "/pic.png" } });
    expect((image as ToolMessage).content).toContainEqual({ type: "image", mimeType: "image/png", data: Buffer.from(PNG).toString("base64") });

    const missing = await tools.read_file!.invoke({ type: "tool_call", id: "c3", name: "read_file", args: { file_path: "/nope.txt" } });
    expect(missing).toMatchObject({ tool_call_id: "c3", status: "error", content: expect.stringContaining("not found") });

    // Called with plain arguments (no ToolCall), the answer is the content itself.
    expect(await tools.ls!.invoke({})).toBe("/a.txt (4 bytes)\n/pic.png (20 bytes)");
  });

  it("answers wrong arguments with a readable error, never a throw", async () => {
    const tools = byName(langChainTools(new StateBackend()));
    const hostile: unknown[] = [{ file_path: 42 }, { file_path: "/x", offset: "ten" }, [], "read everything", null, { file_path: "/x", extra: { deep: true } }];
    for (const args of hostile) {
      const answer = await tools.read_file!.invoke({ type: "tool_call", id: "bad", name: "read_file", args: args as Record<string, unknown> });
      expect(answer, JSON.stringify(args)).toBeInstanceOf(ToolMessage);
      expect((answer as ToolMessage).status, JSON.stringify(args)).toBe("error");
      expect(String((answer as ToolMessage).content)).not.toContain("\n");
    }
    const typed = await tools.read_file!.invoke({ type: "tool_call", id: "bad", name: "read_file", args: { file_path: 42 } });
    expect((typed as ToolMessage).content).toMatch(/^Invalid arguments for read_file: file_path: /);
  });
});

/** Answers its script in order; `bindTools` records what a provider would be sent (LangChain's OpenAI conversion). */
class ScriptedChatModel extends BaseChatModel {
  bound: unknown[] = [];
  private step = 0;

  constructor(private readonly script: AIMessage[]) {
    super({});
  }

  _llmType(): string {
    return "scripted";
  }

  override bindTools(tools: StrataLangChainTool[]): this {
    this.bound = tools.map((tool) => convertToOpenAITool(tool));
    return this;
  }

  async _generate(): Promise<ChatResult> {
    const message = this.script[this.step++] ?? new AIMessage("out of script");
    return { generations: [{ text: typeof message.content === "string" ? message.content : "", message }] };
  }
}

describe("langChainTools in a LangGraph agent loop", () => {
  it("a scripted chat model binds the tools and calls them over a bubblewrap sandbox", async () => {
    const sandbox = new BubblewrapSandbox();
    cleanup.push(() => sandbox.close());
    const tools = langChainTools(sandbox);
    expect(tools.map((tool) => tool.name)).toContain("execute");
    const llm = new ScriptedChatModel([
        new AIMessage({
          content: "",
          tool_calls: [
            { id: "t1", name: "write_file", args: { file_path: "notes.txt", content: "hello\n" }, type: "tool_call" },
            { id: "t2", name: "read_file", args: { file_path: 7 }, type: "tool_call" },
          ],
        }),
        new AIMessage({ content: "", tool_calls: [{ id: "t3", name: "execute", args: { command: "cat /workspace/notes.txt" }, type: "tool_call" }] }),
        new AIMessage("done"),
    ]);
    const agent = createReactAgent({ llm, tools });
    const { messages } = (await agent.invoke({ messages: [{ role: "user", content: "work" }] })) as { messages: BaseMessage[] };
    const results = Object.fromEntries(messages.filter((m): m is ToolMessage => m instanceof ToolMessage).map((m) => [m.tool_call_id, m]));
    expect(results.t1).toMatchObject({ status: "success", content: "Created '/workspace/notes.txt' (1 line, 6 bytes)." });
    expect(results.t2).toMatchObject({ status: "error", content: expect.stringMatching(/^Invalid arguments for read_file/) });
    expect(results.t3).toMatchObject({ status: "success", content: "hello\n[exit code 0]" });
    expect(messages.at(-1)!.content).toBe("done");
    // What a provider is sent: our JSON Schema, through LangChain's own conversion.
    expect(llm.bound).toContainEqual({
      type: "function",
      function: expect.objectContaining({ name: "read_file", parameters: expect.objectContaining({ type: "object", required: ["file_path"] }) }),
    });
  });
});
