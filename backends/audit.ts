import type { ErrorCode } from "../core/errors.js";
import { compileGlob, type GlobMatcher } from "../core/glob.js";
import { isWithin, normalizePath } from "../core/paths.js";
import type { Backend, Sandbox } from "../core/protocol.js";
import { isSandbox } from "../core/protocol.js";
import type {
  DownloadItem,
  EditOptions,
  ExecuteOptions,
  GlobOptions,
  GrepOptions,
  MkdirOptions,
  OperationOptions,
  ReadOptions,
  Result,
  SpawnOptions,
  SpawnedProcess,
  TransferOptions,
  WriteOptions,
} from "../core/types.js";
import type { Namespace, Store } from "../stores/store.js";

/** What the caller says about who asked for an operation: a tool-call id, a user, a run. Stored as given (keep it JSON). */
export type AuditContext = Readonly<Record<string, string | number | boolean | null>>;

/** One operation, as it happened. */
export interface AuditRecord {
  /** Order of recording within one audited wrapper (and its `withContext` views). */
  seq: number;
  /** The native operation's name (`write`, `execute`, …); `spawn.exit` when a spawned command ends. */
  operation: string;
  /** The path(s) the operation names, as the caller gave them; a search's `path` option (default `/`). */
  paths: string[];
  /** Bytes the operation carried: written (write, edit's new string, upload) or read back (read, readRaw, download, execute's output). */
  bytes?: number;
  /** Items in the answer: entries of a listing or glob, grep matches, upload/download items. */
  count?: number;
  /** The shell command of `execute` and `spawn`. */
  command?: string;
  /** `execute`'s and a spawned command's exit code. */
  exitCode?: number | null;
  ok: boolean;
  /** The error code when `ok` is false (`thrown` when the backend broke the contract and threw). */
  code?: ErrorCode | "thrown";
  /** Start of the operation, milliseconds since the epoch. */
  time: number;
  /** How long the operation took, in milliseconds. */
  durationMs: number;
  context?: AuditContext;
}

/** Where records go. `append` may be slow or fail: the audited backend never waits for it and never lets it change an answer. */
export interface AuditSink {
  append(record: AuditRecord): void | Promise<void>;
}

/** Filters of `query`; all given ones must hold. */
export interface AuditQuery {
  /** A path or directory: records naming it or anything under it. */
  path?: string;
  /** Records naming a path matching this glob (the `glob` operation's dialect, absolute). */
  glob?: string;
  /** Records that started at or after this time (ms since the epoch, or a Date). */
  from?: number | Date;
  /** Records that started before this time (exclusive). */
  to?: number | Date;
  operation?: string;
  /** Records whose context holds each of these key/value pairs. */
  context?: AuditContext;
}

/** A sink that can answer queries. */
export interface AuditLog extends AuditSink {
  query(query?: AuditQuery): Promise<AuditRecord[]>;
}

const timeOf = (value: number | Date | undefined) => (value instanceof Date ? value.getTime() : value);

/** The filter of a query, as a predicate (stores use it after narrowing by time). */
export function auditFilter(query: AuditQuery = {}): (record: AuditRecord) => boolean {
  const from = timeOf(query.from);
  const to = timeOf(query.to);
  const under = query.path === undefined ? undefined : normalizePath(query.path);
  const matcher: GlobMatcher | undefined = query.glob === undefined ? undefined : compileGlob(query.glob, "/");
  const normal = (path: string) => {
    try {
      return normalizePath(path);
    } catch {
      return undefined;
    }
  };
  return (record) => {
    if (from !== undefined && record.time < from) return false;
    if (to !== undefined && record.time >= to) return false;
    if (query.operation !== undefined && record.operation !== query.operation) return false;
    if (query.context) {
      for (const [key, value] of Object.entries(query.context)) if (record.context?.[key] !== value) return false;
    }
    if (under !== undefined || matcher) {
      const paths = record.paths.map(normal).filter((p): p is string => p !== undefined);
      if (under !== undefined && !paths.some((p) => isWithin(under, p))) return false;
      if (matcher && !paths.some((p) => matcher(p))) return false;
    }
    return true;
  };
}

