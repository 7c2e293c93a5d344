/**
 * A Strata backend as the `deepagents` package's backend: `toDeepAgents(backend)`
 * answers its `BackendProtocolV2` (and `SandboxBackendProtocolV2` for a
 * sandbox), so `createDeepAgent({ model, backend: toDeepAgents(sandbox) })`
 * gives deepagents' own ls, read_file, write_file, edit_file, glob, grep and
 * execute tools a Strata workspace. Only types come from `deepagents`: nothing
 * of it is loaded at run time.
 *
 * The translation is of shapes and of the few places where deepagents' own
 * backends answer differently from Strata's contract (docs/deepagents.md):
 * its write overwrites; its read answers the window's raw lines (its read_file
 * tool renders them, so they are never numbered twice) and `limit` 0 as nothing; its edit with equal strings,
 * or of an empty file with an empty old string, succeeds; its ls of a file or
 * of a missing directory is empty; its glob over a sandbox answers paths
 * relative to the search path and includes directories (the native glob's
 * `includeDirectories`, one round trip); binary files travel as bytes with a
 * non-text MIME type, and a write to an image, audio, video or PDF path takes
 * base64 text, as deepagents' own backends do.
 */
import type {
  BackendProtocolV2,
  DeleteResult,
  EditResult,
  ExecuteResponse,
  FileData as DeepFileData,
  FileDownloadResponse,
  FileUploadResponse,
  GlobResult,
  GrepResult,
  LsResult,
  ReadRawResult,
  ReadResult,
  SandboxBackendProtocolV2,
  WriteResult,
} from "deepagents";
import { CompositeBackend } from "../backends/composite.js";
import { StateBackend } from "../backends/state.js";
import { applyEdit } from "../core/edit.js";
import { isStrataError, type ErrorInfo } from "../core/errors.js";
import { decodeBase64, fileDataBytes, fileDataText } from "../core/filedata.js";
import { EMPTY_FILE_REMINDER } from "../core/format.js";
import { mimeTypeOf } from "../core/mime.js";
import { joinPath, normalizePath, relativeTo } from "../core/paths.js";
import { isSandbox, type Backend, type Sandbox } from "../core/protocol.js";
import { toSeedProtocol } from "../core/seed.js";
import type { FileData, FilesUpdate } from "../core/types.js";

/** deepagents' read default when a caller gives no limit (its BackendProtocolV2 documents 500). */
const DEFAULT_LIMIT = 500;

/**
 * The extensions deepagents' `getMimeType` maps to a non-text type, with its
 * types: its backends read such a file whole, as bytes, and take a write to
 * one as base64 text; so does this adapter.
 */
const BINARY_TYPES: Readonly<Record<string, string>> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  heic: "image/heic",
  heif: "image/heif",
  mp3: "audio/mpeg",
  wav: "audio/wav",
  aiff: "audio/aiff",
  aac: "audio/aac",
  ogg: "audio/ogg",
  flac: "audio/flac",
  mp4: "video/mp4",
  webm: "video/webm",
  mpeg: "video/mpeg",
  mov: "video/quicktime",
  avi: "video/x-msvideo",
  flv: "video/x-flv",
  mpg: "video/mpeg",
  wmv: "video/x-ms-wmv",
  "3gpp": "video/3gpp",
  pdf: "application/pdf",
  ppt: "application/vnd.ms-powerpoint",
  pptx: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
};

const adapters = new WeakMap<Backend, BackendProtocolV2>();

/**
 * The backend as deepagents takes it. A sandbox (or a composite whose default
 * backend is one) also answers `execute` and `id`. One adapter per backend,
 * cached, so it can be asked for freely (from a deepagents backend factory too).
 */
