/**
 * The one content search above the native `grep`: literal or regex, case
 * folding, context lines, three output modes, paging (issue 11).
 *
 * One engine decides what matches: JavaScript's RegExp, applied line by line
 * under the shared line model (format.ts `forEachLine`: CRLF-aware), over the
 * text of candidate files. A literal pattern is escaped into a RegExp, so a
 * literal and the equivalent regex always agree. The backend's native `grep`
 * is only asked for candidate files, and only with a literal that every match
 * provably contains; otherwise every file under the search path is read.
 * So the answer is the same on every backend, whatever it can do natively.
 */
import { errors, printable, toErrorInfo } from "./errors.js";
import { decodeText } from "./filedata.js";
import { forEachLine } from "./format.js";
import { MAX_PATTERN_LENGTH, looksBinary, validateGrepPattern } from "./grep.js";
import { isWithin, normalizePath } from "./paths.js";
import { ASK_SCOPE } from "./permissions.js";
import type { Backend } from "./protocol.js";
import type { ErrorInfo, Result } from "./types.js";

export interface SearchOptions {
  /** What to look for: a literal string, or a JavaScript regex source with `regex`. */
  pattern: string;
  /** Read `pattern` as a JavaScript RegExp source (no flags, or `i` with `ignoreCase`). */
  regex?: boolean;
  ignoreCase?: boolean;
  /** Lines of context before and after each match (content mode); `before`/`after` override it. */
  context?: number;
  before?: number;
  after?: number;
  /** `content` (default): the lines; `files_with_matches`: the files; `count`: matching lines per file. */
  outputMode?: "content" | "files_with_matches" | "count";
  /** Output units (lines, files or count rows) returned at most. */
  headLimit?: number;
  /** Output units skipped first. */
  offset?: number;
  /** The directory (or file) searched; default `/`. */
  path?: string;
  /** Only files matching this glob (the dialect of `glob`, relative to `path`). */
  glob?: string;
  /** Also search under `node_modules/` and `.git/` directories (skipped by default). */
  includeIgnored?: boolean;
  signal?: AbortSignal;
}

export interface SearchLine {
  path: string;
  /** 1-based. */
  line: number;
  /** The whole line, without its line ending. */
  text: string;
  /** False for a context line. */
  match: boolean;
}

export type SearchAnswer =
  | { mode: "content"; lines: SearchLine[]; totalMatches: number; truncated: boolean; nextOffset?: number }
  | { mode: "files_with_matches"; files: string[]; truncated: boolean; nextOffset?: number }
  | { mode: "count"; counts: Array<{ path: string; count: number }>; truncated: boolean; nextOffset?: number };

/** Files read per `downloadFiles` call. */
const BATCH = 50;
/** Directory names skipped unless `includeIgnored`. */
const IGNORED_DIRS = new Set(["node_modules", ".git"]);

/** Searches file contents; every failure is answered as `{ error }`, never thrown. */
export async function search(backend: Backend, options: SearchOptions): Promise<Result<SearchAnswer>> {
  try {
    return await run(backend, checkOptions(options));
  } catch (error) {
    return { error: toErrorInfo(error) };
  }
}

// ---------------------------------------------------------------- options

interface Checked {
  matcher: RegExp;
  /** A literal every matching line contains, for the native grep; undefined: read every file. */
  prefilter: string | undefined;
  before: number;
  after: number;
  mode: "content" | "files_with_matches" | "count";
  headLimit: number | undefined;
  offset: number;
  path: string | undefined;
  glob: string | undefined;
  includeIgnored: boolean;
  signal: AbortSignal | undefined;
}

