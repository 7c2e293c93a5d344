import { randomBytes } from "node:crypto";
import { z } from "zod";
import { errors, StrataError, type ErrorCode, type ErrorInfo } from "../core/errors.js";
import { decodeText, encodeText } from "../core/filedata.js";
import { timeoutSeconds } from "../core/limits.js";
import { baseName, normalizePath, parentOf } from "../core/paths.js";
import type { Sandbox } from "../core/protocol.js";
import type { ExecuteOptions, FileInfo, Result } from "../core/types.js";
import { TIMEOUT_EXIT_CODE } from "../sandboxes/output.js";
import { shellQuote } from "../sandboxes/shell.js";
import { InvalidPayload } from "./errors.js";

/**
 * Typed tool payloads (OpenRath's BackendTool* types), their results, and
 * `dispatchPayload`, which runs any payload against any sandbox through the
 * native `Sandbox` API alone, so every provider shares one implementation.
 *
 * Payloads are validated with zod because they often arrive as JSON from a
 * model. Results are plain objects discriminated by `type`. A payload that
 * fails returns a `ToolExecutionFailure`, `{ error: { code, message, path? } }`
 * with a core ErrorCode, the failure shape of every Strata result; it is never
 * thrown.
 */

// ---------------------------------------------------------------- payloads

const pathField = z.string().min(1);
const env = z.record(z.string(), z.string());
/**
 * Seconds, like ExecuteOptions.timeout, checked by core's one rule: a delay
 * past what a timer can hold would fire at once instead of never.
 */
export const TimeoutSchema = z.number().superRefine((value, context) => {
  try {
    timeoutSeconds(value);
  } catch (error) {
    context.addIssue({ code: "custom", message: (error as Error).message });
  }
});
const timeout = TimeoutSchema;

export const CommandRunSchema = z
  .object({
    type: z.literal("command.run"),
    /** A shell command line, or an argv list that is quoted for the shell. */
    cmd: z.union([z.string().min(1), z.array(z.string()).min(1)]),
    env: env.optional(),
    /** Virtual working directory (default: the workspace root). */
    cwd: pathField.optional(),
    stdin: z.union([z.string(), z.instanceof(Uint8Array)]).optional(),
    timeout: timeout.optional(),
  })
  .strict();

export const FilesReadSchema = z
  .object({
    type: z.literal("files.read"),
    path: pathField,
    /** "utf-8" returns text (binary files fail); null returns the bytes. */
    encoding: z.literal("utf-8").nullable().default("utf-8"),
  })
  .strict();

export const FilesWriteSchema = z
  .object({
    type: z.literal("files.write"),
    path: pathField,
    data: z.union([z.string(), z.instanceof(Uint8Array)]),
    /** Unix permission bits to set after writing (e.g. 0o755); left to the sandbox when absent. */
    mode: z.number().int().min(0).max(0o7777).optional(),
  })
  .strict();

export const FilesListSchema = z.object({ type: z.literal("files.list"), path: pathField }).strict();

export const FilesExistsSchema = z.object({ type: z.literal("files.exists"), path: pathField }).strict();

export const CODE_LANGUAGES = ["python", "node", "javascript", "bash", "sh"] as const;
export type CodeLanguage = (typeof CODE_LANGUAGES)[number];

export const CodeRunSchema = z
  .object({
    type: z.literal("code.run"),
    code: z.string(),
    language: z.enum(CODE_LANGUAGES).default("python"),
    timeout: timeout.optional(),
  })
  .strict();

export const PayloadSchema = z.discriminatedUnion("type", [
  CommandRunSchema,
  FilesReadSchema,
  FilesWriteSchema,
  FilesListSchema,
  FilesExistsSchema,
  CodeRunSchema,
]);

export type CommandRun = z.output<typeof CommandRunSchema>;
export type FilesRead = z.output<typeof FilesReadSchema>;
export type FilesWrite = z.output<typeof FilesWriteSchema>;
export type FilesList = z.output<typeof FilesListSchema>;
export type FilesExists = z.output<typeof FilesExistsSchema>;
export type CodeRun = z.output<typeof CodeRunSchema>;
export type Payload = z.output<typeof PayloadSchema>;
export type PayloadType = Payload["type"];

export const PAYLOAD_TYPES: readonly PayloadType[] = [
  "command.run",
  "files.read",
  "files.write",
  "files.list",
  "files.exists",
  "code.run",
];

type Fields<S extends z.ZodType> = Omit<z.input<S>, "type">;

