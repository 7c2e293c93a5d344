import { AsyncLocalStorage } from "node:async_hooks";
import { BaseBackend, deleteUnlessDirectory, deletesUnlessDirectory, hiddenNames, hidesNames, type DeletesUnlessDirectory, type HidesNames, type SingleDelete, type DownloadAnswer, type TextWindow, type UploadAnswer } from "../core/base.js";
import { streamExecute, type ExecuteStream } from "../sandboxes/output.js";
import { StrataError, errors, printable, toErrorInfo, type ErrorInfo } from "../core/errors.js";
import { fileDataFromBytes } from "../core/filedata.js";
import { capMatches } from "../core/grep.js";
import { joinPath, normalizePath, relativeTo } from "../core/paths.js";
import {
  PermissionPolicy,
  SECRETS_PRESET,
  deniedBy,
  askScopeOf,
  readDecision,
  type PermissionOperation,
  type PermissionRule,
  type PermissionOptions,
  type PermissionRequest,
  type PermissionVerdict,
} from "../core/permissions.js";
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import type {
  DeleteResult,
  DownloadItem,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileData,
  FileInfo,
  FilesUpdate,
  GrepResult,
  LsOptions,
  Result,
  SpawnOptions,
  SpawnedProcess,
  UploadItem,
  WriteResult,
} from "../core/types.js";

type Decision = { allowed: true; input: Record<string, string> } | { allowed: false; verdict: PermissionVerdict; reason?: string };
type Answer = { allowed: true; input: Record<string, string> } | { allowed: false; reason?: string };
/** The answers of `ask` rules already given in one scope (a batch call, or a search's calls): by rule, then operation. */
type Asked = Map<PermissionRule, Map<PermissionOperation, Promise<Answer>>>;

/** The answers shared by the calls under way in this async context (see `sharedAnswers`). */
const ASKED = new AsyncLocalStorage<Asked>();

/**
 * Enforces permission rules on every native operation of the backend it
 * wraps, so every surface (tools, adapters, MCP) gets them. The argument
 * checks, path translation and error shape are BaseBackend's; the wrapped
 * backend sees only calls the rules let through, with caller paths.
 * Listings and searches leave out what the rules deny for reading.
 */
export class PermissionedBackend extends BaseBackend {
  private compiled: PermissionPolicy | undefined;
  /** Binary content `read` already fetched (and authorised), for the readRaw that BaseBackend's read makes next. */
  private readonly fetched = new Map<string, FileData>();
  /** The answers given under each ask scope (core's ASK_SCOPE option), kept while the scope lives. */
  private readonly scoped = new WeakMap<object, Asked>();

  constructor(
    /** The wrapped backend: the escape hatch, unguarded. */
    readonly inner: Backend,
    private readonly options: PermissionOptions,
  ) {
    super();
    if (typeof options !== "object" || options === null) throw errors.invalidArgument("permissions must be { rules, ask? } or false");
    if (options.ask !== undefined && typeof options.ask !== "function") throw errors.invalidArgument("permissions.ask must be a function");
    // Checked now, so bad rules fail here; compiled on first use, against the root the backend has by then.
    new PermissionPolicy(options.rules);
  }

  /** The rules, compiled against the wrapped backend's root (read once it is constructed: a sandbox's root is set by its subclass). */
  get policy(): PermissionPolicy {
    this.compiled ??= new PermissionPolicy(this.options.rules, this.innerRoot);
    return this.compiled;
  }

  private get innerRoot(): string {
    const root = (this.inner as { root?: unknown }).root;
    return typeof root === "string" ? root : "/";
  }

  protected override get pathRoot(): string {
    return this.innerRoot;
  }

  // ---- decisions ----

