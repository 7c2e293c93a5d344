/**
 * Permission rules: pure logic, no I/O. `backends/permissions.ts` enforces
 * them on every native operation; the sandboxes also use them to find what
 * to hide from commands. docs/permissions.md is the reference.
 */
import { StrataError, errors, printable } from "./errors.js";
import { compileGlob, validateGlob, type GlobMatcher } from "./glob.js";
import { parentOf } from "./paths.js";

/**
 * What a rule governs. The native operations map onto these:
 * read: read, readRaw, stat, ls, glob, grep, downloadFiles, the source of a copy;
 * write: write, uploadFiles, mkdir, the target of a move or copy;
 * edit: edit; delete: delete, the source of a move; execute: execute, spawn (the path is the cwd).
 */
export type PermissionOperation = "read" | "write" | "edit" | "delete" | "execute";

export type PermissionAction = "allow" | "deny" | "ask";

export const PERMISSION_OPERATIONS: readonly PermissionOperation[] = ["read", "write", "edit", "delete", "execute"];

export interface PermissionRule {
  action: PermissionAction;
  /** The operations it governs; default all of them. */
  operations?: PermissionOperation | readonly PermissionOperation[];
  /**
   * Globs in the one dialect (core/glob.ts): without `/` a basename at any
   * depth; a relative one from the backend's root (a sandbox's workspace);
   * an absolute one as the caller names paths. A rule that matches a
   * directory covers everything under it, and `dir/**` covers `dir` too.
   * Default: every path.
   */
  paths?: string | readonly string[];
  /** Named in the message of what it denies. */
  name?: string;
}

/** Which rule decided, and the pattern that matched. No rule: allow. */
export interface PermissionVerdict {
  action: PermissionAction;
  rule?: PermissionRule;
  pattern?: string;
}

/** What an `ask` callback is shown. `input` holds what it may change. */
export interface PermissionRequest {
  operation: PermissionOperation;
  /** The native method called: "write", "uploadFiles", "move", "execute", … */
  method: string;
  /** The path as the caller named it (for execute and spawn: the working directory). */
  path: string;
  /**
   * When one question covers several files (a batch, a grep, a search: asked
   * once per rule, not per file): all of them, `path` first. The answer holds
   * for each.
   */
  paths?: readonly string[];
  rule: PermissionRule;
  /** write: `{ content }`; edit: `{ oldString, newString }`; execute and spawn: `{ command }`; otherwise `{}`. */
  input: Readonly<Record<string, string>>;
}

/**
 * An ask callback's answer: `true` / `{ behavior: "allow" }` approves,
 * `{ behavior: "allow", updatedInput }` approves changed arguments (only the
 * keys of `input`), `false` / `{ behavior: "deny", message }` rejects (the
 * message reaches the model).
 */
export type PermissionDecision = boolean | { behavior: "allow"; updatedInput?: Record<string, string> } | { behavior: "deny"; message?: string };

export type AskCallback = (request: PermissionRequest) => PermissionDecision | Promise<PermissionDecision>;

/** The `permissions` option of FilesystemBackend, the sandboxes and `withPermissions`. */
export interface PermissionOptions {
  /** Replaces the default rules (SECRETS_PRESET): spread it in to keep it. */
  rules: readonly PermissionRule[];
  /** Decides operations an `ask` rule governs; without it they are denied. */
  ask?: AskCallback;
}

/**
 * Secret files, denied by default on FilesystemBackend and the sandboxes.
 * Directories (`.ssh`) cover everything under them.
 */
export const SECRET_PATTERNS: readonly string[] = [
  ".env*",
  "id_rsa*",
  "id_dsa*",
  "id_ecdsa*",
  "id_ed25519*",
  "*.pem",
  "*.key",
  "*.p12",
  "*.pfx",
  ".ssh",
  ".gnupg",
  "**/.aws/credentials",
  "**/.config/gcloud",
  ".azure",
  "**/.kube/config",
  "**/.docker/config.json",
  ".netrc",
  "_netrc",
  ".npmrc",
  ".pypirc",
  ".pgpass",
  ".git-credentials",
  "**/.git/config",
];

/** The file operations on secrets (commands are not matched by path; the sandboxes mask secrets from them instead). */
export const SECRETS_PRESET: readonly PermissionRule[] = [{ name: "secrets", action: "deny", operations: ["read", "write", "edit", "delete"], paths: SECRET_PATTERNS }];

