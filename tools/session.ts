/**
 * ToolSession: the state of one agent run (one MCP session) over a backend.
 *
 * - Ownership. A session made over a SandboxHandle holds one reference to
 *   it (OpenRath's rule: every session slot owns one reference). Making the
 *   session acquires; `end()` (or `await using`) releases once, after the
 *   tool calls in flight have finished; `fork()` makes a session with its own
 *   reference; `detach(registry)` records the sandbox in the persistent
 *   registry and lets go without destroying it, so a later process can
 *   reattach. The sandbox closes when the last session lets go. A session
 *   over a plain Backend owns nothing and ending it only stops its tools.
 * - The stale-file guard. Reading a file, even a window of it, records a
 *   hash of the whole file; an edit or an overwrite of a file never read in
 *   this session, or changed since it was read, is refused with a message
 *   telling the model to read it again. The tools' own writes refresh the
 *   hash. Changes of one path run one at a time across every session over
 *   the same backend in this process, so parallel tool calls (or two agents)
 *   cannot lose each other's edits: the second one's check sees the first
 *   one's write.
 * - Output budgets. Every tool's text is held to `maxOutputChars`; a longer
 *   result is written to the workspace under `.strata/evicted/` (the
 *   sandbox's workspace root for a sandbox) and replaced by a head/tail
 *   preview naming that file. When the write fails (a read-only workspace)
 *   the session keeps the result in memory under the same kind of path, and
 *   read_file pages it from there.
 */
import { StrataError, printable } from "../core/errors.js";
import { fileDataBytes, fileDataText } from "../core/filedata.js";
import { isWithin, joinPath, normalizePath } from "../core/paths.js";
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import type { FileData } from "../core/types.js";
import { SandboxHandle } from "../runtime/handle.js";
import type { PersistentSandboxRegistry, RemoteSandboxRecord } from "../runtime/persistence.js";
import type { ToolOutput } from "./define.js";

/** About 20k tokens at ~4 characters a token (deepagents evicts at about 20k tokens). */
export const DEFAULT_MAX_OUTPUT_CHARS = 80_000;
/** Where evicted results go, relative to the backend's root. */
export const EVICTED_DIR = ".strata/evicted";
/** Characters of evicted results one session keeps in memory when the workspace refuses the write; the oldest go first. */
export const MAX_HELD_CHARS = 16 * 1024 * 1024;

export interface ToolSessionOptions {
  /** Characters of text a tool may answer before it is evicted (or cut). Default 80,000 (about 20k tokens). */
  maxOutputChars?: number;
  /** Characters kept from each end of an evicted result in its preview. Default 2,000 (at most a quarter of the budget). */
  previewChars?: number;
  /** Keep over-budget results whole, in the workspace or else in memory (default true); false only cuts them. */
  evict?: boolean;
}

export interface ForkOptions {
  /**
   * Whether the fork starts knowing what its parent read (default true: a
   * fork continues the parent's conversation, so its model has seen those
   * files). The hashes are copied, not shared: a file the parent changes
   * after the fork is stale for the fork until it reads it again. False for a
   * subagent that starts with a fresh context and must read before it edits.
   */
  inheritReads?: boolean;
}

/** Process-wide state of one backend, shared by every session over it. */
interface BackendState {
  /** Path → the last change queued on it. */
  locks: Map<string, Promise<unknown>>;
  /** The last number used in an evicted result's name. */
  evicted: number;
}
const backendStates = new WeakMap<Backend, BackendState>();
function stateOf(backend: Backend): BackendState {
  let state = backendStates.get(backend);
  if (!state) backendStates.set(backend, (state = { locks: new Map(), evicted: 0 }));
  return state;
}

/**
 * Whether `target` is a runtime SandboxHandle rather than a Backend: by class,
 * or by shape when two copies of the package are loaded (a bundler's dual
 * package), so a handle is never mistaken for a backend.
 */
export function isSandboxHandle(target: unknown): target is SandboxHandle {
  if (target instanceof SandboxHandle) return true;
  const candidate = target as Partial<Record<"acquire" | "release" | "detach" | "dispatch", unknown>> | null;
  return (
    typeof candidate === "object" &&
    candidate !== null &&
    typeof candidate.acquire === "function" &&
    typeof candidate.release === "function" &&
    typeof candidate.detach === "function" &&
    typeof candidate.dispatch === "function" &&
    "refcount" in candidate
  );
}

