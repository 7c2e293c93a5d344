import { z } from "zod";
import { printable } from "../core/errors.js";
import { defineTool, ok, orFail } from "./define.js";
import { canonicalPath } from "./paths.js";

export const globSchema = z.object({
  pattern: z
    .string()
    .describe("Glob pattern: *, **, ?, [abc], {a,b}. A pattern without '/' matches file names at any depth (*.ts); one with '/' is relative to path (src/**/*.test.ts)"),
  path: z.string().optional().describe("Absolute path of the directory to search. Default: the workspace root"),
});

export const glob = defineTool({
  name: "glob",
  description:
    "Finds files by name pattern, e.g. '*.py' or 'src/**/*.ts'. Answers matching file paths, one a line, sorted by path (directories are not listed). Saved over-budget tool results (.strata/evicted/) are left out unless path or pattern names that directory.",
  inputSchema: globSchema,
  async execute(session, input) {
    const path = input.path ?? session.root;
    const found = orFail(await session.backend.glob(input.pattern, { path, sizes: false }));
    const askedForEvicted = session.asksForEvicted(canonicalPath(session, path), input.pattern);
    const files = found.entries.filter((entry) => askedForEvicted || !session.isEvicted(entry.path)).map((entry) => entry.path);
    if (files.length === 0) return ok(`No files match '${printable(input.pattern)}' under '${printable(path)}'.`);
    return ok(files.join("\n"));
  },
});
