/**
 * toDeepAgents inside deepagents itself: an agent from `createDeepAgent`, driven
 * by a scripted fake chat model (no network), calls deepagents' own ls,
 * read_file, write_file, edit_file, glob, grep and execute tools against
 * Strata backends, and the tool messages it sees are compared with what
 * deepagents' own backends answer for the same calls. The deliberate
 * differences (docs/deepagents.md) are asserted as such.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AIMessage, HumanMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import { fakeModel } from "@langchain/core/testing";
import {
  BaseSandbox as DeepBaseSandbox,
  FilesystemBackend as DeepFilesystemBackend,
  StateBackend as DeepStateBackend,
  createDeepAgent,
  type AnyBackendProtocol,
  type ExecuteResponse,
  type FileDownloadResponse,
  type FileUploadResponse,
} from "deepagents";
import { afterAll, describe, expect, it } from "vitest";
import { toDeepAgents } from "../adapters/deepagents.js";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import type { Backend, Sandbox } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SqliteStore } from "../stores/sqlite.js";

interface Call {
  name: string;
  args: Record<string, unknown>;
}

/** A 1×1 PNG: its bytes hold NULs, so every backend must keep it binary. */
const PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/** The calls a model makes, each in its own turn (so they run in order), under `base`. */
function script(base: string): Call[] {
  return [
    { name: "write_file", args: { file_path: `${base}/notes.md`, content: "alpha\nbeta\ngamma\n" } },
    { name: "write_file", args: { file_path: `${base}/src/app.ts`, content: "const a = 1;\nconst b = 2;\n" } },
    { name: "ls", args: { path: base } },
    { name: "read_file", args: { file_path: `${base}/notes.md` } },
    { name: "read_file", args: { file_path: `${base}/notes.md`, offset: 1, limit: 1 } },
    { name: "edit_file", args: { file_path: `${base}/notes.md`, old_string: "beta", new_string: "BETA" } },
    { name: "read_file", args: { file_path: `${base}/notes.md` } },
    { name: "edit_file", args: { file_path: `${base}/notes.md`, old_string: "gamma", new_string: "gamma" } },
    { name: "grep", args: { pattern: "const", path: base } },
    { name: "glob", args: { pattern: "**/*.ts", path: base } },
    { name: "write_file", args: { file_path: `${base}/pixel.png`, content: PIXEL } },
    { name: "read_file", args: { file_path: `${base}/pixel.png` } },
    { name: "write_file", args: { file_path: `${base}/notes.md`, content: "replaced\n" } },
    { name: "read_file", args: { file_path: `${base}/notes.md` } },
    { name: "read_file", args: { file_path: `${base}/notes.md`, limit: 0 } },
    { name: "ls", args: { path: `${base}/missing` } },
    { name: "execute", args: { command: "cat project/notes.md" } },
    // Errors: the wording is each backend's own; both must say "not found" (ours as "Error: …").
    { name: "edit_file", args: { file_path: `${base}/notes.md`, old_string: "absent", new_string: "x" } },
    { name: "read_file", args: { file_path: `${base}/absent.txt` } },
  ];
}
const ERRORS = 2;

/** Runs the script through deepagents' agent loop and answers each tool message as text. */
async function run(backend: AnyBackendProtocol | ((config: { state: unknown }) => AnyBackendProtocol), calls: Call[]): Promise<string[]> {
  let model = fakeModel();
  calls.forEach((call, i) => (model = model.respondWithTools([{ name: call.name, args: call.args, id: `call_${i}` }])));
  model = model.respond(new AIMessage("done"));
  // A model without a profile gets deepagents' fallback summarization, which would spend scripted turns on summaries.
  Object.defineProperty(model, "profile", { value: { maxInputTokens: 100_000_000 } });
  const agent = createDeepAgent({ model, backend });
  const result = await agent.invoke({ messages: [new HumanMessage("go")] }, { recursionLimit: 10 * calls.length });
  const messages = (result.messages as BaseMessage[]).filter((m) => ToolMessage.isInstance(m));
  expect(messages.map((m) => m.tool_call_id)).toEqual(calls.map((_, i) => `call_${i}`));
  return messages.map(render);
}

function render(message: BaseMessage): string {
  if (typeof message.content === "string") return message.content;
  return message.content
    .map((block) => {
      const b = block as { type: string; text?: string; mimeType?: string; data?: string };
      return b.type === "text" ? b.text : `[${b.type} ${b.mimeType} ${b.data}]`;
    })
    .join("\n");
}

/** ls output lines as a set: deepagents' sandbox lists in find's order, the others sorted. */
const sorted = (text: string) => text.split("\n").sort().join("\n");