/** Handles a session detached: the last session to let go of one leaves it running instead of closing it. */
const detachedHandles = new WeakSet<SandboxHandle>();

export class ToolSession implements AsyncDisposable {
  readonly backend: Backend;
  /** The handle this session holds one reference to; undefined over a plain Backend. */
  readonly handle: SandboxHandle | undefined;
  /** Where the backend's path space starts: "/" or a sandbox's workspace. */
  readonly root: string;
  readonly maxOutputChars: number;
  readonly previewChars: number;
  /** The directory evicted results go to. */
  readonly evictionDir: string;
  private readonly evict: boolean;
  private readonly options: ToolSessionOptions;
  /** Path (as the backend answers it) → hash of the whole file as this session last saw it. */
  private readonly seen = new Map<string, string>();
  /** Evicted results kept in memory (the workspace refused the write): path → text, oldest first. */
  private readonly held = new Map<string, string>();
  private heldChars = 0;
  private readonly shared: BackendState;
  private readonly inFlight = new Set<Promise<unknown>>();
  private ending: Promise<void> | undefined;

  /**
   * A session over `target`. Given a SandboxHandle it acquires one reference
   * (and throws BackendSandboxClosed if the handle is already closed); end
   * the session to give it back.
   */
  constructor(target: Backend | SandboxHandle, options: ToolSessionOptions = {}) {
    const max = options.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
    if (!Number.isInteger(max) || max < 200) throw new RangeError("maxOutputChars must be an integer of at least 200");
    // A closed handle throws here (its sandbox getter), before anything is owned.
    const handle = isSandboxHandle(target) ? target : undefined;
    this.backend = handle ? handle.sandbox : (target as Backend);
    const root = (this.backend as { root?: unknown }).root;
    this.root = typeof root === "string" ? normalizePath(root) : "/";
    this.options = { ...options };
    this.maxOutputChars = max;
    this.previewChars = Math.min(options.previewChars ?? 2_000, Math.floor(max / 4));
    this.evict = options.evict ?? true;
    this.evictionDir = joinPath(this.root, EVICTED_DIR);
    this.shared = stateOf(this.backend);
    // Acquired last, when nothing else can throw, so a failed construction never leaks a reference.
    this.handle = handle?.acquire();
  }

  // ---- ownership ----

  /** Whether `end()` or `detach()` has been called. */
  get ended(): boolean {
    return this.ending !== undefined;
  }

  /**
   * Why a tool call cannot run now (the session ended, or its sandbox was
   * closed under it by a lifetime limit or a forced close), or null.
   */
  unusableReason(): string | null {
    if (this.ending) return "This tool session has ended; its tools can no longer be used. Start a new session to keep working";
    if (this.handle?.closed) return `The sandbox '${printable(this.handle.id)}' has been closed; its tools can no longer be used. Start a new session on another sandbox`;
    return null;
  }

  /** Runs one tool call, counted so that `end()` waits for it before letting the sandbox go. */
  async track<T>(call: () => Promise<T>): Promise<T> {
    const running = call();
    this.inFlight.add(running);
    try {
      return await running;
    } finally {
      this.inFlight.delete(running);
    }
  }

  /** The sandbox, for tools that run commands; throws when the backend cannot run them. */
  requireSandbox(): Sandbox {
    const reason = this.unusableReason();
    if (reason) throw new StrataError("sandbox_closed", reason);
    if (!isSandbox(this.backend)) throw new StrataError("unsupported", "This workspace cannot run commands");
    return this.backend;
  }

  /**
   * Ends the session: later tool calls answer an error, the calls in flight
   * finish, then its reference is given back (the last one closes the
   * sandbox, or leaves it running when a session detached it). Idempotent;
   * never throws for a sandbox already closed under it.
   */
  end(): Promise<void> {
    this.ending ??= this.letGo();
    return this.ending;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.end();
  }

