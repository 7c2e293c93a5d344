import picomatch from "picomatch";
import { errors, printable } from "./errors.js";
import type { FileInfo } from "./types.js";
import { baseName, isWithin, joinPath, normalizePath, parentOf, relativeTo } from "./paths.js";

/**
 * The one glob dialect: `*`, `**`, `?`, `[abc]`, `{a,b}`; dot files match.
 * A pattern without `/` matches the basename at any depth; a pattern with `/`
 * is relative to the search path; a pattern starting with `/` is absolute.
 * Extglobs and `!` negation are off so `(`, `)`, `+`, `@` and `!` are literal.
 * Flag `s`: picomatch builds `**` from `.`, which must also match a newline in a name.
 */
const PICOMATCH_OPTIONS = { dot: true, noextglob: true, nonegate: true, strictSlashes: true, flags: "s" } as const;

export interface GlobMatcher {
  /** Tests a normalised absolute path that lies within the search path. */
  (path: string): boolean;
  /** The directory all matches lie under: the search path plus the pattern's literal leading segments. */
  readonly root: string;
  /** Source pattern, for messages. */
  readonly pattern: string;
  /** The search path the matcher was compiled for. */
  readonly searchPath: string;
  /**
   * Tests a directory (its path without the trailing `/`) for `glob` with
   * `includeDirectories`: the same match as a file's, except that the search
   * path itself is never a result, as `find` and deepagents leave it out.
   */
  matchesDirectory(path: string): boolean;
  /**
   * Set when the match of a path strictly below `root` depends on its last
   * name alone (`*.ts`, `**\/*.ts`): a walker tests each entry's name before
   * it builds the entry's path.
   */
  readonly byName?: (name: string) => boolean;
  /** Set when byName is `name.endsWith(nameSuffix)` (`*.ts`): a walker tests that inline, with no call per name. */
  readonly nameSuffix?: string;
}

/** Compiles `pattern` for searches under `searchPath` (a normalised absolute path). */
export function compileGlob(pattern: string, searchPath = "/"): GlobMatcher {
  validateGlob(pattern);
  const absolute = pattern.startsWith("/");
  const body = absolute ? pattern.replace(/^\/+/, "") : pattern;
  const base = absolute ? "/" : searchPath;
  const isBasenamePattern = !body.includes("/");
  // `**/X` (X without a slash) is X tested on the name at any depth below the base: testing the name
  // alone spares building each path's relative form and running the longer `**` expression.
  const nameBelow = isBasenamePattern ? undefined : /^(?:\*\*\/)+([^/]+)$/.exec(body)?.[1];
  let test: (input: string) => boolean;
  try {
    // POSIX spells a negated class `[!a]`; picomatch only reads `[^a]` that way.
    test = picomatch((nameBelow ?? body).replace(/(^|[^\\])\[!/g, "$1[^"), PICOMATCH_OPTIONS);
  } catch {
    throw errors.invalidArgument(`Invalid glob '${printable(pattern)}': picomatch cannot compile it`);
  }
  // A name pattern `*.ext` (the commonest glob, `**/*.ts`) matches exactly the names ending in `.ext`
  // (dotfiles included, as `dot` has it): a suffix test, not a regular expression per name.
  const suffix = isBasenamePattern || nameBelow !== undefined ? /^\*(\.[\w.-]+)$/.exec(nameBelow ?? body)?.[1] : undefined;
  if (suffix !== undefined) test = (name) => name.endsWith(suffix);
  const prefix = isBasenamePattern ? "" : literalPrefix(body);
  let root = prefix === "" ? base : joinPath(base, prefix);
  // An absolute pattern can only narrow the search path, never escape it.
  if (absolute && !isWithin(searchPath, root)) root = isWithin(root, searchPath) ? searchPath : root;
  const matcher = ((path: string) => {
    if (!isWithin(searchPath, path)) return false;
    if (isBasenamePattern) return test(baseName(path));
    if (!isWithin(base, path)) return false;
    if (nameBelow !== undefined) return path !== base && test(baseName(path));
    const relative = relativeTo(base, path);
    return relative !== "" && test(relative);
  }) as GlobMatcher;
  Object.defineProperties(matcher, {
    root: { value: root },
    pattern: { value: pattern },
    searchPath: { value: searchPath },
    matchesDirectory: { value: (path: string) => path !== searchPath && path !== "/" && matcher(path) },
    byName: { value: isBasenamePattern || nameBelow !== undefined ? test : undefined },
    nameSuffix: { value: suffix },
  });
  return matcher;
}

/**
 * The directories a glob with `includeDirectories` finds in a backend whose
 * directories exist while they hold a file (state, stores): the ancestors of
 * `files` at or under the matcher's root that it matches, as listing entries
 * (path ending in `/`, `is_dir: true`, as `ls` shows them).
 */
export function impliedDirectories(matcher: GlobMatcher, files: Iterable<string>): FileInfo[] {
  const seen = new Set<string>();
  for (const file of files) {
    for (let dir = parentOf(file); dir !== "/" && isWithin(matcher.root, dir) && !seen.has(dir); dir = parentOf(dir)) seen.add(dir);
  }
  return [...seen].filter((dir) => matcher.matchesDirectory(dir)).map((dir) => ({ path: `${dir}/`, is_dir: true }));
}

/** Leading segments of a pattern that contain no glob syntax. */
export function literalPrefix(pattern: string): string {
  const segments = pattern.split("/");
  const literal: string[] = [];
  for (let i = 0; i < segments.length - 1; i++) {
    const segment = segments[i]!;
    if (/[*?[\]{}\\]/.test(segment)) break;
    literal.push(segment);
  }
  return literal.filter((s) => s !== "" && s !== ".").join("/");
}

/** Rejects what no backend could answer the same way: empty, NUL, `..`, unbalanced brackets or braces. */
/** Longest glob accepted, in characters: a path is at most 4096, and picomatch refuses patterns past 65536. */
export const MAX_GLOB_LENGTH = 8192;

export function validateGlob(pattern: string): void {
  if (typeof pattern !== "string" || pattern.length === 0) throw errors.invalidArgument("glob pattern must be a non-empty string");
  if (pattern.length > MAX_GLOB_LENGTH) throw errors.invalidArgument(`glob pattern is ${pattern.length} characters, over the ${MAX_GLOB_LENGTH}-character limit`);
  if (pattern.includes("\0")) throw errors.invalidArgument("glob pattern contains a NUL byte");
  if (pattern.split("/").includes("..")) throw errors.invalidPath(pattern, "'..' segments are not allowed in a glob");
  let braces = 0;
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\") {
      i++;
      continue;
    }
    if (inClass) {
      if (c === "]" && pattern[i - 1] !== "[" && !(pattern[i - 1] === "!" && pattern[i - 2] === "[")) inClass = false;
      continue;
    }
    if (c === "[") inClass = true;
    else if (c === "{") braces++;
    else if (c === "}" && --braces < 0) break;
  }
  if (inClass) throw errors.invalidArgument(`Invalid glob '${printable(pattern)}': unclosed '['`);
  if (braces !== 0) throw errors.invalidArgument(`Invalid glob '${printable(pattern)}': unbalanced '{' and '}'`);
}

/** Normalises a search path argument (`null`/`undefined` mean `/`). */
export function searchRoot(path: string | null | undefined): string {
  return path === undefined || path === null ? "/" : normalizePath(path);
}