/**
 * Compares our answers with deepagents' own, call by call: equal, except the
 * error wording (both must be errors) and the differences named in `expected`.
 */
function compare(ours: string[], theirs: string[], expected: Record<number, string> = {}): void {
  for (let i = 0; i < ours.length; i++) {
    if (i in expected) {
      expect(ours[i], `call ${i}`).toBe(expected[i]);
    } else if (i >= ours.length - ERRORS) {
      expect(ours[i], `call ${i}`).toMatch(/^Error: /);
      expect(theirs[i], `call ${i}`).toMatch(/not found|no such file/i);
    } else {
      expect(ours[i], `call ${i}`).toBe(theirs[i]);
    }
  }
}

/** What every Strata backend must answer for the script (no doubled line numbers, binary intact). */
function expectOwnAnswers(answers: string[], base: string): void {
  // deepagents' FilesystemBackend names the host path in its errors; no Strata answer does.
  expect(answers.join("\n")).not.toContain(tmpdir());
  expect(answers[3]).toBe("@@ lines 1-3 of 3 @@\nalpha\nbeta\ngamma");
  expect(answers[4]).toBe("@@ lines 2-2 of 3 | next offset 2 @@\nbeta");
  expect(answers[6]).toBe("@@ lines 1-3 of 3 @@\nalpha\nBETA\ngamma");
  expect(answers[7]).toBe(`Successfully replaced 1 occurrence(s) in '${base}/notes.md'`);
  expect(answers[11]).toBe(`[image image/png ${PIXEL}]`);
  expect(answers[13]).toBe("@@ lines 1-1 of 1 @@\nreplaced");
}

