/**
 * DockerSandbox against hostile commands and a careless caller, on the real
 * test daemon: links planted to steer file transfers, processes that leave
 * every trace of their run, close() during a command, a process that never
 * calls close(), and a batch download bigger than a string can hold.
 */
import { createHash } from "node:crypto";
import Docker from "dockerode";
import { afterAll, describe, expect, it } from "vitest";
import { MAX_TIMEOUT_SECONDS } from "../core/limits.js";
import { toSeedProtocol } from "../core/seed.js";
import { DEADLINE_LABEL, DockerSandbox } from "../sandboxes/docker.js";
import { SharedContainer, TEST_LABELS, dockerService } from "./support/sandbox-services.js";

const { socket, images } = dockerService();
const docker = new Docker({ socketPath: socket });
const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | null) => new TextDecoder().decode(data ?? new Uint8Array());
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const unique = (prefix: number) => `${prefix}${Math.floor(Math.random() * 1e6)}`;

/** `ps` lines in the container that mention `marker`, polled until none is left or `seconds` pass. */
async function processesInside(sandbox: DockerSandbox, marker: string, seconds = 3): Promise<string[]> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const { output } = await toSeedProtocol(sandbox).execute("ps -o pid,args");
    const found = output.split("\n").filter((line) => line.includes(marker));
    if (found.length === 0 || Date.now() > deadline) return found;
    await sleep(100);
  }
}

async function gone(id: string): Promise<boolean> {
  try {
    await docker.getContainer(id).inspect();
    return false;
  } catch (error) {
    return (error as { statusCode?: number }).statusCode === 404;
  }
}

for (const [flavour, image] of Object.entries(images)) {
  describe(`DockerSandbox under hostile commands (${flavour})`, () => {
    const shared = new SharedContainer(image);
    afterAll(() => shared.dispose());

    it("never writes through a planted link: a linked parent is refused, a final link is replaced", async () => {
      // A writable root: only the user the transfer runs as stands between a link and the image.
      const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS, readOnlyRoot: false });
      const sandbox = toSeedProtocol(native);
      try {
        // The links as the command made them, named by the paths it sees (the workspace's own).
        const ws = native.workspace;
        const before = (await sandbox.execute("cksum < /usr/bin/ls || cksum < /bin/ls")).output;
        await sandbox.execute("ln -s /usr/bin b && ln -s /tmp t && echo kept > target && ln -s target final && mkdir d && ln -s ../target d/rel");
        const responses = await sandbox.uploadFiles([
          [`${ws}/b/ls`, bytes("replaced")],
          [`${ws}/t/planted`, bytes("hidden")],
          [`${ws}/final`, bytes("new content")],
          [`${ws}/d/rel`, bytes("relative")],
          [`${ws}/fine/new.txt`, bytes("ok")],
        ]);
        expect(responses).toEqual([
          { path: `${ws}/b/ls`, error: "permission_denied" },
          { path: `${ws}/t/planted`, error: "permission_denied" },
          { path: `${ws}/final`, error: null },
          { path: `${ws}/d/rel`, error: null },
          { path: `${ws}/fine/new.txt`, error: null },
        ]);
        expect((await sandbox.execute("cksum < /usr/bin/ls || cksum < /bin/ls")).output).toBe(before);
        const look = await sandbox.execute("ls /tmp; cat target; echo; [ -L final ] || cat final; echo; [ -L d/rel ] || cat d/rel");
        expect(look.output).toBe("kept\n\nnew content\nrelative");
        // The derived write takes the same stand as the upload.
        const write = await sandbox.write(`${ws}/b/sneaky`, "x");
        expect(write.code).toBe("permission_denied");
        expect((await sandbox.execute("ls /usr/bin/sneaky 2>/dev/null || echo absent")).output).toBe("absent\n");
      } finally {
        await native.close();
      }
    });

    it("reads through links as the shell does: read, single download, batch download and cat agree", async () => {
      const native = await shared.fresh();
      const sandbox = toSeedProtocol(native);
      const ws = native.workspace;
      // A link out to /tmp (a tmpfs the daemon's archive API did not see), and a relative link inside a linked directory.
      const tmp = `/tmp/${unique(11)}`;
      await sandbox.execute(`mkdir ${tmp} && echo outside > ${tmp}/f && ln -s ${tmp} out`);
      await sandbox.execute("mkdir real && echo inner > real/x && echo top > x && ln -s x real/l && ln -s real d");
      // The file operations and `cat` take the same path.
      for (const path of [`${ws}/out/f`, `${ws}/d/l`]) {
        const cat = (await sandbox.execute(`cat ${path}`)).output;
        const read = await sandbox.read(path);
        const [single] = await sandbox.downloadFiles([path]);
        const batch = await sandbox.downloadFiles([path, `${ws}/x`]);
        expect(read).toBe(`     1\t${cat.trimEnd()}`);
        expect(text(single!.content)).toBe(cat);
        expect(text(batch[0]!.content)).toBe(cat);
        expect(text(batch[1]!.content)).toBe("top\n");
      }
      expect((await sandbox.execute("cat d/l")).output).toBe("inner\n");
    });

    it("close() stops a running command of an attached sandbox: it rejects with sandbox_closed and the process is gone", async () => {
      const observer = await shared.fresh();
      const native = await DockerSandbox.attach(observer.id, { docker: socket, workspace: observer.workspace });
      const sandbox = toSeedProtocol(native);
      const marker = unique(21);
      const started = Date.now();
      const running = sandbox.execute(`sleep ${marker}; echo finished`).catch((error: unknown) => error);
      await sleep(700);
      await native.close();
      expect(await running).toMatchObject({ code: "sandbox_closed" });
      expect(Date.now() - started).toBeLessThan(5000);
      expect(await processesInside(observer, marker)).toEqual([]);
    });

    it("close() of a created sandbox rejects its running command with sandbox_closed, not an exit code", async () => {
      const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS });
      const sandbox = toSeedProtocol(native);
      const running = sandbox.execute("sleep 600").catch((error: unknown) => error);
      await sleep(700);
      await native.close();
      expect(await running).toMatchObject({ code: "sandbox_closed" });
      expect(await gone(native.id)).toBe(true);
    });

    it("kills at the timeout what left the group and dropped the marker (setsid env -i), and what held the output after a normal exit", async () => {
      const native = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS });
      const sandbox = toSeedProtocol(native);
      try {
        const quiet = unique(31);
        const timedOut = await sandbox.execute(`setsid env -i sleep ${quiet} >/dev/null 2>&1 & sleep 600`, { timeout: 1 });
        expect(timedOut.exitCode).toBe(124);
        expect(await processesInside(native, quiet)).toEqual([]);

        const holder = unique(32);
        const started = Date.now();
        const normal = await sandbox.execute(`setsid env -i sleep ${holder} & echo done`);
        expect(normal).toEqual({ output: "done\n", exitCode: 0, truncated: false });
        expect(Date.now() - started).toBeLessThan(3000);
        expect(await processesInside(native, holder)).toEqual([]);

        // A background job whose output goes elsewhere is the caller's to keep, as in every sandbox.
        const kept = unique(33);
        await sandbox.execute(`sleep ${kept} >/dev/null 2>&1 &`);
        expect(await processesInside(native, kept, 0)).toHaveLength(1);
      } finally {
        await native.close();
      }
    });
  });
}

