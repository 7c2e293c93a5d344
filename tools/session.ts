/**
 * ToolSession: the state of one agent run (one MCP session) over a backend.
 *
 * - The stale-file guard. Reading a file, even a window of it, records a
 *   hash of the whole file; an edit or an overwrite of a file never read in
 *   this session, or changed since it was read, is refused with a message
 *   telling the model to read it again. The tools' own writes refresh the
 *   hash. Changes of one path by this session's tools run one at a time, so
 *   parallel tool calls on one file cannot lose each other's edits.
 * - Output budgets. Every tool's text is held to `maxOutputChars`; a longer
 *   result is written to the workspace under `/.strata/evicted/` (the
 *   sandbox's workspace root for a sandbox) and replaced by a head/tail
 *   preview naming that file. When the write fails (a read-only workspace)
 *   the preview says how much was cut and nothing is written.
 */
import { printable } from "../core/errors.js";
import { fileDataBytes } from "../core/filedata.js";
import { isWithin, joinPath, normalizePath } from "../core/paths.js";
import type { Backend } from "../core/protocol.js";
import type { FileData } from "../core/types.js";
import type { ToolOutput } from "./define.js";

/** About 20k tokens at ~4 characters a token (deepagents evicts at about 20k tokens). */
export const DEFAULT_MAX_OUTPUT_CHARS = 80_000;
/** Where evicted results go, relative to the backend's root. */
export const EVICTED_DIR = ".strata/evicted";

export interface ToolSessionOptions {
  /** Characters of text a tool may answer before it is evicted (or cut). Default 80,000 (about 20k tokens). */
  maxOutputChars?: number;
  /** Characters kept from each end of an evicted result in its preview. Default 2,000 (at most a quarter of the budget). */
  previewChars?: number;
  /** Write over-budget results to the workspace (default true); false only cuts them. */
  evict?: boolean;
}

export class ToolSession {
  readonly backend: Backend;
  /** Where the backend's path space starts: "/" or a sandbox's workspace. */
  readonly root: string;
  readonly maxOutputChars: number;
  readonly previewChars: number;
  /** The directory evicted results go to. */
  readonly evictionDir: string;
  private readonly evict: boolean;
  /** Path (as the backend answers it) → hash of the whole file as this session last saw it. */
  private readonly seen = new Map<string, string>();
  private readonly locks = new Map<string, Promise<unknown>>();
  private evicted = 0;

  constructor(backend: Backend, options: ToolSessionOptions = {}) {
    this.backend = backend;
    const root = (backend as { root?: unknown }).root;
    this.root = typeof root === "string" ? normalizePath(root) : "/";
    const max = options.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
    if (!Number.isInteger(max) || max < 200) throw new RangeError("maxOutputChars must be an integer of at least 200");
    this.maxOutputChars = max;
    this.previewChars = Math.min(options.previewChars ?? 2_000, Math.floor(max / 4));
    this.evict = options.evict ?? true;
    this.evictionDir = joinPath(this.root, EVICTED_DIR);
  }

  // ---- the stale-file guard ----

  /** Records that the model has seen this version of the file. */
  async remember(path: string, data: FileData | Uint8Array | string): Promise<void> {
    this.seen.set(path, await hashOf(data));
  }

  /** Forgets a path (a read whose hash could not be taken: the next change asks for a fresh read). */
  forget(path: string): void {
    this.seen.delete(path);
  }

  /** Marks what the model saw as out of date (the file changed under one of this session's own edits). */
  invalidate(path: string): void {
    this.seen.set(path, "");
  }

  /** Whether this session has recorded a read (or its own write) of this path. */
  hasRead(path: string): boolean {
    return this.seen.has(path);
  }

  /**
   * Null when the file's current content is the version the model read;
   * otherwise the message that refuses the change.
   */
  async staleReason(path: string, current: FileData, action: "edit" | "overwrite"): Promise<string | null> {
    const known = this.seen.get(path);
    const verb = action === "edit" ? "editing" : "overwriting";
    if (known === undefined) {
      return `File '${printable(path)}' has not been read in this session. Read it with read_file before ${verb} it`;
    }
    if (known !== (await hashOf(current))) {
      return `File '${printable(path)}' has changed since you last read it. Read it again with read_file before ${verb} it`;
    }
    return null;
  }

  /** Runs `fn` after every earlier change of `path` by this session has finished. */
  async exclusive<T>(path: string, fn: () => Promise<T>): Promise<T> {
    const before = this.locks.get(path) ?? Promise.resolve();
    const run = before.then(fn, fn);
    const settled = run.then(
      () => undefined,
      () => undefined,
    );
    this.locks.set(path, settled);
    try {
      return await run;
    } finally {
      if (this.locks.get(path) === settled) this.locks.delete(path);
    }
  }

  // ---- output budgets ----

  /** Whether a path is one of this session's (or another's) evicted results. */
  isEvicted(path: string): boolean {
    return isWithin(this.evictionDir, path);
  }

  /**
   * Holds a tool's answer to the budget: within it, unchanged; over it,
   * written to `<evictionDir>/<tool>-<n>.txt` and replaced by a head/tail
   * preview with the path, or only cut when that write fails.
   */
  async budget(tool: string, output: ToolOutput): Promise<ToolOutput> {
    const { text } = output;
    if (text.length <= this.maxOutputChars) return output;
    const saved = this.evict ? await this.saveEvicted(tool, text) : null;
    const head = cutAtLine(text.slice(0, this.previewChars), "head");
    const tail = cutAtLine(text.slice(text.length - this.previewChars), "tail");
    const omitted = text.length - head.length - tail.length;
    const marker = saved
      ? `[… output truncated: ${omitted} of ${text.length} characters omitted. The full output is in '${printable(saved)}'; read it with read_file (offset/limit) or search it with grep …]`
      : `[… output truncated: ${omitted} of ${text.length} characters omitted (over the ${this.maxOutputChars}-character output budget); narrow the request to see the rest …]`;
    return { ...output, text: `${head}\n${marker}\n${tail}` };
  }

  private async saveEvicted(tool: string, text: string): Promise<string | null> {
    for (let attempt = 0; attempt < 20; attempt++) {
      const path = joinPath(this.evictionDir, `${tool}-${++this.evicted}.txt`);
      // Create-only: another session's result at the same name is never replaced.
      const written = await this.backend.write(path, text);
      if (!written.error) return written.path;
      if (written.error.code !== "already_exists") return null;
    }
    return null;
  }
}

/** SHA-256 of the file's bytes (Web Crypto, global in Node 20 and every browser), hex. */
export async function hashOf(data: FileData | Uint8Array | string): Promise<string> {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data instanceof Uint8Array ? data : fileDataBytes(data);
  const digest = await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>);
  let hex = "";
  for (const byte of new Uint8Array(digest)) hex += byte.toString(16).padStart(2, "0");
  return hex;
}

/** Trims a preview slice to whole lines when a line break is near enough (and never splits a surrogate pair). */
function cutAtLine(slice: string, end: "head" | "tail"): string {
  if (end === "head") {
    if (/[\ud800-\udbff]$/.test(slice)) slice = slice.slice(0, -1);
    const at = slice.lastIndexOf("\n");
    return at > slice.length / 2 ? slice.slice(0, at) : slice;
  }
  if (/^[\udc00-\udfff]/.test(slice)) slice = slice.slice(1);
  const at = slice.indexOf("\n");
  return at !== -1 && at < slice.length / 2 ? slice.slice(at + 1) : slice;
}
