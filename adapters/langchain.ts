/**
 * LangChain JS: the tools as `StructuredTool`s of `@langchain/core/tools`,
 * for `model.bindTools(...)`, LangGraph's ToolNode or `createAgent`.
 *
 * `@langchain/core` is imported directly: whoever imports this module uses
 * LangChain and has it installed (it is not loaded by any other entry point).
 *
 * A tool invoked with a ToolCall answers a ToolMessage whose `status` is
 * "error" when the tool failed, with images as standard image content blocks.
 * Arguments that do not fit the schema never throw: LangChain's own schema
 * check would throw ToolInputParsingException out of `invoke`, so such a call
 * goes to the tool's own validation, which answers one line the model can
 * act on.
 */
import { ToolMessage } from "@langchain/core/messages";
import { StructuredTool, ToolInputParsingException, type ToolRunnableConfig } from "@langchain/core/tools";
import type { Backend } from "../core/protocol.js";
import { createTools, type BoundTool, type CreateToolsOptions, type ToolOutput } from "../tools/index.js";

/** A tool's answer: text, or text and image blocks (LangChain's standard content blocks). */
export type LangChainToolContent = string | Array<{ type: "text"; text: string } | { type: "image"; mimeType: string; data: string }>;

type JsonSchema = Record<string, unknown>;

/** One Strata tool as a LangChain StructuredTool (input checked by the tool itself, never thrown). */
export class StrataLangChainTool extends StructuredTool<JsonSchema> {
  readonly name: string;
  readonly description: string;
  readonly schema: JsonSchema;

  constructor(readonly tool: BoundTool) {
    super();
    this.name = tool.name;
    this.description = tool.description;
    const { $schema: _drop, ...schema } = tool.jsonSchema();
    this.schema = schema;
  }

  protected async _call(input: unknown, _runManager?: unknown, config?: ToolRunnableConfig): Promise<LangChainToolContent | ToolMessage> {
    return this.answer(await this.tool.call(input), config?.toolCall?.id);
  }

  // The signature is StructuredTool's own; only refused input takes the other path.
  override async call(...args: Parameters<StructuredTool<JsonSchema>["call"]>): ReturnType<StructuredTool<JsonSchema>["call"]> {
    try {
      return await super.call(...args);
    } catch (error) {
      if (!(error instanceof ToolInputParsingException)) throw error;
      const [arg, config] = args;
      const toolCall = isToolCall(arg) ? arg : isToolCallConfig(config) ? config.toolCall : undefined;
      const input = isToolCall(arg) ? arg.args : arg;
      return this.answer(await this.tool.call(input), toolCall?.id);
    }
  }

  private answer(output: ToolOutput, toolCallId: string | undefined): LangChainToolContent | ToolMessage {
    const content = contentOf(output);
    if (toolCallId === undefined) return content;
    return new ToolMessage({ content, tool_call_id: toolCallId, name: this.name, status: output.isError ? "error" : "success" });
  }
}

/** The tools over `backend` (or tools already made by `createTools`) as LangChain tools. */
export function langChainTools(backend: Backend | readonly BoundTool[], options: CreateToolsOptions = {}): StrataLangChainTool[] {
  const tools = Array.isArray(backend) ? (backend as readonly BoundTool[]) : createTools(backend as Backend, options);
  return tools.map((tool) => new StrataLangChainTool(tool));
}

function contentOf(output: ToolOutput): LangChainToolContent {
  if (!output.blocks?.length) return output.text;
  return [{ type: "text", text: output.text }, ...output.blocks.map((block) => ({ type: "image" as const, mimeType: block.mimeType, data: block.data }))];
}

function isToolCall(value: unknown): value is { type: "tool_call"; id?: string; args: unknown } {
  return typeof value === "object" && value !== null && (value as { type?: unknown }).type === "tool_call";
}

function isToolCallConfig(value: unknown): value is { toolCall: { id?: string } } {
  const toolCall = typeof value === "object" && value !== null ? (value as { toolCall?: unknown }).toolCall : undefined;
  return typeof toolCall === "object" && toolCall !== null;
}