/** A builder's bad field is the caller's mistake: an InvalidPayload (invalid_argument), not a raw ZodError. */
function build<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new InvalidPayload(`Invalid payload: ${z.prettifyError(parsed.error)}`);
  return parsed.data;
}

/** Builders: `commandRun({ cmd: "ls" })` instead of spelling out `type`. */
export const commandRun = (fields: Fields<typeof CommandRunSchema>): CommandRun => build(CommandRunSchema, { ...fields, type: "command.run" });
export const filesRead = (fields: Fields<typeof FilesReadSchema>): FilesRead => build(FilesReadSchema, { ...fields, type: "files.read" });
export const filesWrite = (fields: Fields<typeof FilesWriteSchema>): FilesWrite => build(FilesWriteSchema, { ...fields, type: "files.write" });
export const filesList = (fields: Fields<typeof FilesListSchema>): FilesList => build(FilesListSchema, { ...fields, type: "files.list" });
export const filesExists = (fields: Fields<typeof FilesExistsSchema>): FilesExists => build(FilesExistsSchema, { ...fields, type: "files.exists" });
export const codeRun = (fields: Fields<typeof CodeRunSchema>): CodeRun => build(CodeRunSchema, { ...fields, type: "code.run" });

// ---------------------------------------------------------------- results

export interface CommandResult {
  type: "command_result";
  stdout: string;
  stderr: string;
  exitCode: number | null;
  elapsedMs: number;
  /** The sandbox cut the output short; stderr may then be missing. */
  truncated: boolean;
}

export interface FileContent {
  type: "file_content";
  path: string;
  /** Text for encoding "utf-8", bytes for encoding null. */
  data: string | Uint8Array;
  encoding: "utf-8" | null;
}

export interface FileEntries {
  type: "file_entries";
  path: string;
  /** The native `ls` entries: sorted, directories end in "/". */
  entries: FileInfo[];
}

export interface FileWriteResult {
  type: "file_write_result";
  path: string;
  bytesWritten: number;
}

export interface CodeResult {
  type: "code_result";
  language: CodeLanguage;
  stdout: string;
  stderr: string;
  exitCode: number | null;
  /** stderr (or the exit status) when the program failed; null when it exited 0. */
  error: string | null;
  elapsedMs: number;
  truncated: boolean;
}

/**
 * Why a payload could not be carried out, in the vocabulary of every Strata
 * result: `{ error: { code, message, path? } }`. `code` is a core ErrorCode
 * (`timeout`, `file_not_found`, `invalid_argument`, …), `message` a sentence a
 * person or a model can act on, `path` the virtual path the failure is about
 * when there is one (a files payload's path, a command's cwd). A plain
 * object, so it survives JSON. The name is OpenRath's.
 */
export interface ToolExecutionFailure {
  error: { code: ErrorCode; message: string; path?: string };
  /** A failure has no `type`, so `result.type === "command_result"` narrows a result. */
  type?: never;
}

export interface PayloadResults {
  "command.run": CommandResult;
  "files.read": FileContent;
  "files.write": FileWriteResult;
  "files.list": FileEntries;
  "files.exists": boolean;
  "code.run": CodeResult;
}

/** What dispatching a payload of type T gives back. */
export type ResultOf<T extends PayloadType> = PayloadResults[T] | ToolExecutionFailure;
export type PayloadResult = ResultOf<PayloadType>;

/**
 * True for a failure. Use it rather than `"error" in result`: a CodeResult
 * has an `error` field too (the failed program's stderr, a string or null).
 */
export function isFailure(value: unknown): value is ToolExecutionFailure {
  if (typeof value !== "object" || value === null) return false;
  const error = (value as { error?: unknown }).error;
  return typeof error === "object" && error !== null && typeof (error as { code?: unknown }).code === "string";
}

export function toolFailure(code: ErrorCode, message: string, path?: string): ToolExecutionFailure {
  return { error: path === undefined ? { code, message } : { code, message, path } };
}

/** Codes that are about a path: only their failures carry the payload's path. */
const PATH_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "file_not_found",
  "permission_denied",
  "is_directory",
  "invalid_path",
  "not_a_directory",
  "already_exists",
  "binary_file",
  "too_large",
  "quota_exceeded",
  "conflict",
  "io_error",
]);

/**
 * A failure from a thrown value. Only StrataError messages are passed on:
 * others may name host paths. `path` (the virtual path the payload is about)
 * is added to failures whose code is about a path, unless the error names
 * its own.
 */
