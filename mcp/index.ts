/**
 * strata-workspace/mcp — a workspace as an MCP server: the tools/ definitions
 * plus the filesystem server's extras (mcp/fs-tools.ts), over stdio or
 * Streamable HTTP, one ToolSession per MCP session.
 */
export { runsCommands } from "../tools/execute.js";
export { createMcpServer, type McpServerOptions, type Workspace, type WorkspaceOpener } from "./server.js";
export { bindingProblem, isLoopback, serveHttp, type HttpMcpServer, type HttpServeOptions } from "./http.js";
export { DEFAULT_ROUTES, embeddedShell, openEmbeddedWorkspace, type EmbeddedWorkspaceOptions, type SandboxChoice, type ShellKind } from "./embedded.js";
export { openRoute, ROUTE_SCHEMES, type OpenedRoute } from "./routes.js";
export { elicitationAsk } from "./elicit.js";
export {
  createDirectory,
  directoryTree,
  getFileInfo,
  listAllowedRoots,
  listDirectoryWithSizes,
  mcpToolDefinitions,
  moveFile,
  readFileTail,
  readMultipleFiles,
  rootsOf,
  type AllowedRoot,
  type McpToolDefinition,
  type StructuredOutput,
} from "./fs-tools.js";
export { runWithSignal, withCallSignal } from "./signal.js";
