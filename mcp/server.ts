/**
 * createMcpServer: a workspace as an MCP server (the official SDK's
 * low-level `Server`, since the tool definitions already carry their JSON
 * Schemas and validate their own input). One server is one MCP session: it
 * owns one ToolSession (stale-file guard, output budget), so sessions never
 * share what a model has read. Connect it to any transport (stdio, or one
 * Streamable HTTP session, see http.ts).
 *
 * The workspace is fixed (a Backend, or a Workspace the caller closes), or
 * opened per session from a directory: the `directory` option when given,
 * else the client's first root when it offers the Roots capability, else
 * `fallbackDirectory` (the current directory). When the client's roots
 * change, the next call opens the new one, and the old workspace closes once
 * its calls in flight are done.
 */
import { setMaxListeners } from "node:events";
import { realpathSync } from "node:fs";
import nodePath from "node:path";
import { fileURLToPath } from "node:url";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import {
  CallToolRequestSchema,
  ListToolsRequestSchema,
  RootsListChangedNotificationSchema,
  type CallToolResult,
  type RequestId,
  type Tool,
  type ToolAnnotations,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { isStrataError } from "../core/errors.js";
import type { Backend } from "../core/protocol.js";
import { runsCommands } from "../tools/execute.js";
import { toolDefinitions } from "../tools/index.js";
import { ToolSession, type ToolSessionOptions } from "../tools/session.js";
import { listAllowedRoots, mcpToolDefinitions, rootsOf, type AllowedRoot, type McpToolDefinition, type StructuredOutput } from "./fs-tools.js";
import { runWithSignal, withCallSignal } from "./signal.js";

/** A backend with what the server tells the model about it, and how to let it go. */
export interface Workspace {
  backend: Backend;
  /** What list_allowed_roots answers. Default: the backend's root, "the workspace". */
  roots?: AllowedRoot[];
  /** Offer `execute`. Default: whether the backend runs commands (a composite: whether its default does). */
  execute?: boolean;
  /** Called when the server is done with a workspace it opened. */
  close?(): Promise<void>;
}

/** Opens the workspace for a host directory (the client's root, or the fallback). */
export type WorkspaceOpener = (directory: string) => Promise<Workspace>;

export interface McpServerOptions extends ToolSessionOptions {
  /** The server's name in the MCP handshake. Default "strata". */
  name?: string;
  version?: string;
  /** With an opener: open this directory and ignore the client's roots. */
  directory?: string;
  /** With an opener: the directory when neither `directory` nor the client's roots name one. Default: the current directory. */
  fallbackDirectory?: string;
  /**
   * With an opener: use a client's root only when it lies inside this host
   * directory (symlinks resolved); others are ignored. For clients that are
   * not the user who started the server (HTTP), so a client cannot name `/`.
   */
  rootsWithin?: string;
}

const READ_ONLY: ToolAnnotations = { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false };

/** Hints per tool; a tool not named here is announced as one that may change anything. */
const ANNOTATIONS: Readonly<Record<string, ToolAnnotations>> = {
  ls: READ_ONLY,
  read_file: READ_ONLY,
  glob: READ_ONLY,
  grep: READ_ONLY,
  read_multiple_files: READ_ONLY,
  read_file_tail: READ_ONLY,
  list_directory_with_sizes: READ_ONLY,
  directory_tree: READ_ONLY,
  get_file_info: READ_ONLY,
  list_allowed_roots: READ_ONLY,
  write_file: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  edit_file: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  create_directory: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  move_file: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  execute: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
};
const UNKNOWN: ToolAnnotations = { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true };

const INSTRUCTIONS = [
  "Strata workspace: files (and, when execute is offered, a shell) behind one set of tools.",
  "Paths are absolute within the workspace; list_allowed_roots says which roots exist.",
  "Read a file before editing or overwriting it.",
].join(" ");

interface Active {
  workspace: Workspace;
  session: ToolSession;
  tools: Map<string, McpToolDefinition>;
  /** Calls in flight. */
  calls: number;
  retired: boolean;
  closed: boolean;
  /** Opened by this server, so closed by it. */
  owned: boolean;
}

export function createMcpServer(workspace: Backend | Workspace | WorkspaceOpener, options: McpServerOptions = {}): Server {
  const { name = "strata", version = "0.1.0", directory, fallbackDirectory, rootsWithin, ...sessionOptions } = options;
  const server = new Server(
    { name, version },
    { capabilities: { tools: { listChanged: true } }, instructions: INSTRUCTIONS },
  );

  const activate = (ws: Workspace, owned: boolean): Active => {
    const backend = withCallSignal(ws.backend);
    const session = new ToolSession(backend, sessionOptions);
    const roots = ws.roots ?? rootsOf(session.root);
    const canExecute = ws.execute ?? runsCommands(ws.backend);
    const tools = new Map<string, McpToolDefinition>();
    for (const tool of [...toolDefinitions, ...mcpToolDefinitions, listAllowedRoots(() => roots)]) {
      if (tool.name === "execute" && !canExecute) continue;
      if (tool.available(backend)) tools.set(tool.name, tool);
    }
    return { workspace: ws, session, tools, calls: 0, retired: false, closed: false, owned };
  };

  let active: Promise<Active> | undefined;
  let fixed: Active | undefined;
  if (typeof workspace !== "function") fixed = activate("backend" in workspace ? workspace : { backend: workspace }, false);

  const open = async (opener: WorkspaceOpener, requestId: RequestId): Promise<Active> => activate(await opener(await chooseDirectory(requestId)), true);
  /** The workspace; `requestId` is the client request that needs it, whose stream carries the roots/list request when it is the first. */
  const current = (requestId: RequestId): Promise<Active> => {
    if (fixed) return Promise.resolve(fixed);
    if (!active) {
      const opening = open(workspace as WorkspaceOpener, requestId);
      active = opening;
      // A failed open is tried again by the next call.
      opening.catch(() => {
        if (active === opening) active = undefined;
      });
    }
    return active;
  };

  const chooseDirectory = async (requestId: RequestId): Promise<string> => {
    if (directory !== undefined) return directory;
    if (server.getClientCapabilities()?.roots) {
      try {
        // Over Streamable HTTP a request not tied to one goes on the client's optional GET stream, which may not be open yet
        // (the client opens it after initialization, concurrently with its first call): there it would be dropped and
        // the call would hang until the request timed out. Tied to the call, it travels on the call's own response stream.
        const { roots } = await server.listRoots(undefined, { relatedRequestId: requestId });
        for (const root of roots) {
          if (!root.uri.startsWith("file:")) continue;
          const dir = fileURLToPath(root.uri);
          if (rootsWithin === undefined || inside(rootsWithin, dir)) return dir;
        }
      } catch {
        // A client that announced roots but cannot list them: the fallback.
      }
    }
    return fallbackDirectory ?? process.cwd();
  };

  const retire = (gone: Active) => {
    gone.retired = true;
    if (gone.calls > 0 || !gone.owned || gone.closed) return;
    gone.closed = true;
    void gone.workspace.close?.().catch(() => undefined);
  };

  server.setNotificationHandler(RootsListChangedNotificationSchema, async () => {
    if (fixed || directory !== undefined || !active) return;
    const previous = active;
    active = undefined;
    previous.then(retire, () => undefined);
    await server.sendToolListChanged().catch(() => undefined);
  });

  server.setRequestHandler(ListToolsRequestSchema, async (_request, extra) => {
    const { tools } = await current(extra.requestId);
    return { tools: [...tools.values()].map(describe) };
  });

  server.setRequestHandler(CallToolRequestSchema, async (request, extra): Promise<CallToolResult> => {
    let state: Active;
    try {
      state = await current(extra.requestId);
    } catch (error) {
      // Only Strata's own messages, which never name a host path; anything else by its kind.
      const reason = isStrataError(error) ? error.message : `an unexpected ${error instanceof Error ? ((error as NodeJS.ErrnoException).code ?? error.name) : "failure"}`;
      return errorResult(`The workspace could not be opened: ${reason}`);
    }
    const tool = state.tools.get(request.params.name);
    if (!tool) return errorResult(`Unknown tool '${request.params.name}'. Available: ${[...state.tools.keys()].join(", ")}`);
    state.calls++;
    // One call is many operations (a batch read, a search), each listening on the call's signal while it runs:
    // not a leak, and Node's warning about it would be printed (and paid for) on every such call.
    setMaxListeners(0, extra.signal);
    try {
      const output: StructuredOutput = await runWithSignal(extra.signal, () => tool.run(state.session, (request.params.arguments ?? {}) as never));
      return toResult(output, tool.outputSchema !== undefined);
    } finally {
      state.calls--;
      if (state.retired) retire(state);
    }
  });

  const previousOnClose = server.onclose;
  server.onclose = () => {
    previousOnClose?.();
    active?.then(retire, () => undefined);
    active = undefined;
  };
  return server;
}

/** Whether `dir` is `base` or below it, both with symlinks resolved (false when either is missing). */
function inside(base: string, dir: string): boolean {
  try {
    const relative = nodePath.relative(realpathSync(base), realpathSync(dir));
    return relative === "" || (!relative.startsWith("..") && !nodePath.isAbsolute(relative));
  } catch {
    return false;
  }
}

/** Each definition's announcement, built once per process (converting zod schemas to JSON Schema is most of a tools/list). */
const described = new WeakMap<McpToolDefinition, Tool>();

function describe(tool: McpToolDefinition): Tool {
  let announced = described.get(tool);
  if (!announced) described.set(tool, (announced = describeOnce(tool)));
  return announced;
}

function describeOnce(tool: McpToolDefinition): Tool {
  const described: Tool = {
    name: tool.name,
    title: titleOf(tool.name),
    description: tool.description,
    inputSchema: tool.jsonSchema() as Tool["inputSchema"],
    annotations: { title: titleOf(tool.name), ...(ANNOTATIONS[tool.name] ?? UNKNOWN) },
  };
  if (tool.outputSchema) {
    const { $schema: _ignored, ...schema } = z.toJSONSchema(tool.outputSchema, { io: "output" }) as Record<string, unknown>;
    described.outputSchema = schema as Tool["outputSchema"];
  }
  return described;
}

function titleOf(name: string): string {
  const words = name.replace(/_/g, " ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

function toResult(output: StructuredOutput, structured: boolean): CallToolResult {
  const content: CallToolResult["content"] = [{ type: "text", text: output.text }];
  for (const block of output.blocks ?? []) {
    // MCP has image content; a PDF travels as an embedded resource (a blob), which clients hand to the model as a document.
    if (block.type === "image") content.push({ type: "image", data: block.data, mimeType: block.mimeType });
    else content.push({ type: "resource", resource: { uri: `file:///${encodeURIComponent(block.name)}`, mimeType: block.mimeType, blob: block.data } });
  }
  const result: CallToolResult = { content, isError: output.isError };
  if (structured && !output.isError && output.structured) result.structuredContent = output.structured;
  return result;
}

function errorResult(text: string): CallToolResult {
  return { content: [{ type: "text", text }], isError: true };
}
