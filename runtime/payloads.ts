import { randomBytes } from "node:crypto";
import { z } from "zod";
import { errors, fileOperationError, StrataError, type ErrorCode } from "../core/errors.js";
import { decodeText, encodeText } from "../core/filedata.js";
import { timeoutSeconds } from "../core/limits.js";
import { normalizePath, parentOf } from "../core/paths.js";
import type { SandboxBackendProtocol } from "../core/protocol.js";
import type { ExecuteOptions, FileInfo } from "../core/types.js";
import { shellQuote, TIMEOUT_EXIT_CODE } from "../sandboxes/base.js";

/**
 * Typed tool payloads (OpenRath's BackendTool* types), their results, and
 * `dispatchPayload`, which runs any payload against any sandbox through the
 * SandboxBackendProtocol alone, so every provider shares one implementation.
 *
 * Payloads are validated with zod because they often arrive as JSON from a
 * model. Results are plain objects discriminated by `type`. A payload that
 * fails at run time returns a `ToolExecutionFailure`; it is never thrown.
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

/** A builder's bad field is the caller's mistake: a typed invalid_argument, not a raw ZodError. */
function build<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new StrataError("invalid_argument", `Invalid payload: ${z.prettifyError(parsed.error)}`);
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
  /** The contract's lsInfo entries: sorted, directories end in "/". */
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

/** Why a payload could not be carried out: an error code, or a missing interpreter. */
export type FailureKind = ErrorCode | "interpreter_missing";