  /**
   * The rules' verdict on a caller path, with the ask callback's answer where
   * a rule asks. Within a shared scope (`sharedAnswers`), a rule asked about
   * an operation is asked once and its answer reused, for requests with no
   * input to change (reads, deletes, uploads: not a write's content or a
   * command). `paths`: every path this one question covers.
   */
  protected async decide(operation: PermissionOperation, method: string, path: string, input: Record<string, string> = {}, paths?: readonly string[]): Promise<Decision> {
    const verdict = this.policy.check(operation, path);
    if (verdict.action === "allow") return { allowed: true, input };
    if (verdict.action === "deny" || !this.options.ask) return { allowed: false, verdict };
    const asked = Object.keys(input).length === 0 ? ASKED.getStore() : undefined;
    const rule = verdict.rule!;
    let answer = asked?.get(rule)?.get(operation);
    if (!answer) {
      answer = this.ask({ operation, method, path, rule, input: { ...input }, ...(paths && paths.length > 1 ? { paths: [...paths] } : {}) }, input);
      if (asked) asked.set(rule, (asked.get(rule) ?? new Map<PermissionOperation, Promise<Answer>>()).set(operation, answer));
    }
    const read = await answer;
    return read.allowed ? read : { allowed: false, verdict, reason: read.reason };
  }

  private async ask(request: PermissionRequest, input: Record<string, string>): Promise<Answer> {
    let answer: unknown;
    try {
      answer = await this.options.ask!(request);
    } catch {
      return { allowed: false, reason: "the ask callback failed" };
    }
    return readDecision(answer, input);
  }

  /**
   * The decision on each of many caller paths, for one operation: each `ask`
   * rule is asked once, the question listing every path it governs here.
   */
  private async decideMany(operation: PermissionOperation, method: string, paths: readonly string[]): Promise<Decision[]> {
    return this.sharedAnswers(undefined, async () => {
      const byRule = new Map<PermissionRule, string[]>();
      for (const path of paths) {
        const verdict = this.policy.check(operation, path);
        if (verdict.action === "ask") byRule.set(verdict.rule!, [...(byRule.get(verdict.rule!) ?? []), path]);
      }
      if (this.options.ask) for (const governed of byRule.values()) await this.decide(operation, method, governed[0]!, {}, governed);
      return Promise.all(paths.map((path) => this.decide(operation, method, path)));
    });
  }

  /**
   * Runs `body` where `ask` answers are shared: those of the scope already
   * entered, else those of the ask scope the call's options carry (a
   * search's calls: core's ASK_SCOPE), else fresh ones for this call alone.
   */
  private sharedAnswers<T>(options: unknown, body: () => Promise<T>): Promise<T> {
    if (ASKED.getStore()) return body();
    const scope = askScopeOf(options);
    let asked: Asked = new Map();
    if (scope) {
      asked = this.scoped.get(scope) ?? asked;
      this.scoped.set(scope, asked);
    }
    return ASKED.run(asked, body);
  }

  /** Authorises a driver path, or throws the denial (named with the driver path: BaseBackend translates it). */
  private async authorize(operation: PermissionOperation, method: string, driverPath: string, input: Record<string, string> = {}): Promise<Record<string, string>> {
    const path = normalizePath(driverPath);
    const decision = await this.decide(operation, method, this.toCallerPath(path), input);
    if (!decision.allowed) throw deniedBy(operation, path, decision.verdict, decision.reason);
    return decision.input;
  }

  /**
   * Every file under a directory (the directory itself already authorised)
   * must pass too: a tree is not a way around a rule. One listing (a glob
   * under a file finds at most the file); skipped when no rule could refuse.
   * A path the listing cannot enter (not there, not a directory, a symlink,
   * which the operation moves or deletes as a link) lets the operation itself
   * answer; a listing cut short (a timeout, a tree too large, a failing
   * engine) refuses: unchecked is not allowed.
   */
  private async authorizeTree(operations: PermissionOperation[], method: string, driverPath: string, mapTo?: (file: string) => string): Promise<void> {
    if (!operations.some((op) => this.policy.hasRestrictions(op))) return;
    const listed = await this.inner.glob("**", { path: this.caller(driverPath), sizes: false });
    if (listed.error) {
      if (TREE_NOT_ENTERED.has(listed.error.code)) return;
      throw new StrataError(listed.error.code, `${method} was not run: what it would change could not be checked against the permission rules (${listed.error.message})`);
    }
    // The path itself was authorised by the caller (an `ask` rule asks once): only what lies under it is new here.
    const root = normalizePath(driverPath);
    await this.authorizeFiles(operations, method, listed.entries.filter((file) => this.driver(file.path) !== root), mapTo);
  }

