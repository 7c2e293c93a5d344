import { afterEach, describe, expect, it } from "vitest";
import { StrataError } from "../core/errors.js";
import {
  BackendSandboxClosed,
  commandRun,
  filesRead,
  filesWrite,
  Future,
  StreamFailed,
  type SandboxHandle,
} from "../runtime/index.js";
import { CountingProvider, sleep } from "./support/runtime-providers.js";

// Streams over real LocalSandboxes; CountingProvider (test/support) can make dispatch throw.

/** Fails the test instead of hanging when a promise never settles. */
function settlesWithin<T>(promise: PromiseLike<T>, ms = 5_000): Promise<T> {
  return Promise.race([Promise.resolve(promise), sleep(ms).then(() => Promise.reject(new Error(`did not settle within ${ms} ms`)))]);
}

const opened: Array<{ provider: CountingProvider; handle: SandboxHandle }> = [];
async function open(): Promise<{ provider: CountingProvider; handle: SandboxHandle }> {
  const provider = new CountingProvider();
  const entry = { provider, handle: await provider.open() };
  opened.push(entry);
  return entry;
}
afterEach(async () => {
  for (const { provider, handle } of opened.splice(0)) await provider.close(handle);
});

describe("stream", () => {
  it("runs payloads one at a time in submission order", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    // Each command appends to one file; the slower early ones would finish last if they overlapped.
    const futures = [40, 0, 20, 0, 10].map((ms, i) => stream.submit(commandRun({ cmd: `sleep ${ms / 1000}; echo ${i} >> log.txt; echo ${i}` })));
    expect(futures.every((future) => future instanceof Future)).toBe(true);
    const results = await settlesWithin(Promise.all(futures));
    expect(results.map((result) => (result.type === "command_result" ? result.stdout : result.type))).toEqual(["0\n", "1\n", "2\n", "3\n", "4\n"]);
    const log = await handle.dispatch(filesRead({ path: "/log.txt" }));
    expect(log).toMatchObject({ data: "0\n1\n2\n3\n4\n" });
    expect(stream.query()).toBe(true);
  });

  it("a future can be inspected without waiting", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    const future = stream.submit(commandRun({ cmd: "sleep 0.05; echo done" }));
    expect(future.done()).toBe(false);
    expect(stream.query()).toBe(false);
    expect(() => future.result()).toThrow(/still pending/);
    await stream.synchronize();
    expect(future.done()).toBe(true);
    expect(future.result()).toMatchObject({ stdout: "done\n" });
    expect(stream.query()).toBe(true);
  });

  it("a failing payload mid-queue returns its failure and the stream goes on", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    const first = stream.submit(filesWrite({ path: "/a.txt", data: "a" }));
    const failing = stream.submit(filesRead({ path: "/missing.txt" }));
    const invalid = stream.submit({ type: "files.read", path: 42 } as never);
    const last = stream.submit(filesRead({ path: "/a.txt" }));
    expect(await settlesWithin(first)).toMatchObject({ type: "file_write_result", bytesWritten: 1 });
    expect(await settlesWithin(failing)).toEqual({ error: { code: "file_not_found", message: "File '/missing.txt' not found", path: "/missing.txt" } });
    expect(await settlesWithin(invalid)).toMatchObject({ error: { code: "invalid_argument" } });
    expect(await settlesWithin(last)).toMatchObject({ type: "file_content", data: "a" });
    expect(stream.failure).toBeUndefined();
  });

  it("records events that complete in order, with elapsed times", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    const start = stream.recordEvent();
    stream.submit(commandRun({ cmd: "sleep 0.1" }));
    const end = stream.recordEvent();
    await settlesWithin(end.wait());
    expect(start.query()).toBe(true);
    expect(end.query()).toBe(true);
    expect(start.elapsedTime(end)).toBeGreaterThanOrEqual(90);
    const pending = stream.recordEvent();
    expect(() => start.elapsedTime(pending)).toThrow(/both events/);
    await pending.synchronize();
  });

  it("waitEvent makes one stream wait for a point in another", async () => {
    const a = await open();
    const b = await open();
    const producer = a.handle.stream();
    const consumer = b.handle.stream();
    const consumerStart = consumer.recordEvent();
    producer.submit(commandRun({ cmd: "sleep 0.15" }));
    const produced = producer.recordEvent();
    consumer.waitEvent(produced, 5);
    const after = consumer.submit(commandRun({ cmd: "echo consumed" }));
    const consumed = consumer.recordEvent();
    expect(await settlesWithin(after)).toMatchObject({ stdout: "consumed\n" });
    await consumed.wait();
    expect(produced.query()).toBe(true);
    // The consumer stream sat idle until the producer's point, then ran its command.
    expect(produced.elapsedTime(consumed)).toBeGreaterThan(0);
    expect(consumerStart.elapsedTime(consumed)).toBeGreaterThanOrEqual(140);
  });

  it("waitStream orders work across streams", async () => {
    const { handle } = await open();
    const first = handle.stream();
    const second = handle.stream();
    first.submit(commandRun({ cmd: "sleep 0.1; echo first >> order.txt" }));
    second.waitStream(first);
    second.submit(commandRun({ cmd: "echo second >> order.txt" }));
    await settlesWithin(second.synchronize());
    expect(await handle.dispatch(filesRead({ path: "/order.txt" }))).toMatchObject({ data: "first\nsecond\n" });
  });

  it("a dispatch that throws stops the stream: every queued future fails, none hangs", async () => {
    const { provider, handle } = await open();
    const stream = handle.stream();
    const started = stream.submit(commandRun({ cmd: "sleep 0.1; echo ran" }));
    const event = stream.recordEvent();
    await sleep(30); // the first command is running now
    provider.breakWith = new StrataError("io_error", "connection to the sandbox lost");
    const doomed = [stream.submit(commandRun({ cmd: "echo 1" })), stream.submit(commandRun({ cmd: "echo 2" })), stream.submit(commandRun({ cmd: "echo 3" }))];
    const afterDoomed = stream.recordEvent();
    expect(await settlesWithin(started)).toMatchObject({ stdout: "ran\n" });
    await settlesWithin(event.wait());
    await expect(settlesWithin(doomed[0]!)).rejects.toThrow("connection to the sandbox lost");
    for (const future of doomed.slice(1)) {
      await expect(settlesWithin(future)).rejects.toBeInstanceOf(StreamFailed);
    }
    await expect(settlesWithin(afterDoomed.wait())).rejects.toBeInstanceOf(StreamFailed);
    await expect(settlesWithin(stream.synchronize())).rejects.toBeInstanceOf(StreamFailed);
    await expect(settlesWithin(stream.submit(commandRun({ cmd: "echo later" })))).rejects.toThrow(/stopped: connection to the sandbox lost/);
    expect(stream.failure).toBeInstanceOf(StreamFailed);
    expect(stream.query()).toBe(true);
  });

  it("a sandbox closed under a stream fails its queued work", async () => {
    const { provider, handle } = await open();
    const stream = handle.stream();
    const running = stream.submit(commandRun({ cmd: "sleep 0.1; echo before" }));
    const queued = Array.from({ length: 5 }, (_, i) => stream.submit(commandRun({ cmd: `echo ${i}` })));
    await sleep(30); // the first command is running now
    const closing = provider.close(handle);
    // The running command was cut off or finished; either way it settles.
    await settlesWithin(running.then(() => undefined, () => undefined));
    await closing;
    await expect(settlesWithin(queued[0]!)).rejects.toBeInstanceOf(BackendSandboxClosed);
    for (const future of queued.slice(1)) await expect(settlesWithin(future)).rejects.toBeInstanceOf(StreamFailed);
  });

  it("a stream waiting on a failed stream's event fails too", async () => {
    const a = await open();
    const b = await open();
    const broken = a.handle.stream();
    const waiting = b.handle.stream();
    a.provider.breakWith = new StrataError("io_error", "gone");
    broken.submit(commandRun({ cmd: "true" }));
    waiting.waitStream(broken);
    const blocked = waiting.submit(commandRun({ cmd: "echo never" }));
    await expect(settlesWithin(blocked)).rejects.toBeInstanceOf(StreamFailed);
    expect(waiting.failure?.message).toMatch(/stopped: The stream on sandbox .* stopped: gone/);
  });

  it("a wait that times out fails the stream instead of hanging", async () => {
    const a = await open();
    const b = await open();
    const slow = a.handle.stream();
    const impatient = b.handle.stream();
    slow.submit(commandRun({ cmd: "sleep 1" }));
    impatient.waitEvent(slow.recordEvent(), 0.1);
    const blocked = impatient.submit(commandRun({ cmd: "echo never" }));
    await expect(settlesWithin(blocked, 2_000)).rejects.toThrow(/not reached within 0.1 s/);
    await slow.synchronize();
  });

  it("close drains the queue, then refuses new work; `await using` closes", async () => {
    const { handle } = await open();
    let future;
    {
      await using stream = handle.stream();
      future = stream.submit(commandRun({ cmd: "sleep 0.05; echo drained" }));
    }
    expect(future.done()).toBe(true);
    expect(future.result()).toMatchObject({ stdout: "drained\n" });
    const stream = handle.stream();
    await stream.close();
    await expect(stream.submit(commandRun({ cmd: "true" }))).rejects.toThrow(/is closed/);
  });

  it("an unsupported payload type stops the stream with UnsupportedBackendTool", async () => {
    const { handle } = await open();
    const stream = handle.stream();
    const bad = stream.submit({ type: "gpu.launch" } as never);
    const next = stream.submit(commandRun({ cmd: "true" }));
    await expect(settlesWithin(bad)).rejects.toThrow(/does not support payload 'gpu.launch'/);
    await expect(settlesWithin(next)).rejects.toBeInstanceOf(StreamFailed);
  });
});
