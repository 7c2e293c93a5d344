import { afterEach, describe, expect, it } from "vitest";
import { isStrataError } from "../core/errors.js";
import { MAX_TIMEOUT_SECONDS } from "../core/limits.js";
import { commandRun, codeRun, providers, StreamEvent, type Payload, type SandboxHandle } from "../runtime/index.js";
import { CountingProvider, sleep } from "./support/runtime-providers.js";

// Every duration the runtime hands to a timer is checked against what a timer can hold:
// Node fires a delay over 2^31-1 ms after 1 ms, so 30 days would have meant "now".

const THIRTY_DAYS = 30 * 24 * 3600;
const invalid = (error: unknown) => isStrataError(error, "invalid_argument");
/** What a synchronous call threw (undefined when it did not throw). */
function thrown(run: () => unknown): unknown {
  try {
    run();
  } catch (error) {
    return error;
  }
  return undefined;
}

const opened: Array<{ provider: CountingProvider; handle: SandboxHandle }> = [];
afterEach(async () => {
  for (const { provider, handle } of opened.splice(0)) if (!handle.closed) await provider.close(handle);
});
async function open(spec = {}): Promise<{ provider: CountingProvider; handle: SandboxHandle }> {
  const provider = new CountingProvider();
  const entry = { provider, handle: await provider.open(spec) };
  opened.push(entry);
  return entry;
}

describe("durations past what a timer can hold", () => {
  it("open refuses a lifetime over the maximum instead of closing the sandbox at once", async () => {
    const provider = new CountingProvider();
    for (const timeout of [THIRTY_DAYS, MAX_TIMEOUT_SECONDS + 1, Infinity, Number.MAX_VALUE]) {
      await expect(provider.open({ timeout })).rejects.toSatisfy(invalid);
    }
    await expect(providers.get("local").open({ timeout: THIRTY_DAYS })).rejects.toThrow(/largest a timer can honour/);
    expect(provider.sandboxCount).toBe(0);
    expect(provider.teardowns).toBe(0);
  });

  it("the largest lifetime is honoured: the sandbox stays open", async () => {
    const { provider, handle } = await open({ timeout: MAX_TIMEOUT_SECONDS });
    await sleep(50);
    expect(handle.closed).toBe(false);
    expect(provider.teardowns).toBe(0);
    expect(await handle.dispatch(commandRun({ cmd: "echo alive" }))).toMatchObject({ stdout: "alive\n", exitCode: 0 });
  });

  it("closeAfter checks its duration", async () => {
    const { provider, handle } = await open();
    expect(invalid(thrown(() => handle.closeAfter(THIRTY_DAYS, () => {})))).toBe(true);
    expect(() => handle.closeAfter(THIRTY_DAYS, () => {})).toThrow(/lifetime timeout of 2592000 s/);
    expect(() => handle.closeAfter(0, () => {})).toThrow(/lifetime timeout must be a positive number/);
    await sleep(20);
    expect(handle.closed).toBe(false);
    expect(provider.teardowns).toBe(0);
  });

  it("command.run and code.run refuse an over-long timeout instead of answering 124 at once", async () => {
    const { handle } = await open();
    // Untrusted payloads (JSON from a model) get a failure; the builders throw the same typed error.
    const raw = { type: "command.run", cmd: "echo ran", timeout: THIRTY_DAYS } as unknown as Payload;
    const result = await handle.dispatch(raw);
    expect(result).toEqual({ error: { code: "invalid_argument", message: expect.stringMatching(/largest a timer can honour/) } });
    const code = await handle.dispatch({ type: "code.run", code: "echo ran", language: "sh", timeout: THIRTY_DAYS } as unknown as Payload);
    expect(code).toMatchObject({ error: { code: "invalid_argument" } });
    expect(() => commandRun({ cmd: "echo ran", timeout: THIRTY_DAYS })).toThrow(/largest a timer can honour/);
    expect(invalid(thrown(() => codeRun({ code: "1", timeout: -1 })))).toBe(true);
    // The largest timeout runs the command normally.
    expect(await handle.dispatch(commandRun({ cmd: "echo ran", timeout: MAX_TIMEOUT_SECONDS }))).toMatchObject({
      type: "command_result",
      stdout: "ran\n",
      exitCode: 0,
    });
  });

  it("waitEvent refuses an over-long wait at once and the stream goes on", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    const never = new StreamEvent(); // recorded by nobody: stays pending
    expect(invalid(thrown(() => stream.waitEvent(never, THIRTY_DAYS)))).toBe(true);
    expect(invalid(thrown(() => stream.waitStream(handle.stream(), NaN)))).toBe(true);
    await expect(never.wait(THIRTY_DAYS)).rejects.toSatisfy(invalid);
    expect(stream.failure).toBeUndefined();
    expect(await stream.submit(commandRun({ cmd: "echo next" }))).toMatchObject({ stdout: "next\n" });
  });

  it("a wait of the largest duration does not fail the stream early", async () => {
    const { handle } = await open();
    const blocked = handle.stream();
    const other = handle.stream();
    const gate = other.recordEvent();
    other.submit(commandRun({ cmd: "sleep 0.2" }));
    const late = other.recordEvent();
    blocked.waitEvent(late, MAX_TIMEOUT_SECONDS);
    const after = blocked.submit(commandRun({ cmd: "echo after" }));
    await gate.wait();
    await sleep(50);
    expect(blocked.failure).toBeUndefined();
    expect(after.done()).toBe(false);
    expect(await after).toMatchObject({ stdout: "after\n" });
  });
});
