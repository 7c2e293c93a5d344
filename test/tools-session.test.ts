/**
 * Tool sessions own their sandbox: each session over a SandboxHandle holds
 * one reference; ending releases it once, after the calls in flight; a fork
 * takes its own; detaching records the sandbox so a later process reattaches.
 * Real providers: bubblewrap for the concurrency cases, Docker (in two
 * processes) for detach and reattach.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { StateBackend } from "../backends/state.js";
import { PersistentSandboxRegistry, providers, type SandboxHandle } from "../runtime/index.js";
import { createTools, ToolSession, type BoundTool, type ToolOutput } from "../tools/index.js";
import { providerMissing, requireService } from "./support/runtime-services.js";

type Tools = Record<string, BoundTool>;

function toolsOf(session: ToolSession): Tools {
  return Object.fromEntries(createTools(session.handle ?? session.backend, { session }).map((tool) => [tool.name, tool]));
}

function expectOk(output: ToolOutput): string {
  expect(output.isError, output.text).toBe(false);
  return output.text;
}

function expectError(output: ToolOutput, pattern: RegExp): void {
  expect(output.isError, output.text).toBe(true);
  expect(output.text).not.toContain("\n");
  expect(output.text).toMatch(pattern);
}

let root: string;
const opened: SandboxHandle[] = [];
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), "strata-tool-sessions-"));
});
afterEach(async () => {
  for (const handle of opened.splice(0)) if (!handle.closed) await handle.close();
  vi.restoreAllMocks();
  rmSync(root, { recursive: true, force: true });
});

async function openBubblewrap(): Promise<{ handle: SandboxHandle; closes: () => number }> {
  const provider = providers.get("bubblewrap");
  if (!provider.isAvailable()) providerMissing("bubblewrap", "bwrap is not on PATH", "20-bubblewrap.sh");
  const handle = await provider.open();
  opened.push(handle);
  const teardown = vi.spyOn(handle.sandbox, "close");
  return { handle, closes: () => teardown.mock.calls.length };
}

describe("tool sessions over a sandbox handle (bubblewrap)", () => {
  it("each session holds one reference; many ending at once close the sandbox exactly once", async () => {
    const { handle, closes } = await openBubblewrap();
    const sessions = Array.from({ length: 12 }, () => new ToolSession(handle));
    expect(handle.refcount).toBe(12);
    // Every session works on the one sandbox. (One after another: 12 bwrap runs at once on a loaded
    // machine sometimes exit 0 with no output, a sandbox flake outside what this test is about.)
    for (const [i, session] of sessions.entries()) expectOk(await toolsOf(session).write_file!.call({ file_path: `s${i}.txt`, content: `${i}\n` }));
    expect(expectOk(await toolsOf(sessions[0]!).execute!.call({ command: "ls | wc -l" }))).toBe("12\n[exit code 0]");
    // All end together, some twice: one teardown, no throw.
    await Promise.all([...sessions.map((session) => session.end()), sessions[0]!.end(), sessions[5]!.end()]);
    expect(handle.closed).toBe(true);
    expect(handle.refcount).toBe(0);
    expect(closes()).toBe(1);
    await sessions[3]!.end();
    expect(closes()).toBe(1);
  });

  it("a session used after end answers a clear error; end waits for the calls in flight", async () => {
    const { handle, closes } = await openBubblewrap();
    const session = new ToolSession(handle);
    const tools = toolsOf(session);
    const running = tools.execute!.call({ command: "sleep 0.4; echo finished" });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const ending = session.end();
    expect(session.ended).toBe(true);
    // Refused from the moment end() is called, even while the earlier call still runs.
    expectError(await tools.read_file!.call({ file_path: "x.txt" }), /^This tool session has ended; its tools can no longer be used/);
    expect(expectOk(await running)).toBe("finished\n[exit code 0]");
    await ending;
    expect(closes()).toBe(1);
    for (const tool of Object.values(tools)) expectError(await tool.call({}), /This tool session has ended/);
    expect(() => session.fork()).toThrow(/This tool session has ended/);
  });

  it("a fork outliving its parent keeps the sandbox open, and knows what the parent read", async () => {
    const { handle, closes } = await openBubblewrap();
    await using parent = new ToolSession(handle);
    const parentTools = toolsOf(parent);
    expectOk(await parentTools.write_file!.call({ file_path: "plan.txt", content: "step one\nstep two\n" }));
    const fork = parent.fork();
    const fresh = parent.fork({ inheritReads: false });
    expect(handle.refcount).toBe(3);
    await parent.end();
    expect(handle.closed).toBe(false);
    expectError(await parentTools.ls!.call({}), /has ended/);
    // The fork inherited the parent's hash of plan.txt: it may edit without reading again.
    expectOk(await toolsOf(fork).edit_file!.call({ file_path: "plan.txt", old_string: "one", new_string: "1" }));
    // The fresh fork must read first; and its read is its own.
    expectError(await toolsOf(fresh).edit_file!.call({ file_path: "plan.txt", old_string: "two", new_string: "2" }), /has not been read in this session/);
    expectOk(await toolsOf(fresh).read_file!.call({ file_path: "plan.txt" }));
    expectOk(await toolsOf(fresh).edit_file!.call({ file_path: "plan.txt", old_string: "two", new_string: "2" }));
    // The fork's copy of the hash is now stale: the fresh fork changed the file.
    expectError(await toolsOf(fork).edit_file!.call({ file_path: "plan.txt", old_string: "1", new_string: "one" }), /has changed since you last read it/);
    await fresh.end();
    expect(handle.closed).toBe(false);
    await fork.end();
    expect(handle.closed).toBe(true);
    expect(closes()).toBe(1);
  });

  it("a sandbox closed under its sessions (a lifetime limit, a forced close) answers an error, and ending is quiet", async () => {
    const { handle, closes } = await openBubblewrap();
    const session = new ToolSession(handle);
    await handle.close();
    expectError(await toolsOf(session).ls!.call({}), /^The sandbox '.+' has been closed; its tools can no longer be used/);
    await expect(session.end()).resolves.toBeUndefined();
    expect(closes()).toBe(1);
    // A closed handle cannot be bound: the constructor throws before anything is owned.
    expect(() => new ToolSession(handle)).toThrow(/is closed/);
  });

  it("detach refuses a sandbox that cannot outlive its process, and the session stays usable", async () => {
    const { handle } = await openBubblewrap();
    const session = new ToolSession(handle);
    await expect(session.detach(new PersistentSandboxRegistry({ root: join(root, "registry") }))).rejects.toThrow(/do not outlive their process/);
    expect(session.ended).toBe(false);
    expectOk(await toolsOf(session).ls!.call({}));
    // A session (or fork) that fails to construct owns nothing.
    expect(() => new ToolSession(handle, { maxOutputChars: 5 })).toThrow(RangeError);
    expect(() => session.fork({ maxOutputChars: 5 })).toThrow(RangeError);
    expect(handle.refcount).toBe(1);
    await session.end();
    expect(handle.closed).toBe(true);
  });

  it("two sessions over one backend cannot both overwrite the version they read", async () => {
    const { handle } = await openBubblewrap();
    await using a = new ToolSession(handle);
    await using b = new ToolSession(handle);
    expectOk(await toolsOf(a).write_file!.call({ file_path: "shared.txt", content: "v0\n" }));
    expectOk(await toolsOf(b).read_file!.call({ file_path: "shared.txt" }));
    const answers = await Promise.all([
      toolsOf(a).write_file!.call({ file_path: "shared.txt", content: "from a\n" }),
      toolsOf(b).write_file!.call({ file_path: "shared.txt", content: "from b\n" }),
    ]);
    expect(answers.filter((answer) => !answer.isError)).toHaveLength(1);
    expectError(answers.find((answer) => answer.isError)!, /has changed since you last read it/);
  });
});

describe("tool sessions over a plain backend", () => {
  it("own nothing: end stops the tools, fork works, detach is refused", async () => {
    const backend = new StateBackend();
    const session = new ToolSession(backend);
    expect(session.handle).toBeUndefined();
    expectOk(await toolsOf(session).write_file!.call({ file_path: "/a.txt", content: "a\n" }));
    const fork = session.fork();
    expectOk(await toolsOf(fork).edit_file!.call({ file_path: "/a.txt", old_string: "a", new_string: "b" }));
    await expect(session.detach(new PersistentSandboxRegistry({ root: join(root, "registry") }))).rejects.toThrow(/Only a session made over a SandboxHandle/);
    await session.end();
    expectError(await toolsOf(session).ls!.call({}), /has ended/);
    expectOk(await toolsOf(fork).ls!.call({}));
  });
});

describe("detach and reattach through the persistent registry (Docker, two processes)", () => {
  const worker = fileURLToPath(new URL("./fixtures/tools-session-detach.ts", import.meta.url));

  function detachInChild(registryRoot: string, spec: object): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, ["--import", "tsx", worker, registryRoot, JSON.stringify(spec)], { stdio: ["ignore", "pipe", "pipe"] });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      child.on("close", (code) => (code === 0 ? resolve(JSON.parse(stdout.trim().split("\n").at(-1)!)) : reject(new Error(`worker exited ${code}: ${stderr.slice(-1500)}`))));
    });
  }

  it("a session detached in one process leaves the sandbox running; a later process reattaches and its last session closes it", async () => {
    const image = requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh");
    requireService("STRATA_DOCKER_HOST", "30-docker.sh");
    const docker = providers.get("docker");
    if (!docker.isAvailable()) providerMissing("docker", "no daemon socket", "30-docker.sh");
    const registryRoot = join(root, "registry");

    const first = await detachInChild(registryRoot, { image });
    expect(first.created).toMatch(/^Created '\/.+\/notes\.txt' \(1 line, \d+ bytes\)\.$/);
    // Detaching ended the parent session (its tools refuse) while the fork kept its reference.
    expect(first.afterDetach).toMatchObject({ refcount: 1, closed: false, parentCall: expect.stringMatching(/has ended/) });
    expect(first.edited).toBe("ok");

    const registry = new PersistentSandboxRegistry({ root: registryRoot, providers });
    const handle = await registry.reattach(first.id as string);
    opened.push(handle);
    expect(handle.remoteId).toBe(first.remoteId);
    const session = new ToolSession(handle);
    const tools = toolsOf(session);
    expect(expectOk(await tools.read_file!.call({ file_path: "notes.txt" }))).toMatch(new RegExp(`^\\s+1\\tedited by pid ${first.pid as number}\\n`));
    expectOk(await tools.edit_file!.call({ file_path: "notes.txt", old_string: "edited", new_string: "reattached" }));
    expect(expectOk(await tools.execute!.call({ command: "cat notes.txt" }))).toBe(`reattached by pid ${first.pid as number}\n[exit code 0]`);
    // The last session ends: the provider created the container, so it is removed.
    await session.end();
    expect(handle.closed).toBe(true);
    await expect(docker.reattach!(first.remoteId as string)).rejects.toThrow(/does not exist/);
    expect(await registry.deleteRemote(first.id as string)).toBe(true);
  }, 120_000);
});
