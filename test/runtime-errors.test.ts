import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { isStrataError, StrataError, type ErrorCode } from "../core/errors.js";
import * as runtime from "../runtime/index.js";
import {
  BackendNotFound,
  BackendSandboxClosed,
  BackendUnavailable,
  codeRun,
  commandRun,
  dispatchPayload,
  filesList,
  filesRead,
  HandleError,
  InvalidPayload,
  InvalidSpec,
  isFailure,
  parsePayload,
  PersistentSandboxRegistry,
  ProviderError,
  ProviderRegistrationError,
  ProviderRegistry,
  providers,
  RuntimeError,
  SandboxRegistryError,
  StreamError,
  StreamEvent,
  StreamFailed,
  UnsupportedBackendTool,
  type Payload,
  type SandboxHandle,
} from "../runtime/index.js";
import { validateSandboxId } from "../runtime/persistence.js";
import type { LocalSandbox } from "../sandboxes/local.js";
import { CountingProvider } from "./support/runtime-providers.js";

// One error class hierarchy for everything the runtime throws, and one failure shape,
// `{ error: { code, message, path? } }`, for everything a payload can fail with.

/** One instance of every runtime error class, by class name, with the code it carries. */
const INSTANCES: Record<string, [RuntimeError, ErrorCode]> = {
  RuntimeError: [new RuntimeError("io_error", "base"), "io_error"],
  BackendNotFound: [new BackendNotFound("x", ["local"]), "invalid_argument"],
  ProviderRegistrationError: [new ProviderRegistrationError("already_exists", "taken"), "already_exists"],
  BackendUnavailable: [new BackendUnavailable("p", "switched off"), "unavailable"],
  InvalidSpec: [new InvalidSpec("bad spec"), "invalid_argument"],
  ProviderError: [new ProviderError("unsupported", "cannot reattach"), "unsupported"],
  BackendSandboxClosed: [new BackendSandboxClosed("sb"), "sandbox_closed"],
  HandleError: [new HandleError("released twice"), "invalid_argument"],
  UnsupportedBackendTool: [new UnsupportedBackendTool("files.read", "p", []), "unsupported"],
  InvalidPayload: [new InvalidPayload("bad payload"), "invalid_argument"],
  StreamError: [new StreamError("timeout", "late"), "timeout"],
  StreamFailed: [new StreamFailed("stopped"), "unavailable"],
  SandboxRegistryError: [new SandboxRegistryError("permission_denied", "a link"), "permission_denied"],
};

/** What a call threw or rejected with. */
async function caught(call: () => unknown): Promise<unknown> {
  try {
    await call();
  } catch (error) {
    return error;
  }
  throw new Error("expected the call to throw");
}

