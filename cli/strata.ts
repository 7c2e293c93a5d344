#!/usr/bin/env node
/**
 * The `strata` command. Subcommands: mcp (serve a workspace over MCP).
 */
import { Command, CommanderError, InvalidArgumentError } from "commander";
import { mcpCommand } from "./mcp.js";

const program = new Command("strata")
  .description("A workspace for AI agents: files and a shell behind one contract")
  .version("0.1.0")
  .showHelpAfterError()
  .addCommand(mcpCommand());

program.parseAsync(process.argv).catch((error: unknown) => {
  if (error instanceof CommanderError) process.exit(error.exitCode);
  const message = error instanceof InvalidArgumentError || error instanceof Error ? error.message : String(error);
  process.stderr.write(`strata: ${message}\n`);
  process.exit(1);
});
