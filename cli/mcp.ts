/**
 * `strata mcp`: the embedded default workspace (see mcp/embedded.ts) as an
 * MCP server, over stdio (default) or Streamable HTTP (`--http`).
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { Command, InvalidArgumentError } from "commander";
import { createMcpServer, type Workspace } from "../mcp/server.js";
import { bindingProblem, serveHttp } from "../mcp/http.js";
import { embeddedShell, openEmbeddedWorkspace } from "../mcp/embedded.js";

interface McpFlags {
  root?: string;
  http?: boolean;
  host: string;
  port: number;
  token?: string;
  allowedHost: string[];
  unsafeLocal?: boolean;
  execute: boolean;
  memories: boolean;
}

function port(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65_535) throw new InvalidArgumentError("a port is an integer from 0 to 65535");
  return n;
}

export function mcpCommand(): Command {
  return new Command("mcp")
    .description(
      "Serve a workspace over MCP: the directory given by --root, else the client's roots (MCP Roots) when it offers them, else the current directory; /memories on SQLite under .strata/; a shell in bubblewrap when it works here",
    )
    .option("-r, --root <dir>", "the workspace directory (the client's roots are then ignored)")
    .option("--http", "serve Streamable HTTP instead of stdio")
    .option("--host <address>", "address to bind with --http (anything but loopback needs a token)", "127.0.0.1")
    .option("-p, --port <port>", "port with --http (0: any free port)", port, 0)
    .option("--token <token>", "bearer token HTTP clients must send (or STRATA_MCP_TOKEN)")
    .option("--allowed-host <host>", "accept this Host header too (repeatable)", (value: string, previous: string[]) => [...previous, value], [] as string[])
    .option("--unsafe-local", "without bubblewrap, run commands as plain local processes (no isolation)")
    .option("--no-execute", "offer no shell")
    .option("--no-memories", "do not mount /memories")
    .action(async (flags: McpFlags) => {
      const token = flags.token ?? process.env.STRATA_MCP_TOKEN;
      const workspaceOptions = { unsafeLocal: flags.unsafeLocal ?? false, execute: flags.execute, memories: flags.memories };
      // Every workspace still open at exit is closed first (SQLite checkpoints, sandboxes end their commands).
      const open = new Set<Workspace>();
      const opener = async (directory: string): Promise<Workspace> => {
        const ws = await openEmbeddedWorkspace(directory, workspaceOptions);
        open.add(ws);
        return {
          ...ws,
          close: async () => {
            open.delete(ws);
            await ws.close?.();
          },
        };
      };
      const closeAll = () => Promise.all([...open].map((ws) => ws.close?.().catch(() => undefined)));
      const makeServer = () => createMcpServer(opener, flags.root === undefined ? {} : { directory: flags.root });
      const shell = await embeddedShell(workspaceOptions);
      if (shell === "none" && flags.execute && !flags.unsafeLocal) {
        process.stderr.write("strata mcp: bubblewrap is not available here, so no shell is offered (--unsafe-local runs commands unisolated)\n");
      }
      if (!flags.http) {
        const server = makeServer();
        await server.connect(new StdioServerTransport());
        // The client closing stdin ends the session.
        process.stdin.on("end", () => void server.close().then(closeAll).finally(() => process.exit(0)));
        return;
      }
      const problem = bindingProblem(flags.host, token);
      if (problem) throw new Error(problem);
      const served = await serveHttp(makeServer, { host: flags.host, port: flags.port, token, allowedHosts: flags.allowedHost });
      process.stderr.write(`strata mcp: listening on ${served.url}\n`);
      const stop = () => void served.close().then(closeAll).finally(() => process.exit(0));
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
    });
}
