/**
 * Typed errors. Every failure a caller can act on carries a stable `code`;
 * messages name virtual paths only, never a host path.
 */

/** The four error codes of the seeds' upload/download contract. */
export type FileOperationError = "file_not_found" | "permission_denied" | "is_directory" | "invalid_path";

/** Every code a Strata operation can fail with. */
export type ErrorCode =
  | FileOperationError
  | "already_exists"
  | "not_a_directory"
  | "binary_file"
  | "no_match"
  | "ambiguous_match"
  | "invalid_argument"
  | "too_large"
  | "quota_exceeded"
  | "busy"
  | "conflict"
  | "timeout"
  | "unavailable"
  | "unsupported"
  | "sandbox_closed"
  | "aborted"
  | "io_error";

export class StrataError extends Error {
  override readonly name: string = this.constructor.name;
  /** The virtual path the failure is about, as a field: callers never parse it out of the message. */
  readonly path?: string;
  constructor(
    readonly code: ErrorCode,
    message: string,
    options?: { cause?: unknown; path?: string },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    if (options?.path !== undefined) this.path = options.path;
  }
}

/**
 * The one failure shape of the native API: `{ error: ErrorInfo }`. A plain
 * object (it survives JSON, a worker boundary, an MCP response).
 */
export interface ErrorInfo {
  code: ErrorCode;
  /** A sentence a person or a model can act on; it names the path too. */
  message: string;
  /** The virtual path the failure is about, when there is one. */
  path?: string;
}

/** The error part of a failed result, from any thrown value (never a host detail). */
export function toErrorInfo(error: unknown, path?: string): ErrorInfo {
  const e = asStrataError(error, path ?? "/");
  const where = e.path ?? path;
  return where === undefined ? { code: e.code, message: e.message } : { code: e.code, message: e.message, path: where };
}

export function isStrataError(value: unknown, code?: ErrorCode): value is StrataError {
  return value instanceof StrataError && (code === undefined || value.code === code);
}

/** Narrows any error code to one of the seeds' four upload/download codes. */
export function toFileOperationError(code: ErrorCode): FileOperationError {
  switch (code) {
    case "file_not_found":
    case "permission_denied":
    case "is_directory":
    case "invalid_path":
      return code;
    case "not_a_directory":
    case "already_exists":
      // A path whose parent is a file (or that names an existing directory's
      // place) cannot be addressed: the caller must pick another path.
      return "invalid_path";
    default:
      return "permission_denied";
  }
}

/** The one place error wording lives, so every backend says the same thing. */
export const errors = {
  invalidPath: (path: string, why: string) =>
    new StrataError("invalid_path", `Invalid path '${printable(path)}': ${why}`, { path: pathField(path) }),
  notFound: (path: string) => new StrataError("file_not_found", `File '${printable(path)}' not found`, { path }),
  isDirectory: (path: string) => new StrataError("is_directory", `'${printable(path)}' is a directory, not a file`, { path }),
  notADirectory: (path: string) =>
    new StrataError("not_a_directory", `A parent of '${printable(path)}' is a file, not a directory`, { path }),
  alreadyExists: (path: string) =>
    new StrataError(
      "already_exists",
      `File '${printable(path)}' already exists. Read it and use edit to change it, or write with overwrite to replace it`,
      { path },
    ),
  binary: (path: string, size: number) =>
    new StrataError("binary_file", `'${printable(path)}' is a binary file (${size} bytes); download it instead of reading it`, { path }),
  permissionDenied: (path: string) => new StrataError("permission_denied", `Permission denied: '${printable(path)}'`, { path }),
  tooLarge: (path: string, size: number, max: number) =>
    new StrataError("too_large", `'${printable(path)}' is ${size} bytes, over the ${max}-byte limit`, { path }),
  quotaExceeded: (path: string, why: string) =>
    new StrataError("quota_exceeded", `Quota exceeded writing '${printable(path)}': ${why}. Delete files to make room`, { path }),
  conflict: (path: string, why: string) =>
    new StrataError("conflict", `'${printable(path)}' changed while it was being edited (${why}); read it again and retry`, { path }),
  notEmpty: (path: string) => new StrataError("already_exists", `'${printable(path)}' is a directory that is not empty`, { path }),
  sandboxClosed: (what = "the sandbox") => new StrataError("sandbox_closed", `${what} is closed`),
  invalidArgument: (message: string) => new StrataError("invalid_argument", message),
  aborted: (what = "The operation") => new StrataError("aborted", `${what} was aborted by its signal`),
  io: (path: string, cause?: unknown) =>
    new StrataError("io_error", `I/O error on '${printable(path)}'`, cause === undefined ? { path } : { cause, path }),
};

/** A hostile path (not a string, NUL, over-long) is kept out of the path field; the message still shows it escaped. */
function pathField(path: unknown): string | undefined {
  return typeof path === "string" && path.length <= 4096 && !path.includes("\0") ? path : undefined;
}

/** The error behind one of the four upload/download codes, worded like every other backend's. */
export function fileOperationError(code: FileOperationError, path: string): StrataError {
  switch (code) {
    case "file_not_found":
      return errors.notFound(path);
    case "is_directory":
      return errors.isDirectory(path);
    case "permission_denied":
      return errors.permissionDenied(path);
    case "invalid_path":
      return errors.invalidPath(path, "the backend cannot address it");
  }
}

/** Makes a hostile path safe to echo in a message (control characters escaped, length capped). */
export function printable(path: string): string {
  if (typeof path !== "string") return `(${path === null ? "null" : typeof path})`;
  const escaped = path.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
  return escaped.length > 200 ? `${escaped.slice(0, 200)}…` : escaped;
}

/** Converts any thrown value into a StrataError without leaking host details. */
export function asStrataError(error: unknown, path: string): StrataError {
  if (error instanceof StrataError) return error;
  return errors.io(path, error);
}