  /** Every file of a listing (caller paths) must pass each operation. */
  private async authorizeFiles(operations: PermissionOperation[], method: string, files: readonly FileInfo[], mapTo?: (file: string) => string): Promise<void> {
    for (const file of files) {
      const path = this.driver(file.path);
      for (const op of operations) await this.authorize(op, method, mapTo ? mapTo(path) : path);
    }
  }

  /** A filter for one answer's entries: what the rules deny for reading is left out (each directory's rules worked out once). */
  private visible(entries: readonly FileInfo[]): FileInfo[] {
    return this.policy.visible("read", entries);
  }

  // ---- path translation: the wrapped backend names paths as the caller does ----

  private caller(driverPath: string): string {
    return this.toCallerPath(normalizePath(driverPath));
  }

  /** A caller path (a directory keeps its trailing `/`) as the driver names it. */
  private driver(path: string): string {
    const root = this.innerRoot;
    if (root === "/" || !path.startsWith("/")) return path;
    if (path === root || path === `${root}/`) return "/";
    return path.startsWith(`${root}/`) ? path.slice(root.length) : path;
  }

  private driverInfo = (info: FileInfo): FileInfo => ({ ...info, path: this.driver(info.path) });

  private driverUpdate<T extends FilesUpdate>(update: T | undefined): T | null {
    if (!update || this.innerRoot === "/") return update ?? null;
    return Object.fromEntries(Object.entries(update).map(([p, v]) => [this.driver(p), v])) as T;
  }

  /** The wrapped backend's value, or its failure rethrown in driver terms (BaseBackend turns it back). */
  private unwrap<T extends object>(result: Result<T>): T {
    if (!result.error) return result as T;
    throw this.driverError(result.error);
  }

  private driverError(error: ErrorInfo): StrataError {
    if (error.path === undefined || this.innerRoot === "/") return new StrataError(error.code, error.message, error.path === undefined ? undefined : { path: error.path });
    const path = this.driver(error.path);
    return new StrataError(error.code, error.message.split(`'${printable(error.path)}'`).join(`'${printable(path)}'`), { path });
  }

  private changeResult<T extends { path: string; filesUpdate: FilesUpdate }>(result: Result<T>): T {
    const value = this.unwrap(result);
    return { ...value, path: this.driver(value.path), filesUpdate: this.driverUpdate(value.filesUpdate) };
  }

  // ---- the driver ----

  protected async doLs(path: string, sizes = true, hides?: (name: string) => boolean): Promise<FileInfo[]> {
    await this.authorize("read", "ls", path);
    const dir = this.caller(path);
    // Every entry is a child of one directory (or the file listed): its rules are worked out once. A backend that
    // can leaves the denied names out itself, before it builds their paths (see hiddenNames); so does this one,
    // for an outer wrapper's names (`hides`, given only where the inner backend takes them too).
    let entries: FileInfo[];
    if (this[hidesNames]) {
      const own = this.policy.nameDenial("read", dir);
      const options: LsOptions & { [hiddenNames]: (name: string) => boolean } = { sizes, [hiddenNames]: hides ? (name) => own(name) || hides(name) : own };
      entries = this.unwrap(await this.inner.ls(dir, options)).entries;
    } else {
      const denied = this.policy.listingDenial("read", dir);
      entries = this.unwrap(await this.inner.ls(dir, sizes ? undefined : { sizes })).entries.filter((entry) => !denied(entry.path));
    }
    return this.innerRoot === "/" ? entries : entries.map(this.driverInfo);
  }

  protected async doReadRaw(path: string): Promise<FileData> {
    const key = normalizePath(path);
    const fetched = this.fetched.get(key);
    if (fetched) {
      this.fetched.delete(key);
      return fetched;
    }
    await this.authorize("read", "read", path);
    return this.unwrap(await this.inner.readRaw(this.caller(path))).data;
  }

