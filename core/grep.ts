import { errors } from "./errors.js";
import { maxCountOf } from "./limits.js";

/** Longest grep pattern, in characters: far beyond any real search, well under argv's 128 KiB per argument. */
export const MAX_PATTERN_LENGTH = 16 * 1024;
import type { GrepMatch } from "./types.js";

/** Rejects patterns that cannot match within one line. */
export function validateGrepPattern(pattern: string): void {
  if (typeof pattern !== "string" || pattern === "") throw errors.invalidArgument("grep pattern must be a non-empty string");
  if (pattern.includes("\n") || pattern.includes("\r")) {
    throw errors.invalidArgument("grep pattern must be a single line (grep matches within lines)");
  }
  if (pattern.includes("\0")) throw errors.invalidArgument("grep pattern must not contain a NUL byte (files holding NUL are binary and never searched)");
  if (pattern.length > MAX_PATTERN_LENGTH) {
    throw errors.invalidArgument(`grep pattern is ${pattern.length} characters, over the ${MAX_PATTERN_LENGTH}-character limit`);
  }
}

/** Validates grep's `maxCount` (see limits.ts); returns the cap, undefined for none. */
export function validateMaxCount(maxCount: unknown): number | undefined {
  return maxCountOf(maxCount);
}

/** A text is treated as binary (and skipped by grep) when it contains a NUL character. */
export function looksBinary(text: string): boolean {
  return text.includes("\0");
}

/**
 * Literal search in one text, under the shared line model (see format.ts).
 * Jumps from hit to hit with indexOf rather than splitting every line, so a
 * file without the pattern costs one scan. Appends at most `limit` matches.
 */
export function grepText(path: string, text: string, pattern: string, out: GrepMatch[], limit = Infinity): void {
  let hit = text.indexOf(pattern);
  if (hit === -1 || looksBinary(text)) return;
  let line = 1;
  let counted = 0; // text[0, counted) has been scanned for newlines
  let taken = 0;
  while (hit !== -1 && taken < limit) {
    for (let n = text.indexOf("\n", counted); n !== -1 && n < hit; n = text.indexOf("\n", n + 1)) {
      line++;
      counted = n + 1;
    }
    const start = text.lastIndexOf("\n", hit) + 1;
    let end = text.indexOf("\n", hit);
    if (end === -1) end = text.length;
    const stop = end < text.length && end > start && text.charCodeAt(end - 1) === 13 ? end - 1 : end;
    out.push({ path, line, text: text.slice(start, stop) });
    taken++;
    counted = Math.max(counted, start);
    hit = end >= text.length ? -1 : text.indexOf(pattern, end + 1);
  }
}

/** Module-level for the reason byPath is (paths.ts). */
function byPathThenLine(a: GrepMatch, b: GrepMatch): number {
  return a.path < b.path ? -1 : a.path > b.path ? 1 : a.line - b.line;
}

/** Sorts matches by path, then line: the order every backend returns. */
export function sortMatches(matches: GrepMatch[]): GrepMatch[] {
  return matches.sort(byPathThenLine);
}

/** Caps merged matches at `maxCount`, reporting whether anything was cut. */
export function capMatches(matches: GrepMatch[], maxCount: number | undefined): { matches: GrepMatch[]; truncated: boolean } {
  if (maxCount === undefined || matches.length <= maxCount) return { matches, truncated: false };
  return { matches: matches.slice(0, maxCount), truncated: true };
}
