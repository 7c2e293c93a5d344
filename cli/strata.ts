#!/usr/bin/env node
/**
 * The `strata` command: the file commands (files.ts), exec, sync, mcp,
 * diff/commit/discard (overlay.ts) and demo. Every command takes --help; a
 * failure prints one line on stderr and exits with the status its error code maps to (common.ts, README "Exit
 * statuses"); a usage error exits 2.
 */
import { Command, CommanderError } from "commander";
import { report } from "./common.js";
import { runDemo } from "./demo.js";
import { execCommand } from "./exec.js";
import { fileCommands } from "./files.js";
import { mcpCommand } from "./mcp.js";
import { overlayCommands } from "./overlay.js";
import { syncCommand } from "./sync.js";

const program = new Command("strata")
  .description("A workspace for AI agents: files and a shell behind one contract")
  .version("0.1.0")
  .exitOverride();

const demo = new Command("demo")
  .description("a tour of one workspace on embedded defaults (a sandbox, SQLite memories under .strata/, scratch in memory)")
  .action(() => runDemo());

for (const command of [...fileCommands(), execCommand(), syncCommand(), mcpCommand(), ...overlayCommands(), demo]) program.addCommand(command);
// A usage error is one line, as every other error (addCommand does not pass these settings down).
for (const command of [program, ...program.commands]) {
  command.exitOverride().configureOutput({
    outputError: (message, write) => write(`strata: usage: ${message.replace(/^error: /, "").trim().replace(/\s*\n\s*/g, " ")} (see --help)\n`),
  });
}

program.parseAsync(process.argv).catch((error: unknown) => {
  if (error instanceof CommanderError) {
    // Help and --version exit 0; a usage error (commander printed it already) is 2.
    process.exit(error.exitCode === 0 ? 0 : 2);
  }
  process.exit(report(error, false));
});
