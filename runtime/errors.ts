import { StrataError, type ErrorCode } from "../core/errors.js";

/**
 * The runtime's errors: one hierarchy under `RuntimeError`, itself a
 * StrataError, so a caller can catch by class (`instanceof BackendNotFound`,
 * `instanceof RuntimeError`) or switch on the core `code` like anywhere else
 * in Strata. Every error the runtime itself throws is one of these classes;
 * an error from the layer below (a sandbox failing to start, say) passes
 * through as the StrataError it is.
 *
 * `name` is the class name (`BackendNotFound`, not `StrataError`): core's
 * StrataError takes it from the constructor, so a subclass of any of these
 * names itself too. A bundler that renames classes (a minifier without
 * keepNames) renames them as well.
 *
 * OpenRath's names are kept where it has them: BackendNotFound,
 * BackendSandboxClosed, UnsupportedBackendTool.
 *
 * Failures of a payload itself are not thrown: they come back as a
 * `ToolExecutionFailure` (`{ error: { code, message, path? } }`), see payloads.ts.
 */

/** The base of every error the runtime throws. */
export class RuntimeError extends StrataError {
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

// ---------------------------------------------------------------- providers and their registry

/** No provider of that name is registered (or none of several is available); the message lists what there is. */
export class BackendNotFound extends RuntimeError {
  declare readonly code: "invalid_argument";
  constructor(
    readonly providerName: string,
    readonly available: readonly string[],
    problem = `Sandbox provider '${providerName}' is not registered`,
  ) {
    super("invalid_argument", `${problem}; available: ${available.length > 0 ? available.join(", ") : "none"}`);
  }
}

/** `register` refused a provider: a bad name or source (`invalid_argument`), or the name is taken (`already_exists`). */
export class ProviderRegistrationError extends RuntimeError {
  declare readonly code: "invalid_argument" | "already_exists";
  constructor(code: "invalid_argument" | "already_exists", message: string) {
    super(code, message);
  }
}

/** The provider cannot run here (no bwrap, no Docker daemon, user namespaces off, …); the message says why. */
export class BackendUnavailable extends RuntimeError {
  declare readonly code: "unavailable";
  constructor(
    readonly providerName: string,
    readonly reason: string,
  ) {
    super("unavailable", `Sandbox provider '${providerName}' is not available: ${reason}`);
  }
}

/** A SandboxSpec that fails validation, or lacks what the provider needs (docker: an image). */
export class InvalidSpec extends RuntimeError {
  declare readonly code: "invalid_argument";
  constructor(message: string) {
    super("invalid_argument", message);
  }
}

/**
 * A provider refused an operation: it cannot reattach (`unsupported`), the
 * handle is another provider's or a reattach argument is malformed
 * (`invalid_argument`), or it could not prepare the sandbox (`permission_denied`,
 * `file_not_found`, `io_error`).
 */
export class ProviderError extends RuntimeError {
  declare readonly code: "unsupported" | "invalid_argument" | "permission_denied" | "file_not_found" | "io_error";
  constructor(code: ProviderError["code"], message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

// ---------------------------------------------------------------- handles and payloads

/** A handle (or the sandbox behind it) was used after it closed or was detached. */
export class BackendSandboxClosed extends RuntimeError {
  declare readonly code: "sandbox_closed";
  constructor(
    readonly sandboxId: string,
    what = "is closed",
  ) {
    super("sandbox_closed", `Sandbox '${sandboxId}' ${what}`);
  }
}

/** A handle was misused while open: released more often than acquired, or given a bad lifetime. */
export class HandleError extends RuntimeError {
  declare readonly code: "invalid_argument";
  constructor(message: string, options?: { cause?: unknown }) {
    super("invalid_argument", message, options);
  }
}

/** The provider does not handle this payload type. */
export class UnsupportedBackendTool extends RuntimeError {
  declare readonly code: "unsupported";
  constructor(
    readonly payloadType: string,
    readonly providerName: string,
    readonly supported: readonly string[],
  ) {
    super(
      "unsupported",
      `Sandbox provider '${providerName}' does not support payload '${payloadType}'; it supports: ${supported.join(", ") || "none"}`,
    );
  }
}

/**
 * A payload builder (`commandRun`, `filesRead`, …) was given bad fields. An
 * untrusted payload dispatched as it is answers an `invalid_argument` failure
 * instead; nothing is thrown there.
 */
export class InvalidPayload extends RuntimeError {
  declare readonly code: "invalid_argument";
  constructor(message: string) {
    super("invalid_argument", message);
  }
}

// ---------------------------------------------------------------- streams

/**
 * A stream, future or event was misused or ran out of time: a future's result
 * read while pending (`conflict`), an event not reached in time (`timeout`), a
 * bad duration or an elapsed time between unfinished events (`invalid_argument`).
 */
export class StreamError extends RuntimeError {
  declare readonly code: "conflict" | "timeout" | "invalid_argument" | "unavailable";
  constructor(code: StreamError["code"], message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

/** A stream stopped (its worker failed or it was closed); queued work was not run. */
export class StreamFailed extends StreamError {
  declare readonly code: "unavailable";
  constructor(message: string, options?: { cause?: unknown }) {
    super("unavailable", message, options);
  }
}

// ---------------------------------------------------------------- persistent identities

/**
 * The PersistentSandboxRegistry refused or failed: a bad id or record
 * (`invalid_argument`), a linked or foreign directory (`permission_denied`),
 * no record under that id (`file_not_found`), a sandbox that cannot be
 * recorded or reattached (`unsupported`), a damaged record or a failed file
 * operation (`io_error`). Messages name ids and errno codes, never host paths.
 */
export class SandboxRegistryError extends RuntimeError {
  declare readonly code: "invalid_argument" | "permission_denied" | "file_not_found" | "unsupported" | "io_error";
  constructor(code: SandboxRegistryError["code"], message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

