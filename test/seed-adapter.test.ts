import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { seedDockerSandbox, seedFilesystemBackend } from "../adapters/seed.js";
import { dockerService } from "./support/sandbox-services.js";

describe("the seeds' constructors", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
  });

  it("FilesystemBackend(root) answers the seeds' protocol", async () => {
    const root = await mkdtemp(join(tmpdir(), "strata-seed-"));
    dirs.push(root);
    const backend = seedFilesystemBackend(root);
    expect(await backend.write("/a.txt", "one\ntwo")).toMatchObject({ path: "/a.txt" });
    expect(await backend.read("/a.txt", 1, 1)).toBe("     2\ttwo");
    expect(await backend.read("/missing")).toMatch(/^Error: File '\/missing' not found/);
    expect(await backend.grepRaw("two")).toEqual([{ path: "/a.txt", line: 2, text: "two" }]);
    const host = seedFilesystemBackend(root, false);
    expect((await host.lsInfo(root)).map((i) => i.path)).toEqual([`${root}/a.txt`]);
  });

  it("DockerSandbox(image, workDir) runs execute(command, timeout) in workDir, and stop() removes it", async () => {
    const { socket, images } = dockerService();
    const previous = process.env.DOCKER_HOST;
    process.env.DOCKER_HOST = `unix://${socket}`;
    try {
      const sandbox = await seedDockerSandbox(images.busybox, "/work");
      try {
        expect(await sandbox.write("/work/script.sh", "echo hello from $(pwd)\n")).toMatchObject({ path: "/work/script.sh" });
        expect(await sandbox.execute("sh /work/script.sh", 30)).toMatchObject({ output: "hello from /work\n", exitCode: 0 });
        expect((await sandbox.execute("sleep 20", 1)).exitCode).toBe(124);
      } finally {
        await sandbox.stop();
      }
      await expect(sandbox.execute("echo hi")).rejects.toMatchObject({ code: "sandbox_closed" });
    } finally {
      if (previous === undefined) delete process.env.DOCKER_HOST;
      else process.env.DOCKER_HOST = previous;
    }
  });
});