const opened: Array<{ provider: CountingProvider; handle: SandboxHandle }> = [];
async function open(provider = new CountingProvider()): Promise<{ provider: CountingProvider; handle: SandboxHandle }> {
  const entry = { provider, handle: await provider.open() };
  opened.push(entry);
  return entry;
}
const roots: string[] = [];
afterEach(async () => {
  for (const { provider, handle } of opened.splice(0)) if (!handle.closed) await provider.close(handle);
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

class SwitchedOff extends CountingProvider {
  override unavailableReason(): string | undefined {
    return "switched off by the test";
  }
}

describe("runtime error classes", () => {
  it("the runtime exports exactly these error classes", () => {
    const exported = Object.entries(runtime)
      .filter(([, value]) => typeof value === "function" && value.prototype instanceof StrataError)
      .map(([name]) => name)
      .sort();
    expect(exported).toEqual(Object.keys(INSTANCES).sort());
  });

  it.each(Object.entries(INSTANCES))("%s: name is the class name; instanceof StrataError and RuntimeError; keeps its code", (name, [error, code]) => {
    expect(error.name).toBe(name);
    expect(error.constructor.name).toBe(name);
    expect(error).toBeInstanceOf(Error);
    expect(error).toBeInstanceOf(StrataError);
    expect(error).toBeInstanceOf(RuntimeError);
    expect(error.code).toBe(code);
    expect(isStrataError(error, code)).toBe(true);
    expect(String(error)).toMatch(new RegExp(`^${name}: `));
    // Serialised like any StrataError, with its own name.
    expect(JSON.parse(JSON.stringify(error))).toMatchObject({ name, code });
  });

  it("a subclass names itself with no override; StrataError keeps its own name", () => {
    class CustomNotFound extends BackendNotFound {}
    const error = new CustomNotFound("x", []);
    expect(error.name).toBe("CustomNotFound");
    expect(error).toBeInstanceOf(BackendNotFound);
    expect(error).toBeInstanceOf(RuntimeError);
    expect(new StrataError("io_error", "core").name).toBe("StrataError");
    expect(StreamFailed.prototype).toBeInstanceOf(StreamError);
  });

  it("each throw site throws its named class with the right code", async () => {
    const registry = new ProviderRegistry();
    registry.register("alpha", CountingProvider);
    const { provider, handle } = await open();
    const closed = await open();
    await closed.provider.close(closed.handle);
    const root = mkdtempSync(join(tmpdir(), "strata-errors-"));
    roots.push(root);
    const stream = handle.stream();
    const stopped = handle.stream();
    await stopped.close();

    const sites: Array<[string, () => unknown, abstract new (...args: never[]) => RuntimeError, ErrorCode]> = [
      ["an unknown provider", () => registry.get("nope"), BackendNotFound, "invalid_argument"],
      ["no default provider", () => registry.current(), BackendNotFound, "invalid_argument"],
      ["a bad provider name", () => registry.register("../x", CountingProvider), ProviderRegistrationError, "invalid_argument"],
      ["a name registered twice", () => registry.register("alpha", CountingProvider), ProviderRegistrationError, "already_exists"],
      ["an invalid spec", () => provider.open({ timeout: -1 }), InvalidSpec, "invalid_argument"],
      ["an unknown spec field", () => provider.open({ bogus: 1 } as never), InvalidSpec, "invalid_argument"],
      ["an unavailable provider", () => new SwitchedOff().open(), BackendUnavailable, "unavailable"],
      ["a reattach the provider cannot do", () => providers.get("local").reattach!("x"), ProviderError, "unsupported"],
      ["another provider's handle", () => new CountingProvider("other").close(handle), ProviderError, "invalid_argument"],
      ["a closed handle's dispatch", () => closed.handle.dispatch(commandRun({ cmd: "true" })), BackendSandboxClosed, "sandbox_closed"],
      ["a closed handle's acquire", () => closed.handle.acquire(), BackendSandboxClosed, "sandbox_closed"],
      ["a release without an acquire", () => handle.release(), HandleError, "invalid_argument"],
      ["a bad lifetime", () => handle.closeAfter(0, () => {}), HandleError, "invalid_argument"],
      ["an unsupported payload type", () => handle.dispatch({ type: "gpu.launch" } as never), UnsupportedBackendTool, "unsupported"],
      ["a builder's bad field", () => commandRun({ cmd: "" }), InvalidPayload, "invalid_argument"],
      ["a builder's bad timeout", () => codeRun({ code: "1", timeout: -1 }), InvalidPayload, "invalid_argument"],
      ["a pending future's result", () => stream.submit(commandRun({ cmd: "sleep 0.2" })).result(), StreamError, "conflict"],
      ["an event not reached in time", () => new StreamEvent().wait(0.05), StreamError, "timeout"],
      ["a bad wait", () => stream.waitEvent(new StreamEvent(), Number.NaN), StreamError, "invalid_argument"],
      ["elapsed time of unfinished events", () => new StreamEvent().elapsedTime(new StreamEvent()), StreamError, "invalid_argument"],
      ["a closed stream's submit", () => stopped.submit(commandRun({ cmd: "true" })), StreamFailed, "unavailable"],
      ["a sandbox id leaving the root", () => validateSandboxId("../x"), SandboxRegistryError, "invalid_argument"],
      ["a reattach of an unrecorded id", () => new PersistentSandboxRegistry({ root }).reattach("none"), SandboxRegistryError, "file_not_found"],
      ["a bad prune age", () => new PersistentSandboxRegistry({ root }).pruneLocal({ olderThanMs: -1 }), SandboxRegistryError, "invalid_argument"],
      ["recording a sandbox that dies with its process", () => new PersistentSandboxRegistry({ root }).recordHandle(handle), SandboxRegistryError, "unsupported"],
    ];
    for (const [what, call, cls, code] of sites) {
      const error = await caught(call);
      expect(error, what).toBeInstanceOf(cls);
      expect((error as Error).name, what).toBe(cls.name);
      expect(isStrataError(error, code), `${what}: ${String(error)}`).toBe(true);
    }
    await stream.synchronize();
  });
});

describe("payload failures reach the caller as { error: { code, message } }", () => {
  /** The failure shape exactly: an `error` with a core code and a message, a `path` only where one is given. */
  function expectFailure(result: unknown, code: ErrorCode, path?: string): void {
    expect(isFailure(result)).toBe(true);
    expect(Object.keys(result as object)).toEqual(["error"]);
    const error = (result as { error: Record<string, unknown> }).error;
    expect(Object.keys(error).sort()).toEqual(path === undefined ? ["code", "message"] : ["code", "message", "path"]);
    expect(error).toEqual({ code, message: expect.any(String), ...(path === undefined ? {} : { path }) });
    expect((error.message as string).length).toBeGreaterThan(0);
    // A plain object: it survives JSON unchanged.
    expect(JSON.parse(JSON.stringify(result))).toEqual(result);
  }

  it("timeout: command.run and code.run past their timeout, through dispatch and through a stream", async () => {
    const { handle } = await open();
    const run = await handle.dispatch(commandRun({ cmd: "sleep 10", timeout: 1 }));
    expectFailure(run, "timeout");
    expect(run).toEqual({ error: { code: "timeout", message: "Timed out after 1 s; the command was killed" } });
    expectFailure(await handle.stream().submit(codeRun({ code: "sleep 10", language: "sh", timeout: 1 })), "timeout");
  });

  it("missing file: files.read of a path that is not there, with the path as a field", async () => {
    const { handle } = await open();
    const read = await handle.dispatch(filesRead({ path: "missing//dir/./x.txt" }));
    expectFailure(read, "file_not_found", "/missing/dir/x.txt");
    expect(read).toEqual({ error: { code: "file_not_found", message: "File '/missing/dir/x.txt' not found", path: "/missing/dir/x.txt" } });
    expectFailure(await handle.dispatch(commandRun({ cmd: "true", cwd: "/no/such/dir" })), "file_not_found", "/no/such/dir");
  });

  it("unsupported tool: a payload type that does not exist, dispatched to a sandbox", async () => {
    const { handle } = await open();
    const unknown = { type: "gpu.launch", kernel: "k" } as unknown as Payload;
    const result = await dispatchPayload(handle.sandbox, unknown);
    expectFailure(result, "unsupported");
    expect(result).toEqual({ error: { code: "unsupported", message: expect.stringMatching(/^Unknown payload type 'gpu.launch'; the payload types are: command.run, /) } });
    expect(parsePayload(unknown)).toEqual(result);
    // Through a provider the unknown type is the caller's bug, thrown as OpenRath's UnsupportedBackendTool.
    await expect(handle.dispatch(unknown)).rejects.toBeInstanceOf(UnsupportedBackendTool);
  });

  it("closed sandbox: a sandbox that closed under an open handle, and dispatchPayload on a closed sandbox", async () => {
    const { handle } = await open();
    const sandbox = handle.sandbox as LocalSandbox;
    await sandbox.close(); // as a container killed or a connection lost would: the handle itself is still open
    expect(handle.closed).toBe(false);
    expectFailure(await handle.dispatch(commandRun({ cmd: "echo never" })), "sandbox_closed");
    // A files payload's native failure comes through unchanged, the path it was about included.
    expectFailure(await handle.dispatch(filesList({ path: "/" })), "sandbox_closed", "/");
    expectFailure(await handle.dispatch(filesRead({ path: "/x.txt" })), "sandbox_closed", "/x.txt");
    expectFailure(await dispatchPayload(sandbox, codeRun({ code: "echo never", language: "sh" })), "sandbox_closed");
    // A closed *handle* is the caller's bug: OpenRath's BackendSandboxClosed is thrown.
    await handle.close();
    await expect(handle.dispatch(commandRun({ cmd: "true" }))).rejects.toBeInstanceOf(BackendSandboxClosed);
  });

  it("invalid payload: bad fields, through dispatch, a stream, dispatchPayload and parsePayload", async () => {
    const { handle } = await open();
    const bad = { type: "files.read", path: 42 } as unknown as Payload;
    expectFailure(await handle.dispatch(bad), "invalid_argument");
    expectFailure(await handle.stream().submit(bad), "invalid_argument");
    expectFailure(await dispatchPayload(handle.sandbox, bad), "invalid_argument");
    expectFailure(await handle.dispatch({ type: "command.run", cmd: "true", extra: 1 } as unknown as Payload), "invalid_argument");
    expectFailure(parsePayload({ cmd: "no type" }), "invalid_argument");
    expectFailure(parsePayload(null), "invalid_argument");
    expect((parsePayload(bad) as { error: { message: string } }).error.message).toMatch(/^Invalid payload: /);
  });

  it("isFailure tells a failure from every result, a CodeResult's string `error` included", async () => {
    const { handle } = await open();
    const failedProgram = await handle.dispatch(codeRun({ code: "echo oops >&2; exit 2", language: "sh" }));
    expect(failedProgram).toMatchObject({ type: "code_result", exitCode: 2, error: "oops" });
    expect(isFailure(failedProgram)).toBe(false);
    expect(isFailure(await handle.dispatch(commandRun({ cmd: "true" })))).toBe(false);
    for (const value of [true, false, null, undefined, "error", { error: null }, { error: "text" }, { error: {} }]) expect(isFailure(value)).toBe(false);
    expect(isFailure({ error: { code: "timeout", message: "late" } })).toBe(true);
  });
});
