/**
 * The Vercel AI SDK (`ai`, majors 6 and 7): the tools as a `ToolSet` built with
 * the SDK's own `tool()`, and a Strata sandbox as the SDK's
 * `Experimental_SandboxSession`, the object `generateText({ experimental_sandbox })`
 * hands to every tool.
 *
 * The SDK's functions are a parameter (`aiSdkTools(ai, backend)` with
 * `import * as ai from "ai"`), not an optional peer this module loads: `ai` 7
 * needs Node >= 22 while the library supports Node 20, where `ai` 6 is the
 * newest that runs; a parameter takes whichever major the caller installed
 * (and its single copy, not one a bundler or a hoisting quirk picks), and this
 * module imports nothing of `ai` at all, not even types, so it compiles
 * against either. The shapes below mirror the SDK's; the tests check that they
 * are assignable to `ToolSet` and `Experimental_SandboxSession` of both majors.
 */
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import type { Result, SpawnedProcess } from "../core/types.js";
import { createTools, type BoundTool, type CreateToolsOptions, type ToolOutput } from "../tools/index.js";

/**
 * The two functions of the `ai` package used here: pass the package itself
 * (`import * as ai from "ai"`). Typed loosely on purpose, so both majors'
 * overloaded generics fit; `S` is whatever the SDK's `jsonSchema` returns.
 */
export interface AiSdkFunctions {
  tool: (spec: never) => unknown;
  jsonSchema: (schema: never) => unknown;
  /**
   * Only probed: the major that has `uploadFile` (7) takes tagged file data,
   * `{ type: "file", data: { type: "data", ... } }`, and warns about the older
   * `image-data` part, which is all 6 takes.
   */
  uploadFile?: unknown;
}

/** An image in a tool result for ai 7: tagged file data. */
export type AiSdkFilePart = { type: "file"; mediaType: string; data: { type: "data"; data: string } };
/** An image in a tool result for ai 6. */
export type AiSdkImageDataPart = { type: "image-data"; data: string; mediaType: string };
/** The image part the SDK module `M` takes. */
export type AiSdkImagePart<M> = M extends { uploadFile: (...args: never[]) => unknown } ? AiSdkFilePart : AiSdkImageDataPart;

/** What `toModelOutput` answers: the SDK's `ToolResultOutput` variants used here. */
export type AiSdkModelOutput<I = AiSdkFilePart | AiSdkImageDataPart> =
  | { type: "text"; value: string }
  | { type: "error-text"; value: string }
  | { type: "content"; value: Array<{ type: "text"; text: string } | I> };

/** One tool as the SDK's `tool()` returns it. */
export interface AiSdkTool<S, I = AiSdkFilePart | AiSdkImageDataPart> {
  description: string;
  inputSchema: S;
  /** Never throws: a failure is `{ isError: true }`, which `toModelOutput` sends as error output. */
  execute(input: unknown, options: { abortSignal?: AbortSignal }): Promise<ToolOutput>;
  toModelOutput(options: { output: ToolOutput }): AiSdkModelOutput<I>;
}

/** The tool set `aiSdkTools` builds with the SDK module `M`. */
export type AiSdkToolSet<M extends AiSdkFunctions> = Record<string, AiSdkTool<ReturnType<M["jsonSchema"]>, AiSdkImagePart<M>>>;

/**
 * The tools over `backend` (or tools already made by `createTools`) as an AI
 * SDK `ToolSet`, keyed by tool name: `generateText({ model, tools:
 * aiSdkTools(ai, backend) })`. Input is validated by the tools themselves (the
 * schema handed to the SDK carries no validator), so a model's wrong arguments
 * come back as one readable error line rather than the SDK's schema dump; and
 * a `null` for an omitted optional parameter is accepted, as OpenAI's strict
 * mode sends it.
 */
export function aiSdkTools<M extends AiSdkFunctions>(sdk: M, backend: Backend | readonly BoundTool[], options: CreateToolsOptions = {}): AiSdkToolSet<M> {
  const tools = Array.isArray(backend) ? (backend as readonly BoundTool[]) : createTools(backend as Backend, options);
  const fileParts = typeof sdk.uploadFile === "function";
  const set: Record<string, AiSdkTool<unknown>> = {};
  for (const bound of tools) {
    const spec: AiSdkTool<unknown> = {
      description: bound.description,
      inputSchema: sdk.jsonSchema(bound.jsonSchema() as never),
      execute: (input) => bound.call(input),
      toModelOutput: ({ output }) => modelOutput(output, fileParts),
    };
    // tool() is an identity at run time in both majors; calling it keeps the SDK's own contract in the loop.
    set[bound.name] = sdk.tool(spec as never) as AiSdkTool<unknown>;
  }
  // The image part matches M by the probe above; the schema is what M's jsonSchema made.
  return set as AiSdkToolSet<M>;
}