export function failureFrom(error: unknown, path?: string): ToolExecutionFailure {
  if (error instanceof StrataError) {
    const own = (error as { path?: unknown }).path;
    return toolFailure(error.code, error.message, typeof own === "string" ? own : PATH_CODES.has(error.code) ? path : undefined);
  }
  const name = error instanceof Error ? error.name : typeof error;
  return toolFailure("io_error", `The sandbox operation failed (${name})`, path);
}

/**
 * A failure from a native result's `{ error }`: its code, message and path
 * carried over unchanged (the full code: `sandbox_closed`, `not_a_directory`,
 * …). `path` fills in only where the error names none and its code is about
 * a path, as in `failureFrom`.
 */
function failureOf(error: ErrorInfo, path?: string): ToolExecutionFailure {
  return toolFailure(error.code, error.message, error.path ?? (PATH_CODES.has(error.code) ? path : undefined));
}

/** The payload's path as a failure's `path`: as the sandbox names it when it can be; a hostile one (NUL, over-long) is left out. */
function failurePath(sandbox: Sandbox, path: string | undefined): string | undefined {
  if (path === undefined) return undefined;
  try {
    return sandboxPath(sandbox, path);
  } catch {
    return path.length <= 4096 && !path.includes("\0") ? path : undefined;
  }
}

/** The path a payload is about, if any: a files payload's path, a command's cwd. */
function subjectPath(sandbox: Sandbox, payload: Payload): string | undefined {
  switch (payload.type) {
    case "files.read":
    case "files.write":
    case "files.list":
    case "files.exists":
      return failurePath(sandbox, payload.path);
    case "command.run":
      return failurePath(sandbox, payload.cwd);
    case "code.run":
      return undefined;
  }
}

// ---------------------------------------------------------------- validation

/**
 * Validates an untrusted payload (e.g. JSON from a model). A `type` that is
 * no payload type is an `unsupported` failure; any other bad payload an
 * `invalid_argument` one.
 */
export function parsePayload(value: unknown): Payload | ToolExecutionFailure {
  const type = (value as { type?: unknown } | null | undefined)?.type;
  if (typeof type === "string" && !(PAYLOAD_TYPES as readonly string[]).includes(type)) {
    return toolFailure("unsupported", `Unknown payload type '${type.slice(0, 80)}'; the payload types are: ${PAYLOAD_TYPES.join(", ")}`);
  }
  const parsed = PayloadSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  return toolFailure("invalid_argument", `Invalid payload: ${z.prettifyError(parsed.error)}`);
}

// ---------------------------------------------------------------- dispatch

export interface DispatchContext {
  /** Environment every command and program in this sandbox starts with (the spec's env); a payload's env wins. */
  env?: Readonly<Record<string, string>>;
}

/**
 * Validates and runs one payload. Never throws: whatever goes wrong (a bad
 * payload, an unknown type, a missing file, a timeout, a closed sandbox)
 * comes back as a ToolExecutionFailure.
 */
export async function dispatchPayload<P extends Payload>(
  sandbox: Sandbox,
  payload: P,
  context: DispatchContext = {},
): Promise<ResultOf<P["type"]>> {
  const parsed = parsePayload(payload);
  if (isFailure(parsed)) return parsed;
  try {
    return (await run(sandbox, parsed, context)) as ResultOf<P["type"]>;
  } catch (error) {
    return failureFrom(error, subjectPath(sandbox, parsed));
  }
}

function run(sandbox: Sandbox, payload: Payload, context: DispatchContext): Promise<PayloadResult> {
  switch (payload.type) {
    case "command.run":
      return runCommand(sandbox, payload, context);
    case "files.read":
      return readFile(sandbox, payload);
    case "files.write":
      return writeFile(sandbox, payload);
    case "files.list":
      return listFiles(sandbox, payload);
    case "files.exists":
      return fileExists(sandbox, payload);
    case "code.run":
      return runCode(sandbox, payload, context);
  }
}

async function runCommand(sandbox: Sandbox, payload: CommandRun, context: DispatchContext): Promise<CommandResult | ToolExecutionFailure> {
  const cmd = typeof payload.cmd === "string" ? payload.cmd : payload.cmd.map(shellQuote).join(" ");
  const cwd = payload.cwd === undefined ? undefined : sandboxPath(sandbox, payload.cwd);
  const run = await executeSeparated(sandbox, cmd, {
    env: mergeEnv(context.env, payload.env),
    cwd,
    stdin: payload.stdin,
    timeout: payload.timeout,
  });
  if (run.error) return failureOf(run.error, cwd);
  if (run.timedOut) return timeoutFailure(payload.timeout);
  return { type: "command_result", stdout: run.stdout, stderr: run.stderr, exitCode: run.exitCode, elapsedMs: run.elapsedMs, truncated: run.truncated };
}