/** A composite runs commands only when its default backend is a sandbox: check with deepagents' `isSandboxBackend`. */
export function toDeepAgents(backend: CompositeBackend): BackendProtocolV2;
export function toDeepAgents(backend: Sandbox): SandboxBackendProtocolV2;
export function toDeepAgents(backend: Backend): BackendProtocolV2;
export function toDeepAgents(backend: Backend): BackendProtocolV2 {
  let adapter = adapters.get(backend);
  if (!adapter) {
    const runs = backend instanceof CompositeBackend ? isSandbox(backend.default) : isSandbox(backend);
    adapter = runs ? sandboxAdapter(backend as Sandbox) : backendAdapter(backend, false);
    adapters.set(backend, adapter);
  }
  return adapter;
}

function backendAdapter(backend: Backend, sandbox: boolean): BackendProtocolV2 {
  const seed = toSeedProtocol(backend);
  const root = isSandbox(backend) ? backend.root : "/";
  /** deepagents' tools search and list "/" by default: in a sandbox that is its workspace. */
  const searchPath = (path: string | null | undefined): string | undefined =>
    path === undefined || path === null || path === "" || path === "/" ? (root === "/" ? undefined : root) : path;
  /** The absolute path a caller's path names (relative paths start at the root), or null when it names none. */
  const absolute = (path: string): string | null => {
    try {
      return normalizePath(path.startsWith("/") ? path : joinPath(root, path));
    } catch {
      return null;
    }
  };

  /**
   * deepagents' sandboxes answer ls and grep in the form they were asked (its
   * `find` and `grep -r` echo the path given): a relative search path gets
   * paths relative to the workspace, where commands resolve them too.
   */
  const asAsked = (asked: string | null | undefined, path: string): string =>
    sandbox && typeof asked === "string" && asked !== "" && !asked.startsWith("/") ? path.slice(root === "/" ? 1 : root.length + 1) : path;

  return {
    async ls(path): Promise<LsResult> {
      const listed = await backend.ls(searchPath(path));
      if (listed.error) return { error: listed.error.message };
      const entries = listed.entries;
      // deepagents lists only directories: a file's listing is empty, as its own backends answer.
      const only = entries.length === 1 ? entries[0]! : undefined;
      if (only && !only.is_dir && only.path === absolute(searchPath(path) ?? "/")) return { files: [] };
      return { files: entries.map((info) => ({ ...info, path: asAsked(path, info.path) })) };
    },

    async read(filePath, offset = 0, limit = DEFAULT_LIMIT): Promise<ReadResult> {
      if (isBinaryPath(filePath)) {
        // deepagents reads an image, audio, video or PDF whole, as bytes, whatever they hold.
        const raw = await backend.readRaw(filePath);
        return raw.error ? { error: raw.error.message } : { content: fileDataBytes(raw.data), mimeType: binaryMime(filePath) };
      }
      const start = Number.isFinite(offset) ? Math.max(0, Math.floor(offset)) : 0;
      const count = Number.isFinite(limit) ? Math.max(0, Math.floor(limit)) : DEFAULT_LIMIT;
      if (count === 0) {
        const info = await backend.stat(filePath);
        if (info.error) return { error: info.error.message };
        if (info.is_dir) return { error: `'${filePath}' is a directory, not a file` };
        return { content: "", mimeType: textMime(filePath) };
      }
      const read = await backend.read(filePath, { offset: start, limit: count });
      if (read.error) return { error: read.error.message };
      if (read.encoding === "binary") return { content: read.content, mimeType: binaryMime(filePath) };
      const mimeType = textMime(filePath);
      if (read.totalLines === 0) return { content: EMPTY_FILE_REMINDER, mimeType };
      const end = read.offset + read.lineCount;
      return {
        // The window's lines as they are, never numbered: deepagents' read_file tool renders them under its range header.
        content: read.content,
        mimeType,
        totalLines: read.totalLines,
        startLine: read.offset + 1,
        endLine: end,
        ...(end < read.totalLines ? { nextOffset: end } : {}),
      };
    },

    async readRaw(filePath): Promise<ReadRawResult> {
      const raw = await backend.readRaw(filePath);
      return raw.error ? { error: raw.error.message } : { data: toDeepFileData(raw.path, raw.data) };
    },

    async write(filePath, content): Promise<WriteResult> {
      if (isBinaryPath(filePath)) {
        const bytes = base64Bytes(content);
        if (!bytes) return { error: `Error: '${filePath}' is a binary file type: write its content as base64 text` };
        const [item] = await seed.uploadFiles([[filePath, bytes]]);
        if (item?.error) return { error: `Error: writing '${filePath}' failed (${item.error.replace(/_/g, " ")})` };
        // An upload reports no state update; a StateBackend on the agent's own state needs one, or the next step loses the file.
        const stored = backend instanceof StateBackend ? await backend.readRaw(filePath) : undefined;
        return { path: filePath, filesUpdate: stored && !stored.error ? { [stored.path]: toDeepFileData(stored.path, stored.data) } : null };
      }
      const written = await backend.write(filePath, content, { overwrite: true });
      return written.error ? { error: errorText(written.error) } : { path: filePath, filesUpdate: deepUpdate(written.filesUpdate) };
    },

    async edit(filePath, oldString, newString, replaceAll = false): Promise<EditResult> {
      if (oldString === newString || oldString === "") return specialEdit(backend, filePath, oldString, newString, replaceAll, sandbox);
      const edited = await backend.edit(filePath, oldString, newString, { replaceAll });
      if (edited.error) return { error: errorText(edited.error) };
      return { path: filePath, filesUpdate: deepUpdate(edited.filesUpdate), occurrences: edited.occurrences };
    },

    async delete(filePath): Promise<DeleteResult> {
      const removed = await backend.delete(filePath);
      if (removed.error) return { error: errorText(removed.error) };
      return { path: filePath, filesUpdate: deletions(removed.filesUpdate) };
    },

    async grep(pattern, path, glob, maxCount): Promise<GrepResult> {
      const found = await backend.grep(pattern, { path: searchPath(path), glob: glob ?? undefined, maxCount: maxCount ?? undefined });
      if (found.error) return { error: errorText(found.error) };
      return { matches: found.matches.map((match) => ({ ...match, path: asAsked(path, match.path) })), truncated: found.truncated };
    },

    async glob(pattern, path): Promise<GlobResult> {
      const at = searchPath(path);
      // deepagents' sandboxes answer paths relative to the search path, directories included; its other backends absolute files.
      const found = await backend.glob(pattern, { path: at, includeDirectories: sandbox });
      if (found.error) return { error: found.error.message };
      if (!sandbox) return { files: found.entries };
      const base = absolute(at ?? "/") ?? "/";
      return {
        files: found.entries.map((info) => {
          const full = info.path.endsWith("/") ? info.path.slice(0, -1) : info.path;
          return { ...info, path: relativeTo(base, full) };
        }),
      };
    },

    uploadFiles: (files): Promise<FileUploadResponse[]> => seed.uploadFiles(files),
    downloadFiles: (paths): Promise<FileDownloadResponse[]> => seed.downloadFiles(paths),
  };
}

