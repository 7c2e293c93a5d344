/**
 * `strata mcp --overlay`, then `strata diff`, `strata commit` and `strata
 * discard`, as real processes: an agent's changes through the MCP server wait
 * in .strata/overlay.db, the directory untouched, until a person reviews them.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, describe, expect, it } from "vitest";
import { openOverlay } from "../mcp/overlay.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
const CLI = join(ROOT, "cli", "strata.ts");
// Every command is a fresh Node process through tsx: seconds apiece on a loaded 2-core machine.
const SLOW = 240_000;

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-cli-overlay-"));
  dirs.push(dir);
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true });
    writeFileSync(join(dir, name), content);
  }
  return dir;
}

function strata(cwd: string, args: string[]): Promise<{ status: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", TSX, CLI, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => err.push(chunk));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status, out: Buffer.concat(out).toString("utf8"), err: Buffer.concat(err).toString("utf8") }));
  });
}

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<{ isError: boolean; text: string }> {
  const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
  const first = result.content[0];
  return { isError: result.isError === true, text: first?.type === "text" ? first.text : "" };
}

describe("strata mcp --overlay, strata diff, strata commit, strata discard", () => {
  it("an agent's changes over MCP wait for review; diff shows them, commit applies them", { timeout: SLOW }, async () => {
    const dir = tempDir({ "src/app.ts": "export const greeting = 'hello';\n", "README.md": "# app\n" });
    const client = new Client({ name: "strata-overlay-test", version: "1" });
    // The whole environment: on Node 24 the server needs NODE_OPTIONS' better-sqlite3 hook, which the SDK's default environment drops.
    const env = process.env as Record<string, string>;
    await client.connect(new StdioClientTransport({ command: process.execPath, args: ["--import", TSX, CLI, "mcp", "--overlay", "--no-execute", "--no-memories", "--root", dir], cwd: ROOT, stderr: "pipe", env }));
    try {
      const tools = (await client.listTools()).tools.map((t) => t.name);
      expect(tools).not.toContain("execute");
      expect((await call(client, "write_file", { file_path: "/src/new.ts", content: "export const added = 1;\n" })).isError).toBe(false);
      expect((await call(client, "read_file", { file_path: "/src/app.ts" })).isError).toBe(false);
      const edit = await call(client, "edit_file", { file_path: "/src/app.ts", old_string: "hello", new_string: "hi" });
      expect(edit.isError, edit.text).toBe(false);
      expect((await call(client, "read_file", { file_path: "/src/app.ts" })).text).toContain("'hi'");
    } finally {
      await client.close();
    }
    // The directory is untouched: the changes live in the layer.
    expect(readFileSync(join(dir, "src/app.ts"), "utf8")).toBe("export const greeting = 'hello';\n");
    expect(existsSync(join(dir, "src/new.ts"))).toBe(false);
    expect(existsSync(join(dir, ".strata", "overlay.db"))).toBe(true);

    const stat = await strata(dir, ["diff", "--stat"]);
    expect(stat.status, stat.err).toBe(0);
    expect(stat.out).toBe("M /src/app.ts\nA /src/new.ts\n");
    const diff = await strata(dir, ["diff"]);
    expect(diff.out).toContain("--- a/src/app.ts\n+++ b/src/app.ts\n");
    expect(diff.out).toContain("-export const greeting = 'hello';\n+export const greeting = 'hi';\n");
    expect(diff.out).toContain("+export const added = 1;\n");
    const json = JSON.parse((await strata(dir, ["diff", "--json"])).out) as { changes: Array<{ path: string; kind: string }> };
    expect(json.changes.map((c) => [c.kind, c.path])).toEqual([["modified", "/src/app.ts"], ["added", "/src/new.ts"]]);

    const commit = await strata(dir, ["commit"]);
    expect(commit.status, commit.err).toBe(0);
    expect(commit.out).toBe("wrote /src/app.ts\nwrote /src/new.ts\n");
    expect(readFileSync(join(dir, "src/app.ts"), "utf8")).toBe("export const greeting = 'hi';\n");
    expect(readFileSync(join(dir, "src/new.ts"), "utf8")).toBe("export const added = 1;\n");
    expect((await strata(dir, ["diff"])).out).toBe("");
    expect((await strata(dir, ["commit"])).out).toBe("nothing to commit\n");
  });

  it("with a shell: what a command does through the overlay waits in the layer too; strata diff shows it", { timeout: SLOW }, async () => {
    const dir = tempDir({ "src/app.ts": "export const greeting = 'hello';\n", "notes.txt": "draft\n" });
    const client = new Client({ name: "strata-overlay-test", version: "1" });
    const env = process.env as Record<string, string>;
    await client.connect(new StdioClientTransport({ command: process.execPath, args: ["--import", TSX, CLI, "mcp", "--overlay", "--no-memories", "--root", dir], cwd: ROOT, stderr: "pipe", env }));
    try {
      const tools = (await client.listTools()).tools.map((t) => t.name);
      expect(tools).toContain("execute");
      // Commands see the workspace at /workspace (bubblewrap), and so do the file tools.
      const written = await call(client, "write_file", { file_path: "/workspace/from-tool.txt", content: "tool\n" });
      expect(written.isError, written.text).toBe(false);
      const ran = await call(client, "execute", { command: "cat from-tool.txt; sed -i 's/hello/hi/' src/app.ts; rm notes.txt; mkdir -p out && echo built > out/log" });
      expect(ran.isError, ran.text).toBe(false);
      expect(ran.text).toContain("tool");
      expect((await call(client, "read_file", { file_path: "/workspace/out/log" })).text).toContain("built");
    } finally {
      await client.close();
    }
    expect(readFileSync(join(dir, "src/app.ts"), "utf8")).toBe("export const greeting = 'hello';\n");
    expect(readFileSync(join(dir, "notes.txt"), "utf8")).toBe("draft\n");
    expect(existsSync(join(dir, "out"))).toBe(false);

    const stat = await strata(dir, ["diff", "--stat"]);
    expect(stat.status, stat.err).toBe(0);
    expect(stat.out).toBe("A /from-tool.txt\nD /notes.txt\nA /out/log\nM /src/app.ts\n");
    expect((await strata(dir, ["diff"])).out).toContain("-export const greeting = 'hello';\n+export const greeting = 'hi';\n");
    const commit = await strata(dir, ["commit"]);
    expect(commit.status, commit.err).toBe(0);
    expect(readFileSync(join(dir, "src/app.ts"), "utf8")).toBe("export const greeting = 'hi';\n");
    expect(readFileSync(join(dir, "out/log"), "utf8")).toBe("built\n");
    expect(existsSync(join(dir, "notes.txt"))).toBe(false);
  });

  it("--overlay refuses a docker or ssh sandbox at the start: their files are not the directory", { timeout: SLOW }, async () => {
    const dir = tempDir({ "a.txt": "a\n" });
    const refused = await strata(dir, ["mcp", "--overlay", "--sandbox", "docker:strata-test/busybox", "--root", dir]);
    expect(refused.status).not.toBe(0);
    expect(refused.err).toContain("--overlay lies over the local directory");
    expect(refused.err).not.toContain(dir);
  });

  it("commit refuses a file changed on disk meanwhile (exit 5, the list on one line), discard drops the layer", { timeout: SLOW }, async () => {
    const dir = tempDir({ "a.txt": "a\n", "b.txt": "b\n" });
    const { overlay, close } = openOverlay(dir);
    expect((await overlay.write("/a.txt", "layer a\n", { overwrite: true })).error).toBeUndefined();
    expect((await overlay.write("/c.txt", "layer c\n")).error).toBeUndefined();
    expect((await overlay.delete("/b.txt")).error).toBeUndefined();
    await close();
    writeFileSync(join(dir, "a.txt"), "someone else\n");

    const refused = await strata(dir, ["commit"]);
    expect(refused.status).toBe(5);
    expect(refused.err.split("\n").filter(Boolean)).toEqual(["strata: conflict: Nothing committed: 1 path(s) changed on disk since the overlay read them: /a.txt (modified)"]);
    expect(refused.err).not.toContain(dir);
    expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("someone else\n");
    expect(existsSync(join(dir, "b.txt"))).toBe(true);
    expect(existsSync(join(dir, "c.txt"))).toBe(false);
    expect((await strata(dir, ["diff", "--stat"])).out).toBe("M /a.txt\nD /b.txt\nA /c.txt\n");

    const discarded = await strata(dir, ["discard"]);
    expect(discarded.status, discarded.err).toBe(0);
    expect(discarded.out).toBe("discarded 3 change(s)\n");
    expect((await strata(dir, ["diff", "--stat"])).out).toBe("");
    expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("someone else\n");
    expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("b\n");
  });

  it("the layer's own database is out of the agent's reach through the overlay", async () => {
    const dir = tempDir({ "a.txt": "a\n" });
    const { overlay, close } = openOverlay(dir);
    try {
      expect((await overlay.write("/x.txt", "x")).error).toBeUndefined();
      expect((await overlay.delete("/.strata")).error?.code).toBe("permission_denied");
      expect((await overlay.write("/.strata/overlay.db", "x", { overwrite: true })).error?.code).toBe("permission_denied");
      expect((await overlay.move("/.strata", "/elsewhere")).error?.code).toBe("permission_denied");
      expect((await overlay.glob("**")).entries!.map((e) => e.path)).toEqual(["/a.txt", "/x.txt"]);
    } finally {
      await close();
    }
  });

  it("without an overlay there is nothing to review, and none is created", { timeout: SLOW }, async () => {
    const dir = tempDir({ "a.txt": "a\n" });
    expect((await strata(dir, ["diff"])).out).toBe("");
    expect((await strata(dir, ["commit"])).out).toBe("nothing to commit\n");
    expect((await strata(dir, ["discard", "--json"])).out).toBe('{"discarded":0}\n');
    expect(existsSync(join(dir, ".strata"))).toBe(false);
    for (const command of ["diff", "commit", "discard"]) {
      const help = await strata(dir, [command, "--help"]);
      expect(help.status).toBe(0);
      expect(help.out).toContain(`Usage: strata ${command}`);
    }
  });
});
