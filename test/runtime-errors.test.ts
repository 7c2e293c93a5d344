import { describe, expect, it } from "vitest";
import { StrataError } from "../core/errors.js";
import { BackendNotFound, BackendSandboxClosed, providers, StreamFailed, UnsupportedBackendTool } from "../runtime/index.js";

describe("runtime error classes", () => {
  it("each names its own class and keeps its code", () => {
    const cases: Array<[StrataError, string, string]> = [
      [new BackendNotFound("x", ["local"]), "BackendNotFound", "invalid_argument"],
      [new BackendSandboxClosed("sb"), "BackendSandboxClosed", "sandbox_closed"],
      [new UnsupportedBackendTool("files.read", "p", []), "UnsupportedBackendTool", "unsupported"],
      [new StreamFailed("stopped"), "StreamFailed", "unavailable"],
    ];
    for (const [error, name, code] of cases) {
      expect(error).toBeInstanceOf(StrataError);
      expect(error.name).toBe(name);
      expect(error.code).toBe(code);
      expect(String(error)).toMatch(new RegExp(`^${name}: `));
      // Serialised like any StrataError, with its own name.
      expect(JSON.parse(JSON.stringify(error))).toMatchObject({ name, code });
    }
  });

  it("a lookup of a missing provider throws a BackendNotFound by that name", () => {
    let caught: unknown;
    try {
      providers.get("no-such-provider");
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(BackendNotFound);
    expect((caught as Error).name).toBe("BackendNotFound");
  });
});
