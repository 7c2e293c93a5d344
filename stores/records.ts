import { errors } from "../core/errors.js";
import { fileDataSize, isFileDataV1 } from "../core/filedata.js";
import type { FileData, FileEncoding } from "../core/types.js";
import { checkValueSize, validateKey, validateValue } from "./store.js";

/**
 * How a FileData record is laid out in an engine that stores UTF-8 text
 * (PostgreSQL, Redis). A JS string can hold what UTF-8 cannot (a lone
 * surrogate would silently become U+FFFD) and PostgreSQL text cannot hold
 * NUL, so such text is kept exactly, as JSON, in `original`, while `content`
 * keeps a searchable copy with those characters replaced by U+FFFD. A v1
 * record keeps its list of lines as JSON in `original` and the joined text in
 * `content`, so it is searched like any text and read back unchanged.
 */
export interface EngineRecord {
  encoding: FileEncoding | "lines";
  /** The text to search (or the base64 payload); exact unless `original` is set. */
  content: string;
  /** JSON of the exact content when `content` had to be altered, else null. */
  original: string | null;
  size: number;
  created_at: string;
  modified_at: string;
}

/** NUL and lone surrogates: what a UTF-8 text column cannot hold as they are. */
const UNSTORABLE = /\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const UNSTORABLE_ALL = new RegExp(UNSTORABLE.source, "g");

/** Default `maxValueSize` of the engine stores: 64 MiB. */
export const DEFAULT_MAX_VALUE_SIZE = 64 * 1024 * 1024;

/** Keys a `list` page holds when the call gives no limit, in every bundled store; StoreBackend reads keys in pages this size. */
export const DEFAULT_PAGE = 1000;
/** The most keys a `list` page holds, whatever the call asks. */
export const MAX_PAGE = 10_000;

/** A `list` limit as PostgreSQL and Redis take it: a whole number from 1 to MAX_PAGE; DEFAULT_PAGE unless it is a finite number. */
export function pageSize(limit: number | undefined): number {
  return Number.isFinite(limit) ? Math.min(Math.max(1, Math.floor(limit!)), MAX_PAGE) : DEFAULT_PAGE;
}

/** Validates a key for an engine that stores UTF-8: normalised, and valid Unicode. */
export function checkEngineKey(key: string): string {
  validateKey(key);
  if (UNSTORABLE.test(key)) throw errors.invalidPath(key, "path is not valid Unicode (it contains a lone surrogate)");
  return key;
}

export function toEngineRecord(key: string, value: FileData, maxValueSize: number): EngineRecord {
  validateValue(value);
  if (UNSTORABLE.test(value.created_at) || UNSTORABLE.test(value.modified_at)) {
    throw errors.invalidArgument(`the value for '${key}' has a timestamp that is not valid text`);
  }
  checkValueSize(key, value, maxValueSize);
  const stamps = { size: fileDataSize(value), created_at: value.created_at, modified_at: value.modified_at };
  if (isFileDataV1(value)) {
    return { encoding: "lines", content: searchable(value.content.join("\n")), original: JSON.stringify(value.content), ...stamps };
  }
  const exact = !UNSTORABLE.test(value.content);
  return { encoding: value.encoding, content: exact ? value.content : searchable(value.content), original: exact ? null : JSON.stringify(value.content), ...stamps };
}

export function fromEngineRecord(record: EngineRecord): FileData {
  const { created_at, modified_at } = record;
  if (record.encoding === "lines") return { content: JSON.parse(record.original ?? "[]") as string[], created_at, modified_at };
  const content = record.original === null ? record.content : (JSON.parse(record.original) as string);
  return { content, encoding: record.encoding, created_at, modified_at };
}

/**
 * The string to look for in `content`, or undefined when the substring itself
 * holds an unstorable character, so `content` cannot answer and every text
 * record is a candidate. A storable substring found in the exact text is
 * also found in the searchable copy: the characters replaced were not in it.
 */
export function searchableNeedle(substring: string): string | undefined {
  return UNSTORABLE.test(substring) ? undefined : substring;
}

function searchable(text: string): string {
  return text.replace(UNSTORABLE_ALL, "\uFFFD");
}

/** What every key under `dir` starts with. */
export function treePrefix(dir: string): string {
  return dir === "/" ? "/" : `${dir}/`;
}

/** The directory prefix (with its trailing `/`) and the name of a key. */
export function splitKey(key: string): { dir: string; name: string } {
  const slash = key.lastIndexOf("/");
  return { dir: key.slice(0, slash + 1), name: key.slice(slash + 1) };
}