/** A tool's answer as the SDK's model output: errors as error text, images as file parts (`image-data` for ai 6). */
export function modelOutput(output: ToolOutput, fileParts = true): AiSdkModelOutput {
  if (output.isError) return { type: "error-text", value: output.text };
  if (!output.blocks?.length) return { type: "text", value: output.text };
  return {
    type: "content",
    value: [
      { type: "text", text: output.text },
      ...output.blocks.map((block) =>
        fileParts
          ? { type: "file" as const, mediaType: block.mimeType, data: { type: "data" as const, data: block.data } }
          : { type: "image-data" as const, data: block.data, mediaType: block.mimeType },
      ),
    ],
  };
}

// ---------------------------------------------------------------- the sandbox slot

interface PathOptions {
  path: string;
  abortSignal?: AbortSignal;
}

interface ProcessOptions {
  command: string;
  workingDirectory?: string;
  env?: Record<string, string>;
  abortSignal?: AbortSignal;
  stdin?: boolean;
}

/** The SDK's `Experimental_SandboxProcess` (with `stdin` when spawned with `stdin: true`). */
export interface AiSdkSandboxProcess {
  readonly stdout: ReadableStream<Uint8Array>;
  readonly stderr: ReadableStream<Uint8Array>;
  readonly stdin?: WritableStream<Uint8Array>;
  wait(): Promise<{ exitCode: number }>;
  kill(): Promise<void>;
}

/** The SDK's `Experimental_SandboxSession`, over a Strata sandbox. */
export interface AiSdkSandboxSession {
  readonly description: string;
  readFile(options: PathOptions): Promise<ReadableStream<Uint8Array> | null>;
  readBinaryFile(options: PathOptions): Promise<Uint8Array | null>;
  readTextFile(options: PathOptions & { encoding?: string; startLine?: number; endLine?: number }): Promise<string | null>;
  writeFile(options: PathOptions & { content: ReadableStream<Uint8Array> }): Promise<void>;
  writeBinaryFile(options: PathOptions & { content: Uint8Array }): Promise<void>;
  writeTextFile(options: PathOptions & { content: string; encoding?: string }): Promise<void>;
  stat(options: PathOptions): Promise<{ type: "file" | "directory" | "other"; size: number } | null>;
  listDirectory(options: PathOptions): Promise<Array<{ name: string; type: "file" | "directory" | "symlink" | "other" }> | null>;
  deleteFile(options: PathOptions): Promise<boolean>;
  spawn(options: ProcessOptions & { stdin: true }): Promise<AiSdkSandboxProcess & { readonly stdin: WritableStream<Uint8Array> }>;
  spawn(options: ProcessOptions & { stdin?: false }): Promise<AiSdkSandboxProcess>;
  spawn(options: ProcessOptions): Promise<AiSdkSandboxProcess>;
  run(options: Omit<ProcessOptions, "stdin">): Promise<{ exitCode: number; stdout: string; stderr: string }>;
}

/** A native failure as the rejection the SDK's interface expects; its message names no host path (the contract). */
class SandboxSessionError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "SandboxSessionError";
  }
}

function valueOf<T extends object>(result: Result<T>): T {
  if (result.error) throw new SandboxSessionError(result.error.code, result.error.message);
  return result as T;
}

/** The exit code a shell reports for a command killed by SIGKILL: for one `kill()` ended, or a signal (native `null`). */
const KILLED_EXIT_CODE = 137;

/**
 * `sandbox` as the SDK's `Experimental_SandboxSession`:
 * `generateText({ experimental_sandbox: aiSdkSandbox(sandbox) })`. Relative
 * paths and working directories start in the sandbox's workspace, as the SDK
 * requires and every Strata sandbox already does; file operations keep the
 * sandbox's containment (an absolute path outside the workspace rejects).
 * Methods reject with the native error's message; a missing file resolves to
 * `null` (`false` for `deleteFile`) as the interface says. Docker and SSH
 * deliver stderr merged into stdout. Commands are held to the sandbox's own
 * `timeout` (300 s by default): a `spawn` meant to outlive it needs a sandbox
 * made with a longer one. `listDirectory` reports files and directories only
 * (the native listing does not mark symbolic links).
 */