/** Records kept in memory, in order; `maxRecords` keeps only the newest (the oldest are dropped first). */
export class MemoryAuditLog implements AuditLog {
  readonly records: AuditRecord[] = [];
  /** Records let go because `maxRecords` was reached. */
  dropped = 0;
  constructor(private readonly options: { maxRecords?: number } = {}) {}

  append(record: AuditRecord): void {
    this.records.push(record);
    const max = this.options.maxRecords;
    if (max !== undefined && this.records.length > max) {
      this.dropped += this.records.length - max;
      this.records.splice(0, this.records.length - max);
    }
  }

  async query(query?: AuditQuery): Promise<AuditRecord[]> {
    return this.records.filter(auditFilter(query));
  }
}

const TIME_DIGITS = 15;
const pad = (n: number, digits: number) => String(n).padStart(digits, "0");

/**
 * Records in a Store namespace, one key per record: `/<start ms>-<seq>-<writer>`,
 * so keys sort by time and a time-range query reads only its window. A path
 * query reads that window and filters (the store has no index on paths).
 * Records survive a restart where the store does (SQLite, PostgreSQL, Redis).
 */
export class StoreAuditLog implements AuditLog {
  /** Tells apart writers sharing a namespace, so two never pick one key. */
  private readonly writer = Math.random().toString(36).slice(2, 10);
  private next = 0;
  constructor(
    readonly store: Store,
    readonly namespace: Namespace = ["audit"],
  ) {}

  async append(record: AuditRecord): Promise<void> {
    const key = `/${pad(record.time, TIME_DIGITS)}-${pad(this.next++, 9)}-${this.writer}`;
    const now = new Date(record.time).toISOString();
    await this.store.put(this.namespace, key, { content: JSON.stringify(record), encoding: "utf-8", created_at: now, modified_at: now }, { expectedVersion: null });
  }

  async query(query: AuditQuery = {}): Promise<AuditRecord[]> {
    const filter = auditFilter(query);
    const from = timeOf(query.from);
    const to = timeOf(query.to);
    const found: AuditRecord[] = [];
    let after: string | undefined = from === undefined ? undefined : `/${pad(Math.max(0, from - 1), TIME_DIGITS)}~`;
    const end = to === undefined ? undefined : `/${pad(Math.max(0, to), TIME_DIGITS)}`;
    for (;;) {
      const page = await this.store.list(this.namespace, after === undefined ? {} : { after });
      for (const item of page.items) {
        if (end !== undefined && item.key >= end) return found;
        const stored = await this.store.get(this.namespace, item.key);
        if (!stored || !("encoding" in stored.value)) continue;
        const record = JSON.parse(stored.value.content) as AuditRecord;
        if (filter(record)) found.push(record);
      }
      if (!page.next) return found;
      after = page.next;
    }
  }
}

/** How an audited wrapper is doing with its sink. */
export interface AuditStats {
  /** Records the sink accepted. */
  recorded: number;
  /** Appends that threw or rejected (each such record waits in the backlog for `flush`). */
  failed: number;
  /** Records lost because the backlog was full (the oldest go first). */
  dropped: number;
  /** Records waiting in the backlog. */
  backlog: number;
  /** Appends started and not yet settled. */
  inFlight: number;
}

export interface AuditOptions {
  /** Where records go: a MemoryAuditLog, a StoreAuditLog, or any sink. */
  log: AuditSink;
  /** Context stamped on every record of this wrapper (a `withContext` view replaces it). */
  context?: AuditContext;
  /** Records kept for a retry after the sink failed them; beyond it the oldest are dropped and counted. Default 10,000. */
  maxBacklog?: number;
}