  protected override async doRead(path: string, offset: number, limit: number): Promise<TextWindow> {
    await this.authorize("read", "read", path);
    const read = this.unwrap(await this.inner.read(this.caller(path), { offset, limit }));
    if (read.encoding === "binary") {
      // BaseBackend answers a binary file through readRaw next: handed over here, so the ask callback is asked once.
      this.fetched.set(normalizePath(path), fileDataFromBytes(read.content));
      throw errors.binary(normalizePath(path), read.size);
    }
    return { lines: read.lineCount === 0 ? [] : read.content.split("\n"), totalLines: read.totalLines };
  }

  protected async doWrite(path: string, content: string, overwrite: boolean): Promise<WriteResult> {
    const input = await this.authorize("write", "write", path, { content });
    return this.changeResult(await this.inner.write(this.caller(path), input.content!, { overwrite })) as WriteResult;
  }

  protected async doEdit(path: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    const input = await this.authorize("edit", "edit", path, { oldString, newString });
    const result = this.changeResult(await this.inner.edit(this.caller(path), input.oldString!, input.newString!, { replaceAll })) as EditResult;
    // The text the edit left is a read of the file: answered only where the rules allow reading it outright (no `ask`).
    if (result.content !== undefined && this.policy.hasRestrictions("read") && this.policy.check("read", this.caller(path)).action !== "allow") delete result.content;
    return result;
  }

  protected async doDelete(path: string): Promise<DeleteResult> {
    await this.authorize("delete", "delete", path);
    if (this.policy.hasRestrictions("delete") && this[deletesUnlessDirectory]) {
      // A file (or a link) has no tree under it: deleted in one step where the backend can refuse a directory there,
      // and a directory's files come back in the same round trip, to be checked before the delete.
      // A directory with no entry a refusing rule could name goes in the same step too.
      const single = await this.innerDeleteUnlessDirectory(path, this.policy.refusalNames("delete"));
      if (single.error?.code !== "unsupported") {
        const done = this.unwrap(single);
        if (done.deleted) return this.changeResult(done.deleted) as DeleteResult;
        await this.authorizeFiles(["delete"], "delete", done.tree);
        return this.changeResult(await this.inner.delete(this.caller(path))) as DeleteResult;
      }
    }
    await this.authorizeTree(["delete"], "delete", path);
    return this.changeResult(await this.inner.delete(this.caller(path))) as DeleteResult;
  }

  /** This wrapper's own rules first, then the wrapped backend's (so wrappers stack). */
  protected override async doDeleteUnlessDirectory(path: string, names?: readonly string[]): Promise<DeleteResult | FileInfo[]> {
    // Asked before the rules: an `ask` rule must not ask for a one-step delete that will not happen.
    if (!this[deletesUnlessDirectory]) return super.doDeleteUnlessDirectory(path);
    await this.authorize("delete", "delete", path);
    // A whole directory only where neither an outer wrapper's rules nor this one's could refuse anything in it.
    const own = this.policy.refusalNames("delete");
    const both = names === undefined || own === undefined ? undefined : [...names, ...own];
    const done = this.unwrap(await this.innerDeleteUnlessDirectory(path, both));
    return done.deleted ? (this.changeResult(done.deleted) as DeleteResult) : done.tree.map(this.driverInfo);
  }

  /** As the wrapped backend: wrappers stack (an outer one's names are passed on with this one's). */
  override get [hidesNames](): boolean {
    return (this.inner as Partial<HidesNames>)[hidesNames] === true;
  }

  /** As the wrapped backend: wrappers stack. */
  override get [deletesUnlessDirectory](): boolean {
    return (this.inner as Partial<DeletesUnlessDirectory>)[deletesUnlessDirectory] === true;
  }

  private innerDeleteUnlessDirectory(path: string, names?: readonly string[]): Promise<Result<SingleDelete>> {
    const single = (this.inner as Partial<DeletesUnlessDirectory>)[deleteUnlessDirectory];
    if (typeof single !== "function") return Promise.resolve({ error: toErrorInfo(new StrataError("unsupported", "no single-step delete")) });
    return single.call(this.inner, this.caller(path), undefined, names);
  }