function checkOptions(input: unknown): Checked {
  if (typeof input !== "object" || input === null || Array.isArray(input)) throw errors.invalidArgument("search options must be an object");
  let o: Record<string, unknown>;
  try {
    o = { ...(input as Record<string, unknown>) };
  } catch {
    throw errors.invalidArgument("search options could not be read (a getter or a Proxy threw)");
  }
  const pattern = o.pattern;
  if (typeof pattern !== "string" || pattern === "") throw errors.invalidArgument("pattern must be a non-empty string");
  if (pattern.length > MAX_PATTERN_LENGTH) {
    throw errors.invalidArgument(`pattern is ${pattern.length} characters, over the ${MAX_PATTERN_LENGTH}-character limit`);
  }
  if (/[\r\n]/.test(pattern)) throw errors.invalidArgument("pattern must be a single line (search matches within lines)");
  if (pattern.includes("\0")) throw errors.invalidArgument("pattern must not contain a NUL byte (files holding NUL are binary and never searched)");
  const regex = bool(o, "regex");
  const ignoreCase = bool(o, "ignoreCase");
  const context = count(o, "context") ?? 0;
  const mode = o.outputMode ?? "content";
  if (mode !== "content" && mode !== "files_with_matches" && mode !== "count") {
    throw errors.invalidArgument(`outputMode must be "content", "files_with_matches" or "count", got ${describe(mode)}`);
  }
  let headLimit: number | undefined;
  if (o.headLimit !== undefined && o.headLimit !== Infinity) {
    if (typeof o.headLimit !== "number" || !Number.isSafeInteger(o.headLimit) || o.headLimit < 1) {
      throw errors.invalidArgument(`headLimit must be a positive integer, got ${describe(o.headLimit)}`);
    }
    headLimit = o.headLimit;
  }
  const signal = o.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) throw errors.invalidArgument("signal must be an AbortSignal");
  const { matcher, prefilter } = compile(pattern, regex, ignoreCase);
  return {
    matcher,
    prefilter,
    before: count(o, "before") ?? context,
    after: count(o, "after") ?? context,
    mode,
    headLimit,
    offset: count(o, "offset") ?? 0,
    path: optionalString(o, "path"),
    glob: optionalString(o, "glob"),
    includeIgnored: bool(o, "includeIgnored"),
    signal,
  };
}

function bool(o: Record<string, unknown>, name: string): boolean {
  const value = o[name];
  if (value === undefined) return false;
  if (typeof value !== "boolean") throw errors.invalidArgument(`${name} must be true or false, got ${describe(value)}`);
  return value;
}

function count(o: Record<string, unknown>, name: string): number | undefined {
  const value = o[name];
  if (value === undefined) return undefined;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw errors.invalidArgument(`${name} must be a non-negative integer, got ${describe(value)}`);
  }
  return value;
}

function optionalString(o: Record<string, unknown>, name: string): string | undefined {
  const value = o[name];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") throw errors.invalidArgument(`${name} must be a string, got ${describe(value)}`);
  return value;
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "string") return JSON.stringify(printable(value));
  return typeof value === "number" ? String(value) : typeof value;
}

// ---------------------------------------------------------------- the pattern

/** Escapes a literal into RegExp source. */
export function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}

function compile(pattern: string, regex: boolean, ignoreCase: boolean): { matcher: RegExp; prefilter: string | undefined } {
  const flags = ignoreCase ? "i" : "";
  if (!regex) {
    // The literal itself is what every match contains; case folding defeats the native (case-sensitive) grep.
    return { matcher: new RegExp(escapeRegExp(pattern), flags), prefilter: ignoreCase ? undefined : grepable(pattern) };
  }
  let matcher: RegExp;
  try {
    matcher = new RegExp(pattern, flags);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw errors.invalidArgument(`Invalid regex '${printable(pattern)}': ${why}`);
  }
  const ast = parseRegex(pattern);
  if (matcher.test("") || nullable(ast.alternatives)) {
    throw errors.invalidArgument(
      `The regex '${printable(pattern)}' can match the empty string, so it would match every line; make it require at least one character`,
    );
  }
  return { matcher, prefilter: ignoreCase || ast.unsure ? undefined : grepable(requiredLiteral(ast.alternatives)) };
}

/** The literal when the native grep accepts it (non-empty, one line, no NUL), else undefined. */
function grepable(literal: string): string | undefined {
  if (literal === "") return undefined;
  try {
    validateGrepPattern(literal);
    return literal;
  } catch {
    return undefined;
  }
}

/**
 * A JavaScript regex (no `u` or `v` flag, Annex B syntax), parsed only as far
 * as deciding two things: can it match the empty string, and which literal
 * runs must every match contain. The source has already compiled.
 */
type Node =
  | { kind: "char"; ch: string }
  /** Consumes one character, not a known literal: `.`, a class, `\d`, `\n`, … */
  | { kind: "set" }
  /** Zero width: `^`, `$`, `\b`, `\B`, lookarounds. */
  | { kind: "assert" }
  /** Can match the empty string (an empty or unset group). */
  | { kind: "backref" }
  | { kind: "group"; alternatives: Node[][] }
  | { kind: "repeat"; node: Node; min: number };

