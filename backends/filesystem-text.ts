/**
 * Reading and searching file content on disk for the filesystem backend:
 * `read` windows streamed from large files, grep of one file (small files
 * whole, large ones in pieces), and ripgrep as a finder of candidate files.
 * All of it goes through directory fds from safe-fs.ts and the shared line,
 * read and grep rules from core/.
 */
import type { spawn } from "node:child_process";
import { closeSync, fstatSync, openSync, read, readSync } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { errors } from "../core/errors.js";
import { decodeText } from "../core/filedata.js";
import { checkOffset, type TextWindow } from "../core/base.js";
import { forEachLine } from "../core/format.js";
import { grepText } from "../core/grep.js";
import type { GrepMatch } from "../core/types.js";
import { findOnPath, isExecutable } from "./executable.js";
import { at, keepShape, READ_FLAGS } from "./safe-fs.js";
import { childProcess } from "../stores/lazy-builtins.js";

/** Files up to this size are read whole (exact formatRead semantics); larger ones stream. */
export const WHOLE_FILE_LIMIT = 8 * 1024 * 1024;
const CHUNK_SIZE = 1024 * 1024;

/** Lines of `bytes` that end in `\n`, decoded; null for binary (NUL or invalid UTF-8). */
function decodeLines(parts: Buffer[]): string | null {
  return decodeText(parts.length === 1 ? parts[0]! : Buffer.concat(parts));
}

/**
 * `read` of a large file without loading it: lines outside the window are
 * only counted (newline bytes, nothing decoded or kept), lines in it are
 * decoded and split by the shared line model. The answer equals textWindow's,
 * except that invalid UTF-8 is only noticed inside the window (NUL anywhere).
 */
export async function readWindow(handle: FileHandle, path: string, size: number, offset: number, limit: number): Promise<TextWindow> {
  const end = offset + limit;
  const lines: string[] = [];
  const buffer = Buffer.allocUnsafe(CHUNK_SIZE);
  let index = 0; // the line the next byte belongs to
  let carry: Buffer[] = []; // the start of line `index`, once inside the window
  let lastByte = 10;
  const take = (parts: Buffer[]) => {
    const text = decodeLines(parts);
    if (text === null) throw errors.binary(path, size);
    forEachLine(text, (line) => {
      if (index >= offset && index < end) lines.push(line);
      index++;
    });
  };
  for (let position = 0; ; ) {
    const { bytesRead } = await handle.read(buffer, 0, CHUNK_SIZE, position);
    if (bytesRead === 0) break;
    position += bytesRead;
    const chunk = buffer.subarray(0, bytesRead);
    if (chunk.includes(0)) throw errors.binary(path, size);
    lastByte = chunk[bytesRead - 1]!;
    let start = 0;
    // Outside the window, lines are counted, not decoded.
    for (let newline = chunk.indexOf(10); (index < offset || index >= end) && newline !== -1; newline = chunk.indexOf(10, start)) {
      index++;
      start = newline + 1;
      carry = [];
    }
    if (index < offset || index >= end) continue;
    const last = chunk.lastIndexOf(10);
    if (last >= start) {
      take([...carry, chunk.subarray(start, last + 1)]);
      carry = [];
      start = last + 1;
    }
    if (start < bytesRead && index < end) carry.push(Buffer.from(chunk.subarray(start))); // copied: the buffer is reused
  }
  if (carry.length > 0) take(carry);
  else if (lastByte !== 10) index++; // an unterminated last line outside the window
  checkOffset(offset, index, path);
  return { lines, totalLines: index };
}

export interface Needle {
  text: string;
  /** The pattern's UTF-8 bytes: a file without them cannot match, so it is not decoded. */
  bytes: Buffer;
  /** Most matches one file needs to contribute. */
  limit: number;
}

/**
 * grep of one file through its directory fd, appending to `out`. Small
 * files are read synchronously (see Slicer in safe-fs.ts) and searched
 * whole; large ones stream (the promise returned, which owns the open file,
 * so the directory fd may close meanwhile). A NUL or invalid UTF-8 anywhere
 * makes the file binary: it is skipped. So is a file that vanished or
 * became a symlink since it was listed.
 */