  protected override async doStat(path: string): Promise<FileInfo> {
    await this.authorize("read", "stat", path);
    return this.driverInfo(this.unwrap(await this.inner.stat(this.caller(path))));
  }

  protected override async doMkdir(path: string, recursive: boolean): Promise<FilesUpdate> {
    await this.authorize("write", "mkdir", path);
    return this.driverUpdate(this.unwrap(await this.inner.mkdir(this.caller(path), { recursive })).filesUpdate);
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    await this.authorizeTransfer("move", from, to);
    return this.driverUpdate(this.unwrap(await this.inner.move(this.caller(from), this.caller(to), { overwrite })).filesUpdate);
  }

  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    await this.authorizeTransfer("copy", from, to);
    return this.driverUpdate(this.unwrap(await this.inner.copy(this.caller(from), this.caller(to), { overwrite })).filesUpdate);
  }

  /** Both ends: the source is read (and, for a move, deleted), the target written; for a tree, every file at both ends. */
  private async authorizeTransfer(method: "move" | "copy", from: string, to: string): Promise<void> {
    const source = normalizePath(from);
    const target = normalizePath(to);
    const sourceOps: PermissionOperation[] = method === "move" ? ["read", "delete"] : ["read"];
    for (const op of sourceOps) await this.authorize(op, method, source);
    await this.authorize("write", method, target);
    await this.authorizeTree(sourceOps, method, source);
    await this.authorizeTree(["write"], method, source, (file) => joinPath(target, relativeTo(source, file)));
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    await this.authorize("read", "grep", path ?? "/");
    // Matches in files a rule denies are left out; an ask rule is asked once for all the files it governs with matches.
    // Most files no rule touches: those pass on the action alone.
    const action = this.policy.actionChecker("read");
    const shown = async (result: GrepResult) => {
      const undecided = [...new Set(result.matches.map((m) => m.path))].filter((file) => action(file) !== "allow");
      const decisions = await this.decideMany("read", "grep", undecided);
      const refused = new Set(undecided.filter((_, i) => !decisions[i]!.allowed));
      return result.matches.filter((m) => !refused.has(m.path)).map((m) => ({ ...m, path: this.driver(m.path) }));
    };
    const options = { path: path === null ? undefined : this.caller(path), glob, maxCount };
    const first = this.unwrap(await this.inner.grep(pattern, options));
    const matches = await shown(first);
    if (!first.truncated || matches.length === first.matches.length) return { matches, truncated: first.truncated };
    // The cap was spent partly on hidden matches: search again uncapped and cap what is shown.
    const all = await shown(this.unwrap(await this.inner.grep(pattern, { ...options, maxCount: undefined })));
    return capMatches(all, maxCount);
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    await this.authorize("read", "glob", path ?? "/");
    const found = this.unwrap(await this.inner.glob(pattern, { path: path === null ? undefined : this.caller(path), includeDirectories, sizes })).entries;
    const shown = this.visible(found);
    // Over a backend rooted at `/` driver and caller paths agree: the entries (fresh from the glob) serve as they are.
    return this.innerRoot === "/" ? shown : shown.map(this.driverInfo);
  }

  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    const answers: UploadAnswer[] = files.map(([path]) => ({ path, error: null }));
    const passed = await this.batchDecisions("write", "uploadFiles", files.map(([path]) => path), answers);
    if (passed.length > 0) {
      const result = await this.inner.uploadFiles(passed.map(({ index, path }) => [path, files[index]![1]] as const));
      passed.forEach(({ index }, k) => (answers[index] = { path: files[index]![0], error: result.error ? result.error.code : (result.files[k]?.error?.code ?? null) }));
    }
    return answers;
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    const answers: DownloadAnswer[] = paths.map((path) => ({ path, content: null, error: null }));
    const passed = await this.batchDecisions("read", "downloadFiles", paths, answers);
    if (passed.length > 0) {
      const result = await this.inner.downloadFiles(passed.map(({ path }) => path));
      passed.forEach(({ index }, k) => {
        const item = result.error ? undefined : result.files[k];
        answers[index] = { path: paths[index]!, content: item?.content ?? null, error: result.error ? result.error.code : (item?.error?.code ?? null) };
      });
    }
    return answers;
  }

  /**
   * Each item's decision; refused ones answer permission_denied in `answers`.
   * An item whose path is invalid goes through as given, for the wrapped
   * backend to refuse item by item (no rule can match a path that is not one).
   */
  private async batchDecisions(operation: PermissionOperation, method: string, paths: readonly string[], answers: Array<{ error: string | null }>): Promise<Array<{ index: number; path: string }>> {
    const undecided: Array<{ index: number; path: string }> = [];
    const passed: Array<{ index: number; path: string }> = [];
    // Most items no rule touches: those pass on the action alone; the rest are decided together (an ask rule asked once).
    const action = this.policy.actionChecker(operation);
    for (const [index, path] of paths.entries()) {
      let shown: string;
      try {
        shown = this.caller(path);
      } catch {
        passed.push({ index, path });
        continue;
      }
      if (action(shown) === "allow") passed.push({ index, path: shown });
      else undecided.push({ index, path: shown });
    }
    const decisions = await this.decideMany(
      operation,
      method,
      undecided.map(({ path }) => path),
    );
    undecided.forEach((item, k) => {
      if (decisions[k]!.allowed) passed.push(item);
      else answers[item.index]!.error = "permission_denied";
    });
    return passed.sort((a, b) => a.index - b.index);
  }

  /** A batch item refused here names the rule, as every other denial does (the driver answers only a code). */
  override async uploadFiles(files: unknown, options?: unknown): Promise<Result<{ files: UploadItem[] }>> {
    return this.explainItems(await this.sharedAnswers(options, () => super.uploadFiles(files, options)), "write");
  }

  override async downloadFiles(paths: unknown, options?: unknown): Promise<Result<{ files: DownloadItem[] }>> {
    return this.explainItems(await this.sharedAnswers(options, () => super.downloadFiles(paths, options)), "read");
  }

  /** Within a search (core's askScope), grep's questions are the ones its reads then reuse. */
  override grep(pattern: unknown, options?: unknown): Promise<Result<GrepResult>> {
    return this.sharedAnswers(options, () => super.grep(pattern, options));
  }

  private explainItems<T extends UploadItem>(result: Result<{ files: T[] }>, operation: PermissionOperation): Result<{ files: T[] }> {
    if (result.error) return result;
    const files = result.files.map((item) => {
      if (item.error?.code !== "permission_denied" || item.error.path === undefined) return item;
      const verdict = this.policy.check(operation, item.error.path);
      if (verdict.action === "allow") return item; // the wrapped backend's own refusal
      const reason = verdict.action === "ask" && this.options.ask ? "the ask callback rejected it" : undefined;
      return { ...item, error: toErrorInfo(deniedBy(operation, item.error.path, verdict, reason)) };
    });
    return { files };
  }
}

