/**
 * `strata mcp`: a workspace (mcp/embedded.ts) as an MCP server, over stdio
 * (default) or Streamable HTTP (`--http`). Flags, or a JSON config file
 * (`--config`) whose keys are the flags' names in camelCase; a flag given on
 * the command line wins over the file.
 */
import nodePath from "node:path";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { Command, InvalidArgumentError } from "commander";
import { z } from "zod";
import { withPermissions } from "../backends/permissions.js";
import { borrowWorkingDirectory } from "../backends/safe-fs.js";
import { elicitationAsk } from "../mcp/elicit.js";
import { createMcpServer, type Workspace } from "../mcp/server.js";
import { embeddedShell, openEmbeddedWorkspace, type EmbeddedWorkspaceOptions, type SandboxChoice } from "../mcp/embedded.js";
import { sshSandboxOptions } from "../mcp/ssh-target.js";
import { readJsonFile } from "./json-file.js";
import { PERMISSION_PRESETS, loadPermissions, rulesSchema } from "./permissions.js";

const sandboxChoice = z.union([z.enum(["auto", "none", "local", "bwrap"]), z.templateLiteral(["docker:", z.string().min(1)]), z.templateLiteral(["ssh://", z.string().min(1)])]);

/** The config file: every key optional; relative paths start at the file's directory. */
const configSchema = z.strictObject({
  root: z.string().optional(),
  sandbox: sandboxChoice.optional(),
  identity: z.string().optional(),
  knownHosts: z.string().optional(),
  unsafeLocal: z.boolean().optional(),
  execute: z.boolean().optional(),
  memories: z.boolean().optional(),
  overlay: z.boolean().optional(),
  fsync: z.boolean().optional(),
  routes: z.record(z.string(), z.string()).optional(),
  http: z.boolean().optional(),
  host: z.string().optional(),
  port: z.number().int().min(0).max(65_535).optional(),
  allowedHosts: z.array(z.string()).optional(),
  maxOutputChars: z.number().int().min(200).optional(),
  /** Permission rules inline, or the path of a JSON file that holds them, or a preset's name. */
  permissions: z.union([z.string(), rulesSchema]).optional(),
});
type Config = z.infer<typeof configSchema>;

interface McpFlags {
  config?: string;
  root?: string;
  sandbox?: SandboxChoice;
  identity?: string;
  knownHosts?: string;
  route?: string[];
  http?: boolean;
  host?: string;
  port?: number;
  token?: string;
  allowedHost?: string[];
  unsafeLocal?: boolean;
  execute?: boolean;
  memories?: boolean;
  overlay?: boolean;
  fsync?: boolean;
  maxOutputChars?: number;
  permissions?: string;
}

function port(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65_535) throw new InvalidArgumentError("a port is an integer from 0 to 65535");
  return n;
}

function budget(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 200) throw new InvalidArgumentError("an integer of at least 200");
  return n;
}

function sandbox(value: string): SandboxChoice {
  const parsed = sandboxChoice.safeParse(value);
  if (!parsed.success) throw new InvalidArgumentError("one of auto, none, local, bwrap, docker:IMAGE, ssh://user@host[:port]/dir");
  return parsed.data;
}

function route(value: string, previous: string[] = []): string[] {
  if (!/^\/[^=]*=.+$/.test(value)) throw new InvalidArgumentError("PREFIX=URL, e.g. /memories=sqlite:.strata/memories.db");
  return [...previous, value];
}

function readConfig(file: string): Config {
  const config = readJsonFile(file, "config file", configSchema);
  const base = nodePath.dirname(nodePath.resolve(file));
  if (config.root !== undefined) config.root = nodePath.resolve(base, config.root);
  if (config.identity !== undefined) config.identity = nodePath.resolve(base, config.identity);
  if (config.knownHosts !== undefined) config.knownHosts = nodePath.resolve(base, config.knownHosts);
  if (typeof config.permissions === "string" && !Object.hasOwn(PERMISSION_PRESETS, config.permissions)) config.permissions = nodePath.resolve(base, config.permissions);
  return config;
}

