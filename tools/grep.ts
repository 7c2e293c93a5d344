import { z } from "zod";
import { printable } from "../core/errors.js";
import { search, type SearchAnswer, type SearchLine } from "../core/search.js";
import { defineTool, ok, orFail } from "./define.js";
import { canonicalPath } from "./paths.js";

/** Output units (lines, files or count rows) a grep answers when head_limit is not given. */
export const DEFAULT_HEAD_LIMIT = 500;

export const grepSchema = z.object({
  pattern: z.string().min(1).describe("The text to search for: a literal string, or a JavaScript regular expression when regex is true"),
  path: z.string().optional().describe("Absolute path of the directory (or file) to search. Default: the workspace root"),
  glob: z.string().optional().describe("Only search files whose path matches this glob, e.g. '*.ts' or 'src/**/*.py'"),
  output_mode: z
    .enum(["content", "files_with_matches", "count"])
    .optional()
    .describe("content: the matching lines (path:line:text); files_with_matches (default): only the paths of files that match; count: matching lines per file"),
  regex: z.boolean().optional().describe("Treat pattern as a JavaScript regular expression instead of literal text. Default false"),
  case_insensitive: z.boolean().optional().describe("Ignore case. Default false"),
  context: z.number().int().min(0).max(100).optional().describe("Lines of context before and after each match (content mode)"),
  head_limit: z.number().int().min(1).optional().describe(`At most this many output lines, files or counts. Default ${DEFAULT_HEAD_LIMIT}`),
  offset: z.number().int().min(0).optional().describe("Skip this many output lines, files or counts first (to page on from a previous answer)"),
  include_ignored: z.boolean().optional().describe("Also search node_modules/ and .git/ (skipped by default)"),
});

export const grep = defineTool({
  name: "grep",
  description: [
    "Searches file contents. The pattern is literal text by default; set regex for a JavaScript regular expression.",
    "output_mode: files_with_matches (default) lists the files that match; content shows matching lines as",
    "path:line:text (context lines as path-line-text, groups separated by --); count gives matching lines per file.",
    "Narrow with path and glob; page with head_limit and offset. node_modules/ and .git/ are skipped unless",
    "include_ignored is set, and saved over-budget tool results (.strata/evicted/) unless path or glob names that",
    "directory; binary files are never searched.",
  ].join(" "),
  inputSchema: grepSchema,
  async execute(session, input) {
    const path = input.path ?? session.root;
    const answer = orFail(
      await search(session.backend, {
        pattern: input.pattern,
        regex: input.regex ?? false,
        ignoreCase: input.case_insensitive ?? false,
        context: input.context ?? 0,
        outputMode: input.output_mode ?? "files_with_matches",
        headLimit: input.head_limit ?? DEFAULT_HEAD_LIMIT,
        offset: input.offset ?? 0,
        path,
        ...(input.glob === undefined ? {} : { glob: input.glob }),
        includeIgnored: input.include_ignored ?? false,
      }),
    );
    const listsEvicted = session.asksForEvicted(canonicalPath(session, path), input.glob);
    const keep = (p: string) => listsEvicted || !session.isEvicted(p);
    return ok(render(answer, keep, input.pattern, path));
  },
});

function render(answer: SearchAnswer, keep: (path: string) => boolean, pattern: string, path: string): string {
  let body: string;
  let empty: boolean;
  if (answer.mode === "content") {
    const lines = answer.lines.filter((line) => keep(line.path));
    empty = lines.length === 0;
    body = renderContent(lines);
  } else if (answer.mode === "files_with_matches") {
    const files = answer.files.filter(keep);
    empty = files.length === 0;
    body = files.join("\n");
  } else {
    const counts = answer.counts.filter((row) => keep(row.path));
    empty = counts.length === 0;
    body = counts.map((row) => `${row.path}:${row.count}`).join("\n");
  }
  const more = answer.nextOffset !== undefined ? `[More results: call grep again with offset=${answer.nextOffset}]` : answer.truncated ? "[Results were cut short]" : "";
  if (empty) return more ? `No matches in this page.\n${more}` : `No matches for '${printable(pattern)}' under '${printable(path)}'.`;
  return more ? `${body}\n\n${more}` : body;
}

/** grep -n style: `path:line:text` for a match, `path-line-text` for context, `--` between groups that do not touch. */
function renderContent(lines: readonly SearchLine[]): string {
  const out: string[] = [];
  let previous: SearchLine | undefined;
  const hasContext = lines.some((line) => !line.match);
  for (const line of lines) {
    if (hasContext && previous && (previous.path !== line.path || line.line !== previous.line + 1)) out.push("--");
    out.push(`${line.path}${line.match ? ":" : "-"}${line.line}${line.match ? ":" : "-"}${line.text}`);
    previous = line;
  }
  return out.join("\n");
}
