#!/usr/bin/env node
/**
 * The `strata` command: the file commands (files.ts), exec, sync, mcp,
 * diff/commit/discard (overlay.ts) and demo. Every command takes --help; a
 * failure prints one line on stderr and exits with the status its error code maps to (common.ts, README "Exit
 * statuses"); a usage error exits 2.
 *
 * Only the module of the command named is loaded (an MCP client starts
 * `strata mcp` for every session, so its start-up is the server's); a
 * program-level --help, or a name that is no command, loads them all.
 */
import { Command, CommanderError } from "commander";
import { report } from "./common.js";

const FILE_COMMANDS = ["ls", "read", "write", "edit", "glob", "grep", "upload", "download"];
const OVERLAY_COMMANDS = ["diff", "commit", "discard"];

/** The definitions of the commands a run needs: the one named, or all of them. */
async function commands(name: string | undefined): Promise<Command[]> {
  const files = async () => (await import("./files.js")).fileCommands();
  const exec = async () => [(await import("./exec.js")).execCommand()];
  const sync = async () => [(await import("./sync.js")).syncCommand()];
  const mcp = async () => [(await import("./mcp.js")).mcpCommand()];
  const overlay = async () => (await import("./overlay.js")).overlayCommands();
  const demo = async () => [
    new Command("demo")
      .description("a tour of one workspace on embedded defaults (a sandbox, SQLite memories under .strata/, scratch in memory)")
      .action(async () => (await import("./demo.js")).runDemo()),
  ];
  if (name !== undefined && FILE_COMMANDS.includes(name)) return (await files()).filter((command) => command.name() === name);
  if (name !== undefined && OVERLAY_COMMANDS.includes(name)) return (await overlay()).filter((command) => command.name() === name);
  const one = { exec, sync, mcp, demo }[name ?? ""];
  if (one) return one();
  return (await Promise.all([files(), exec(), sync(), mcp(), overlay(), demo()])).flat();
}

const program = new Command("strata")
  .description("A workspace for AI agents: files and a shell behind one contract")
  .version("0.1.0")
  .exitOverride();

async function main(): Promise<void> {
  for (const command of await commands(process.argv[2])) program.addCommand(command);
  // A usage error is one line, as every other error (addCommand does not pass these settings down).
  for (const command of [program, ...program.commands]) {
    command.exitOverride().configureOutput({
      outputError: (message, write) => write(`strata: usage: ${message.replace(/^error: /, "").trim().replace(/\s*\n\s*/g, " ")} (see --help)\n`),
    });
  }
  await program.parseAsync(process.argv);
}

main().catch((error: unknown) => {
  if (error instanceof CommanderError) {
    // Help and --version exit 0; a usage error (commander printed it already) is 2.
    process.exit(error.exitCode === 0 ? 0 : 2);
  }
  process.exit(report(error, false));
});