/** The same, over a sandbox: commands are governed by `execute` rules, matched against their working directory. */
export class PermissionedSandbox extends PermissionedBackend implements Sandbox {
  constructor(
    override readonly inner: Sandbox,
    options: PermissionOptions,
  ) {
    super(inner, options);
  }

  get id(): string {
    return this.inner.id;
  }

  async execute(command: string, options?: ExecuteOptions): Promise<Result<ExecuteResponse>> {
    const gate = await this.gateCommand(command, options, "execute");
    if ("error" in gate) return gate;
    return this.inner.execute(gate.command, gate.options);
  }

  async spawn(command: string, options?: SpawnOptions): Promise<Result<SpawnedProcess>> {
    const gate = await this.gateCommand(command, options, "spawn");
    if ("error" in gate) return gate;
    return this.inner.spawn(gate.command, gate.options);
  }

  /** `execute` with its output as an async iterable (BaseSandbox's), through the same gate as execute. */
  executeStream(command: string, options: Omit<ExecuteOptions, "onOutput"> = {}): ExecuteStream {
    return streamExecute((line, run) => this.execute(line, run), command, options);
  }

  /** Closes the wrapped sandbox. */
  close(): Promise<void> {
    return this.inner.close();
  }

  /** The options are read once, so the cwd checked is the cwd used; a bad command or cwd is left to the sandbox to refuse. */
  private async gateCommand<O extends { cwd?: string }>(command: string, options: O | undefined, method: string): Promise<{ error: ErrorInfo } | { command: string; options: O | undefined }> {
    let copy: O | undefined;
    try {
      copy = options === undefined || options === null || typeof options !== "object" ? options : { ...options };
    } catch {
      return { error: toErrorInfo(errors.invalidArgument("options could not be read (a getter or a Proxy threw)")) };
    }
    let cwd: string;
    try {
      const given = copy?.cwd;
      cwd = given === undefined ? this.root : normalizePath(typeof given === "string" && !given.startsWith("/") ? joinPath(this.root, given) : (given as string));
    } catch {
      // No path, so no rule to match: the sandbox refuses it with its own code.
      return { command, options: copy };
    }
    if (typeof command !== "string") return { command, options: copy };
    const decision = await this.decide("execute", method, cwd, { command });
    if (!decision.allowed) return { error: toErrorInfo(deniedBy("execute", cwd, decision.verdict, decision.reason)) };
    return { command: decision.input.command!, options: copy };
  }
}

