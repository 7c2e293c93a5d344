/**
 * `strata diff`, `strata commit`, `strata discard`: review what an agent
 * changed through `strata mcp --overlay` (the layer at .strata/overlay.db),
 * then apply it to the directory or drop it.
 */
import { Command } from "commander";
import { hasOverlay, openOverlay, OVERLAY_DB } from "../mcp/overlay.js";
import type { OverlayBackend } from "../backends/overlay.js";
import { printJson, report, unwrap } from "./common.js";

interface OverlayFlags {
  root?: string;
  json?: boolean;
  stat?: boolean;
}

function options(command: Command): Command {
  return command
    .option("-r, --root <dir>", "the workspace directory `strata mcp --overlay` served (default: the current directory)")
    .option("--json", "print the native result as JSON (errors too: {error:{code,message}})");
}

/** Runs `body` on the workspace's overlay; without one, `none` answers (no layer is created just to look). */
async function withOverlay(flags: OverlayFlags, none: () => void, body: (overlay: OverlayBackend) => Promise<void>): Promise<void> {
  const directory = flags.root ?? process.cwd();
  try {
    if (!hasOverlay(directory)) return none();
    const opened = openOverlay(directory);
    try {
      await body(opened.overlay);
    } finally {
      await opened.close();
    }
  } catch (error) {
    process.exitCode = report(error, flags.json === true);
  }
}

const MARK = { added: "A", modified: "M", deleted: "D" } as const;

export function overlayCommands(): Command[] {
  const diff = options(new Command("diff"))
    .description(`show what the overlay (${OVERLAY_DB}) would change on disk: a unified diff per file`)
    .option("--stat", "one line per file: A (added), M (modified) or D (deleted), and the path")
    .action((flags: OverlayFlags) =>
      withOverlay(flags, () => (flags.json ? printJson({ changes: [] }) : undefined), async (overlay) => {
        const { changes } = unwrap(await overlay.diff());
        if (flags.json) return printJson({ changes });
        for (const change of changes) {
          if (flags.stat) process.stdout.write(`${MARK[change.kind]} ${change.path}\n`);
          else process.stdout.write(change.patch ?? `Binary file ${change.path} ${change.kind}\n`);
        }
      }),
    );

  const commit = options(new Command("commit"))
    .description("apply the overlay to the directory (each file atomically); refused whole, listing them, when files changed on disk meanwhile")
    .action((flags: OverlayFlags) =>
      withOverlay(flags, () => (flags.json ? printJson({ written: [], removed: [], directories: [] }) : process.stdout.write("nothing to commit\n")), async (overlay) => {
        const done = unwrap(await overlay.commit());
        if (flags.json) return printJson(done);
        for (const path of done.removed) process.stdout.write(`removed ${path}\n`);
        for (const path of done.directories) process.stdout.write(`made ${path}/\n`);
        for (const path of done.written) process.stdout.write(`wrote ${path}\n`);
        if (done.removed.length + done.directories.length + done.written.length === 0) process.stdout.write("nothing to commit\n");
      }),
    );

  const discard = options(new Command("discard"))
    .description("drop the overlay's changes: the directory stays as it is")
    .action((flags: OverlayFlags) =>
      withOverlay(flags, () => (flags.json ? printJson({ discarded: 0 }) : process.stdout.write("nothing to discard\n")), async (overlay) => {
        const done = unwrap(await overlay.discard());
        if (flags.json) return printJson(done);
        process.stdout.write(`discarded ${done.discarded} change(s)\n`);
      }),
    );

  return [diff, commit, discard];
}