/** A read-only route: every changing operation under `paths` is denied. */
export function readOnly(paths: string | readonly string[], name = "read-only"): PermissionRule {
  return { name, action: "deny", operations: ["write", "edit", "delete"], paths };
}

/**
 * The options key of an operation made of many native calls (core/search: a
 * listing, then files read in batches): calls whose options carry the same
 * object under it share the answers of `ask` rules, so each rule is asked
 * once for the whole operation rather than once per call. A symbol, so no
 * backend takes it for an option of its own, and views that copy options
 * (`{ ...options, signal }`) keep it.
 */
export const ASK_SCOPE: unique symbol = Symbol("strata.askScope");

/** The ask scope an options object carries, if any. */
export function askScopeOf(options: unknown): object | undefined {
  try {
    const scope = typeof options === "object" && options !== null ? (options as { [ASK_SCOPE]?: unknown })[ASK_SCOPE] : undefined;
    return typeof scope === "object" && scope !== null ? scope : undefined;
  } catch {
    return undefined;
  }
}

const STRENGTH: Record<PermissionAction, number> = { allow: 0, ask: 1, deny: 2 };

/** The verdict when no rule matches (shared: a listing checks thousands of paths). */
const ALLOWED: PermissionVerdict = Object.freeze({ action: "allow" });

interface CompiledRule {
  rule: PermissionRule;
  operations: ReadonlySet<PermissionOperation>;
  matchers: Matcher[] | null;
  /**
   * A test every path one of the matchers matches also passes (their
   * literal heads and tails, in one regular expression), or null when some
   * matcher has none: most names fail it, and it costs one test instead of
   * one per pattern.
   */
  gate: ((path: string, start?: number) => boolean) | null;
}

/**
 * A set of rules, compiled once. Precedence: deny > ask > allow among the
 * rules that match; no matching rule allows.
 */
export class PermissionPolicy {
  private readonly compiled: CompiledRule[];
  private readonly byOperation = new Map<PermissionOperation, readonly CompiledRule[]>();

  /** `root`: where relative patterns start (a sandbox's workspace, "/" elsewhere). */
  constructor(
    readonly rules: readonly PermissionRule[],
    readonly root = "/",
  ) {
    if (!Array.isArray(rules)) throw errors.invalidArgument("permissions.rules must be an array of rules");
    this.compiled = rules.map((rule, i) => compileRule(rule, i, root));
  }

  /** Whether any rule could deny or ask: a policy of allows only needs no checks. */
  get restrictive(): boolean {
    return this.compiled.some((c) => c.rule.action !== "allow");
  }

  /**
   * The verdict for `operation` on `path`, a normalised absolute path as the
   * caller names it (a directory's trailing `/` is ignored). Not validated
   * again: a sandbox also asks about names no API path may take (its own
   * lock files), which rules match like any other.
   */
  check(operation: PermissionOperation, path: string): PermissionVerdict {
    return this.verdict(operation, path, true);
  }

  /**
   * The verdict on `path` from the rules that match it alone, not an
   * ancestor: for a walk that stops at a denied directory, whose every
   * ancestor was therefore already found allowed.
   */
  checkOwn(operation: PermissionOperation, path: string): PermissionVerdict {
    return this.verdict(operation, path, false);
  }

  private verdict(operation: PermissionOperation, path: string, ancestors: boolean): PermissionVerdict {
    return verdictAmong(this.rulesFor(operation), withoutTrailingSlash(path), ancestors);
  }

  /** The rules of one operation, in order (worked out once: a listing checks thousands of paths). */
  private rulesFor(operation: PermissionOperation): readonly CompiledRule[] {
    let rules = this.byOperation.get(operation);
    if (!rules) this.byOperation.set(operation, (rules = this.compiled.filter((c) => c.operations.has(operation))));
    return rules;
  }