/**
 * `backend` with `rules` enforced on every native operation (and `ask`
 * consulted where a rule asks). A sandbox stays a sandbox; closing the
 * wrapper closes it. The wrapped backend is `.inner`.
 */
export function withPermissions(backend: Sandbox, options: PermissionOptions): PermissionedSandbox;
export function withPermissions(backend: Backend, options: PermissionOptions): PermissionedBackend;
export function withPermissions(backend: Backend, options: PermissionOptions): PermissionedBackend {
  return isSandbox(backend) ? new PermissionedSandbox(backend, options) : new PermissionedBackend(backend, options);
}

/** Codes of a tree listing that mean there is no tree to check, rather than a check cut short. */
const TREE_NOT_ENTERED = new Set<string>(["file_not_found", "not_a_directory", "permission_denied", "invalid_path", "sandbox_closed"]);

/** The methods a guarded instance answers through its permission wrapper. */
const GUARDED = new Set<PropertyKey>(["ls", "read", "readRaw", "write", "edit", "delete", deleteUnlessDirectory, "grep", "glob", "stat", "mkdir", "move", "copy", "uploadFiles", "downloadFiles", "execute", "executeStream", "spawn"]);

/**
 * What the constructors of FilesystemBackend and the sandboxes return: the
 * instance itself, whose native operations go through the rules of its
 * `permissions` option (default SECRETS_PRESET; false: none). Everything
 * else (its own fields and methods, `instanceof`) is the instance's own, and
 * the instance's internal calls bypass the wrapper (they are not the
 * caller's). `permissions` is checked here, so a bad one fails the constructor.
 */
export function guarded<B extends Backend>(backend: B, permissions: PermissionOptions | false | undefined): B {
  if (permissions === false) return backend;
  const options = permissions ?? { rules: SECRETS_PRESET };
  // Decided by shape, not isSandbox: a sandbox's constructor calls this before its subclass has set its id.
  const wrapper = typeof (backend as Partial<Sandbox>).execute === "function" ? new PermissionedSandbox(backend as unknown as Sandbox, options) : new PermissionedBackend(backend, options);
  const bound = new Map<PropertyKey, unknown>();
  return new Proxy(backend, {
    get(target, prop) {
      if (GUARDED.has(prop) && typeof Reflect.get(target, prop, target) === "function") {
        if (!bound.has(prop)) bound.set(prop, (wrapper as unknown as Record<PropertyKey, (...args: unknown[]) => unknown>)[prop as string]!.bind(wrapper));
        return bound.get(prop);
      }
      const value: unknown = Reflect.get(target, prop, target);
      return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