describe("toDeepAgents in deepagents' agent loop", () => {
  const dirs: string[] = [];
  const tempDir = () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-deepagents-"));
    dirs.push(dir);
    return dir;
  };
  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  const calls = script("/project");
  let reference: string[] | undefined;
  /** deepagents' own StateBackend, answering the same script. */
  const stateReference = async () => (reference ??= await run(new DeepStateBackend(), calls));
  const noExecute = "Error: Execution not available.";

  const nonSandboxes: Array<[string, () => Backend]> = [
    ["StateBackend", () => new StateBackend()],
    ["StoreBackend over SQLite", () => new StoreBackend({ store: new SqliteStore({ path: join(tempDir(), "files.db") }), namespace: ["agent"] })],
    ["CompositeBackend (state, and a SQLite route)", () => new CompositeBackend({ default: new StateBackend(), routes: { "/project/src": new StoreBackend({ store: new SqliteStore({ path: join(tempDir(), "r.db") }), namespace: ["src"] }) } })],
  ];

  for (const [name, create] of nonSandboxes) {
    it(`${name}: the same tool messages as deepagents' StateBackend`, async () => {
      const ours = await run(toDeepAgents(create()), calls);
      const theirs = await stateReference();
      expectOwnAnswers(ours, "/project");
      expect(ours[16]).toContain(noExecute);
      compare(ours, theirs);
    });
  }

  it("hands binary files to read_file as bytes, whatever their name, and text as text", async () => {
    const backend = new StateBackend();
    const bytes = Uint8Array.of(0, 1, 2, 255, 10, 0);
    await backend.uploadFiles([["/data/blob.txt", bytes], ["/data/raw.bin", bytes]]);
    await backend.write("/data/config.yaml", "a: 1\n");
    const answers = await run(toDeepAgents(backend), [
      { name: "read_file", args: { file_path: "/data/blob.txt" } },
      { name: "read_file", args: { file_path: "/data/raw.bin" } },
      { name: "read_file", args: { file_path: "/data/config.yaml" } },
    ]);
    const base64 = Buffer.from(bytes).toString("base64");
    expect(answers).toEqual([`[file application/octet-stream ${base64}]`, `[file application/octet-stream ${base64}]`, "@@ lines 1-1 of 1 @@\na: 1"]);
    const raw = await toDeepAgents(backend).readRaw("/data/raw.bin");
    expect(raw.data?.content).toEqual(bytes);
  });

  it("a StateBackend on the agent's own state reads what deepagents' tools put there", async () => {
    // The backend factory form: our StateBackend over deepagents' runtime, whose `files` the write tool updates.
    const answers = await run((runtime) => toDeepAgents(new StateBackend(runtime as unknown as { state: Record<string, unknown> })), [
      { name: "write_file", args: { file_path: "/s/a.txt", content: "one\ntwo\n" } },
      { name: "read_file", args: { file_path: "/s/a.txt" } },
      { name: "edit_file", args: { file_path: "/s/a.txt", old_string: "two", new_string: "2" } },
      { name: "grep", args: { pattern: "2", path: "/s" } },
      { name: "write_file", args: { file_path: "/s/pixel.png", content: PIXEL } },
      { name: "read_file", args: { file_path: "/s/pixel.png" } },
    ]);
    expect(answers.slice(1)).toEqual([
      "@@ lines 1-2 of 2 @@\none\ntwo",
      "Successfully replaced 1 occurrence(s) in '/s/a.txt'",
      "/s/a.txt:\n  2: 2",
      "Successfully wrote to '/s/pixel.png'",
      `[image image/png ${PIXEL}]`,
    ]);
  });

  it("answers a sandbox's relative paths as deepagents' sandboxes do: relative in, relative out", async () => {
    const sandbox = new LocalSandbox();
    try {
      const adapter = toDeepAgents(sandbox);
      await adapter.write("dir/a.txt", "needle\n");
      await sandbox.mkdir("/dir/empty");
      expect((await adapter.ls("dir")).files?.map((f) => f.path)).toEqual(["dir/a.txt", "dir/empty/"]);
      expect((await adapter.ls("/dir")).files?.map((f) => f.path)).toEqual(["/dir/a.txt", "/dir/empty/"]);
      expect((await adapter.grep("needle", "dir")).matches).toEqual([{ path: "dir/a.txt", line: 1, text: "needle" }]);
      expect((await adapter.glob("*", "/dir")).files?.map((f) => [f.path, f.is_dir])).toEqual([
        ["a.txt", false],
        ["empty", true],
      ]);
      expect((await adapter.execute("cat dir/a.txt")).output).toBe("needle\n");
    } finally {
      await sandbox.close();
    }
  });

  it("FilesystemBackend: the same tool messages as deepagents' FilesystemBackend", async () => {
    const ours = await run(toDeepAgents(new FilesystemBackend({ workspace: tempDir() })), calls);
    const theirs = await run(new DeepFilesystemBackend({ rootDir: tempDir(), virtualMode: true }), calls);
    expectOwnAnswers(ours, "/project");
    compare(ours, theirs);
  });

  it("BubblewrapSandbox: the same tool messages as deepagents' BaseSandbox over the same kind of sandbox", async () => {
    const ours = new BubblewrapSandbox();
    const other = new BubblewrapSandbox();
    try {
      const sandboxCalls = script("/workspace/project");
      const mine = await run(toDeepAgents(ours), sandboxCalls);
      const theirs = await run(new ShellOnly(other), sandboxCalls);
      expectOwnAnswers(mine, "/workspace/project");
      expect(mine[16]).toBe("replaced\n\n[Command succeeded with exit code 0]");
      // deepagents' BaseSandbox numbers the lines itself, so its read_file body carries them.
      expect(theirs[3]).toBe("@@ lines 1-3 of 3 @@\n     1\talpha\n     2\tbeta\n     3\tgamma");
      compare(mine, theirs, {
        // deepagents' BaseSandbox lists in find's order; Strata sorts by path.
        2: sorted(theirs[2]!),
        3: "@@ lines 1-3 of 3 @@\nalpha\nbeta\ngamma",
        4: "@@ lines 2-2 of 3 | next offset 2 @@\nbeta",
        6: "@@ lines 1-3 of 3 @@\nalpha\nBETA\ngamma",
        13: "@@ lines 1-1 of 1 @@\nreplaced",
      });
      expect(mine[2]).toBe(sorted(mine[2]!));
    } finally {
      await Promise.all([ours.close(), other.close()]);
    }
  });
});

/**
 * deepagents' own BaseSandbox (its shell-derived ls, read, write, edit, grep
 * and glob) over a Strata sandbox's execute, upload and download only: the
 * reference for what deepagents answers on a sandbox.
 */
class ShellOnly extends DeepBaseSandbox {
  readonly id: string;
  constructor(private readonly sandbox: Sandbox) {
    super();
    this.id = `shell-${sandbox.id}`;
  }
  async execute(command: string): Promise<ExecuteResponse> {
    const run = await this.sandbox.execute(command);
    if (run.error) throw new Error(run.error.message);
    return run;
  }
  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const result = await this.sandbox.uploadFiles(files);
    if (result.error) throw new Error(result.error.message);
    return result.files.map((f) => ({ path: f.path, error: f.seedError }));
  }
  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const result = await this.sandbox.downloadFiles(paths);
    if (result.error) throw new Error(result.error.message);
    return result.files.map((f) => ({ path: f.path, content: f.content, error: f.seedError }));
  }
}