describe("DockerSandbox lifetime", () => {
  it("a created container stops and is removed at its lifetime even though close() is never called", async () => {
    const native = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS, lifetimeSeconds: 3 });
    const sandbox = toSeedProtocol(native);
    const info = await docker.getContainer(native.id).inspect();
    expect(Number(info.Config.Labels[DEADLINE_LABEL])).toBeGreaterThan(Date.now() / 1000);
    expect(info.HostConfig.AutoRemove).toBe(true);
    expect((await sandbox.execute("echo alive")).output).toBe("alive\n");
    // The Node-side reference is simply dropped: nothing here calls close().
    let removed = false;
    for (let i = 0; i < 40 && !removed; i++) {
      await sleep(250);
      removed = await gone(native.id);
    }
    expect(removed).toBe(true);
  });

  it("the next create sweeps a container whose deadline passed (one its first process could not stop)", async () => {
    const past = String(Math.floor(Date.now() / 1000) - 60);
    const stale = await docker.createContainer({ Image: images.busybox, Cmd: ["sleep", "600"], Labels: { ...TEST_LABELS, [DEADLINE_LABEL]: past } });
    await stale.start();
    const sandbox = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS });
    await sandbox.close();
    expect(await gone(stale.id)).toBe(true);
  });

  it("refuses durations a timer cannot honour: lifetimeSeconds, default timeout and per-call timeout", async () => {
    const tooLong = MAX_TIMEOUT_SECONDS + 1;
    await expect(DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS, lifetimeSeconds: tooLong })).rejects.toMatchObject({
      code: "invalid_argument",
    });
    await expect(DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS, timeout: tooLong })).rejects.toMatchObject({
      code: "invalid_argument",
    });
    const native = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS, lifetimeSeconds: MAX_TIMEOUT_SECONDS });
    const sandbox = toSeedProtocol(native);
    try {
      await expect(sandbox.execute("true", { timeout: 2592000 })).rejects.toMatchObject({ code: "invalid_argument" });
      expect((await sandbox.execute("echo fine", { timeout: MAX_TIMEOUT_SECONDS })).output).toBe("fine\n");
    } finally {
      await native.close();
    }
  });
});

describe("DockerSandbox big batch download", () => {
  it("downloads two ~200 MB files in one call, intact, without one string or buffer for both", async () => {
    const native = await DockerSandbox.create({ image: images.gnu, docker: socket, labels: TEST_LABELS, memoryMb: 512, quota: false });
    const sandbox = toSeedProtocol(native);
    try {
      const made = await sandbox.execute(
        "dd if=/dev/urandom of=a.bin bs=1M count=200 2>/dev/null && dd if=/dev/urandom of=b.bin bs=1M count=190 2>/dev/null && sha256sum a.bin b.bin",
        { timeout: 120 },
      );
      expect(made.exitCode).toBe(0);
      const expected = made.output.trim().split("\n").map((line) => line.split(/\s+/)[0]);
      const rssBefore = process.memoryUsage().rss;
      const [a, b] = await sandbox.downloadFiles([`${native.workspace}/a.bin`, `${native.workspace}/b.bin`]);
      const grown = process.memoryUsage().rss - rssBefore;
      expect([a!.error, b!.error]).toEqual([null, null]);
      expect(a!.content!.length).toBe(200 * 1024 * 1024);
      expect(b!.content!.length).toBe(190 * 1024 * 1024);
      const hashes = [a, b].map((response) => createHash("sha256").update(response!.content!).digest("hex"));
      expect(hashes).toEqual(expected);
      // The two files themselves are 390 MiB; the transfer adds little on top (it was 1.4 GB and a throw).
      expect(grown).toBeLessThan(800 * 1024 * 1024);
    } finally {
      await native.close();
    }
  }, 120_000);
});