function sandboxAdapter(sandbox: Sandbox): SandboxBackendProtocolV2 {
  return {
    ...backendAdapter(sandbox, true),
    get id() {
      return sandbox.id;
    },
    async execute(command): Promise<ExecuteResponse> {
      const run = await sandbox.execute(command);
      return run.error ? { output: `Error: ${run.error.message}`, exitCode: 1, truncated: false } : run;
    },
  };
}

/**
 * The two edits Strata's contract refuses and deepagents' backends accept:
 * equal strings (nothing changes; the answer counts the occurrences, with the
 * same not-found and ambiguity checks as any edit) and an empty old string in
 * an empty file (the new string becomes its content).
 */
async function specialEdit(backend: Backend, filePath: string, oldString: string, newString: string, replaceAll: boolean, sandbox: boolean): Promise<EditResult> {
  const raw = await backend.readRaw(filePath);
  if (raw.error) return { error: errorText(raw.error) };
  const text = fileDataText(raw.data);
  if (text === null) return { error: `Error: '${filePath}' is a binary file; it cannot be edited as text` };
  if (oldString === "") {
    if (text !== "") return { error: "Error: old_string must not be empty unless the file is empty" };
    const written = newString === "" ? undefined : await backend.write(filePath, newString, { overwrite: true });
    if (written?.error) return { error: errorText(written.error) };
    // deepagents' state and filesystem backends count 0 here, its sandboxes 1 (0 when nothing was written).
    return { path: filePath, filesUpdate: deepUpdate(written?.filesUpdate ?? null), occurrences: sandbox && newString !== "" ? 1 : 0 };
  }
  try {
    // Counted by core's edit (CRLF-aware), with a replacement that differs so it runs; the result is not written.
    const { occurrences } = applyEdit(text, oldString, `${oldString}\0`, replaceAll, raw.path);
    return { path: filePath, filesUpdate: null, occurrences };
  } catch (error) {
    if (isStrataError(error)) return { error: errorText({ code: error.code, message: error.message }) };
    throw error;
  }
}

