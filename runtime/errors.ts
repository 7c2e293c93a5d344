import { StrataError } from "../core/errors.js";

/**
 * The runtime's typed errors. They keep OpenRath's names so code written
 * against its `rath.backend` reads the same here, and they are StrataErrors,
 * so callers that only look at `code` keep working.
 */

/**
 * StrataError fixes `name` to "StrataError"; each runtime error names its own
 * class instead (a literal, so bundlers that rename classes cannot change it),
 * while `code` and `instanceof StrataError` stay as they were.
 */
function nameAs(error: StrataError, name: string): void {
  Object.defineProperty(error, "name", { value: name, enumerable: true, configurable: true, writable: false });
}

/** No provider of that name is registered (or none of several is available); the message lists what there is. */
export class BackendNotFound extends StrataError {
  constructor(
    readonly providerName: string,
    readonly available: readonly string[],
    problem = `Sandbox provider '${providerName}' is not registered`,
  ) {
    super("invalid_argument", `${problem}; available: ${available.length > 0 ? available.join(", ") : "none"}`);
    nameAs(this, "BackendNotFound");
  }
}

/** A handle (or the sandbox behind it) was used after it closed. */
export class BackendSandboxClosed extends StrataError {
  constructor(
    readonly sandboxId: string,
    what = "is closed",
  ) {
    super("sandbox_closed", `Sandbox '${sandboxId}' ${what}`);
    nameAs(this, "BackendSandboxClosed");
  }
}

/** The provider does not handle this payload type. */
export class UnsupportedBackendTool extends StrataError {
  constructor(
    readonly payloadType: string,
    readonly providerName: string,
    readonly supported: readonly string[],
  ) {
    super(
      "unsupported",
      `Sandbox provider '${providerName}' does not support payload '${payloadType}'; it supports: ${supported.join(", ") || "none"}`,
    );
    nameAs(this, "UnsupportedBackendTool");
  }
}

/** A stream stopped (its worker failed or it was closed); queued work was not run. */
export class StreamFailed extends StrataError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("unavailable", message, options);
    nameAs(this, "StreamFailed");
  }
}