/** Shared by a wrapper and its `withContext` views: one order, one backlog, one set of counts. */
export class AuditRecorder {
  seq = 0;
  readonly stats: AuditStats = { recorded: 0, failed: 0, dropped: 0, backlog: 0, inFlight: 0 };
  private readonly backlog: AuditRecord[] = [];
  private readonly pending = new Set<Promise<void>>();
  constructor(
    private readonly sink: AuditSink,
    private readonly maxBacklog: number,
  ) {}

  /** Hands a record to the sink without waiting; a throw or rejection puts it in the backlog. */
  record(record: AuditRecord): void {
    let answer: void | Promise<void>;
    try {
      answer = this.sink.append(record);
    } catch {
      this.failedOne(record);
      return;
    }
    // Any thenable counts as asynchronous, not only a native Promise.
    if (typeof (answer as PromiseLike<void> | undefined)?.then !== "function") {
      this.stats.recorded++;
      return;
    }
    this.stats.inFlight++;
    const settled: Promise<void> = Promise.resolve(answer).then(
      () => void this.stats.recorded++,
      () => this.failedOne(record),
    ).finally(() => {
      this.stats.inFlight--;
      this.pending.delete(settled);
    });
    this.pending.add(settled);
  }

  private failedOne(record: AuditRecord): void {
    this.stats.failed++;
    this.backlog.push(record);
    if (this.backlog.length > this.maxBacklog) {
      this.backlog.shift();
      this.stats.dropped++;
    }
    this.stats.backlog = this.backlog.length;
  }

  /** Waits for appends under way, then offers the backlog to the sink once more (in order). A sink that never answers keeps it waiting. */
  async flush(): Promise<void> {
    while (this.pending.size > 0) await Promise.all([...this.pending]);
    const retry = this.backlog.splice(0);
    this.stats.backlog = 0;
    for (const record of retry) this.record(record);
    while (this.pending.size > 0) await Promise.all([...this.pending]);
  }
}

/** The size a result carries back, for the record. */
type Describe<T> = (value: T) => Partial<Pick<AuditRecord, "bytes" | "count" | "exitCode">>;

/** A path argument as recorded: never calls into the caller's value (a hostile `toString` cannot break the record). */
const named = (value: unknown): string => (typeof value === "string" ? value : `[${value === null ? "null" : typeof value}]`);

/** UTF-8 length without encoding the text (and without node's Buffer, so the wrapper runs anywhere). */
function utf8(text: unknown): number | undefined {
  if (typeof text !== "string") return undefined;
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit < 0x80) bytes += 1;
    else if (unit < 0x800) bytes += 2;
    else if (unit >= 0xd800 && unit < 0xdc00 && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}

/**
 * Any backend, with every operation recorded: name, path(s), sizes, result or
 * error code, start time, duration and the caller's context. The answer is
 * the wrapped backend's, untouched: the record is handed to the sink after
 * the operation settles and is never awaited, so a slow sink costs nothing
 * and a failing one changes nothing (its records wait in a backlog for
 * `flush`, counted in `stats`).
 */
export class AuditedBackend<B extends Backend = Backend> implements Backend {
  protected readonly recorder: AuditRecorder;

  constructor(
    readonly backend: B,
    protected readonly options: AuditOptions,
    recorder?: AuditRecorder,
  ) {
    this.recorder = recorder ?? new AuditRecorder(options.log, options.maxBacklog ?? 10_000);
  }

  get stats(): Readonly<AuditStats> {
    return { ...this.recorder.stats };
  }

  /** A view on the same backend and log whose records carry this context (a tool-call id, …). */
  withContext(context: AuditContext): AuditedBackend<B> {
    return new AuditedBackend(this.backend, { ...this.options, context }, this.recorder);
  }