  /**
   * A new session over the same backend with its own reference to the
   * sandbox, so it may outlive this one; same options. See ForkOptions for
   * what it inherits of the stale-file guard. Evicted results this session
   * keeps in memory stay readable from the fork.
   */
  fork(options: ForkOptions & ToolSessionOptions = {}): ToolSession {
    const reason = this.unusableReason();
    if (reason) throw new StrataError("sandbox_closed", reason);
    const { inheritReads = true, ...sessionOptions } = options;
    const child = new ToolSession(this.handle ?? this.backend, { ...this.options, ...sessionOptions });
    if (inheritReads) for (const [path, hash] of this.seen) child.seen.set(path, hash);
    for (const [path, text] of this.held) child.hold(path, text);
    return child;
  }

  /**
   * Records the sandbox in `registry` (under `options.id`, else a fresh id)
   * and ends this session without destroying the sandbox: when the last
   * session over it lets go, the handle is detached (disconnected, the
   * container or workspace left running) instead of closed, and a later
   * process finds it again with `registry.reattach(record.id)`. Throws, and
   * the session stays usable, when the sandbox cannot outlive its process
   * (local and bubblewrap sandboxes have no remote id).
   */
  async detach(registry: PersistentSandboxRegistry, options: { id?: string } = {}): Promise<RemoteSandboxRecord> {
    if (!this.handle) throw new StrataError("unsupported", "Only a session made over a SandboxHandle can detach its sandbox");
    const reason = this.unusableReason();
    if (reason) throw new StrataError("sandbox_closed", reason);
    const record = await registry.recordHandle(this.handle, options);
    detachedHandles.add(this.handle);
    await this.end();
    return record;
  }

