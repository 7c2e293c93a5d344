import { expect } from "vitest";
import type { Sandbox } from "../../core/protocol.js";
import { toSeedProtocol } from "../../core/seed.js";

/**
 * The seeds' own example on a sandbox whose workspace is /workspace: the file
 * a write makes is the file a command runs, by the same absolute path;
 * relative paths start in the workspace; every file operation outside it
 * answers invalid_path and touches nothing.
 */
export async function expectOnePathSpace(native: Sandbox & { workspace: string }): Promise<void> {
  const s = toSeedProtocol(native);
  const bytes = (text: string) => new TextEncoder().encode(text);
  expect([native.workspace, native.root]).toEqual(["/workspace", "/workspace"]);
  expect(await s.write("/workspace/script.sh", 'echo "hello from $(pwd)"\n')).toMatchObject({ path: "/workspace/script.sh" });
  expect(await s.execute("sh /workspace/script.sh")).toMatchObject({ output: "hello from /workspace\n", exitCode: 0 });
  expect(await s.read("script.sh")).toBe('     1\techo "hello from $(pwd)"');
  await s.execute("mkdir -p sub && echo made > /workspace/sub/made.txt");
  expect(await s.read("/workspace/sub/made.txt")).toBe("     1\tmade");
  expect(await s.execute("sh ../script.sh", { cwd: "sub" })).toMatchObject({ output: "hello from /workspace/sub\n", exitCode: 0 });
  const invalid = { error: expect.objectContaining({ code: "invalid_path" }) };
  for (const path of ["/etc/passwd", "/a.txt"]) {
    expect(await native.read(path)).toMatchObject(invalid);
    expect(await native.write(path, "x")).toMatchObject(invalid);
    expect(await native.write(path, "x", { overwrite: true })).toMatchObject(invalid);
    expect(await native.edit(path, "root", "toor")).toMatchObject(invalid);
    expect(await native.delete(path)).toMatchObject(invalid);
    expect(await native.stat(path)).toMatchObject(invalid);
    expect(await native.ls(path)).toMatchObject(invalid);
    expect(await native.grep("root", { path })).toMatchObject(invalid);
    expect(await native.uploadFiles([[path, bytes("x")]])).toMatchObject({ files: [{ path, error: { code: "invalid_path" } }] });
    expect(await native.downloadFiles([path])).toMatchObject({ files: [{ path, content: null, error: { code: "invalid_path" } }] });
    expect(await s.uploadFiles([[path, bytes("x")]])).toEqual([{ path, error: "invalid_path" }]);
  }
  expect(await native.execute("true", { cwd: "/etc" })).toMatchObject(invalid);
  expect((await s.execute("head -c 5 /etc/passwd; [ -e /a.txt ] && echo a-exists || echo no-a")).output).toBe("root:no-a\n");
}
