import { z } from "zod";
import { printable } from "../core/errors.js";
import { MAX_LINE_LENGTH } from "../core/format.js";
import { search, type SearchAnswer, type SearchLine } from "../core/search.js";
import { ToolFailure, defineTool, ok, orFail } from "./define.js";
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
    if (input.regex && nestsQuantifiers(input.pattern, input.case_insensitive ?? false)) {
      throw new ToolFailure(
        `Regex '${printable(input.pattern)}' repeats a group that itself repeats (like (a+)+), which can take exponential time on some lines; rewrite it without the nested repetition`,
      );
    }
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
    out.push(`${line.path}${line.match ? ":" : "-"}${line.line}${line.match ? ":" : "-"}${cutLine(line.text)}`);
    previous = line;
  }
  return out.join("\n");
}

/** A long line (minified code, a data blob) cut as read_file cuts it, never between the halves of a surrogate pair. */
function cutLine(text: string): string {
  if (text.length <= MAX_LINE_LENGTH) return text;
  const keep = /[\ud800-\udbff]/.test(text.charAt(MAX_LINE_LENGTH - 1)) ? MAX_LINE_LENGTH - 1 : MAX_LINE_LENGTH;
  return `${text.slice(0, keep)}… [line truncated: ${text.length} characters]`;
}

/**
 * Whether a regex repeats a group that can end in an unbounded repetition
 * ((a+)+, (\w*\s?)*, ((x|y+))+, (a+.)+): the commonest pattern on which
 * JavaScript's backtracking engine takes exponential time, since the inner
 * and outer repetitions can split the same run of characters in
 * exponentially many ways. A model's pattern runs in this process, so such a
 * pattern is refused before it runs. An inner repetition followed by a
 * literal character it cannot match ((\w+\.)+, (x+y)+) is unambiguous and
 * allowed. A guard against the common case, not a proof: other slow
 * patterns exist.
 */
export function nestsQuantifiers(source: string, ignoreCase = false): boolean {
  interface Group {
    /** The current branch can end inside an unbounded repetition (only optional atoms after it). */
    tail: boolean;
    /** Some earlier branch can. */
    branches: boolean;
    /** The source of the last repeated atom of this branch, while it is the tail. */
    repeated: string | undefined;
  }
  const groups: Group[] = [{ tail: false, branches: false, repeated: undefined }];
  /** The atom just read, not yet known to be repeated. */
  let pending: { source: string; groupTail: boolean; literal: string | undefined } | null = null;
  const top = () => groups[groups.length - 1]!;
  const matches = (atom: string, char: string) => {
    try {
      return new RegExp(`^(?:${atom})$`, ignoreCase ? "iu" : "u").test(char) || new RegExp(`^(?:${atom})$`, ignoreCase ? "i" : "").test(char);
    } catch {
      return true;
    }
  };
  const commit = () => {
    if (!pending) return;
    const group = top();
    if (pending.groupTail) {
      group.tail = true;
      group.repeated = undefined;
    } else if (group.tail && !(pending.literal !== undefined && group.repeated !== undefined && !matches(group.repeated, pending.literal))) {
      // Still ambiguous: what follows could be eaten by the repetition before it.
    } else {
      group.tail = false;
      group.repeated = undefined;
    }
    pending = null;
  };
  for (let i = 0; i < source.length; i++) {
    const c = source[i]!;
    const rest = source.slice(i);
    const unbounded = c === "*" || c === "+" || (c === "{" && /^\{\d*,\d*\}/.test(rest) && !/^\{\d*,[01]\}/.test(rest));
    const optional = c === "?" || (c === "{" && /^\{\d*(,[01])?\}/.test(rest));
    if (unbounded || optional) {
      if (c === "{") i = source.indexOf("}", i);
      if (!pending) continue; // a lazy suffix, not a new repetition
      const atom: { source: string; groupTail: boolean } = pending;
      pending = null;
      if (unbounded) {
        if (atom.groupTail) return true;
        top().tail = true;
        top().repeated = atom.source;
      }
      continue;
    }
    commit();
    if (c === "\\") {
      const escaped = source[i + 1] ?? "";
      i++;
      pending = { source: `\\${escaped}`, groupTail: false, literal: /[^A-Za-z0-9]/.test(escaped) ? escaped : undefined };
    } else if (c === "[") {
      const start = i;
      for (i++; i < source.length && source[i] !== "]"; i++) if (source[i] === "\\") i++;
      pending = { source: source.slice(start, i + 1), groupTail: false, literal: undefined };
    } else if (c === "(") {
      // (?:, (?=, (?<name> …: the prefix is not an atom.
      if (source[i + 1] === "?") i += source[i + 2] === "<" && source[i + 3] !== "=" && source[i + 3] !== "!" ? source.indexOf(">", i) - i : 2;
      groups.push({ tail: false, branches: false, repeated: undefined });
    } else if (c === ")") {
      const group = groups.length > 1 ? groups.pop()! : top();
      pending = { source: "(?:group)", groupTail: group.tail || group.branches, literal: undefined };
    } else if (c === "|") {
      top().branches ||= top().tail;
      top().tail = false;
      top().repeated = undefined;
    } else if (c === "^" || c === "$") {
      // Anchors match no characters: they change nothing.
    } else {
      pending = { source: c === "." ? "." : c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), groupTail: false, literal: c === "." ? undefined : c };
    }
  }
  return false;
}
