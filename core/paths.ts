import { errors } from "./errors.js";

/**
 * Virtual paths: absolute, POSIX, normalised. This is the only place path
 * rules live; every backend calls `normalizePath` before touching storage.
 */

/** Longest path accepted, in UTF-16 code units (Linux PATH_MAX is 4096 bytes). */
export const MAX_PATH_LENGTH = 4096;
/** Longest single segment, in UTF-8 bytes (Linux NAME_MAX). */
export const MAX_SEGMENT_BYTES = 255;

const encoder = new TextEncoder();

/** The last path `normalizePath` found already normal ("/" is normal too, so it starts there). */
let lastNormal = "/";

/**
 * Validates and normalises a virtual path. A missing leading `/` is added
 * (models often omit it); `//`, `.` and a trailing `/` are folded away.
 * Rejected with `invalid_path`: empty, NUL, a `..` segment, a leading `~`,
 * a drive letter, a backslash, or an over-long path or segment.
 */
export function normalizePath(input: string): string {
  // One call often checks the same string twice (a backend, then its store): the second time is one comparison.
  if (input === lastNormal) return input;
  if (isPlainNormal(input)) {
    lastNormal = input;
    return input;
  }
  // Never String(input): an agent's JSON object can carry a `toString` that is not a function.
  if (typeof input !== "string") throw errors.invalidPath(`(${input === null ? "null" : typeof input})`, "path must be a string");
  if (input.length === 0) throw errors.invalidPath(input, "path is empty");
  if (input.includes("\0")) throw errors.invalidPath(input, "path contains a NUL byte");
  if (input.startsWith("~")) throw errors.invalidPath(input, "home-relative paths ('~') are not allowed");
  if (/^[A-Za-z]:/.test(input)) throw errors.invalidPath(input, "drive letters are not allowed; use POSIX paths");
  if (input.includes("\\")) throw errors.invalidPath(input, "backslashes are not allowed; use '/'");
  if (input.length > MAX_PATH_LENGTH) throw errors.invalidPath(input, `path is longer than ${MAX_PATH_LENGTH} characters`);
  const segments: string[] = [];
  for (const segment of input.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") throw errors.invalidPath(input, "'..' segments are not allowed");
    if (isReservedName(segment)) throw errors.invalidPath(input, `names starting with '${TEMP_PREFIX}' or '${LOCK_PREFIX}' are reserved for Strata's own temporary and lock files`);
    if (segment.length > MAX_SEGMENT_BYTES / 4 && encoder.encode(segment).length > MAX_SEGMENT_BYTES) {
      throw errors.invalidPath(input, `a path segment is longer than ${MAX_SEGMENT_BYTES} bytes`);
    }
    segments.push(segment);
  }
  return "/" + segments.join("/");
}

/**
 * True for a path that is already normal and that every rule above accepts:
 * printable ASCII without a backslash, one `/` before each non-empty segment,
 * no segment over the byte limit, no `.` or `..` segment, no segment
 * starting with `.strata-` (the reserved names). Most paths are; normalising them again is the hot path of
 * every operation, so they are recognised in one scan without allocating.
 * Anything else takes the full route.
 */
function isPlainNormal(input: string): boolean {
  if (typeof input !== "string") return false;
  const length = input.length;
  if (length < 2 || length > MAX_PATH_LENGTH || input.charCodeAt(0) !== 47 /* / */) return false;
  let start = 1;
  for (let i = 1; i <= length; i++) {
    const c = i === length ? 47 : input.charCodeAt(i);
    if (c === 47) {
      if (i === start || i - start > MAX_SEGMENT_BYTES) return false;
      if (input.charCodeAt(start) === 46 /* . */ && ((i - start <= 2 && input.charCodeAt(i - 1) === 46) || input.startsWith(".strata-", start))) return false;
      start = i + 1;
    } else if (c < 0x20 || c > 0x7e || c === 92 /* \ */) return false;
  }
  return true;
}

const TEMP_PREFIX = ".strata-tmp-";
const LOCK_PREFIX = ".strata-lock-";

/**
 * Names Strata gives its own temporary and lock files beside a target (disk
 * and sandboxes): no path may name one, and listings and searches never show
 * one, or anything under one. One rule on every backend.
 */
export function isReservedName(name: string): boolean {
  return name.startsWith(TEMP_PREFIX) || name.startsWith(LOCK_PREFIX);
}

/** Parent directory of a normalised path (`/` for top-level entries and for `/`). */
export function parentOf(path: string): string {
  const i = path.lastIndexOf("/");
  return i <= 0 ? "/" : path.slice(0, i);
}

/** Last segment of a normalised path (`""` for `/`). */
export function baseName(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}

/** Joins a normalised directory and a relative path. */
export function joinPath(dir: string, relative: string): string {
  if (relative === "") return dir;
  return dir === "/" ? `/${relative}` : `${dir}/${relative}`;
}

/** True when `path` is `dir` itself or lies under it (segment boundaries respected). */
export function isWithin(dir: string, path: string): boolean {
  if (dir === "/") return true;
  return path === dir || (path.startsWith(dir) && path.charCodeAt(dir.length) === 47 /* / */);
}

/** `path` relative to `dir` (both normalised, `path` within `dir`); `""` when equal. */
export function relativeTo(dir: string, path: string): string {
  if (dir === "/") return path.slice(1);
  return path === dir ? "" : path.slice(dir.length + 1);
}

/** Every ancestor directory of a normalised path, nearest last, excluding the path itself. */
export function ancestorsOf(path: string): string[] {
  const result: string[] = ["/"];
  let i = path.indexOf("/", 1);
  while (i !== -1) {
    result.push(path.slice(0, i));
    i = path.indexOf("/", i + 1);
  }
  return path === "/" ? [] : result;
}

/**
 * Module-level, not an arrow made per sort: V8 keeps a function's optimized
 * code only while the function object lives, so a comparator made per call
 * ran unoptimized again after every full GC (a large sort's main cost).
 */
function byPath(a: { path: string }, b: { path: string }): number {
  return a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
}

/** Sorts entries by path in code-unit order: the order every listing is returned in. */
export function sortByPath<T extends { path: string }>(entries: T[]): T[] {
  return entries.sort(byPath);
}

/**
 * sortByPath for the entries of one directory, given each entry's name
 * (a directory's with its trailing '/') at the same index. Their paths share
 * everything before the name, so the names order them alike; a listing
 * whose names already come in order (readdir answers them sorted) is kept
 * as it is. One pass over short names instead of a sort of full paths,
 * whose comparisons cost most of a large listing.
 */
export function sortEntriesOfOneDirectory<T extends { path: string }>(entries: T[], names: readonly string[]): T[] {
  for (let i = 1; i < names.length; i++) if (names[i - 1]! >= names[i]!) return sortByPath(entries);
  return entries;
}