  /** Waits for the sink to take every record handed to it, retrying failed ones once; never settles while the sink hangs. */
  flush(): Promise<void> {
    return this.recorder.flush();
  }

  protected async run<T>(
    operation: string,
    paths: string[],
    call: () => Promise<T>,
    describe?: Describe<T>,
    extra: Partial<AuditRecord> = {},
  ): Promise<T> {
    const time = Date.now();
    const start = performance.now();
    let answer: T;
    try {
      answer = await call();
    } catch (error) {
      this.note({ operation, paths, ok: false, code: "thrown", time, durationMs: performance.now() - start, ...extra });
      throw error;
    }
    const durationMs = performance.now() - start;
    // Describing the answer must not break it either: a failure there only thins the record.
    let details: Partial<AuditRecord> = {};
    const failed = (answer as { error?: { code?: ErrorCode } } | null)?.error;
    try {
      if (!failed && describe) details = describe(answer);
    } catch {
      details = {};
    }
    this.note({ operation, paths, time, durationMs, ...extra, ...details, ...(failed ? { ok: false, code: failed.code } : { ok: true }) });
    return answer;
  }

  protected note(record: Omit<AuditRecord, "seq" | "context">): void {
    const full: AuditRecord = { seq: this.recorder.seq++, ...record };
    if (this.options.context !== undefined) full.context = this.options.context;
    this.recorder.record(full);
  }

  /** What an omitted path means: the root here, a sandbox's workspace there. */
  protected get defaultPath(): string {
    return "/";
  }

  private searchPath(options: GrepOptions | undefined): string {
    const path: unknown = typeof options === "object" && options !== null ? options.path : undefined;
    return path === undefined || path === null ? this.defaultPath : named(path);
  }

  ls(path?: string, options?: OperationOptions) {
    return this.run("ls", [path === undefined ? this.defaultPath : named(path)], () => this.backend.ls(path, options), (r) => ({ count: r.entries?.length }));
  }
  read(path: string, options?: ReadOptions) {
    return this.run("read", [named(path)], () => this.backend.read(path, options), (r) => ({
      bytes: r.encoding === "binary" ? r.size : utf8(r.content),
    }));
  }
  readRaw(path: string, options?: OperationOptions) {
    return this.run("readRaw", [named(path)], () => this.backend.readRaw(path, options), (r) => ({ bytes: utf8(r.data?.content) }));
  }
  write(path: string, content: string, options?: WriteOptions) {
    return this.run("write", [named(path)], () => this.backend.write(path, content, options), undefined, { bytes: utf8(content) });
  }
  edit(path: string, oldString: string, newString: string, options?: EditOptions) {
    return this.run("edit", [named(path)], () => this.backend.edit(path, oldString, newString, options), (r) => ({ count: r.occurrences }), {
      bytes: utf8(newString),
    });
  }
  delete(path: string, options?: OperationOptions) {
    return this.run("delete", [named(path)], () => this.backend.delete(path, options));
  }
  grep(pattern: string, options?: GrepOptions) {
    return this.run("grep", [this.searchPath(options)], () => this.backend.grep(pattern, options), (r) => ({ count: r.matches?.length }));
  }
  glob(pattern: string, options?: GlobOptions) {
    return this.run("glob", [this.searchPath(options)], () => this.backend.glob(pattern, options), (r) => ({ count: r.entries?.length }));
  }
  stat(path: string, options?: OperationOptions) {
    return this.run("stat", [named(path)], () => this.backend.stat(path, options), (r) => ({ bytes: r.size }));
  }
  mkdir(path: string, options?: MkdirOptions) {
    return this.run("mkdir", [named(path)], () => this.backend.mkdir(path, options));
  }
  move(from: string, to: string, options?: TransferOptions) {
    return this.run("move", [named(from), named(to)], () => this.backend.move(from, to, options));
  }
  copy(from: string, to: string, options?: TransferOptions) {
    return this.run("copy", [named(from), named(to)], () => this.backend.copy(from, to, options));
  }
  uploadFiles(files: ReadonlyArray<readonly [string, Uint8Array]>, options?: OperationOptions) {
    const list = Array.isArray(files) ? files : [];
    const paths = list.map((item) => named(Array.isArray(item) ? item[0] : item));
    const bytes = list.reduce((sum, item) => sum + (Array.isArray(item) && item[1] instanceof Uint8Array ? item[1].byteLength : 0), 0);
    return this.run("uploadFiles", paths, () => this.backend.uploadFiles(files, options), (r) => ({ count: r.files?.length }), { bytes });
  }
  downloadFiles(paths: readonly string[], options?: OperationOptions) {
    const names = Array.isArray(paths) ? paths.map((path) => named(path)) : [];
    return this.run("downloadFiles", names, () => this.backend.downloadFiles(paths, options), (r) => ({
      count: r.files?.length,
      bytes: (r.files ?? []).reduce((sum: number, item: DownloadItem) => sum + (item.content?.byteLength ?? 0), 0),
    }));
  }
}

