/**
 * LocalSandbox claims no isolation, only what every sandbox promises about
 * commands (timeout, process-tree kill, output cap) plus a workspace its
 * uploads and downloads cannot leave through a symlink.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { toSeedProtocol } from "../core/seed.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { commandCases } from "./containment-cases.js";

commandCases({ name: "LocalSandbox", create: async () => new LocalSandbox() });

describe("LocalSandbox", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const step of cleanup.splice(0)) await step();
  });
  const sandbox = (options?: ConstructorParameters<typeof LocalSandbox>[0]) => {
    const created = new LocalSandbox(options);
    cleanup.push(() => created.close());
    return created;
  };
  const tempDir = () => {
    const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-local-test-"));
    cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
    return dir;
  };

  it("says plainly that it isolates nothing beyond a process", () => {
    expect(sandbox().isolation).toBe("process");
  });

  it("does not hand this process's environment to commands unless asked", async () => {
    process.env.STRATA_LOCAL_TEST_SECRET = "do-not-leak";
    try {
      const native = sandbox({ env: undefined });
      const s = toSeedProtocol(native);
      expect((await s.execute("echo \"[$STRATA_LOCAL_TEST_SECRET]\" \"$HOME\"")).output).toBe(`[] ${native.workspace}\n`);
      expect((await s.execute('echo "$X"', { env: { X: "given" } })).output).toBe("given\n");
    } finally {
      delete process.env.STRATA_LOCAL_TEST_SECRET;
    }
  });

  it("refuses uploads and downloads through a symlink that leads out of the workspace", async () => {
    const outside = tempDir();
    writeFileSync(nodePath.join(outside, "secret.txt"), "secret");
    const native = sandbox();
    const s = toSeedProtocol(native);
    symlinkSync(outside, nodePath.join(native.workspace, "door"));
    symlinkSync(nodePath.join(outside, "secret.txt"), nodePath.join(native.workspace, "secret-link"));
    const [up] = await s.uploadFiles([["/door/planted.txt", new TextEncoder().encode("x")]]);
    expect(up!.error).not.toBeNull();
    expect(existsSync(nodePath.join(outside, "planted.txt"))).toBe(false);
    const [down] = await s.downloadFiles(["/secret-link"]);
    expect(down).toMatchObject({ content: null });
    expect(down!.error).not.toBeNull();
    const [over] = await s.uploadFiles([["/secret-link", new TextEncoder().encode("clobbered")]]);
    expect(over!.error).not.toBeNull();
    expect(readFileSync(nodePath.join(outside, "secret.txt"), "utf8")).toBe("secret");
  });

  it("uses a given workspace and keeps it on close; removes a workspace it made", async () => {
    const dir = tempDir();
    mkdirSync(nodePath.join(dir, "src"));
    writeFileSync(nodePath.join(dir, "src", "a.txt"), "from host\n");
    const given = new LocalSandbox({ workspace: dir });
    expect(await toSeedProtocol(given).read("/src/a.txt")).toBe("     1\tfrom host");
    await given.close();
    expect(existsSync(nodePath.join(dir, "src", "a.txt"))).toBe(true);
    const own = new LocalSandbox();
    const made = own.workspace;
    await own.close();
    expect(existsSync(made)).toBe(false);
    expect(() => new LocalSandbox({ workspace: nodePath.join(dir, "missing") })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
  });

  it("runs commands with the default timeout when the call gives none", async () => {
    const s = toSeedProtocol(sandbox({ timeout: 0.5 }));
    const result = await s.execute("sleep 20");
    expect(result.exitCode).toBe(124);
    expect(result.output).toContain("timed out after 0.5 s");
  });
});