export function mcpCommand(): Command {
  return new Command("mcp")
    .description(
      "Serve a workspace over MCP: the directory given by --root, else the client's roots (MCP Roots) when it offers them, else the current directory; /memories on SQLite under .strata/; a shell in bubblewrap when it works here",
    )
    .option("-c, --config <file>", "read these options from a JSON file (flags given here win)")
    .option("-r, --root <dir>", "the workspace directory (the client's roots are then ignored)")
    .option("--sandbox <kind>", "where commands run: auto, none, local, bwrap, docker:IMAGE, ssh://user@host[:port]/dir (default auto: bwrap when it works here)", sandbox)
    .option("-i, --identity <file>", "with ssh://: the private key (default: ~/.ssh/id_ed25519, id_ecdsa or id_rsa, and ssh-agent)")
    .option("--known-hosts <file>", "with ssh://: the known_hosts file that must list the server (default ~/.ssh/known_hosts)")
    .option("--route <prefix=url>", "mount memory:, sqlite:PATH, postgres://…, redis://…, file:DIR at a prefix (repeatable; replaces the /memories default)", route)
    .option("--http", "serve Streamable HTTP instead of stdio")
    .option("--host <address>", "address to bind with --http (anything but loopback needs a token) (default: 127.0.0.1)")
    .option("-p, --port <port>", "port with --http (default: 0, any free port)", port)
    .option("--token <token>", "bearer token HTTP clients must send (or STRATA_MCP_TOKEN)")
    .option("--allowed-host <host>", "accept this Host header too (repeatable)", (value: string, previous: string[] = []) => [...previous, value])
    .option("--max-output-chars <n>", "characters a tool may answer before the rest goes to a file in the workspace (default 80000)", budget)
    .option("--unsafe-local", "without bubblewrap, run commands as plain local processes (no isolation)")
    .option(
      "--permissions <file|preset>",
      `permission rules from a JSON file ([{action, operations?, paths?, name?}] or {rules}) or a preset (${Object.keys(PERMISSION_PRESETS).join(", ")}); 'ask' rules ask the client's user (MCP elicitation), else deny`,
    )
    .option("--no-execute", "offer no shell")
    .option("--no-memories", "do not mount /memories")
    .option("--no-fsync", "write the directory's files without fsync: still atomic for readers (temp file, rename), but a power cut may lose the newest writes; faster edits and writes")
    .option("--overlay", "serve the directory through an overlay: changes (the shell's too, run on a scratch copy) wait in .strata/overlay.db for `strata diff`, `strata commit` or `strata discard`")
    .action(async (flags: McpFlags, command: Command) => {
      // This process is the server alone, all of its paths absolute: listings may borrow its cwd (see lstatNamesSync).
      borrowWorkingDirectory();
      const config = flags.config === undefined ? {} : readConfig(flags.config);
      // A flag typed on the command line wins; a default (--no-x's true) does not hide the file's value.
      const given = (name: keyof McpFlags) => command.getOptionValueSource(name) === "cli";
      const pick = <K extends keyof McpFlags & keyof Config>(name: K): McpFlags[K] | Config[K] => (given(name) ? flags[name] : (config[name] ?? flags[name]));
      const root = given("root") ? flags.root : (config.root ?? flags.root);
      const routes = flags.route ? Object.fromEntries(flags.route.map((r) => [r.slice(0, r.indexOf("=")), r.slice(r.indexOf("=") + 1)])) : config.routes;
      const identity = pick("identity");
      const knownHosts = pick("knownHosts");
      const workspaceOptions: EmbeddedWorkspaceOptions = {
        sandbox: pick("sandbox"),
        ssh: { ...(identity === undefined ? {} : { identity }), ...(knownHosts === undefined ? {} : { knownHosts }) },
        unsafeLocal: pick("unsafeLocal") ?? false,
        execute: pick("execute") ?? true,
        memories: pick("memories") ?? true,
        overlay: pick("overlay") ?? false,
        fsync: pick("fsync") ?? true,
        routes,
      };
      const token = flags.token ?? process.env.STRATA_MCP_TOKEN;
      const http = pick("http") ?? false;
      const host = pick("host") ?? "127.0.0.1";

      // Before exiting, every workspace is closed, and closes under way finish (SQLite checkpoints, containers go).
      const permissionSource = given("permissions") ? flags.permissions : (config.permissions ?? flags.permissions);
      const rules = permissionSource === undefined ? undefined : typeof permissionSource === "string" ? loadPermissions(permissionSource) : permissionSource;

      const open = new Set<Workspace>();
      const closing = new Set<Promise<void>>();
      // Rules wrap the whole workspace (the secrets preset of its files and sandbox stays on beneath them);
      // an `ask` rule asks the user of the session's own client.
      const opener = (server: () => Server | undefined) => async (directory: string): Promise<Workspace> => {
        const ws = await openEmbeddedWorkspace(directory, workspaceOptions);
        open.add(ws);
        let closed: Promise<void> | undefined;
        return {
          ...ws,
          ...(rules ? { backend: withPermissions(ws.backend, { rules, ask: elicitationAsk(server) }) } : {}),
          close: () => {
            if (!closed) {
              open.delete(ws);
              closed = (ws.close?.() ?? Promise.resolve()).catch(() => undefined);
              closing.add(closed);
            }
            return closed;
          },
        };
      };
      const closeAll = async () => {
        await Promise.all([...open].map((ws) => ws.close?.()));
        await Promise.all(closing);
      };
      let exiting = false;
      const exit = (before: () => Promise<unknown>) => {
        if (exiting) return;
        exiting = true;
        void before()
          .then(closeAll)
          .finally(() => process.exit(0));
      };
      // Over HTTP a client is not necessarily the user who started the server: its roots must lie in the current directory.
      const maxOutputChars = pick("maxOutputChars");
      const placement = root === undefined ? (http ? { rootsWithin: process.cwd() } : {}) : { directory: root };
      const makeServer = () => {
        let server: Server | undefined = undefined;
        server = createMcpServer(
          opener(() => server),
          { ...placement, ...(maxOutputChars === undefined ? {} : { maxOutputChars }) },
        );
        return server;
      };
      const shell = await embeddedShell(workspaceOptions);
      if (workspaceOptions.sandbox === "bwrap" && workspaceOptions.execute) {
        const { BubblewrapSandbox } = await import("../sandboxes/bubblewrap.js");
        const why = await BubblewrapSandbox.unavailableReason();
        if (why) throw new Error(`--sandbox bwrap: bubblewrap cannot run here: ${why}`);
      }
      if (workspaceOptions.overlay && (shell === "docker" || shell === "ssh")) {
        throw new Error("--overlay lies over the local directory: its commands run in bubblewrap (or locally with --unsafe-local), not in docker or over ssh");
      }
      // Before serving: a URL or credentials that cannot work fail the start, not each session.
      if (shell === "ssh") await sshSandboxOptions(workspaceOptions.sandbox ?? "", workspaceOptions.ssh);
      if (shell === "none" && workspaceOptions.execute && (workspaceOptions.sandbox ?? "auto") === "auto") {
        process.stderr.write("strata mcp: bubblewrap is not available here, so no shell is offered (--unsafe-local runs commands unisolated)\n");
      }
      if (!http) {
        const server = makeServer();
        await server.connect(new StdioServerTransport());
        // The client closing stdin ends the session.
        process.stdin.on("end", () => exit(() => server.close()));
        process.once("SIGINT", () => exit(() => server.close()));
        process.once("SIGTERM", () => exit(() => server.close()));
        return;
      }
      const { bindingProblem, serveHttp } = await import("../mcp/http.js");
      const problem = bindingProblem(host, token);
      if (problem) throw new Error(problem);
      const allowedHosts = [...(config.allowedHosts ?? []), ...(flags.allowedHost ?? [])];
      const served = await serveHttp(makeServer, { host, port: pick("port") ?? 0, token, allowedHosts });
      process.stderr.write(`strata mcp: listening on ${served.url}\n`);
      process.once("SIGINT", () => exit(() => served.close()));
      process.once("SIGTERM", () => exit(() => served.close()));
    });
}
