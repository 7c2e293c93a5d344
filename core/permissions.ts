/**
 * Permission rules: pure logic, no I/O. `backends/permissions.ts` enforces
 * them on every native operation; the sandboxes also use them to find what
 * to hide from commands. docs/permissions.md is the reference.
 */
import { StrataError, errors, printable } from "./errors.js";
import { compileGlob } from "./glob.js";
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

const STRENGTH: Record<PermissionAction, number> = { allow: 0, ask: 1, deny: 2 };

interface CompiledRule {
  rule: PermissionRule;
  operations: ReadonlySet<PermissionOperation>;
  matchers: Matcher[] | null;
  /** The pattern matching a directory or one of its ancestors ("" for none), per directory: a listing asks for every file of a few directories. */
  above: Map<string, string>;
}

/**
 * A set of rules, compiled once. Precedence: deny > ask > allow among the
 * rules that match; no matching rule allows.
 */
export class PermissionPolicy {
  private readonly compiled: CompiledRule[];

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
    const target = path.length > 1 ? path.replace(/\/+$/, "") : path;
    let best: PermissionVerdict = { action: "allow" };
    for (const c of this.compiled) {
      // Only a stronger action can change the verdict (the first rule of an action is the one named).
      if (!c.operations.has(operation) || (best.rule && STRENGTH[c.rule.action] <= STRENGTH[best.action])) continue;
      const pattern = c.matchers === null ? "**" : matchedPattern(c, target, ancestors);
      if (pattern === undefined) continue;
      best = { action: c.rule.action, rule: c.rule, pattern };
    }
    return best;
  }

  /** Whether some rule could refuse `operation` (deny or ask) somewhere. */
  hasRestrictions(operation: PermissionOperation): boolean {
    return this.compiled.some((c) => c.rule.action !== "allow" && c.operations.has(operation));
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

/** Directories whose ancestor answer a rule keeps (then it starts afresh). */
const ANCESTOR_CACHE = 4096;

function matchedPattern(c: CompiledRule, path: string, ancestors: boolean): string | undefined {
  for (const m of c.matchers!) if (m.test(path)) return m.pattern;
  if (path === "/" || !ancestors) return undefined;
  // Each ancestor: a rule on a directory covers what lies under it. The tests are pure, so a directory's answer is kept.
  const dir = parentOf(path);
  let above = c.above.get(dir);
  if (above === undefined) {
    above = matchedPattern(c, dir, true) ?? "";
    if (c.above.size >= ANCESTOR_CACHE) c.above.clear();
    c.above.set(dir, above);
  }
  return above === "" ? undefined : above;
}

interface Matcher {
  pattern: string;
  test: (path: string) => boolean;
}

/** Answers per basename are kept (a walk meets the same names in every directory), up to this many per pattern. */
const BASENAME_CACHE = 4096;

/** A basename pattern's test, remembering its answer per name: the glob is a regular expression, a lookup is cheaper. */
function basenameTest(pattern: string): (path: string) => boolean {
  const test = compileGlob(pattern, "/");
  const seen = new Map<string, boolean>();
  // The literal text before the first and after the last special character: a name lacking either
  // cannot match, and most names (`*.pem`, `.env*`) are ruled out with two comparisons, no regex, no cache.
  const special = /[*?[\]{}\\!()|+@]/;
  const first = pattern.search(special);
  const prefix = first === -1 ? pattern : pattern.slice(0, first);
  let last = pattern.length;
  while (last > 0 && !special.test(pattern[last - 1]!)) last--;
  const suffix = first === -1 ? "" : pattern.slice(last);
  return (path) => {
    const slash = path.lastIndexOf("/");
    if (!path.startsWith(prefix, slash + 1) || !path.endsWith(suffix) || path.length - slash - 1 < prefix.length + suffix.length) return false;
    const name = path.slice(slash + 1);
    let answer = seen.get(name);
    if (answer === undefined) {
      if (seen.size >= BASENAME_CACHE) seen.clear();
      answer = path !== "/" && test(`/${name}`);
      seen.set(name, answer);
    }
    return answer;
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
  if (rule.paths !== undefined) {
    const patterns = typeof rule.paths === "string" ? [rule.paths] : rule.paths;
    if (!Array.isArray(patterns) || patterns.some((p) => typeof p !== "string")) throw errors.invalidArgument(`${where}.paths must be a glob or an array of globs`);
    matchers = [];
    for (const pattern of patterns as string[]) {
      try {
        matchers.push({ pattern, test: compilePattern(pattern, root) });
        // `dir/**` covers `dir` itself.
        if (pattern.endsWith("/**") && pattern.length > 3) matchers.push({ pattern, test: compilePattern(pattern.slice(0, -3), root, true) });
      } catch (error) {
        throw errors.invalidArgument(`${where}.paths: ${error instanceof StrataError ? error.message : "invalid glob"}`);
      }
    }
  }
  return { rule, operations: new Set(ops as PermissionOperation[]), matchers, above: new Map() };
}

/**
 * A rule's glob. One segment after a leading `/` (or, with `anchored`, a
 * relative one) names that place only, not a basename at any depth as a
 * bare name does in a search.
 */
function compilePattern(pattern: string, root: string, anchored = false): (path: string) => boolean {
  const body = pattern.replace(/^\/+/, "");
  if (body.includes("/")) {
    const glob = compileGlob(pattern, root);
    // A literal last segment (`**/.aws/credentials`) rules out almost every path with one comparison.
    const last = body.slice(body.lastIndexOf("/") + 1);
    if (last === "" || /[*?[\]{}\\]/.test(last)) return glob;
    return (path) => path.endsWith(`/${last}`) && glob(path);
  }
  if (!pattern.startsWith("/") && !anchored) return basenameTest(pattern);
  const base = pattern.startsWith("/") ? "/" : root;
  const name = compileGlob(body, base);
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
