import { describe, expect, it, vi } from "vitest";
import { isStrataError } from "../core/errors.js";
import { BackendSandboxClosed, commandRun, filesRead, filesWrite, type SandboxHandle } from "../runtime/index.js";
import type { LocalSandbox } from "../sandboxes/local.js";
import { CountingProvider, sleep } from "./support/runtime-providers.js";

// Refcounted handles over real LocalSandboxes; CountingProvider (test/support) counts teardowns.

const randomDelay = () => sleep(Math.random() * 5);

async function openCounted(): Promise<{ provider: CountingProvider; handle: SandboxHandle }> {
  const provider = new CountingProvider();
  return { provider, handle: await provider.open() };
}

describe("sandbox handle reference counting", () => {
  it("opens with no references", async () => {
    const { provider, handle } = await openCounted();
    expect(handle.refcount).toBe(0);
    expect(handle.closed).toBe(false);
    expect(provider.sandboxCount).toBe(1);
    await provider.close(handle);
    expect(provider.sandboxCount).toBe(0);
  });

  it("100 concurrent acquire/release pairs leave it open; the last release closes it once", async () => {
    const { provider, handle } = await openCounted();
    handle.acquire(); // the owner's reference
    await Promise.all(
      Array.from({ length: 100 }, async () => {
        await randomDelay();
        handle.acquire();
        await randomDelay();
        await handle.release();
      }),
    );
    expect(handle.refcount).toBe(1);
    expect(provider.teardowns).toBe(0);
    const result = await handle.dispatch(commandRun({ cmd: "echo still open" }));
    expect(result).toMatchObject({ type: "command_result", stdout: "still open\n", exitCode: 0 });
    await handle.release();
    expect(provider.teardowns).toBe(1);
    expect(handle.closed).toBe(true);
  });

  it("100 references released at once close the sandbox exactly once", async () => {
    const { provider, handle } = await openCounted();
    for (let i = 0; i < 100; i++) handle.acquire();
    const sandbox = handle.sandbox;
    await Promise.all(Array.from({ length: 100 }, () => handle.release()));
    expect(provider.teardowns).toBe(1);
    expect(handle.refcount).toBe(0);
    expect(await sandbox.execute("true")).toMatchObject({ error: { code: "sandbox_closed" } });
  });

  it("concurrent closes tear down once", async () => {
    const { provider, handle } = await openCounted();
    handle.acquire();
    await Promise.all([provider.close(handle), provider.close(handle), handle.close(), provider.close(handle)]);
    expect(provider.teardowns).toBe(1);
  });

  it("a release after close is an error, not a second close", async () => {
    const { provider, handle } = await openCounted();
    handle.acquire();
    handle.acquire();
    await provider.close(handle);
    await expect(handle.release()).rejects.toBeInstanceOf(BackendSandboxClosed);
    await expect(handle.release()).rejects.toThrow(/released after it closed/);
    expect(provider.teardowns).toBe(1);
  });

  it("using a closed handle raises BackendSandboxClosed", async () => {
    const { provider, handle } = await openCounted();
    await provider.close(handle);
    expect(() => handle.acquire()).toThrow(BackendSandboxClosed);
    expect(() => handle.sandbox).toThrow(BackendSandboxClosed);
    await expect(handle.dispatch(commandRun({ cmd: "true" }))).rejects.toBeInstanceOf(BackendSandboxClosed);
    await expect(provider.dispatch(handle, commandRun({ cmd: "true" }))).rejects.toBeInstanceOf(BackendSandboxClosed);
    expect(() => handle.use()).toThrow(BackendSandboxClosed);
    expect(() => handle.stream()).toThrow(BackendSandboxClosed);
  });

  it("an acquire racing the last release's close fails instead of holding a dying sandbox", async () => {
    const { provider, handle } = await openCounted();
    handle.acquire();
    const releasing = handle.release();
    expect(() => handle.acquire()).toThrow(BackendSandboxClosed);
    await releasing;
    expect(provider.teardowns).toBe(1);
  });

  it("release without a reference is refused and closes nothing", async () => {
    const { provider, handle } = await openCounted();
    await expect(handle.release()).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
    expect(handle.closed).toBe(false);
    expect(provider.teardowns).toBe(0);
    await provider.close(handle);
  });

  it("`await using handle.use()` holds a reference for the scope", async () => {
    const { provider, handle } = await openCounted();
    {
      await using lease = handle.use();
      expect(handle.refcount).toBe(1);
      await lease.sandbox.write("/a.txt", "inside the scope");
      {
        await using _inner = handle.use();
        expect(handle.refcount).toBe(2);
      }
      expect(handle.refcount).toBe(1);
    }
    expect(handle.closed).toBe(true);
    expect(provider.teardowns).toBe(1);
  });

  it("`await using` releases when the scope throws", async () => {
    const { provider, handle } = await openCounted();
    await expect(
      (async () => {
        await using _lease = handle.use();
        throw new Error("boom");
      })(),
    ).rejects.toThrow("boom");
    expect(handle.closed).toBe(true);
    expect(provider.teardowns).toBe(1);
  });

  it("closes at the end of the spec's lifetime, whatever its references", async () => {
    // The test drives the lifetime's clock: on a loaded machine the write alone can outlast a real 0.2 s, and the
    // lifetime then ended under it. The sandbox's own work (file I/O, teardown) still runs for real.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const provider = new CountingProvider();
      const handle = await provider.open({ timeout: 0.2 });
      handle.acquire();
      expect(await handle.dispatch(filesWrite({ path: "/x", data: "1" }))).toMatchObject({ type: "file_write_result" });
      vi.advanceTimersByTime(199);
      expect(handle.closed).toBe(false);
      vi.advanceTimersByTime(1);
      expect(handle.closed).toBe(true);
      await handle.close(); // joins the teardown the lifetime started (close is idempotent)
      expect(provider.teardowns).toBe(1);
      await expect(handle.release()).rejects.toBeInstanceOf(BackendSandboxClosed);
    } finally {
      vi.useRealTimers();
    }
  });

  it("a closed-early handle's lifetime timer does nothing", async () => {
    const provider = new CountingProvider();
    const handle = await provider.open({ timeout: 0.1 });
    await provider.close(handle);
    await sleep(200);
    expect(provider.teardowns).toBe(1);
  });

  it("detach lets go without tearing down", async () => {
    const { provider, handle } = await openCounted();
    handle.acquire();
    const sandbox = handle.sandbox as LocalSandbox;
    await handle.detach();
    expect(handle.closed).toBe(true);
    expect(provider.teardowns).toBe(0);
    expect(() => handle.sandbox).toThrow(/detached/);
    await provider.close(handle); // no-op: the detach already settled it
    expect(provider.teardowns).toBe(0);
    expect(await sandbox.execute("echo alive")).toMatchObject({ output: "alive\n", exitCode: 0 });
    await sandbox.close(); // the test's own cleanup: detach left the temporary workspace behind on purpose
  });

  it("rejects an invalid spec with a typed error", async () => {
    const provider = new CountingProvider();
    await expect(provider.open({ timeout: -1 })).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
    await expect(provider.open({ env: { "BAD NAME": "x" } })).rejects.toThrow(/Invalid sandbox spec/);
    await expect(provider.open({ bogus: 1 } as never)).rejects.toThrow(/Invalid sandbox spec/);
    expect(provider.sandboxCount).toBe(0);
  });

  it("applies the spec's env to payloads; a payload's env wins", async () => {
    const provider = new CountingProvider();
    const handle = await provider.open({ env: { GREETING: "hello", WHO: "spec" } });
    try {
      const result = await handle.dispatch(commandRun({ cmd: 'echo "$GREETING $WHO"', env: { WHO: "payload" } }));
      expect(result).toMatchObject({ stdout: "hello payload\n" });
      const read = await handle.dispatch(filesRead({ path: "/missing" }));
      expect(read).toEqual({ error: { code: "file_not_found", message: "File '/missing' not found", path: "/missing" } });
    } finally {
      await provider.close(handle);
    }
  });

  it("a handle belongs to the provider that opened it", async () => {
    const { provider, handle } = await openCounted();
    const other = new CountingProvider("other");
    await expect(other.close(handle)).rejects.toThrow(/opened by provider 'counting'/);
    await provider.close(handle);
  });
});