/** An error as deepagents' backends word it for write, edit and delete: `Error: …`; an ambiguous edit says "multiple occurrences". */
function errorText(error: Pick<ErrorInfo, "code" | "message">): string {
  return error.code === "ambiguous_match" ? `Error: Multiple occurrences: ${error.message}` : `Error: ${error.message}`;
}

function isDeepAgentsText(mimeType: string): boolean {
  return mimeType.startsWith("text/") || mimeType === "application/json" || mimeType === "application/javascript" || mimeType === "image/svg+xml";
}

/** A MIME type deepagents reads as text, for text content (`application/yaml` becomes `text/plain`). */
function textMime(path: string): string {
  const type = mimeTypeOf(path, true);
  return isDeepAgentsText(type) ? type : "text/plain";
}

/** A MIME type deepagents reads as binary, for binary content (a `.txt` holding NUL bytes is `application/octet-stream`). */
function binaryMime(path: string): string {
  const type = binaryType(path) ?? mimeTypeOf(path, false);
  return isDeepAgentsText(type) ? "application/octet-stream" : type;
}

/** deepagents' MIME type for an image, audio, video or document path, or undefined. */
function binaryType(path: string): string | undefined {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const dot = name.lastIndexOf(".");
  return dot > 0 ? BINARY_TYPES[name.slice(dot + 1).toLowerCase()] : undefined;
}

function isBinaryPath(path: string): boolean {
  return binaryType(path) !== undefined;
}

/** base64 text as deepagents accepts it (a `data:` URL prefix and whitespace allowed), or null. */
function base64Bytes(text: string): Uint8Array | null {
  const trimmed = text.trim();
  const payload = (trimmed.startsWith("data:") ? trimmed.slice(trimmed.indexOf(",") + 1) : trimmed).replace(/\s/g, "");
  try {
    return decodeBase64(payload.padEnd(Math.ceil(payload.length / 4) * 4, "="));
  } catch {
    return null;
  }
}

/** A stored record as deepagents' FileData v2: text as a string, bytes as a Uint8Array, with a MIME type. */
function toDeepFileData(path: string, data: FileData): DeepFileData {
  const text = isBinaryPath(path) ? null : fileDataText(data);
  return {
    content: text ?? fileDataBytes(data),
    mimeType: text === null ? binaryMime(path) : textMime(path),
    created_at: data.created_at,
    modified_at: data.modified_at,
  };
}

/** A checkpoint backend's update, its records in deepagents' shape (it applies them to the agent's `files` state). */
function deepUpdate(update: FilesUpdate): Record<string, DeepFileData> | null {
  if (!update) return null;
  const out: Record<string, DeepFileData> = {};
  for (const [path, data] of Object.entries(update)) if (data) out[path] = toDeepFileData(path, data);
  return Object.keys(out).length > 0 ? out : null;
}

function deletions(update: FilesUpdate): Record<string, null> | null {
  if (!update) return null;
  const out: Record<string, null> = {};
  for (const path of Object.keys(update)) out[path] = null;
  return out;
}