  /**
   * The action (not the whole verdict) for `operation`, for many paths that
   * share directories (a listing's entries, a search's files): each
   * directory's verdict from the rules matching it or an ancestor is worked
   * out once per checker, so a path costs only the rules matching its own
   * name. Equal to `check(operation, path).action`. Use one checker per
   * answer: it remembers every directory it met.
   */
  actionChecker(operation: PermissionOperation): (path: string) => PermissionAction {
    const rules = this.rulesFor(operation);
    if (rules.length === 0) return allowAll;
    const checker = newChecker(rules);
    // A thin closure: the work is in module-level functions, whose optimized code outlives a full GC (see byPath in paths.ts).
    return (path) => checkedAction(checker, path);
  }

  /** The entries (a listing, a search's answer) whose path `operation` is not denied on: actionChecker's test in one loop. */
  visible<T extends { path: string }>(operation: PermissionOperation, entries: readonly T[]): T[] {
    const rules = this.rulesFor(operation);
    return rules.length === 0 ? entries.slice() : visibleAmong(newChecker(rules), entries);
  }

  /**
   * Whether `operation` is denied, for the entries of one listing of `dir`
   * (a normalised path): equal to `check(operation, path).action === "deny"`.
   * A direct child of `dir` is denied when `dir` is (its rules or an
   * ancestor's, worked out once) or when a deny rule matches the child
   * itself: only the deny rules are tried, and only on the child's path, so
   * a listing of thousands of names costs little more than the names'
   * gates. Any other path is checked in full.
   */
  listingDenial(operation: PermissionOperation, dir: string): (path: string) => boolean {
    const prefix = childPrefix(dir);
    const child = this.childDenial(operation, prefix);
    if (child === false) return () => false;
    const full = (path: string) => this.check(operation, path).action === "deny";
    return (path) => {
      const target = path.charCodeAt(path.length - 1) === 47 /* / */ ? withoutTrailingSlash(path) : path;
      // A direct child: its name starts right after the prefix (a deeper path has ancestors this shortcut has not seen).
      const start = nameStart(target);
      if (start !== prefix.length || start === target.length || !target.startsWith(prefix)) return full(path);
      return child === true || child(target, start, false);
    };
  }

  /**
   * listingDenial for the names of `dir`'s own entries (see hiddenNames in
   * core/base): a name costs only the rules' gates, tested on the name
   * itself.
   */
  nameDenial(operation: PermissionOperation, dir: string): (name: string) => boolean {
    const prefix = childPrefix(dir);
    const child = this.childDenial(operation, prefix);
    if (typeof child === "boolean") return () => child;
    return (name) => child(name, 0, true);
  }

  /**
   * The test listingDenial and nameDenial share, for a direct child of the
   * directory `prefix` names: `text` holds the child's name from `start`,
   * and is its whole path unless `bare` (the name alone: the path is built
   * only for a rule whose gate the name passes). false: no deny rule at all;
   * true: the directory itself is denied, so every child is.
   */
  private childDenial(operation: PermissionOperation, prefix: string): boolean | ((text: string, start: number, bare: boolean) => boolean) {
    const denials = this.rulesFor(operation).filter((c) => c.rule.action === "deny");
    if (denials.length === 0) return false;
    if (this.check(operation, prefix === "/" ? "/" : prefix.slice(0, -1)).action === "deny") return true;
    return (text, start, bare) => {
      for (const c of denials) {
        if (c.matchers === null) return true;
        if (c.gate !== null && !c.gate(text, start)) continue;
        if (matchedPattern(c.matchers, null, bare ? prefix + text : text, false) !== undefined) return true;
      }
      return false;
    };
  }

  /** Whether some rule could refuse `operation` (deny or ask) somewhere. */
  hasRestrictions(operation: PermissionOperation): boolean {
    return this.compiled.some((c) => c.rule.action !== "allow" && c.operations.has(operation));
  }

