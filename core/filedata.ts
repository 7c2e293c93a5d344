import { errors } from "./errors.js";
import type { FileData, FileDataV1, FileDataV2, FileInfo } from "./types.js";

/**
 * File records: v2 (`content` string + `encoding`) is what every backend
 * writes; v1 (a list of lines) is still read and becomes v2 on the next write.
 */

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

// Node's Buffer is much faster than btoa/atob on large inputs; it is used when
// present (feature detection, not an import, so core still runs in a browser).
const NodeBuffer = (globalThis as { Buffer?: typeof import("buffer").Buffer }).Buffer;

export function isFileDataV1(data: FileData): data is FileDataV1 {
  return Array.isArray(data.content);
}

export function isFileData(value: unknown): value is FileData {
  if (typeof value !== "object" || value === null) return false;
  const record = value as Record<string, unknown>;
  const content = record.content;
  if (Array.isArray(content)) return content.every((line) => typeof line === "string");
  return typeof content === "string" && (record.encoding === "utf-8" || record.encoding === "base64");
}

/**
 * Upgrades a v1 record; v2 records are returned as they are. A record in the
 * deepagents package's own v2 shape (`content` a string or bytes, a
 * `mimeType`, no `encoding`), as its tools put into an agent's shared `files`
 * state, is read as ours by the same text-or-binary rule.
 */
export function toFileDataV2(data: FileData): FileDataV2 {
  if (isFileDataV1(data)) return { content: data.content.join("\n"), encoding: "utf-8", created_at: data.created_at, modified_at: data.modified_at };
  if ((data as { encoding?: unknown }).encoding === undefined) {
    const content: unknown = data.content;
    const times = { created_at: data.created_at, modified_at: data.modified_at };
    if (ArrayBuffer.isView(content)) return { ...fileDataFromBytes(new Uint8Array(content.buffer, content.byteOffset, content.byteLength)), ...times };
    if (typeof content === "string") return { ...fileDataFromText(content), ...times };
  }
  return data;
}

let lastMs = Number.NaN;
let lastStamp = "";

/** The current time as an ISO string; formatting a Date costs more than a small write, so one string serves each millisecond. */
export function now(): string {
  const ms = Date.now();
  if (ms !== lastMs) {
    lastMs = ms;
    lastStamp = new Date(ms).toISOString();
  }
  return lastStamp;
}

/**
 * A text becomes a record by the contract's one rule, "binary = contains NUL
 * or invalid UTF-8": a text holding NUL is stored as base64, exactly as its
 * bytes would be by fileDataFromBytes, so every backend reports it the same.
 */
export function fileDataFromText(text: string, createdAt?: string): FileDataV2 {
  if (text.includes("\0")) return fileDataFromBytes(utf8.encode(text), createdAt);
  const timestamp = now();
  return { content: text, encoding: "utf-8", created_at: createdAt ?? timestamp, modified_at: timestamp };
}

/** Bytes become UTF-8 text when they decode strictly and hold no NUL; base64 otherwise. */
export function fileDataFromBytes(bytes: Uint8Array, createdAt?: string): FileDataV2 {
  const text = decodeText(bytes);
  const timestamp = now();
  return text === null
    ? { content: encodeBase64(bytes), encoding: "base64", created_at: createdAt ?? timestamp, modified_at: timestamp }
    : { content: text, encoding: "utf-8", created_at: createdAt ?? timestamp, modified_at: timestamp };
}

/** The text of a record, or null for binary content. */
export function fileDataText(data: FileData): string | null {
  const v2 = toFileDataV2(data);
  return v2.encoding === "utf-8" ? v2.content : null;
}

export function fileDataBytes(data: FileData): Uint8Array {
  const v2 = toFileDataV2(data);
  return v2.encoding === "base64" ? decodeBase64(v2.content) : utf8.encode(v2.content);
}

/** Size in bytes of the stored content. */
export function fileDataSize(data: FileData): number {
  const v2 = toFileDataV2(data);
  if (v2.encoding === "base64") {
    const padding = v2.content.endsWith("==") ? 2 : v2.content.endsWith("=") ? 1 : 0;
    return (v2.content.length / 4) * 3 - padding;
  }
  return utf8ByteLength(v2.content);
}

/** The listing entry of a stored file record. */
export function fileDataInfo(path: string, data: FileData): FileInfo {
  return { path, is_dir: false, size: fileDataSize(data), modified_at: data.modified_at };
}

export function utf8ByteLength(text: string): number {
  if (NodeBuffer) return NodeBuffer.byteLength(text, "utf8");
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) bytes += 1;
    else if (c < 0x800) bytes += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < text.length) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}

/** Strict UTF-8 decode; null when the bytes are not valid UTF-8 or contain NUL. */
export function decodeText(bytes: Uint8Array): string | null {
  if (bytes.includes(0)) return null;
  try {
    return strictUtf8.decode(bytes);
  } catch {
    return null;
  }
}

export function encodeText(text: string): Uint8Array {
  return utf8.encode(text);
}

export function encodeBase64(bytes: Uint8Array): string {
  if (NodeBuffer) return NodeBuffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

export function decodeBase64(text: string): Uint8Array {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) throw errors.invalidArgument("stored content is not valid base64");
  if (NodeBuffer) {
    const buffer = NodeBuffer.from(text, "base64");
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  }
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}
