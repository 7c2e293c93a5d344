import { afterAll, describe, expect, it } from "vitest";
import { MAX_UNREAD_BYTES } from "../sandboxes/spawn.js";
import { LocalSandbox } from "../sandboxes/local.js";

describe("spawn's flow control (LocalSandbox; the streams are the same on every sandbox)", () => {
  const sandbox = new LocalSandbox();
  afterAll(() => sandbox.close());

  it("never cuts output that is read, however much there is", async () => {
    const started = await sandbox.spawn(`head -c ${MAX_UNREAD_BYTES + 16 * 1024 * 1024} /dev/zero`);
    if (started.error) throw new Error(started.error.message);
    let total = 0;
    const reader = started.stdout.getReader();
    for (let next = await reader.read(); !next.done; next = await reader.read()) total += next.value.byteLength;
    expect(total).toBe(MAX_UNREAD_BYTES + 16 * 1024 * 1024);
    expect(await started.wait()).toEqual({ exitCode: 0 });
  });

  it("stops a command whose output nobody reads once MAX_UNREAD_BYTES wait, and says so", async () => {
    const started = await sandbox.spawn("cat /dev/zero");
    if (started.error) throw new Error(started.error.message);
    const ended = await started.wait();
    expect(ended.error?.code).toBe("too_large");
    expect(process.memoryUsage().rss).toBeLessThan(2 * 1024 * 1024 * 1024);
  });

  it("waits for the command to read stdin instead of buffering what it does not read", async () => {
    const started = await sandbox.spawn("sleep 1; head -c 1 >/dev/null; sleep 5");
    if (started.error) throw new Error(started.error.message);
    const writer = started.stdin.getWriter();
    const chunk = new Uint8Array(1024 * 1024);
    let written = 0;
    const writing = (async () => {
      for (let i = 0; i < 256; i++) {
        await writer.write(chunk);
        written++;
      }
    })().catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 2500));
    // A pipe holds 64 KiB and the stream a little more: far from 256 MiB.
    expect(written).toBeLessThan(16);
    await started.kill();
    await writing;
  });
});