export function aiSdkSandbox(sandbox: Sandbox, options: { description?: string } = {}): AiSdkSandboxSession {
  if (!isSandbox(sandbox)) throw new TypeError("aiSdkSandbox: expected a Strata sandbox (with execute and spawn)");

  const bytesOf = async (path: string, signal?: AbortSignal): Promise<Uint8Array | null> => {
    const item = valueOf(await sandbox.downloadFiles([path], { signal })).files[0];
    if (!item) throw new SandboxSessionError("io_error", `No answer for '${path}'`);
    if (item.error?.code === "file_not_found") return null;
    if (item.error) throw new SandboxSessionError(item.error.code, item.error.message);
    return item.content ?? new Uint8Array();
  };

  const write = async (path: string, content: Uint8Array, signal?: AbortSignal): Promise<void> => {
    const item = valueOf(await sandbox.uploadFiles([[path, content]], { signal })).files[0];
    if (item?.error) throw new SandboxSessionError(item.error.code, item.error.message);
  };

  const info = async (path: string, signal?: AbortSignal) => {
    const result = await sandbox.stat(path, { signal });
    if (result.error?.code === "file_not_found") return null;
    return valueOf(result);
  };

  const start = async (spawnOptions: ProcessOptions): Promise<AiSdkSandboxProcess> => {
    const { command, workingDirectory, env, abortSignal, stdin } = spawnOptions;
    const child: SpawnedProcess = valueOf(await sandbox.spawn(command, { cwd: workingDirectory, env, signal: abortSignal }));
    let killed = false;
    const handle: AiSdkSandboxProcess = {
      stdout: child.stdout,
      stderr: child.stderr,
      async wait() {
        const ended = await child.wait();
        // The SDK: an aborted command's wait rejects with the abort reason; a killed one just ends.
        if (ended.error && abortSignal?.aborted) throw abortSignal.reason;
        if (ended.error?.code === "aborted" && killed) return { exitCode: KILLED_EXIT_CODE };
        return { exitCode: valueOf(ended).exitCode ?? KILLED_EXIT_CODE };
      },
      kill: () => {
        killed = true;
        return child.kill();
      },
    };
    if (stdin === true) return { ...handle, stdin: child.stdin };
    // Without stdin the command must see end-of-file at once, not wait on an open pipe.
    await child.stdin.close().catch(() => undefined);
    return handle;
  };

  const session = {
    description:
      options.description ??
      `A sandbox whose workspace is ${sandbox.root}: commands start there, relative paths resolve there, and files outside it cannot be read or written.`,

    async readFile({ path, abortSignal }: PathOptions) {
      const bytes = await bytesOf(path, abortSignal);
      return bytes === null ? null : streamOf(bytes);
    },
    readBinaryFile: ({ path, abortSignal }: PathOptions) => bytesOf(path, abortSignal),
    async readTextFile({ path, abortSignal, encoding, startLine, endLine }: PathOptions & { encoding?: string; startLine?: number; endLine?: number }) {
      const bytes = await bytesOf(path, abortSignal);
      if (bytes === null) return null;
      const text = new TextDecoder(encoding ?? "utf-8").decode(bytes);
      if (startLine === undefined && endLine === undefined) return text;
      // Lines keep their endings, so a window of a CRLF file reads back byte for byte.
      const lines = text.match(/[^\n]*\n|[^\n]+$/g) ?? [];
      return lines.slice(Math.max(0, (startLine ?? 1) - 1), endLine ?? lines.length).join("");
    },

    async writeFile({ path, content, abortSignal }: PathOptions & { content: ReadableStream<Uint8Array> }) {
      await write(path, await collect(content), abortSignal);
    },
    writeBinaryFile: ({ path, content, abortSignal }: PathOptions & { content: Uint8Array }) => write(path, content, abortSignal),
    async writeTextFile({ path, content, encoding, abortSignal }: PathOptions & { content: string; encoding?: string }) {
      if (encoding !== undefined && !/^utf-?8$/i.test(encoding)) {
        throw new SandboxSessionError("unsupported", `Only UTF-8 text can be written, not '${encoding}'; use writeBinaryFile`);
      }
      await write(path, new TextEncoder().encode(content), abortSignal);
    },

    async stat({ path, abortSignal }: PathOptions) {
      const found = await info(path, abortSignal);
      if (found === null) return null;
      return found.is_dir ? { type: "directory" as const, size: found.size ?? 0 } : { type: "file" as const, size: found.size ?? 0 };
    },
    async listDirectory({ path, abortSignal }: PathOptions) {
      // The native ls lists a missing directory as empty; the SDK wants null there, and a rejection for a file.
      const found = await info(path, abortSignal);
      if (found === null) return null;
      if (!found.is_dir) throw new SandboxSessionError("not_a_directory", `'${path}' is a file, not a directory`);
      const { entries } = valueOf(await sandbox.ls(path, { signal: abortSignal }));
      return entries.map((entry) => ({
        name: entry.path.replace(/\/$/, "").split("/").pop() ?? entry.path,
        type: entry.is_dir ? ("directory" as const) : ("file" as const),
      }));
    },
    async deleteFile({ path, abortSignal }: PathOptions) {
      // The native delete also removes trees; the SDK's deletes files only.
      const found = await info(path, abortSignal);
      if (found === null) return false;
      if (found.is_dir) throw new SandboxSessionError("is_directory", `'${path}' is a directory, not a file`);
      valueOf(await sandbox.delete(path, { signal: abortSignal }));
      return true;
    },

    spawn: start,
    async run(runOptions: Omit<ProcessOptions, "stdin">) {
      const child = await start(runOptions);
      const [stdout, stderr, { exitCode }] = await Promise.all([text(child.stdout), text(child.stderr), child.wait()]);
      return { exitCode, stdout, stderr };
    },
  };
  return session as AiSdkSandboxSession;
}

function streamOf(bytes: Uint8Array): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  const reader = stream.getReader();
  for (let next = await reader.read(); !next.done; next = await reader.read()) chunks.push(next.value);
  const out = new Uint8Array(chunks.reduce((sum, chunk) => sum + chunk.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

async function text(stream: ReadableStream<Uint8Array>): Promise<string> {
  return new TextDecoder().decode(await collect(stream));
}