interface ParsedRegex {
  alternatives: Node[][];
  /** Syntax this parser does not model exactly: no prefilter is derived. */
  unsure: boolean;
}

export function parseRegex(source: string): ParsedRegex {
  let i = 0;
  let unsure = false;
  const hasNamedGroups = /\(\?<[^=!]/.test(source);
  const groups = capturingGroups(source);

  const disjunction = (): Node[][] => {
    const alternatives = [alternative()];
    while (source[i] === "|") {
      i++;
      alternatives.push(alternative());
    }
    return alternatives;
  };

  const alternative = (): Node[] => {
    const terms: Node[] = [];
    while (i < source.length && source[i] !== "|" && source[i] !== ")") {
      const node = atom();
      const min = quantifier();
      terms.push(min === undefined ? node : { kind: "repeat", node, min });
    }
    return terms;
  };

  const quantifier = (): number | undefined => {
    const c = source[i];
    let min: number | undefined;
    if (c === "*" || c === "?") min = 0;
    else if (c === "+") min = 1;
    else if (c === "{") {
      const m = /^\{(\d+)(?:,(\d*))?\}/.exec(source.slice(i));
      if (!m) return undefined; // a literal '{' (Annex B)
      i += m[0].length - 1;
      min = Number(m[1]);
    }
    if (min === undefined) return undefined;
    i++;
    if (source[i] === "?") i++; // lazy: the same minimum
    return min;
  };

  const atom = (): Node => {
    const c = source[i]!;
    if (c === "^" || c === "$") {
      i++;
      return { kind: "assert" };
    }
    if (c === ".") {
      i++;
      return { kind: "set" };
    }
    if (c === "[") {
      i++;
      if (source[i] === "^") i++;
      while (i < source.length && source[i] !== "]") i += source[i] === "\\" ? 2 : 1;
      i++;
      return { kind: "set" };
    }
    if (c === "(") return group();
    if (c === "\\") return escape();
    if (c === "*" || c === "+" || c === "?") {
      // Cannot follow nothing in a source that compiled; be safe anyway.
      unsure = true;
      i++;
      return { kind: "set" };
    }
    i++;
    return { kind: "char", ch: c };
  };

  const group = (): Node => {
    i++; // (
    let lookaround = false;
    if (source[i] === "?") {
      const next = source[i + 1];
      if (next === "=" || next === "!") {
        lookaround = true;
        i += 2;
      } else if (next === "<" && (source[i + 2] === "=" || source[i + 2] === "!")) {
        lookaround = true;
        i += 3;
      } else if (next === ":") {
        i += 2;
      } else if (next === "<") {
        const close = source.indexOf(">", i);
        i = close === -1 ? source.length : close + 1;
      } else {
        // Modifiers such as (?i:…) change matching inside: parse on, derive nothing.
        unsure = true;
        const colon = source.indexOf(":", i);
        i = colon === -1 ? source.length : colon + 1;
      }
    }
    const alternatives = disjunction();
    if (source[i] === ")") i++;
    else unsure = true;
    return lookaround ? { kind: "assert" } : { kind: "group", alternatives };
  };

  const escape = (): Node => {
    const d = source[i + 1];
    if (d === undefined) {
      unsure = true;
      i++;
      return { kind: "set" };
    }
    if (d === "b" || d === "B") {
      i += 2;
      return { kind: "assert" };
    }
    if (d >= "1" && d <= "9") {
      // A backreference may match nothing; past the group count (Annex B) it is an octal or identity escape: one character.
      const digits = /^[0-9]+/.exec(source.slice(i + 1))![0];
      i += 1 + digits.length;
      return Number(digits) <= groups ? { kind: "backref" } : { kind: "set" };
    }
    if (d === "k" && hasNamedGroups && source[i + 2] === "<") {
      const close = source.indexOf(">", i);
      i = close === -1 ? source.length : close + 1;
      return { kind: "backref" };
    }
    if (d === "0") {
      i += 2;
      for (let n = 0; n < 2 && /[0-7]/.test(source[i] ?? ""); n++) i++;
      return { kind: "set" };
    }
    if (d === "x" && /^[0-9a-fA-F]{2}$/.test(source.slice(i + 2, i + 4))) {
      i += 4;
      return { kind: "set" };
    }
    if (d === "u" && /^[0-9a-fA-F]{4}$/.test(source.slice(i + 2, i + 6))) {
      i += 6;
      return { kind: "set" };
    }
    if (d === "c") {
      if (/^[A-Za-z]$/.test(source[i + 2] ?? "")) {
        i += 3;
        return { kind: "set" };
      }
      // Annex B: `\c` without a control letter is a literal backslash; the `c` is the next atom (`\c?` needs the backslash).
      i += 1;
      return { kind: "char", ch: "\\" };
    }
    i += 2;
    // An escaped punctuation character is that character; any letter or digit escape is a class or
    // a control character (\d, \w, \s, \n, \t, …), or an Annex B identity escape: none is taken as a literal.
    if (/[A-Za-z0-9_]/.test(d)) return { kind: "set" };
    return { kind: "char", ch: d };
  };

  const alternatives = disjunction();
  if (i < source.length) unsure = true; // an unbalanced ')' cannot compile; be safe anyway
  return { alternatives, unsure };
}

/** How many capturing groups a regex source holds (escapes and classes skipped). */
function capturingGroups(source: string): number {
  let groups = 0;
  let inClass = false;
  for (let i = 0; i < source.length; i++) {
    const c = source[i];
    if (c === "\\") i++;
    else if (inClass) inClass = c !== "]";
    else if (c === "[") inClass = true;
    else if (c === "(" && (source[i + 1] !== "?" || (source[i + 2] === "<" && source[i + 3] !== "=" && source[i + 3] !== "!"))) groups++;
  }
  return groups;
}

/** True when some alternative can match without consuming a character (assertions count as empty). */
export function nullable(alternatives: Node[][]): boolean {
  return alternatives.some((terms) => terms.every(nullableNode));
}

function nullableNode(node: Node): boolean {
  switch (node.kind) {
    case "char":
    case "set":
      return false;
    case "assert":
    case "backref":
      return true;
    case "group":
      return nullable(node.alternatives);
    case "repeat":
      return node.min === 0 || nullableNode(node.node);
  }
}

/**
 * The longest literal every match provably contains: a run of consecutive
 * literal characters in a regex without top-level alternation. A character
 * repeated at least once ends one run and starts the next (`xa+b`: "xa", "ab");
 * anything optional, a class, a group or an assertion ends the run.
 */
export function requiredLiteral(alternatives: Node[][]): string {
  if (alternatives.length !== 1) return "";
  let best = "";
  let run = "";
  const flush = () => {
    if (run.length > best.length) best = run;
    run = "";
  };
  for (const node of alternatives[0]!) {
    if (node.kind === "char") run += node.ch;
    else if (node.kind === "repeat" && node.node.kind === "char" && node.min >= 1) {
      run += node.node.ch;
      flush();
      run = node.node.ch;
    } else flush();
  }
  flush();
  return best;
}

// ---------------------------------------------------------------- the search

interface FileHits {
  path: string;
  /** Lines of the file (only kept in content mode). */
  lines: string[];
  /** 0-based indexes of matching lines, ascending. */
  matches: number[];
}

async function run(backend: Backend, o: Checked): Promise<Result<SearchAnswer>> {
  // One search is many native calls: under one ask scope, a permission rule that asks is asked once for all of them.
  const scoped = { signal: o.signal, [ASK_SCOPE]: {} };
  const listed = await candidates(backend, o, scoped);
  if (listed.error) return { error: listed.error };
  const files = listed.paths.filter((path) => o.includeIgnored || !ignored(path, o.path)).sort(comparePaths);

  // Output units needed before the scan can stop: one past the page tells whether more remain.
  // Content mode reports the total of matches, so it always reads every candidate.
  const enough = o.mode === "content" || o.headLimit === undefined ? Infinity : o.offset + o.headLimit + 1;
  const hits: FileHits[] = [];
  for (let start = 0; start < files.length && hits.length < enough; start += BATCH) {
    if (o.signal?.aborted) throw errors.aborted("The search");
    const batch = files.slice(start, start + BATCH);
    const answer = await backend.downloadFiles(batch, scoped);
    if (answer.error) return { error: answer.error };
    for (const item of answer.files) {
      if (item.error) {
        // Gone (or replaced by a directory) since it was listed: no longer a file to search. One a
        // permission rule keeps from this caller is left out, as the native grep leaves it out.
        if (item.error.code === "file_not_found" || item.error.code === "is_directory" || item.error.code === "permission_denied") continue;
        return { error: item.error };
      }
      const text = item.content === null ? null : decodeText(item.content);
      if (text === null || looksBinary(text)) continue;
      const found = scan(item.path, text, o);
      if (found) hits.push(found);
    }
  }
  return answerOf(hits, o);
}

/** The files to read: those the native grep finds for the required literal, or every file under the path. */
async function candidates(backend: Backend, o: Checked, scoped: { signal: AbortSignal | undefined; [ASK_SCOPE]: object }): Promise<{ paths: string[]; error?: undefined } | { error: ErrorInfo }> {
  const scope = { ...scoped, path: o.path };
  if (o.prefilter !== undefined) {
    const found = await backend.grep(o.prefilter, { ...scope, glob: o.glob });
    if (found.error) return { error: found.error };
    return { paths: [...new Set(found.matches.map((m) => m.path))] };
  }
  const listed = await backend.glob(o.glob ?? "**", scope);
  if (listed.error) return { error: listed.error };
  return { paths: listed.entries.filter((e) => !e.is_dir).map((e) => e.path) };
}

/** Under a `node_modules/` or `.git/` directory below the search path. */
function ignored(path: string, searchPath: string | undefined): boolean {
  const segments = path.split("/");
  segments.pop(); // the file's own name: a file called `.git` (a worktree's) is searched
  let skip = 0;
  if (searchPath !== undefined) {
    try {
      const root = normalizePath(searchPath);
      if (root !== "/" && isWithin(root, path)) skip = root.split("/").length;
    } catch {
      // The backend has accepted the path; a form this cannot normalise checks every segment.
    }
  }
  return segments.slice(skip).some((s) => IGNORED_DIRS.has(s));
}

function comparePaths(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function scan(path: string, text: string, o: Checked): FileHits | undefined {
  const keepLines = o.mode === "content";
  const lines: string[] = [];
  const matches: number[] = [];
  forEachLine(text, (line, index) => {
    if (keepLines) lines.push(line);
    if (o.matcher.test(line)) {
      matches.push(index);
      if (o.mode === "files_with_matches") return false;
    }
    return true;
  });
  return matches.length === 0 ? undefined : { path, lines, matches };
}

function answerOf(hits: FileHits[], o: Checked): SearchAnswer {
  switch (o.mode) {
    case "files_with_matches": {
      const { page, ...rest } = paginate(
        hits.map((h) => h.path),
        o,
      );
      return { mode: "files_with_matches", files: page, ...rest };
    }
    case "count": {
      const { page, ...rest } = paginate(
        hits.map((h) => ({ path: h.path, count: h.matches.length })),
        o,
      );
      return { mode: "count", counts: page, ...rest };
    }
    case "content": {
      const lines: SearchLine[] = [];
      let totalMatches = 0;
      for (const hit of hits) {
        totalMatches += hit.matches.length;
        emitWithContext(hit, o.before, o.after, lines);
      }
      const { page, ...rest } = paginate(lines, o);
      return { mode: "content", lines: page, totalMatches, ...rest };
    }
  }
}

/** The matching lines and their context, windows merged where they overlap or touch, each line once. */
function emitWithContext(hit: FileHits, before: number, after: number, out: SearchLine[]): void {
  const last = hit.lines.length - 1;
  let next = 0; // first line not yet emitted
  for (let m = 0; m < hit.matches.length; m++) {
    const index = hit.matches[m]!;
    const from = Math.max(next, index - before);
    const to = Math.min(last, index + after);
    for (let line = from; line <= to; line++) {
      out.push({ path: hit.path, line: line + 1, text: hit.lines[line]!, match: line === index || isMatch(hit.matches, m, line) });
    }
    next = Math.max(next, to + 1);
  }
}

/** Whether `line` (at or after matches[m]) is itself a match: only later matches can be. */
function isMatch(matches: number[], m: number, line: number): boolean {
  for (let k = m; k < matches.length && matches[k]! <= line; k++) if (matches[k] === line) return true;
  return false;
}

function paginate<T>(units: T[], o: Checked): { page: T[]; truncated: boolean; nextOffset?: number } {
  const end = o.headLimit === undefined ? units.length : Math.min(units.length, o.offset + o.headLimit);
  const page = units.slice(o.offset, end);
  return end < units.length && o.offset < units.length ? { page, truncated: true, nextOffset: end } : { page, truncated: false };
}