async function readFile(sandbox: Sandbox, payload: FilesRead): Promise<FileContent | ToolExecutionFailure> {
  const path = sandboxPath(sandbox, payload.path);
  const downloaded = await sandbox.downloadFiles([path]);
  if (downloaded.error) return failureOf(downloaded.error, path);
  const [item] = downloaded.files;
  if (item?.error) return failureOf(item.error, path);
  if (!item?.content) return failureFrom(errors.notFound(path), path);
  if (payload.encoding === null) return { type: "file_content", path, data: item.content, encoding: null };
  const text = decodeText(item.content);
  if (text === null) return failureFrom(errors.binary(path, item.content.length), path);
  return { type: "file_content", path, data: text, encoding: "utf-8" };
}

async function writeFile(sandbox: Sandbox, payload: FilesWrite): Promise<FileWriteResult | ToolExecutionFailure> {
  const path = sandboxPath(sandbox, payload.path);
  // "/" is a directory in every sandbox, within its files' path space or not (the workspace itself answers so from the sandbox).
  if (path === "/") return failureFrom(errors.isDirectory(path), path);
  const bytes = typeof payload.data === "string" ? encodeText(payload.data) : payload.data;
  const uploaded = await sandbox.uploadFiles([[path, bytes]]);
  if (uploaded.error) return failureOf(uploaded.error, path);
  const [item] = uploaded.files;
  if (!item) return failureFrom(errors.io(path), path);
  if (item.error) return failureOf(item.error, path);
  if (payload.mode !== undefined) {
    // The native API has no chmod; the sandbox's own chmod, run in the file's directory (a cwd in the same path space), sets the bits.
    const chmod = await sandbox.execute(`chmod ${payload.mode.toString(8)} ${shellQuote(`./${baseName(path)}`)}`, { cwd: parentOf(path) });
    if (chmod.error) return failureOf(chmod.error, path);
    if (chmod.exitCode !== 0) {
      const said = chmod.output.trim().split("\n")[0]?.slice(0, 200);
      return toolFailure("permission_denied", `Wrote '${path}' but could not set its mode to ${payload.mode.toString(8)}${said ? ` (${said})` : ""}`, path);
    }
  }
  return { type: "file_write_result", path, bytesWritten: bytes.length };
}

async function listFiles(sandbox: Sandbox, payload: FilesList): Promise<FileEntries | ToolExecutionFailure> {
  const path = sandboxPath(sandbox, payload.path);
  const listed = await sandbox.ls(path);
  if (listed.error) return failureOf(listed.error, path);
  return { type: "file_entries", path, entries: listed.entries };
}

/**
 * `stat`s the path: missing (or under a file) is false. Not a listing of its
 * parent: the workspace's parent lies outside a sandbox's path space.
 */
async function fileExists(sandbox: Sandbox, payload: FilesExists): Promise<boolean | ToolExecutionFailure> {
  const path = sandboxPath(sandbox, payload.path);
  if (path === "/") return true;
  const info = await sandbox.stat(path);
  if (!info.error) return true;
  if (info.error.code === "file_not_found" || info.error.code === "not_a_directory") return false;
  return failureOf(info.error, path);
}

/**
 * A payload's path as the sandbox names it. Paths are the sandbox's own (its
 * workspace's absolute paths in bubblewrap, Docker and SSH; LocalSandbox's
 * "/" is its workspace), and a relative path starts at its `root`, the
 * workspace.
 */
function sandboxPath(sandbox: Sandbox, path: string): string {
  const normal = normalizePath(path);
  const root = sandbox.root ?? "/";
  if (path.startsWith("/") || root === "/") return normal;
  return normal === "/" ? root : `${root}${normal}`;
}

/** Interpreters tried in order for each language; the program is read from stdin (`-`/`-s`), never from argv. */
const INTERPRETERS: Record<CodeLanguage, { names: string[]; stdinArg: string }> = {
  python: { names: ["python3", "python"], stdinArg: "-" },
  node: { names: ["node", "nodejs"], stdinArg: "-" },
  javascript: { names: ["node", "nodejs"], stdinArg: "-" },
  bash: { names: ["bash"], stdinArg: "-s" },
  sh: { names: ["sh"], stdinArg: "-s" },
};