export function grepFile(dirFd: number, name: string, path: string, needle: Needle, out: GrepMatch[]): void | Promise<void> {
  let fd: number;
  try {
    fd = openSync(at(dirFd, name), READ_FLAGS);
  } catch {
    return;
  }
  let handedOver = false;
  try {
    const stat = fstatSync(fd);
    keepShape(stat);
    if (!stat.isFile()) return;
    if (stat.size > WHOLE_FILE_LIMIT) {
      handedOver = true;
      return grepLargeFile(fd, path, needle, out);
    }
    const bytes = Buffer.allocUnsafe(stat.size);
    let length = 0;
    for (let n = 1; n > 0 && length < stat.size; length += n) n = readSync(fd, bytes, length, stat.size - length, length);
    const content = bytes.subarray(0, length);
    if (content.indexOf(needle.bytes) === -1) return;
    const text = decodeText(content);
    if (text !== null) grepText(path, text, needle.text, out, needle.limit);
  } catch {
    // Unreadable: nothing to report.
  } finally {
    if (!handedOver) closeSync(fd);
  }
}

function readAt(fd: number, buffer: Buffer, position: number): Promise<number> {
  return new Promise((resolve, reject) => read(fd, buffer, 0, buffer.length, position, (error, bytesRead) => (error ? reject(error) : resolve(bytesRead))));
}

/** grep of a file over the whole-file limit (its fd owned and closed here), in pieces cut at line ends, line numbers carried over. */
async function grepLargeFile(fd: number, path: string, needle: Needle, out: GrepMatch[]): Promise<void> {
  const found: GrepMatch[] = [];
  let firstLine = 1;
  const search = (parts: Buffer[]): boolean => {
    const text = decodeLines(parts);
    if (text === null) return false;
    const piece: GrepMatch[] = [];
    grepText(path, text, needle.text, piece, needle.limit - found.length);
    for (const match of piece) found.push({ ...match, line: match.line + firstLine - 1 });
    for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) firstLine++;
    return true;
  };
  try {
    const buffer = Buffer.allocUnsafe(CHUNK_SIZE);
    let carry: Buffer[] = [];
    for (let position = 0; ; ) {
      const bytesRead = await readAt(fd, buffer, position);
      if (bytesRead === 0) break;
      position += bytesRead;
      const chunk = buffer.subarray(0, bytesRead);
      if (chunk.includes(0)) return;
      const last = chunk.lastIndexOf(10);
      if (last === -1) {
        carry.push(Buffer.from(chunk));
        continue;
      }
      if (!search([...carry, chunk.subarray(0, last + 1)])) return;
      carry = last + 1 < bytesRead ? [Buffer.from(chunk.subarray(last + 1))] : [];
    }
    if (carry.length === 0 || search(carry)) out.push(...found);
  } catch {
    // Unreadable midway: nothing to report.
  } finally {
    closeSync(fd);
  }
}

let ripgrepLookup: Promise<string | undefined> | undefined;

/** The `rg` executable on PATH, looked up once per process. */
export function ripgrepPath(): Promise<string | undefined> {
  ripgrepLookup ??= Promise.resolve(findOnPath("rg", { accept: isExecutable }));
  return ripgrepLookup;
}

/**
 * Calls `visit` with the relative path of each file under `dir` that
 * ripgrep says contains `pattern`, as rg finds them (so checking them
 * overlaps rg's search). False when rg could not run or failed midway: the
 * caller then walks in JS. rg runs in the directory itself (cwd is our fd's
 * /proc entry, not a path), never follows links, reads no ignore or config
 * files, and compares raw bytes (`-E none`: no BOM sniffing or
 * transcoding), so it cannot miss a file grepText would match.
 */
export async function ripgrepCandidates(dir: FileHandle, pattern: string, visit: (relative: string) => void | Promise<void>): Promise<boolean> {
  const rg = await ripgrepPath();
  if (!rg) return false;
  const args = ["--files-with-matches", "--null", "--fixed-strings", "--hidden", "--no-ignore", "--no-config", "--no-messages", "-E", "none"];
  let child: ReturnType<typeof spawn>;
  try {
    child = childProcess().spawn(rg, [...args, "-e", pattern, "--", "."], { cwd: at(dir), stdio: ["ignore", "pipe", "ignore"] });
  } catch {
    return false; // an argument rg cannot be given (too long, a NUL): the JS walk answers instead
  }
  const exit = new Promise<number | null>((resolve) => {
    child.on("error", () => resolve(null));
    child.on("close", resolve);
  });
  try {
    let rest: Buffer = Buffer.alloc(0);
    for await (const chunk of child.stdout as AsyncIterable<Buffer>) {
      const data = rest.length > 0 ? Buffer.concat([rest, chunk]) : chunk;
      let start = 0;
      for (let end = data.indexOf(0); end !== -1; end = data.indexOf(0, start)) {
        const name = data.toString("utf8", start, end);
        start = end + 1;
        const pending = visit(name.startsWith("./") ? name.slice(2) : name);
        if (pending) await pending;
      }
      rest = data.subarray(start);
    }
  } catch (error) {
    child.kill();
    throw error;
  }
  const code = await exit;
  return code === 0 || code === 1;
}