/** A sandbox, audited: files as AuditedBackend, plus `execute`, `spawn` (and its end, as `spawn.exit`) and `close`. */
export class AuditedSandbox<S extends Sandbox = Sandbox> extends AuditedBackend<S> implements Sandbox {
  get id(): string {
    return this.backend.id;
  }
  get root(): string {
    return this.backend.root;
  }
  protected override get defaultPath(): string {
    return this.backend.root;
  }

  override withContext(context: AuditContext): AuditedSandbox<S> {
    return new AuditedSandbox(this.backend, { ...this.options, context }, this.recorder);
  }

  /** The working directory a command ran in: its `cwd`, else the workspace. */
  private cwdOf(options: { cwd?: string } | undefined): string[] {
    const cwd: unknown = typeof options === "object" && options !== null ? options.cwd : undefined;
    return [cwd === undefined ? this.backend.root : named(cwd)];
  }

  execute(command: string, options?: ExecuteOptions) {
    return this.run("execute", this.cwdOf(options), () => this.backend.execute(command, options), (r) => ({
      bytes: utf8(r.output),
      exitCode: r.exitCode,
    }), { command: named(command) });
  }

  async spawn(command: string, options?: SpawnOptions): Promise<Result<SpawnedProcess>> {
    const paths = this.cwdOf(options);
    const answer = await this.run("spawn", paths, () => this.backend.spawn(command, options), undefined, { command: named(command) });
    if (answer.error) return answer;
    const started = Date.now();
    const clock = performance.now();
    const process = answer;
    let ended: ReturnType<SpawnedProcess["wait"]> | undefined;
    // The end is recorded once, however often `wait` is called.
    const wait = () =>
      (ended ??= process.wait().then((result) => {
        this.note({
          operation: "spawn.exit",
          paths,
          command: named(command),
          time: started,
          durationMs: performance.now() - clock,
          ...(result.error ? { ok: false, code: result.error.code } : { ok: true, exitCode: result.exitCode }),
        });
        return result;
      }));
    return {
      stdin: process.stdin,
      stdout: process.stdout,
      stderr: process.stderr,
      wait,
      kill: () => process.kill(),
    };
  }

  close(): Promise<void> {
    return this.run("close", [], () => this.backend.close());
  }
}

/** What `audited` gives back: an AuditedSandbox for a sandbox, else an AuditedBackend. */
export type Audited<B extends Backend> = B extends Sandbox ? AuditedSandbox<B> : AuditedBackend<B>;

/** Wraps a backend (or a sandbox, keeping `execute`) so every operation is recorded in `options.log`. */
export function audited<B extends Backend>(backend: B, options: AuditOptions): Audited<B> {
  return (isSandbox(backend) ? new AuditedSandbox(backend, options) : new AuditedBackend(backend, options)) as Audited<B>;
}