async function runCode(sandbox: Sandbox, payload: CodeRun, context: DispatchContext): Promise<CodeResult | ToolExecutionFailure> {
  const { names, stdinArg } = INTERPRETERS[payload.language];
  const missing = `__STRATA_NO_INTERPRETER_${nonce()}__`;
  const script = [
    `__strata_interp=`,
    `for __strata_c in ${names.join(" ")}; do`,
    `  if command -v "$__strata_c" >/dev/null 2>&1; then __strata_interp=$__strata_c; break; fi`,
    `done`,
    `if [ -z "$__strata_interp" ]; then printf '%s' ${shellQuote(missing)}; exit 127; fi`,
    `exec "$__strata_interp" ${stdinArg}`,
  ].join("\n");
  const run = await executeSeparated(sandbox, script, { env: mergeEnv(context.env, undefined), stdin: payload.code, timeout: payload.timeout });
  if (run.error) return failureOf(run.error);
  if (run.exitCode === 127 && run.stdout === missing) {
    // Core has no code of its own for this: the sandbox does not support the language.
    return toolFailure("unsupported", `No ${payload.language} interpreter in this sandbox (looked for ${names.join(", ")} on PATH)`);
  }
  if (run.timedOut) return timeoutFailure(payload.timeout);
  const error = run.exitCode === 0 ? null : run.stderr.trim() || `exited with status ${run.exitCode}`;
  return {
    type: "code_result",
    language: payload.language,
    stdout: run.stdout,
    stderr: run.stderr,
    exitCode: run.exitCode,
    error,
    elapsedMs: run.elapsedMs,
    truncated: run.truncated,
  };
}

// ---------------------------------------------------------------- separate stdout and stderr

interface SeparatedRun {
  stdout: string;
  stderr: string;
  exitCode: number | null;
  elapsedMs: number;
  truncated: boolean;
  /** The sandbox killed the command at its timeout (the wrapper died with it, so stderr is lost). */
  timedOut: boolean;
}

/**
 * The native `execute` returns stdout and stderr combined. To hand them
 * back apart, the command runs in a subshell whose stderr goes to a temporary
 * file inside the sandbox; after it ends, the wrapper prints a random marker
 * and then that file. Everything before the marker is stdout, everything
 * after it stderr. The subshell also contains `exit` and syntax errors, whose
 * messages land in stderr like any other. If the sandbox truncates the output
 * before the marker, the whole output is reported as stdout with
 * `truncated: true`.
 *
 * The file is opened twice (fd 3 to write, fd 4 to read back) and unlinked
 * before the command starts: it has no name while it holds anything, and the
 * kernel frees it however the wrapper ends — a timeout's SIGKILL, an abort or
 * a dropped connection included — so no command output is ever left behind in
 * a shared /tmp. A pipe would not do: a background child holding it open
 * would keep the wrapper waiting. Without mktemp, stderr stays in the
 * combined output (reported as stdout) rather than going to a guessable name.
 */
async function executeSeparated(sandbox: Sandbox, cmd: string, options: ExecuteOptions): Promise<Result<SeparatedRun>> {
  const marker = `__STRATA_STDERR_${nonce()}__`;
  const script = [
    `if __strata_err=$(mktemp 2>/dev/null); then exec 3>"$__strata_err" 4<"$__strata_err"; rm -f -- "$__strata_err"; else exec 3>&2 4</dev/null; fi`,
    `( eval ${shellQuote(cmd)} ) 2>&3 3>&- 4<&-`,
    `__strata_status=$?`,
    `exec 3>&-`,
    `printf '%s' ${shellQuote(marker)}`,
    `cat <&4`,
    `exit "$__strata_status"`,
  ].join("\n");
  const started = performance.now();
  const response = await sandbox.execute(script, options);
  const elapsedMs = performance.now() - started;
  if (response.error) return response;
  const at = response.output.lastIndexOf(marker);
  if (at === -1) {
    // Only a killed wrapper ends without the marker and with the timeout status.
    const timedOut = response.exitCode === TIMEOUT_EXIT_CODE;
    return { stdout: response.output, stderr: "", exitCode: response.exitCode, elapsedMs, truncated: true, timedOut };
  }
  return {
    stdout: response.output.slice(0, at),
    stderr: response.output.slice(at + marker.length),
    exitCode: response.exitCode,
    elapsedMs,
    truncated: response.truncated,
    timedOut: false,
  };
}

function timeoutFailure(seconds: number | undefined): ToolExecutionFailure {
  const limit = seconds === undefined ? "the sandbox's default timeout" : `${seconds} s`;
  return toolFailure("timeout", `Timed out after ${limit}; the command was killed`);
}

function mergeEnv(base: Readonly<Record<string, string>> | undefined, own: Record<string, string> | undefined): Record<string, string> | undefined {
  if (!base) return own;
  return { ...base, ...own };
}

function nonce(): string {
  return randomBytes(8).toString("hex");
}
