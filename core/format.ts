import { StrataError, printable } from "./errors.js";
import { readWindow } from "./limits.js";

/** Lines returned by `read` when no limit is given. */
export const DEFAULT_READ_LIMIT = 2000;
/** Lines longer than this many characters are cut in `read` output. */
export const MAX_LINE_LENGTH = 2000;
/** What `read` returns for an existing, empty file (the seeds' wording). */
export const EMPTY_FILE_REMINDER = "System reminder: File exists but has empty contents";

/**
 * Line model shared by read, grep and edit: lines end at `\n`; a final `\n`
 * ends the last line rather than starting an empty one; a `\r` before `\n`
 * belongs to the line ending, not to the line.
 */
export function splitLines(text: string): string[] {
  const lines: string[] = [];
  forEachLine(text, (line) => {
    lines.push(line);
  });
  return lines;
}

/**
 * Calls `visit(line, index)` for each line of `text` under the line model
 * above, stopping early when `visit` returns false. Returns the lines seen.
 */
export function forEachLine(text: string, visit: (line: string, index: number) => boolean | void): number {
  let index = 0;
  let start = 0;
  while (start < text.length) {
    let newline = text.indexOf("\n", start);
    const terminated = newline !== -1;
    if (!terminated) newline = text.length;
    const stop = terminated && newline > start && text.charCodeAt(newline - 1) === 13 ? newline - 1 : newline;
    if (visit(text.slice(start, stop), index++) === false) return index;
    start = newline + 1;
  }
  return index;
}

/** Validates a read window (see limits.ts for the table); returns it with the limit clamped. */
export function validateReadWindow(offset: unknown, limit: unknown): { offset: number; limit: number } {
  return readWindow(offset, limit);
}

/** Renders lines `cat -n` style (`%6d\t`), numbering from `firstLineNumber`, cutting long lines. */
export function renderLines(lines: readonly string[], firstLineNumber: number): string {
  let out = "";
  for (let i = 0; i < lines.length; i++) {
    let line = lines[i]!;
    if (line.length > MAX_LINE_LENGTH) {
      // Never cut between the halves of a surrogate pair: a lone half is not text a model API accepts.
      const keep = /[\ud800-\udbff]/.test(line.charAt(MAX_LINE_LENGTH - 1)) ? MAX_LINE_LENGTH - 1 : MAX_LINE_LENGTH;
      line = `${line.slice(0, keep)}… [line truncated: ${line.length} characters]`;
    }
    out += `${String(firstLineNumber + i).padStart(6, " ")}\t${line}${i + 1 < lines.length ? "\n" : ""}`;
  }
  return out;
}

/**
 * Renders a window of a file whose total line count is known: the empty-file
 * reminder, the offset-past-end error, or the numbered lines.
 */
export function renderWindow(window: readonly string[], offset: number, totalLines: number, path: string): string {
  if (totalLines === 0 && offset === 0) return EMPTY_FILE_REMINDER;
  if (offset >= totalLines) {
    throw new StrataError(
      "invalid_argument",
      `Line offset ${offset} exceeds the length of '${printable(path)}' (${totalLines} lines)`,
    );
  }
  return renderLines(window, offset + 1);
}

/**
 * `read` over a text held in memory. Scans to the window instead of
 * splitting the whole text, so reading 100 lines of a large file is cheap.
 */
export function formatRead(text: string, path: string, offsetArg: unknown = 0, limitArg: unknown = DEFAULT_READ_LIMIT): string {
  const { offset, limit } = validateReadWindow(offsetArg, limitArg);
  const window: string[] = [];
  const end = offset + limit;
  let pastWindow = false;
  const total = forEachLine(text, (line, index) => {
    if (index >= end) {
      pastWindow = true;
      return false;
    }
    if (index >= offset) window.push(line);
    return true;
  });
  // Past the window the total only matters when the window is empty, so stop counting.
  return pastWindow ? renderLines(window, offset + 1) : renderWindow(window, offset, total, path);
}

/** The seeds' error-string form of a failure, for `read` and `grepRaw`. */
export function errorString(error: unknown): string {
  return `Error: ${error instanceof Error ? error.message : String(error)}`;
}