  /**
   * Name globs (`*` the only wildcard, as find's -name reads it) of which every
   * path a deny or ask rule on `operation` matches carries one, as its own
   * name or an ancestor's: a tree none of whose entries has such a name
   * holds nothing those rules refuse below its root (its root and what lies
   * above it are checked on their own). A rule's last segment is that name,
   * whatever prefix a backend's paths have. Undefined when some rule cannot
   * be put so (no paths, a last segment of `**`, braces or classes).
   */
  refusalNames(operation: PermissionOperation): string[] | undefined {
    const names = new Set<string>();
    for (const c of this.rulesFor(operation)) {
      if (c.rule.action === "allow") continue;
      if (c.matchers === null) return undefined;
      for (const { pattern } of c.matchers) {
        const last = pattern.split("/").filter((segment) => segment !== "").pop();
        if (last === undefined || /^\*+$/.test(last) || !/^[\w.*?@+=,:~%#-]+$/.test(last)) return undefined;
        // `?` becomes `*`: find may read a name byte by byte (the C locale), where one character can be several.
        names.add(last.replace(/\?/g, "*"));
      }
    }
    return [...names];
  }

  /** Whether some rule denies `operation` somewhere. */
  hasDenials(operation: PermissionOperation): boolean {
    return this.compiled.some((c) => c.rule.action === "deny" && c.operations.has(operation));
  }

  /** Whether `operation` on `path` is denied outright (a sandbox masks such paths from its commands). */
  denies(operation: PermissionOperation, path: string): boolean {
    return this.check(operation, path).action === "deny";
  }
}

const allowAll = (): PermissionAction => "allow";

/** What an actionChecker remembers. */
interface Checker {
  rules: readonly CompiledRule[];
  /** The action on each directory met, from the rules matching it or an ancestor. */
  directories: Map<string, PermissionAction>;
  /** A listing's entries share their directory: its action is kept at hand, not looked up per entry. */
  lastDir: string;
  lastAction: PermissionAction;
}

function newChecker(rules: readonly CompiledRule[]): Checker {
  return { rules, directories: new Map(), lastDir: "", lastAction: "allow" };
}

function visibleAmong<T extends { path: string }>(checker: Checker, entries: readonly T[]): T[] {
  const shown: T[] = [];
  for (let i = 0; i < entries.length; i++) if (checkedAction(checker, entries[i]!.path) !== "deny") shown.push(entries[i]!);
  return shown;
}

function checkedAction(checker: Checker, path: string): PermissionAction {
  const target = withoutTrailingSlash(path);
  const own = verdictAmong(checker.rules, target, false).action;
  if (target === "/" || own === "deny") return own;
  const slash = nameStart(target) - 1;
  if (checker.lastDir.length !== Math.max(slash, 1) || !target.startsWith(checker.lastDir)) {
    checker.lastDir = parentOf(target);
    checker.lastAction = directoryAction(checker, checker.lastDir);
  }
  return stronger(own, checker.lastAction);
}

function directoryAction(checker: Checker, dir: string): PermissionAction {
  let action = checker.directories.get(dir);
  if (action === undefined) {
    const own = verdictAmong(checker.rules, dir, false).action;
    action = dir === "/" ? own : stronger(own, directoryAction(checker, parentOf(dir)));
    checker.directories.set(dir, action);
  }
  return action;
}

function stronger(a: PermissionAction, b: PermissionAction): PermissionAction {
  return STRENGTH[a] >= STRENGTH[b] ? a : b;
}

/** The verdict of `rules` (one operation's) on a path without its trailing '/'. */
function verdictAmong(rules: readonly CompiledRule[], target: string, ancestors: boolean): PermissionVerdict {
  let best: PermissionVerdict = ALLOWED;
  for (const c of rules) {
    // Only a stronger action can change the verdict (the first rule of an action is the one named).
    if (best.rule && STRENGTH[c.rule.action] <= STRENGTH[best.action]) continue;
    const pattern = c.matchers === null ? "**" : matchedPattern(c.matchers, c.gate, target, ancestors);
    if (pattern === undefined) continue;
    best = { action: c.rule.action, rule: c.rule, pattern };
  }
  return best;
}

function withoutTrailingSlash(path: string): string {
  return path.length > 1 && path.charCodeAt(path.length - 1) === 47 /* / */ ? path.replace(/\/+$/, "") : path;
}

/** What the paths of a directory's entries start with: `/` for the root, else the directory and a `/`. */
function childPrefix(dir: string): string {
  const base = withoutTrailingSlash(dir);
  return base === "/" ? "/" : `${base}/`;
}

/**
 * Where a path's last segment starts: lastIndexOf("/") + 1, by a loop over
 * the name's few characters (V8's lastIndexOf is a call into the runtime,
 * which dominated the check of a large listing).
 */
function nameStart(path: string): number {
  let i = path.length - 1;
  while (i >= 0 && path.charCodeAt(i) !== 47 /* / */) i--;
  return i + 1;
}

function matchedPattern(matchers: Matcher[], gate: CompiledRule["gate"], path: string, ancestors: boolean): string | undefined {
  // The path and each ancestor: a rule on a directory covers what lies under it.
  for (let p = path; ; p = parentOf(p)) {
    if (gate === null || gate(p)) for (const m of matchers) if (m.test(p)) return m.pattern;
    if (p === "/" || !ancestors) return undefined;
  }
}

interface Matcher {
  pattern: string;
  test: (path: string) => boolean;
}

/** Answers per basename are kept (a walk meets the same names in every directory), up to this many per pattern. */
const BASENAME_CACHE = 4096;

/** Letters, digits, `_`, `.`, `-`, `*` and `/` only: a glob picomatch cannot refuse once validateGlob has passed it. */
const PLAIN_GLOB = /^[\w.*/-]+$/;

/**
 * A rule's glob test. A plain one (every secret pattern of the preset) is
 * compiled when first needed: most are never needed, since their literal
 * head or tail rules out nearly every name first, and compiling the preset
 * is a good part of opening a workspace. Any other is compiled now, so a
 * bad rule fails when the policy is made.
 */
function globTest(pattern: string, root: string): (path: string) => boolean {
  if (!PLAIN_GLOB.test(pattern)) return compileGlob(pattern, root);
  validateGlob(pattern);
  let test: GlobMatcher | undefined;
  return (path) => (test ??= compileGlob(pattern, root))(path);
}

/** Characters with a meaning in a glob: a pattern's text before the first (and after the last) is matched literally. */
const GLOB_SYNTAX = /[*?[\]{}\\!()|+@]/;

/**
 * A basename pattern's test. Most names fail the pattern's literal head or
 * tail (`.env*`, `*.pem`), which two string comparisons rule out; the glob
 * (a regular expression) runs only on names that pass them. A pattern with
 * no literal head or tail remembers its answer per name instead (a walk
 * meets the same names in every directory).
 */
function basenameTest(pattern: string): (path: string) => boolean {
  const test = globTest(pattern, "/");
  const { head, tail } = literalEnds(pattern);
  if (head !== "" || tail !== "") {
    const least = head.length + tail.length;
    return (path) => {
      // The name is compared in place (a listing checks every entry against every pattern): sliced only for the glob.
      const start = path.lastIndexOf("/") + 1;
      return path.length - start >= least && path.startsWith(head, start) && path.endsWith(tail) && path !== "/" && test(`/${path.slice(start)}`);
    };
  }
  const seen = new Map<string, boolean>();
  return (path) => {
    const name = path.slice(path.lastIndexOf("/") + 1);
    let answer = seen.get(name);
    if (answer === undefined) {
      if (seen.size >= BASENAME_CACHE) seen.clear();
      answer = path !== "/" && test(`/${name}`);
      seen.set(name, answer);
    }
    return answer;
  };
}

/** A basename pattern's literal text before its first glob character and after its last. */
function literalEnds(pattern: string): { head: string; tail: string } {
  const first = pattern.search(GLOB_SYNTAX);
  const head = first === -1 ? pattern : pattern.slice(0, first);
  let tail = "";
  if (first !== -1) for (let i = pattern.length - 1; i > first && !GLOB_SYNTAX.test(pattern[i]!); i--) tail = pattern[i]! + tail;
  return { head, tail };
}

const escapeRegExp = (text: string) => text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");

/** What a path's name must start or end with for a pattern's test to match it (a literal name: both). */
interface Ends {
  head: string;
  tail: string;
  /** The name is `head` itself. */
  exact?: boolean;
}

/** A pattern's required ends (see CompiledRule.gate), or undefined when it requires none. */
function requiredEnds(pattern: string, anchored: boolean): Ends | undefined {
  const body = pattern.replace(/^\/+/, "");
  if (body.includes("/")) {
    // compilePatternOnce: a literal last segment is the name itself.
    const last = body.slice(body.lastIndexOf("/") + 1);
    return last === "" || /[*?[\]{}\\]/.test(last) ? undefined : { head: last, tail: "", exact: true };
  }
  if (pattern.startsWith("/") || anchored) return undefined;
  const ends = literalEnds(pattern);
  return ends.head === "" && ends.tail === "" ? undefined : ends;
}

/**
 * One test for every pattern's ends: the first and last characters against
 * those any pattern needs (most names fail there), then one regular
 * expression of them all. A pattern with a head is ruled out by the first
 * character, one with only a tail by the last.
 */
const FIRST = 1;
const LAST = 2;

function gateOf(ends: readonly Ends[]): (path: string, start?: number) => boolean {
  const firsts = new Set(ends.filter((e) => e.head !== "").map((e) => e.head.charCodeAt(0)));
  const lasts = new Set(ends.filter((e) => e.head === "").map((e) => e.tail.charCodeAt(e.tail.length - 1)));
  // ASCII characters in a table as well: a Set lookup per entry cost more than the rest of the test.
  const ascii = new Uint8Array(128);
  for (const code of firsts) if (code < 128) ascii[code]! |= FIRST;
  for (const code of lasts) if (code < 128) ascii[code]! |= LAST;
  const first = (code: number) => (code < 128 ? (ascii[code]! & FIRST) !== 0 : firsts.has(code));
  const last = (code: number) => (code < 128 ? (ascii[code]! & LAST) !== 0 : lasts.has(code));
  const names = new RegExp(`^(?:${ends.map((e) => (e.exact ? escapeRegExp(e.head) : `${escapeRegExp(e.head)}.*${escapeRegExp(e.tail)}`)).join("|")})$`, "s");
  // `start`: where the path's name starts, when the caller knows it already.
  return (path, start = nameStart(path)) => {
    if (start === path.length || !(first(path.charCodeAt(start)) || last(path.charCodeAt(path.length - 1)))) return false;
    return names.test(start === 0 ? path : path.slice(start));
  };
}

function compileRule(rule: PermissionRule, index: number, root: string): CompiledRule {
  const where = `permissions.rules[${index}]`;
  if (typeof rule !== "object" || rule === null) throw errors.invalidArgument(`${where} must be an object`);
  if (rule.action !== "allow" && rule.action !== "deny" && rule.action !== "ask") throw errors.invalidArgument(`${where}.action must be "allow", "deny" or "ask"`);
  const ops = rule.operations === undefined ? PERMISSION_OPERATIONS : typeof rule.operations === "string" ? [rule.operations] : rule.operations;
  if (!Array.isArray(ops) || ops.some((op) => !PERMISSION_OPERATIONS.includes(op as PermissionOperation))) {
    throw errors.invalidArgument(`${where}.operations must name ${PERMISSION_OPERATIONS.join(", ")}`);
  }
  if (rule.name !== undefined && typeof rule.name !== "string") throw errors.invalidArgument(`${where}.name must be a string`);
  let matchers: CompiledRule["matchers"] = null;
  let gates: Array<Ends | undefined> = [];
  if (rule.paths !== undefined) {
    const patterns = typeof rule.paths === "string" ? [rule.paths] : rule.paths;
    if (!Array.isArray(patterns) || patterns.some((p) => typeof p !== "string")) throw errors.invalidArgument(`${where}.paths must be a glob or an array of globs`);
    matchers = [];
    for (const pattern of patterns as string[]) {
      try {
        matchers.push({ pattern, test: compilePattern(pattern, root) });
        gates.push(requiredEnds(pattern, false));
        // `dir/**` covers `dir` itself.
        if (pattern.endsWith("/**") && pattern.length > 3) {
          matchers.push({ pattern, test: compilePattern(pattern.slice(0, -3), root, true) });
          gates.push(requiredEnds(pattern.slice(0, -3), true));
        }
      } catch (error) {
        throw errors.invalidArgument(`${where}.paths: ${error instanceof StrataError ? error.message : "invalid glob"}`);
      }
    }
  }
  if (gates.length === 0 || gates.includes(undefined)) gates = [];
  return { rule, operations: new Set(ops as PermissionOperation[]), matchers, gate: gates.length === 0 ? null : gateOf(gates as Ends[]) };
}

/**
 * A rule's glob. One segment after a leading `/` (or, with `anchored`, a
 * relative one) names that place only, not a basename at any depth as a
 * bare name does in a search.
 */
function compilePattern(pattern: string, root: string, anchored = false): (path: string) => boolean {
  // A test depends on nothing but these three, so policies share it (every FilesystemBackend and sandbox compiles the preset).
  const key = `${anchored ? 1 : 0}\0${root}\0${pattern}`;
  let test = compiledPatterns.get(key);
  if (!test) {
    test = compilePatternOnce(pattern, root, anchored);
    if (compiledPatterns.size >= MAX_COMPILED_PATTERNS) compiledPatterns.clear();
    compiledPatterns.set(key, test);
  }
  return test;
}

/** Compiled pattern tests, shared by every policy in the process (a bound on what rules built at run time can hold). */
const compiledPatterns = new Map<string, (path: string) => boolean>();
const MAX_COMPILED_PATTERNS = 4096;

function compilePatternOnce(pattern: string, root: string, anchored: boolean): (path: string) => boolean {
  const body = pattern.replace(/^\/+/, "");
  if (body.includes("/")) {
    const glob = globTest(pattern, root);
    // A literal last segment (`**/.aws/credentials`) rules out almost every path with one comparison.
    const last = body.slice(body.lastIndexOf("/") + 1);
    if (last === "" || /[*?[\]{}\\]/.test(last)) return glob;
    return (path) => path.endsWith(`/${last}`) && glob(path);
  }
  if (!pattern.startsWith("/") && !anchored) return basenameTest(pattern);
  const base = pattern.startsWith("/") ? "/" : root;
  const name = globTest(body, base);
  return (path) => parentOf(path) === base && name(path);
}

/** How a rule is named in a message: its name, else its action and operations. */
export function describeRule(rule: PermissionRule): string {
  if (rule.name) return `'${printable(rule.name)}'`;
  const ops = rule.operations === undefined ? "all" : typeof rule.operations === "string" ? rule.operations : rule.operations.join(",");
  return `'${rule.action} ${ops}'`;
}

/** The error of a denied operation: which rule (and pattern) denied it. */
export function deniedBy(operation: PermissionOperation, path: string, verdict: PermissionVerdict, reason?: string): StrataError {
  const shown = printable(path);
  let message: string;
  if (reason !== undefined) message = `Permission denied: ${operation} of '${shown}' was rejected: ${printable(reason)}`;
  else if (verdict.action === "ask") message = `Permission denied: ${operation} of '${shown}' needs approval (rule ${describeRule(verdict.rule!)}) and no ask callback is configured`;
  else message = `Permission denied: ${operation} of '${shown}' is denied by rule ${describeRule(verdict.rule!)}${verdict.pattern && verdict.pattern !== "**" ? ` (pattern '${printable(verdict.pattern)}')` : ""}`;
  return new StrataError("permission_denied", message, { path });
}

/**
 * An ask answer as allow (with the input to use) or deny (with a reason).
 * A changed input may only replace the keys of the request's input, with strings.
 */
export function readDecision(decision: unknown, input: Readonly<Record<string, string>>): { allowed: true; input: Record<string, string> } | { allowed: false; reason: string } {
  if (decision === true) return { allowed: true, input: { ...input } };
  if (decision === false || decision === undefined || decision === null) return { allowed: false, reason: "the ask callback rejected it" };
  if (typeof decision !== "object") return { allowed: false, reason: "the ask callback gave no decision" };
  const d = decision as { behavior?: unknown; message?: unknown; updatedInput?: unknown };
  if (d.behavior === "deny") return { allowed: false, reason: typeof d.message === "string" && d.message !== "" ? d.message : "the ask callback rejected it" };
  if (d.behavior !== "allow") return { allowed: false, reason: "the ask callback gave no decision" };
  if (d.updatedInput === undefined) return { allowed: true, input: { ...input } };
  if (typeof d.updatedInput !== "object" || d.updatedInput === null) return { allowed: false, reason: "the ask callback's updatedInput is not an object" };
  const next = { ...input };
  for (const [key, value] of Object.entries(d.updatedInput as Record<string, unknown>)) {
    if (!(key in input) || typeof value !== "string") return { allowed: false, reason: `the ask callback's updatedInput.${printable(key)} cannot be changed to that` };
    next[key] = value;
  }
  return { allowed: true, input: next };
}

/**
 * Secret-looking environment variable names: refused as pass-through unless
 * opted in, so a wildcard or a careless list cannot hand a token to a command.
 */
export function looksSecret(name: string): boolean {
  return /KEY|SECRET|TOKEN|PASSWORD/i.test(name);
}