export interface ToolExecutionFailure {
  type: "failure";
  kind: FailureKind;
  message: string;
  detail: string | null;
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

export function isFailure(value: unknown): value is ToolExecutionFailure {
  return typeof value === "object" && value !== null && (value as { type?: unknown }).type === "failure";
}

export function toolFailure(kind: FailureKind, message: string, detail: string | null = null): ToolExecutionFailure {
  return { type: "failure", kind, message, detail };
}

/** A failure from a thrown value. Only StrataError messages are passed on: others may name host paths. */
export function failureFrom(error: unknown): ToolExecutionFailure {
  if (error instanceof StrataError) return toolFailure(error.code, error.message);
  const name = error instanceof Error ? error.name : typeof error;
  return toolFailure("io_error", "The sandbox operation failed", name);
}

// ---------------------------------------------------------------- validation

/** Validates an untrusted payload (e.g. JSON from a model); a bad one becomes an invalid_argument failure. */
export function parsePayload(value: unknown): Payload | ToolExecutionFailure {
  const parsed = PayloadSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  return toolFailure("invalid_argument", `Invalid payload: ${z.prettifyError(parsed.error)}`);
}

// ---------------------------------------------------------------- dispatch

export interface DispatchContext {
  /** Environment every command and program in this sandbox starts with (the spec's env); a payload's env wins. */
  env?: Readonly<Record<string, string>>;
}

/** Runs one validated payload. Never throws for a failure of the payload itself. */
export async function dispatchPayload<P extends Payload>(
  sandbox: SandboxBackendProtocol,
  payload: P,
  context: DispatchContext = {},
): Promise<ResultOf<P["type"]>> {
  try {
    return (await run(sandbox, payload, context)) as ResultOf<P["type"]>;
  } catch (error) {
    return failureFrom(error);
  }
}

function run(sandbox: SandboxBackendProtocol, payload: Payload, context: DispatchContext): Promise<PayloadResult> {
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

async function runCommand(sandbox: SandboxBackendProtocol, payload: CommandRun, context: DispatchContext): Promise<CommandResult | ToolExecutionFailure> {
  const cmd = typeof payload.cmd === "string" ? payload.cmd : payload.cmd.map(shellQuote).join(" ");
  const cwd = payload.cwd === undefined ? undefined : normalizePath(payload.cwd);
  const run = await executeSeparated(sandbox, cmd, {
    env: mergeEnv(context.env, payload.env),
    cwd,
    stdin: payload.stdin,
    timeout: payload.timeout,
  });
  if (run.timedOut) return timeoutFailure(payload.timeout, run);
  return { type: "command_result", stdout: run.stdout, stderr: run.stderr, exitCode: run.exitCode, elapsedMs: run.elapsedMs, truncated: run.truncated };
}

async function readFile(sandbox: SandboxBackendProtocol, payload: FilesRead): Promise<FileContent | ToolExecutionFailure> {
  const path = normalizePath(payload.path);
  const [response] = await sandbox.downloadFiles([path]);
  if (!response || response.error || !response.content) return failureFrom(fileOperationError(response?.error ?? "file_not_found", path));
  if (payload.encoding === null) return { type: "file_content", path, data: response.content, encoding: null };
  const text = decodeText(response.content);
  if (text === null) return failureFrom(errors.binary(path, response.content.length));
  return { type: "file_content", path, data: text, encoding: "utf-8" };
}

async function writeFile(sandbox: SandboxBackendProtocol, payload: FilesWrite): Promise<FileWriteResult | ToolExecutionFailure> {
  const path = normalizePath(payload.path);
  if (path === "/") return failureFrom(errors.isDirectory(path));
  const bytes = typeof payload.data === "string" ? encodeText(payload.data) : payload.data;
  const [response] = await sandbox.uploadFiles([[path, bytes]]);
  if (!response || response.error) return failureFrom(fileOperationError(response?.error ?? "permission_denied", path));
  if (payload.mode !== undefined) {
    // The protocol has no chmod; the sandbox's own chmod, relative to the workspace root, sets the bits.
    const chmod = await sandbox.execute(`chmod ${payload.mode.toString(8)} ${shellQuote(`.${path}`)}`, { cwd: "/" });
    if (chmod.exitCode !== 0) return toolFailure("permission_denied", `Wrote '${path}' but could not set its mode to ${payload.mode.toString(8)}`, chmod.output.trim() || null);
  }
  return { type: "file_write_result", path, bytesWritten: bytes.length };
}

async function listFiles(sandbox: SandboxBackendProtocol, payload: FilesList): Promise<FileEntries> {
  const path = normalizePath(payload.path);
  return { type: "file_entries", path, entries: await sandbox.lsInfo(path) };
}

/** Looks the name up in its parent's listing: an empty directory and a missing one both list as []. */
async function fileExists(sandbox: SandboxBackendProtocol, payload: FilesExists): Promise<boolean> {
  const path = normalizePath(payload.path);
  if (path === "/") return true;
  const siblings = await sandbox.lsInfo(parentOf(path));
  return siblings.some((entry) => entry.path === path || entry.path === `${path}/`);
}

/** Interpreters tried in order for each language; the program is read from stdin (`-`/`-s`), never from argv. */
const INTERPRETERS: Record<CodeLanguage, { names: string[]; stdinArg: string }> = {
  python: { names: ["python3", "python"], stdinArg: "-" },
  node: { names: ["node", "nodejs"], stdinArg: "-" },
  javascript: { names: ["node", "nodejs"], stdinArg: "-" },
  bash: { names: ["bash"], stdinArg: "-s" },
  sh: { names: ["sh"], stdinArg: "-s" },
};

async function runCode(sandbox: SandboxBackendProtocol, payload: CodeRun, context: DispatchContext): Promise<CodeResult | ToolExecutionFailure> {
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
  if (run.exitCode === 127 && run.stdout === missing) {
    return toolFailure(
      "interpreter_missing",
      `No ${payload.language} interpreter in this sandbox (looked for ${names.join(", ")} on PATH)`,
      payload.language,
    );
  }
  if (run.timedOut) return timeoutFailure(payload.timeout, run);
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
 * The protocol's `execute` returns stdout and stderr combined. To hand them
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
async function executeSeparated(sandbox: SandboxBackendProtocol, cmd: string, options: ExecuteOptions): Promise<SeparatedRun> {
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

function timeoutFailure(seconds: number | undefined, run: SeparatedRun): ToolExecutionFailure {
  const limit = seconds === undefined ? "the sandbox's default timeout" : `${seconds} s`;
  return toolFailure("timeout", `Timed out after ${limit}; the command was killed`, run.stdout || null);
}

function mergeEnv(base: Readonly<Record<string, string>> | undefined, own: Record<string, string> | undefined): Record<string, string> | undefined {
  if (!base) return own;
  return { ...base, ...own };
}

function nonce(): string {
  return randomBytes(8).toString("hex");
}
