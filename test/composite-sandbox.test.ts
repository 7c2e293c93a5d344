import { afterAll, describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { StateBackend } from "../backends/state.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";

describe("CompositeBackend over a sandbox whose path space starts at its workspace", () => {
  const sandbox = new BubblewrapSandbox();
  const memories = new StateBackend();
  const composite = new CompositeBackend({ default: sandbox, routes: { "/memories": memories } });
  afterAll(() => sandbox.close());

  it("lists the way down to the workspace, searches it from '/', and runs commands in it", async () => {
    expect((await composite.write("/workspace/app.sh", "echo needle\n")).error).toBeUndefined();
    expect((await composite.write("/memories/notes.md", "a needle too\n")).error).toBeUndefined();
    const root = await composite.ls("/");
    expect(root.error).toBeUndefined();
    expect(root.entries?.map((e) => e.path)).toEqual(["/memories/", "/workspace/"]);
    expect((await composite.stat("/workspace")).is_dir).toBe(true);
    expect((await composite.glob("**")).entries?.map((e) => e.path)).toEqual(["/memories/notes.md", "/workspace/app.sh"]);
    expect((await composite.grep("needle")).matches?.map((m) => m.path)).toEqual(["/memories/notes.md", "/workspace/app.sh"]);
    expect((await composite.execute("sh /workspace/app.sh")).output).toBe("needle\n");
    expect((await composite.read("/etc/passwd")).error?.code).toBe("invalid_path");
  });
});
