import { errors } from "./errors.js";

/**
 * The one table of numeric arguments. Every backend, store and sandbox checks
 * numbers here, so `read(p, 0, 1e21)` means the same everywhere:
 *
 * | parameter        | accepted                      | clamped                        | invalid_argument                          |
 * |------------------|-------------------------------|--------------------------------|-------------------------------------------|
 * | offset (lines)   | integer 0 … 2^53-1            | —                              | negative, fractional, NaN, ±Infinity, non-number, > 2^53-1 |
 * | limit (lines)    | integer ≥ 1                   | > 2^53-1 and +Infinity → 2^53-1 | ≤ 0, fractional, NaN, -Infinity, non-number |
 * | maxCount         | integer ≥ 1                   | +Infinity → no cap             | ≤ 0, fractional, NaN, non-number          |
 * | timeout (s)      | number > 0 … MAX_TIMEOUT_SECONDS | —                           | ≤ 0, NaN, ±Infinity, over the maximum, non-number |
 * | maxOutputBytes   | integer ≥ 0                   | > 2^53-1 and +Infinity → 2^53-1 | negative, fractional, NaN, non-number     |
 */

/** Largest line number or count a window can name; every engine prints it as a plain integer. */
export const MAX_LINE_NUMBER = Number.MAX_SAFE_INTEGER;

/**
 * Longest duration a timer can honour: Node (and browsers) store delays in a
 * signed 32-bit millisecond count, and a longer one fires after 1 ms.
 */
export const MAX_TIMEOUT_SECONDS = Math.floor(0x7fffffff / 1000);

const describe = (value: unknown) => (typeof value === "number" ? String(value) : typeof value);

/** Validates a read window; an over-large or infinite limit is clamped, never an error. */
export function readWindow(offset: unknown, limit: unknown): { offset: number; limit: number } {
  if (typeof offset !== "number" || !Number.isSafeInteger(offset) || offset < 0) {
    throw errors.invalidArgument(`offset must be a non-negative integer line number, got ${describe(offset)}`);
  }
  if (typeof limit !== "number" || Number.isNaN(limit) || limit < 1 || (Number.isFinite(limit) && !Number.isInteger(limit))) {
    throw errors.invalidArgument(`limit must be a positive integer, got ${describe(limit)}`);
  }
  return { offset, limit: Math.min(limit, MAX_LINE_NUMBER) };
}

/** Validates grep's `maxCount`; undefined and +Infinity mean no cap. */
export function maxCountOf(maxCount: unknown): number | undefined {
  if (maxCount === undefined || maxCount === Infinity) return undefined;
  if (typeof maxCount !== "number" || !Number.isInteger(maxCount) || maxCount < 1) {
    throw errors.invalidArgument(`maxCount must be a positive integer, got ${describe(maxCount)}`);
  }
  return maxCount;
}

/** Validates a duration in seconds against what a timer can honour. */
export function timeoutSeconds(value: unknown, name = "timeout"): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
    throw errors.invalidArgument(`${name} must be a positive number of seconds, got ${describe(value)}`);
  }
  if (value > MAX_TIMEOUT_SECONDS) {
    throw errors.invalidArgument(`${name} of ${value} s is over the largest a timer can honour (${MAX_TIMEOUT_SECONDS} s, about 24.8 days)`);
  }
  return value;
}

/** Validates a byte count (an output cap, a quota); an over-large or infinite one is clamped. */
export function byteCount(value: unknown, name: string): number {
  if (typeof value !== "number" || Number.isNaN(value) || value < 0 || (Number.isFinite(value) && !Number.isInteger(value))) {
    throw errors.invalidArgument(`${name} must be a non-negative integer number of bytes, got ${describe(value)}`);
  }
  return Math.min(value, Number.MAX_SAFE_INTEGER);
}

/** Optional limits on what a backend, store or sandbox workspace may hold. */
export interface Quota {
  /** Total bytes of file content. */
  maxBytes?: number;
  /** Number of files. */
  maxFiles?: number;
}

/** What a backend holds now, for a quota check. */
export interface Usage {
  bytes: number;
  files: number;
}

/** Validates quota options once, at construction. */
export function validateQuota(quota: Quota | undefined): Quota | undefined {
  if (quota === undefined) return undefined;
  if (typeof quota !== "object" || quota === null) throw errors.invalidArgument("quota must be an object { maxBytes?, maxFiles? }");
  return {
    maxBytes: quota.maxBytes === undefined ? undefined : byteCount(quota.maxBytes, "quota.maxBytes"),
    maxFiles: quota.maxFiles === undefined ? undefined : byteCount(quota.maxFiles, "quota.maxFiles"),
  };
}

/**
 * Fails with `quota_exceeded` when a change of `delta` (bytes and files; negative
 * for a shrink or a delete) would take `usage` over the quota. A change that
 * shrinks is always allowed, so a workspace over its quota can be cleaned up.
 */
export function checkQuota(quota: Quota | undefined, usage: Usage, delta: Usage, path: string): void {
  if (!quota) return;
  if (quota.maxBytes !== undefined && delta.bytes > 0 && usage.bytes + delta.bytes > quota.maxBytes) {
    throw errors.quotaExceeded(path, `${usage.bytes + delta.bytes} bytes would exceed the ${quota.maxBytes}-byte quota`);
  }
  if (quota.maxFiles !== undefined && delta.files > 0 && usage.files + delta.files > quota.maxFiles) {
    throw errors.quotaExceeded(path, `${usage.files + delta.files} files would exceed the ${quota.maxFiles}-file quota`);
  }
}
