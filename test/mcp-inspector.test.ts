/**
 * `strata mcp` driven by a client nobody here wrote: the MCP Inspector's CLI
 * mode (@modelcontextprotocol/inspector 2, which needs Node >= 22). It runs on
 * the Node of the test when that is 22 or later (the Node 24 pass of `npm
 * test`, where a missing Node 24 has already failed the run, and this file
 * fails too if it finds an older Node there), else on the Node 24 that
 * scripts/node24.sh installs into .node24/ when it is there; on a Node 20 pass
 * before that install, the file waits for the Node 24 pass.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { arch, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const INSPECTOR = join(ROOT, "node_modules", "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
const NODE24 = join(ROOT, ".node24", "node_modules", `node-linux-${arch()}`, "bin", "node");
const MAJOR = Number(process.versions.node.split(".")[0]);
const NODE24_PASS = process.env.STRATA_NODE24_RUN === "1";

/** The Node that runs the inspector: this one when new enough, else .node24's. */
const inspectorNode = MAJOR >= 22 || NODE24_PASS ? process.execPath : existsSync(NODE24) ? NODE24 : undefined;

const dir = mkdtempSync(join(tmpdir(), "strata-inspector-"));
const catalog = join(mkdtempSync(join(tmpdir(), "strata-inspector-catalog-")), "mcp.json");
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  rmSync(dirname(catalog), { recursive: true, force: true });
});

interface Run {
  status: number | null;
  out: string;
  err: string;
}

/** One inspector run: it starts `strata mcp` over stdio, sends one request, prints the answer as JSON, and exits. */
function inspector(args: string[]): Promise<Run> {
  const node = inspectorNode as string;
  // The server runs on this test's Node; on Node 24 it needs the better-sqlite3 hook, which the inspector's
  // default server environment (PATH, HOME, …) would drop.
  const env = process.env.NODE_OPTIONS ? ["-e", `NODE_OPTIONS=${process.env.NODE_OPTIONS}`] : [];
  const server = [process.execPath, "--import", TSX, join(ROOT, "cli", "strata.ts"), "mcp", "--root", dir, "--no-execute"];
  return new Promise((resolve, reject) => {
    const child = spawn(node, [INSPECTOR, "--cli", ...env, ...args, "--", ...server], {
      cwd: dir,
      env: { ...process.env, MCP_CATALOG_PATH: catalog },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString("utf8")));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status, out, err }));
  });
}

describe("the MCP Inspector's CLI against strata mcp", () => {
  it("has a Node to run on: Node >= 22 in the Node 24 pass", () => {
    if (NODE24_PASS) expect(MAJOR).toBeGreaterThanOrEqual(22);
    expect(existsSync(INSPECTOR)).toBe(true);
  });

  // Each inspector run starts a server and a client, several seconds apiece on a loaded machine.
  const SLOW = 180_000;

  it.skipIf(inspectorNode === undefined)("lists the tools, with annotations and output schemas", { timeout: SLOW }, async () => {
    const run = await inspector(["--method", "tools/list"]);
    expect(run.status, run.err).toBe(0);
    const { tools } = JSON.parse(run.out) as { tools: Array<{ name: string; annotations?: Record<string, unknown>; outputSchema?: object }> };
    const names = tools.map((tool) => tool.name);
    for (const name of ["ls", "read_file", "write_file", "edit_file", "glob", "grep", "read_multiple_files", "directory_tree", "move_file", "list_allowed_roots"]) expect(names).toContain(name);
    expect(names).not.toContain("execute");
    const read = tools.find((tool) => tool.name === "read_file");
    expect(read?.annotations).toMatchObject({ readOnlyHint: true });
    expect(tools.find((tool) => tool.name === "write_file")?.annotations).toMatchObject({ readOnlyHint: false });
    expect(tools.find((tool) => tool.name === "get_file_info")?.outputSchema).toBeDefined();
  });

  it.skipIf(inspectorNode === undefined)("calls tools: write, read back, file info with structured content", { timeout: SLOW }, async () => {
    const wrote = await inspector(["--method", "tools/call", "--tool-name", "write_file", "--tool-arg", "file_path=/notes/hello.md", "content=hello from the inspector"]);
    expect(wrote.status, wrote.err).toBe(0);
    expect(readFileSync(join(dir, "notes", "hello.md"), "utf8")).toBe("hello from the inspector");

    writeFileSync(join(dir, "data.txt"), "alpha\nbeta\n");
    const read = await inspector(["--method", "tools/call", "--tool-name", "read_file", "--tool-arg", "file_path=/data.txt"]);
    expect(read.status, read.err).toBe(0);
    const answer = JSON.parse(read.out) as { content: Array<{ type: string; text?: string }>; isError?: boolean };
    expect(answer.isError ?? false).toBe(false);
    expect(answer.content[0]?.text).toContain("beta");
    const info = await inspector(["--method", "tools/call", "--tool-name", "get_file_info", "--tool-arg", "path=/data.txt"]);
    expect(info.status, info.err).toBe(0);
    expect(JSON.parse(info.out)).toMatchObject({ structuredContent: expect.objectContaining({ size: 11 }) });
  });

  it.skipIf(inspectorNode === undefined)("searches /memories (SQLite); a hostile path is an error that names no host path", { timeout: SLOW }, async () => {

    const memory = await inspector(["--method", "tools/call", "--tool-name", "write_file", "--tool-arg", "file_path=/memories/fact.md", "content=kept in SQLite"]);
    expect(memory.status, memory.err).toBe(0);
    const grep = await inspector(["--method", "tools/call", "--tool-name", "grep", "--tool-arg", "pattern=SQLite", "path=/memories"]);
    expect(grep.status, grep.err).toBe(0);
    expect(grep.out).toContain("/memories/fact.md");

    const hostile = await inspector(["--method", "tools/call", "--tool-name", "read_file", "--tool-arg", "file_path=/../../etc/passwd"]);
    expect(hostile.status).not.toBe(0);
    expect(JSON.parse(hostile.out)).toMatchObject({ isError: true });
    expect(hostile.out).not.toContain("root:");
    expect(hostile.out + hostile.err).not.toContain(dir);
  });
});