  private async letGo(): Promise<void> {
    await Promise.allSettled([...this.inFlight]);
    this.held.clear();
    this.heldChars = 0;
    const handle = this.handle;
    // Closed under the session (a lifetime limit, a forced close): nothing left to give back.
    if (!handle || handle.closed) return;
    // The check and the release happen in one synchronous step, so sessions ending at once cannot both see the last reference.
    if (detachedHandles.has(handle) && handle.refcount === 1) await handle.detach();
    else await handle.release();
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

  /** Runs `fn` after every earlier change of `path` by any session over this backend (in this process) has finished. */
  async exclusive<T>(path: string, fn: () => Promise<T>): Promise<T> {
    const locks = this.shared.locks;
    const before = locks.get(path) ?? Promise.resolve();
    const run = before.then(fn, fn);
    const settled = run.then(
      () => undefined,
      () => undefined,
    );
    locks.set(path, settled);
    try {
      return await run;
    } finally {
      if (locks.get(path) === settled) locks.delete(path);
    }
  }

  // ---- output budgets ----

  /** Whether a path is one of the evicted results (this session's or another's), or their directory. */
  isEvicted(path: string): boolean {
    return isWithin(this.evictionDir, path);
  }

  /**
   * Whether a listing or search asks for evicted results: its directory is
   * (inside) the eviction directory, or its pattern names that directory.
   * Otherwise they are tool artefacts, left out as noise.
   */
  asksForEvicted(directory: string, pattern?: string): boolean {
    return this.isEvicted(directory) || (pattern !== undefined && pattern.includes(EVICTED_DIR));
  }

  /** An evicted result this session keeps in memory (the workspace refused the write), by its path. */
  heldResult(path: string): string | undefined {
    return this.held.get(path);
  }

  /**
   * Holds a tool's answer to the budget: within it, unchanged; over it, the
   * full text is kept (written to `<evictionDir>/<tool>-<n>.txt`, or held in
   * this session's memory under that path when the write fails) and the
   * answer becomes a head/tail preview naming the path. With `evict: false`
   * the text is only cut.
   */
  async budget(tool: string, output: ToolOutput): Promise<ToolOutput> {
    const { text } = output;
    if (text.length <= this.maxOutputChars) return output;
    const head = cutAtLine(text.slice(0, this.previewChars), "head");
    const tail = cutAtLine(text.slice(text.length - this.previewChars), "tail");
    const omitted = text.length - head.length - tail.length;
    const cut = `[… output truncated: ${omitted} of ${text.length} characters omitted`;
    let marker: string;
    if (!this.evict) {
      marker = `${cut} (over the ${this.maxOutputChars}-character output budget); narrow the request to see the rest …]`;
    } else {
      const { path, saved } = await this.saveEvicted(tool, text);
      if (saved) {
        marker = `${cut}. The full output is in '${printable(path)}'; read it with read_file (offset/limit) or search it with grep …]`;
      } else {
        this.hold(path, text);
        marker = `${cut}. The workspace could not store it, so this session keeps the full output in memory as '${printable(path)}'; read it with read_file (offset/limit) …]`;
      }
    }
    return { ...output, text: `${head}\n${marker}\n${tail}` };
  }

  private hold(path: string, text: string): void {
    this.held.set(path, text);
    this.heldChars += text.length;
    // Oldest first out, but the newest is always kept.
    for (const [old, kept] of this.held) {
      if (this.heldChars <= MAX_HELD_CHARS || old === path) break;
      this.held.delete(old);
      this.heldChars -= kept.length;
    }
  }

  /** Writes the result under a fresh name; when the workspace refuses, answers the name it tried (saved: false). */
  private async saveEvicted(tool: string, text: string): Promise<{ path: string; saved: boolean }> {
    let rescanned = false;
    let path = "";
    for (let attempt = 0; attempt < 5; attempt++) {
      const n = ++this.shared.evicted;
      if (n === 1) await this.markAsArtefacts();
      path = joinPath(this.evictionDir, `${safeName(tool)}-${n}.txt`);
      // Create-only: another session's (or an earlier process's) result at the same name is never replaced.
      const written = await this.backend.write(path, text).catch(() => null);
      if (written === null) return { path, saved: false }; // a backend that throws: keep the result in memory
      if (!written.error) return { path: written.path, saved: true };
      if (written.error.code !== "already_exists") return { path, saved: false };
      if (!rescanned) {
        // An earlier process left results here: continue after the highest number there.
        rescanned = true;
        const listing = await this.backend.ls(this.evictionDir).catch(() => null);
        for (const entry of listing?.entries ?? []) {
          const number = /-(\d+)\.txt$/.exec(entry.path)?.[1];
          if (number !== undefined) this.shared.evicted = Math.max(this.shared.evicted, Number(number));
        }
      }
    }
    return { path: joinPath(this.evictionDir, `${safeName(tool)}-${++this.shared.evicted}.txt`), saved: false };
  }

  /** A `.gitignore` of `*` in the eviction directory keeps its results out of diffs and commits. */
  private async markAsArtefacts(): Promise<void> {
    await this.backend.write(joinPath(this.evictionDir, ".gitignore"), "# Strata's evicted tool results: artefacts, never committed\n*\n").catch(() => null);
  }
}

/** A tool name as a file-name part (a custom tool's name may hold anything). */
function safeName(tool: string): string {
  return tool.replace(/[^A-Za-z0-9_.-]/g, "_").slice(0, 64) || "tool";
}

/** Node's hashing, where the runtime offers it (Node 20.16+, read without a `node:` import so the tools still load in a browser). */
interface NodeCrypto {
  createHash(algorithm: "sha256"): { update(data: Uint8Array | string): { digest(encoding: "hex"): string } };
}
const nodeCrypto = (globalThis as { process?: { getBuiltinModule?: (id: string) => unknown } }).process?.getBuiltinModule?.("node:crypto") as NodeCrypto | undefined;

/**
 * SHA-256 of the file's bytes, hex. Node's hash runs in this thread at once
 * (a file the model reads is small; Web Crypto's round trip through the
 * thread pool costs more than hashing it); elsewhere Web Crypto, global in
 * every browser. Text is hashed as its UTF-8 bytes either way.
 */
export async function hashOf(data: FileData | Uint8Array | string): Promise<string> {
  const input = typeof data === "string" || data instanceof Uint8Array ? data : (fileDataText(data) ?? fileDataBytes(data));
  if (nodeCrypto) return nodeCrypto.createHash("sha256").update(input).digest("hex");
  const bytes = typeof input === "string" ? new TextEncoder().encode(input) : input;
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
