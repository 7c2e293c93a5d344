/**
 * `strata mcp` as a real process: the SDK's Client over a real stdio pipe
 * and over a real HTTP port. Tools and their annotations, structured output,
 * hostile paths, binary files and images, the stale-file guard per session,
 * MCP Roots (and a roots change), ten HTTP clients at once, the Host and
 * Origin checks, the token rule off loopback, cancellation, and a client
 * that disconnects mid-call.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ListRootsRequestSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { bindingProblem, isLoopback } from "../mcp/http.js";
import { requireService } from "./support/runtime-services.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const CLI = join(ROOT, "cli", "strata.ts");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
const NODE_ARGS = ["--import", TSX, CLI, "mcp"];

const dirs: string[] = [];
const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0).reverse()) await step().catch(() => undefined);
});
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function workspace(files: Record<string, string | Uint8Array> = {}): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-mcp-"));
  dirs.push(dir);
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true });
    writeFileSync(join(dir, name), content);
  }
  return dir;
}

type Roots = { current: string[] };

async function stdioClient(args: string[], options: { cwd?: string; roots?: Roots; env?: Record<string, string> } = {}): Promise<Client> {
  // The test's own environment, not the SDK's default handful of variables: the Node 24 pass loads its
  // better-sqlite3 build through NODE_OPTIONS, which the server process needs too.
  const env = { ...(process.env as Record<string, string>), ...options.env };
  const transport = new StdioClientTransport({ command: process.execPath, args: [...NODE_ARGS, ...args], cwd: options.cwd ?? ROOT, stderr: "pipe", env });
  const client = new Client({ name: "strata-test", version: "1" }, options.roots ? { capabilities: { roots: { listChanged: true } } } : {});
  if (options.roots) {
    const roots = options.roots;
    client.setRequestHandler(ListRootsRequestSchema, () => ({ roots: roots.current.map((dir) => ({ uri: pathToFileURL(dir).href, name: "root" })) }));
  }
  await client.connect(transport);
  cleanup.push(() => client.close());
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown> = {}): Promise<CallToolResult> {
  return (await client.callTool({ name, arguments: args })) as CallToolResult;
}

function text(result: CallToolResult): string {
  const first = result.content[0];
  return first?.type === "text" ? first.text : "";
}

function byName(listed: { tools: Array<{ name: string; inputSchema: { properties?: Record<string, unknown> } }> }, name: string) {
  return listed.tools.find((tool) => tool.name === name);
}

function okText(result: CallToolResult): string {
  expect(result.isError, text(result)).toBe(false);
  return text(result);
}

/** Starts `strata mcp --http` and answers its URL (read from its stderr). */
async function httpServer(args: string[], env: Record<string, string> = {}, cwd = ROOT): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, [...NODE_ARGS, "--http", ...args], { cwd, env: { ...process.env, ...env }, stdio: ["ignore", "ignore", "pipe"] });
  cleanup.push(async () => {
    if (child.exitCode === null) {
      child.kill("SIGTERM");
      await new Promise((resolve) => child.once("exit", resolve));
    }
  });
  const url = await new Promise<string>((resolve, reject) => {
    let err = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      err += chunk.toString();
      const found = /listening on (\S+)/.exec(err);
      if (found?.[1]) resolve(found[1]);
    });
    child.once("exit", (code) => reject(new Error(`strata mcp exited with ${code}: ${err}`)));
  });
  return { url, child };
}

async function httpClient(url: string, headers: Record<string, string> = {}, roots?: Roots): Promise<Client> {
  const client = new Client({ name: "strata-http-test", version: "1" }, roots ? { capabilities: { roots: { listChanged: true } } } : {});
  if (roots) client.setRequestHandler(ListRootsRequestSchema, () => ({ roots: roots.current.map((dir) => ({ uri: pathToFileURL(dir).href })) }));
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  cleanup.push(() => client.close());
  return client;
}

/** A raw POST with the headers given (node:http, which lets a test set Host). */
function rawPost(url: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const target = new URL(url);
  const body = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } });
  return new Promise((resolve, reject) => {
    const req = request(
      { host: target.hostname, port: target.port, path: target.pathname, method: "POST", headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers } },
      (res) => {
        let data = "";
        res.on("data", (chunk: Buffer) => (data += chunk.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: data }));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

const PNG = Buffer.from(
  "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082",
  "hex",
);

describe("strata mcp over stdio", () => {
  it("offers the tools with annotations and output schemas, and answers structured content", async () => {
    const dir = workspace({ "notes/a.md": "one\ntwo\n" });
    const client = await stdioClient(["--root", dir, "--no-execute"]);
    const { tools } = await client.listTools();
    const byName = new Map(tools.map((tool) => [tool.name, tool]));
    for (const name of ["ls", "read_file", "write_file", "edit_file", "glob", "grep", "read_multiple_files", "read_file_tail", "list_directory_with_sizes", "directory_tree", "create_directory", "move_file", "get_file_info", "list_allowed_roots"]) {
      expect(byName.has(name), name).toBe(true);
    }
    expect(byName.has("execute")).toBe(false);
    expect(byName.get("read_file")?.annotations).toMatchObject({ readOnlyHint: true, destructiveHint: false, idempotentHint: true });
    expect(byName.get("edit_file")?.annotations).toMatchObject({ readOnlyHint: false, destructiveHint: true, idempotentHint: false });
    expect(byName.get("create_directory")?.annotations).toMatchObject({ readOnlyHint: false, destructiveHint: false, idempotentHint: true });
    expect(byName.get("read_file")?.inputSchema.properties).toHaveProperty("file_path");
    expect(byName.get("get_file_info")?.outputSchema?.properties).toHaveProperty("type");

    const info = await call(client, "get_file_info", { path: "/notes/a.md" });
    expect(info.structuredContent).toMatchObject({ path: "/notes/a.md", type: "file", size: 8 });
    const tree = await call(client, "directory_tree", {});
    expect(okText(tree)).toBe("memories/\nnotes/\n  a.md");
    const roots = await call(client, "list_allowed_roots");
    expect(roots.structuredContent).toEqual({
      roots: [expect.objectContaining({ path: "/" }), expect.objectContaining({ path: "/memories" })],
    });
    expect(text(roots)).not.toContain(dir);
    const sizes = await call(client, "list_directory_with_sizes", { path: "/notes" });
    expect(sizes.structuredContent).toMatchObject({ files: 1, directories: 0, totalBytes: 8 });
  });

  it("ls answers sizes by default; sizes: false answers names and kinds only; the secrets preset's names are left out of both", async () => {
    const dir = workspace({ "b.txt": "12345", "a/x.md": "x", ".env": "KEY=1" });
    const client = await stdioClient(["--root", dir, "--no-execute", "--no-memories"]);
    const ls = byName(await client.listTools(), "ls");
    expect(ls?.inputSchema.properties).toHaveProperty("sizes");
    expect(okText(await call(client, "ls"))).toBe("/a/\n/b.txt (5 bytes)");
    expect(okText(await call(client, "ls", { sizes: false }))).toBe("/a/\n/b.txt");
    expect(okText(await call(client, "ls", { path: "/a", sizes: false }))).toBe("/a/x.md");
    expect((await call(client, "ls", { sizes: "no" })).isError).toBe(true);
  });

  it("reads, edits (after reading), moves, makes directories, and keeps memories in SQLite under .strata/", async () => {
    const dir = workspace({ "src/app.ts": "const a = 1;\n", "log.txt": Array.from({ length: 50 }, (_, i) => `line ${i + 1}`).join("\n") });
    const client = await stdioClient(["--root", dir, "--no-execute"]);
    // The stale-file guard: no edit of a file this session has not read.
    expect(text(await call(client, "edit_file", { file_path: "/src/app.ts", old_string: "1", new_string: "2" }))).toMatch(/has not been read/);
    expect(okText(await call(client, "read_file", { file_path: "/src/app.ts" }))).toContain("const a = 1;");
    okText(await call(client, "edit_file", { file_path: "/src/app.ts", old_string: "1", new_string: "2" }));
    expect(readFileSync(join(dir, "src/app.ts"), "utf8")).toBe("const a = 2;\n");
    expect(okText(await call(client, "read_file_tail", { file_path: "/log.txt", lines: 2 }))).toMatch(/49\tline 49\n\s+50\tline 50/);
    const both = okText(await call(client, "read_multiple_files", { paths: ["/src/app.ts", "/missing.txt"] }));
    expect(both).toContain("=== /src/app.ts ===");
    expect(both).toMatch(/=== \/missing.txt ===\nError: .*not found/);
    okText(await call(client, "create_directory", { path: "/out/deep" }));
    okText(await call(client, "move_file", { source: "/log.txt", destination: "/out/deep/log.txt" }));
    expect(existsSync(join(dir, "out/deep/log.txt"))).toBe(true);
    expect(existsSync(join(dir, "log.txt"))).toBe(false);
    okText(await call(client, "write_file", { file_path: "/memories/prefs.md", content: "tabs" }));
    expect(existsSync(join(dir, ".strata", "memories.db"))).toBe(true);
    expect(existsSync(join(dir, "memories"))).toBe(false);
    await client.close();
    // A later session sees the memory.
    const again = await stdioClient(["--root", dir, "--no-execute"]);
    expect(okText(await call(again, "read_file", { file_path: "/memories/prefs.md" }))).toContain("tabs");
  });

  it("--max-output-chars: a longer answer goes to a file in the workspace, previewed", async () => {
    const dir = workspace({ "many.txt": Array.from({ length: 400 }, (_, i) => `needle ${i}`).join("\n") });
    const client = await stdioClient(["--root", dir, "--no-execute", "--no-memories", "--max-output-chars", "500"]);
    const found = okText(await call(client, "grep", { pattern: "needle", output_mode: "content", head_limit: 1000 }));
    expect(found.length).toBeLessThan(1_000);
    const saved = /'(\/\.strata\/evicted\/[^']+)'/.exec(found)?.[1];
    expect(saved, found).toBeDefined();
    expect(readFileSync(join(dir, saved!), "utf8")).toContain("needle 399");
  });

  it("refuses hostile paths without showing a host path, and answers binary files and images", async () => {
    const outside = workspace({ "secret.txt": "top secret" });
    const dir = workspace({ "data.bin": new Uint8Array([0, 1, 2, 255, 0, 7]), "pixel.png": PNG, "misnamed.txt": PNG });
    symlinkSync(join(outside, "secret.txt"), join(dir, "link.txt"));
    symlinkSync(outside, join(dir, "linkdir"));
    const client = await stdioClient(["--root", dir, "--no-execute"]);
    for (const path of ["/../secret.txt", "../secret.txt", "/link.txt", "/linkdir/secret.txt", join(outside, "secret.txt"), "~/secret.txt", "/a\u0000b"]) {
      const result = await call(client, "read_file", { file_path: path });
      expect(result.isError, `${path}: ${text(result)}`).toBe(true);
      expect(text(result)).not.toContain("top secret");
      expect(text(result)).not.toContain(dir);
      if (!path.includes(outside)) expect(text(result)).not.toContain(outside);
    }
    const write = await call(client, "write_file", { file_path: "/linkdir/new.txt", content: "x" });
    expect(write.isError).toBe(true);
    expect(existsSync(join(outside, "new.txt"))).toBe(false);

    const binary = await call(client, "read_file", { file_path: "/data.bin" });
    expect(okText(binary)).toMatch(/binary file .*6 bytes/);
    for (const name of ["/pixel.png", "/misnamed.txt"]) {
      const image = await call(client, "read_file", { file_path: name });
      const block = image.content.find((item) => item.type === "image");
      expect(block, name).toMatchObject({ type: "image", mimeType: "image/png", data: PNG.toString("base64") });
    }
  });

  it("with no --root: the client's roots, followed when they change; else the current directory", async () => {
    const first = workspace({ "first.txt": "1" });
    const second = workspace({ "second.txt": "2" });
    const roots: Roots = { current: [first] };
    const client = await stdioClient(["--no-execute", "--no-memories"], { roots, cwd: ROOT });
    expect(okText(await call(client, "ls"))).toBe("/first.txt (1 bytes)");
    roots.current = [second];
    await client.sendRootsListChanged();
    await expect.poll(async () => text(await call(client, "ls")), { timeout: 10_000 }).toBe("/second.txt (1 bytes)");

    const cwd = workspace({ "here.txt": "3" });
    const plain = await stdioClient(["--no-execute", "--no-memories"], { cwd });
    expect(okText(await call(plain, "ls"))).toBe("/here.txt (1 bytes)");
  });

  it("cancellation aborts a running command: its process dies and what it would have written never appears", async () => {
    const dir = workspace();
    const client = await stdioClient(["--root", dir, "--unsafe-local", "--no-memories"]);
    const { tools } = await client.listTools();
    expect(tools.some((tool) => tool.name === "execute")).toBe(true);
    const controller = new AbortController();
    const started = Date.now();
    const running = client.callTool({ name: "execute", arguments: { command: "sleep 3 && echo late > marker.txt" } }, undefined, { signal: controller.signal });
    setTimeout(() => controller.abort(), 500);
    await expect(running).rejects.toThrow(/abort/i);
    expect(Date.now() - started).toBeLessThan(2_900); // before the command would have ended
    await new Promise((resolve) => setTimeout(resolve, 3_500));
    expect(existsSync(join(dir, "marker.txt"))).toBe(false);
    // The session goes on.
    expect(okText(await call(client, "execute", { command: "echo alive" }))).toContain("alive");
  });
});

describe("strata mcp routes, config file and sandboxes", () => {
  it("mounts routes by URL: memory:, file:, sqlite:, postgres://, redis://", async () => {
    const dir = workspace({ "top.txt": "top" });
    const other = workspace({ "shared.md": "from the other folder" });
    const ns = `mcp-test-${process.pid}-${Date.now()}`;
    const client = await stdioClient([
      "--root", dir, "--no-execute",
      "--route", "/scratch=memory:",
      "--route", `/other=file:${other}`,
      "--route", "/notes=sqlite:.strata/notes.db",
      "--route", `/pg-${ns}=${requireService("STRATA_POSTGRES_URL", "10-postgres.sh")}`,
      "--route", `/redis-${ns}=${requireService("STRATA_REDIS_URL", "20-redis.sh")}`,
    ]);
    const roots = (await call(client, "list_allowed_roots")).structuredContent as { roots: { path: string; description: string }[] };
    expect(roots.roots.map((root) => root.path)).toEqual(["/", "/scratch", "/other", "/notes", `/pg-${ns}`, `/redis-${ns}`]);
    expect(JSON.stringify(roots)).not.toMatch(/postgres:\/\/|redis:\/\/|password/);
    expect(okText(await call(client, "read_file", { file_path: "/other/shared.md" }))).toContain("from the other folder");
    for (const prefix of ["/scratch", "/notes", `/pg-${ns}`, `/redis-${ns}`]) {
      okText(await call(client, "write_file", { file_path: `${prefix}/a.md`, content: `in ${prefix}` }));
      expect(okText(await call(client, "read_file", { file_path: `${prefix}/a.md` }))).toContain(`in ${prefix}`);
    }
    expect(existsSync(join(dir, ".strata", "notes.db"))).toBe(true);
    expect(existsSync(join(dir, ".strata", "memories.db"))).toBe(false); // --route replaces the default
    const grep = okText(await call(client, "grep", { pattern: "in /", output_mode: "files_with_matches" }));
    expect(grep.split("\n").sort()).toEqual([`/notes/a.md`, `/pg-${ns}/a.md`, `/redis-${ns}/a.md`, "/scratch/a.md"].sort());
    expect(text(await call(client, "execute", { command: "true" }))).toMatch(/Unknown tool 'execute'/); // --no-execute
  });

  it("--no-fsync, or fsync: false in the config file: writes and edits land as by default, no temp file left; a wrong type is refused", async () => {
    const dir = workspace({ "a.txt": "one\n" });
    const configDir = workspace({ "strata.json": JSON.stringify({ root: dir, execute: false, memories: false, fsync: false }) });
    for (const args of [["--root", dir, "--no-execute", "--no-memories", "--no-fsync"], ["--config", join(configDir, "strata.json")]]) {
      const client = await stdioClient(args);
      okText(await call(client, "read_file", { file_path: "/a.txt" }));
      const edited = okText(await call(client, "edit_file", { file_path: "/a.txt", old_string: "one", new_string: "two" }));
      expect(edited).toContain("+two");
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("two\n");
      okText(await call(client, "write_file", { file_path: "/b.txt", content: "new" }));
      expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("new");
      okText(await call(client, "edit_file", { file_path: "/a.txt", old_string: "two", new_string: "one" }));
      rmSync(join(dir, "b.txt"));
      await client.close();
    }
    expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("one\n");
    expect(readdirSync(dir).filter((name) => name.startsWith(".strata-"))).toEqual([]);

    writeFileSync(join(configDir, "bad.json"), JSON.stringify({ root: dir, fsync: "no" }));
    const bad = spawn(process.execPath, [...NODE_ARGS, "--config", join(configDir, "bad.json")], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    bad.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
    expect(await new Promise((resolve) => bad.once("close", resolve))).toBe(1);
    expect(err).toMatch(/strata: The config file 'bad.json': fsync/);
  });

  it("reads a config file; a flag given on the command line wins over it", async () => {
    const dir = workspace({ "cfg.txt": "configured" });
    const configDir = workspace({ "strata.json": "" });
    writeFileSync(join(configDir, "strata.json"), JSON.stringify({ root: dir, execute: false, routes: { "/scratch": "memory:" } }));
    const client = await stdioClient(["--config", join(configDir, "strata.json")]);
    const { tools } = await client.listTools();
    expect(tools.some((tool) => tool.name === "execute")).toBe(false);
    expect(okText(await call(client, "ls"))).toBe("/cfg.txt (10 bytes)\n/scratch/");
    const elsewhere = workspace({ "flag.txt": "x" });
    const overridden = await stdioClient(["--config", join(configDir, "strata.json"), "--root", elsewhere]);
    expect(okText(await call(overridden, "ls"))).toBe("/flag.txt (1 bytes)\n/scratch/");

    writeFileSync(join(configDir, "bad.json"), JSON.stringify({ root: dir, sandbox: "vm" }));
    const bad = spawn(process.execPath, [...NODE_ARGS, "--config", join(configDir, "bad.json")], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    bad.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
    expect(await new Promise((resolve) => bad.once("close", resolve))).toBe(1);
    expect(err).toMatch(/strata: The config file 'bad.json': sandbox/);
    expect(err).not.toContain(configDir);
  });

  it("--sandbox docker:IMAGE works in a fresh container (not the folder), removed when the session ends", async () => {
    const socket = requireService("STRATA_DOCKER_HOST", "30-docker.sh");
    const image = requireService("STRATA_DOCKER_IMAGE_GNU", "30-docker.sh");
    const dir = workspace();
    const client = await stdioClient(["--root", dir, "--sandbox", `docker:${image}`, "--no-memories"], { env: { DOCKER_HOST: `unix://${socket}` } });
    okText(await call(client, "write_file", { file_path: "/workspace/hello.sh", content: "echo hello from $(cat /etc/hostname)\n" }));
    const said = okText(await call(client, "execute", { command: "sh hello.sh" }));
    const container = /hello from ([0-9a-f]{12})/.exec(said)?.[1];
    expect(container, said).toBeDefined();
    expect(existsSync(join(dir, "hello.sh"))).toBe(false); // the container's workspace, not the folder
    // Ending the session removes the container.
    await client.close();
    const { default: Docker } = await import("dockerode");
    const docker = new Docker({ socketPath: socket });
    await expect.poll(async () => (await docker.listContainers({ all: true })).some((c) => c.Id.startsWith(container!)), { timeout: 15_000 }).toBe(false);
  });
});

describe("strata mcp over Streamable HTTP", () => {
  it("serves ten clients at once, each its own session (its own stale-file guard)", async () => {
    const dir = workspace({ "shared.txt": "base\n" });
    const { url } = await httpServer(["--root", dir, "--no-execute", "--no-memories"]);
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
    const clients = await Promise.all(Array.from({ length: 10 }, () => httpClient(url)));
    await Promise.all(
      clients.map(async (client, i) => {
        okText(await call(client, "write_file", { file_path: `/c${i}.txt`, content: `client ${i}` }));
        expect(okText(await call(client, "read_file", { file_path: `/c${i}.txt` }))).toContain(`client ${i}`);
        expect(okText(await call(client, "grep", { pattern: `client ${i}` }))).toContain(`/c${i}.txt`);
      }),
    );
    // Only the session that read shared.txt may edit it.
    okText(await call(clients[0]!, "read_file", { file_path: "/shared.txt" }));
    const refused = await call(clients[1]!, "edit_file", { file_path: "/shared.txt", old_string: "base", new_string: "one" });
    expect(text(refused)).toMatch(/has not been read in this session/);
    okText(await call(clients[0]!, "edit_file", { file_path: "/shared.txt", old_string: "base", new_string: "zero" }));
    expect(readFileSync(join(dir, "shared.txt"), "utf8")).toBe("zero\n");
    for (let i = 0; i < 10; i++) expect(readFileSync(join(dir, `c${i}.txt`), "utf8")).toBe(`client ${i}`);
  });

  it("with no --root, each HTTP session works in its own client's root, if it lies in the server's directory", async () => {
    const base = workspace({ "alpha/alpha.txt": "a", "beta/beta.txt": "b", "base.txt": "c" });
    const outside = workspace({ "secret.txt": "s" });
    symlinkSync(outside, join(base, "sneaky"));
    const { url } = await httpServer(["--no-execute", "--no-memories"], {}, base);
    const asked = [join(base, "alpha"), join(base, "beta"), outside, join(base, "sneaky"), "/"];
    const clients = await Promise.all(asked.map((dir) => httpClient(url, {}, { current: [dir] })));
    const listings = await Promise.all(clients.map(async (client) => okText(await call(client, "ls"))));
    // A root outside the server's directory (or leading out of it through a symlink) is ignored: the server's directory is served.
    expect(listings.slice(0, 2)).toEqual(["/alpha.txt (1 bytes)", "/beta.txt (1 bytes)"]);
    for (const listing of listings.slice(2)) {
      expect(listing).toContain("/base.txt (1 bytes)");
      expect(listing).not.toContain("secret");
    }
  });

  it("asks a client for its roots on the call's own stream, so a client without the optional GET stream is served", async () => {
    // The client opens its GET stream after initialization, concurrently with its first call; a server that sent roots/list
    // there lost it whenever the call arrived first (under load) and the call hung. This client never opens that stream.
    const base = workspace({ "alpha/alpha.txt": "a" });
    const { url } = await httpServer(["--no-execute", "--no-memories"], {}, base);
    const noGetStream = (input: string | URL | Request, init?: RequestInit): Promise<Response> =>
      init?.method === "GET" ? Promise.resolve(new Response(null, { status: 405 })) : fetch(input, init);
    const client = new Client({ name: "strata-http-test", version: "1" }, { capabilities: { roots: { listChanged: true } } });
    client.setRequestHandler(ListRootsRequestSchema, () => ({ roots: [{ uri: pathToFileURL(join(base, "alpha")).href }] }));
    await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: noGetStream }));
    cleanup.push(() => client.close());
    expect(okText(await call(client, "ls"))).toBe("/alpha.txt (1 bytes)");
  });

  it("refuses a foreign Host header or Origin (DNS rebinding) and an unknown session", async () => {
    const dir = workspace();
    const { url } = await httpServer(["--root", dir, "--no-execute", "--no-memories"]);
    const port = new URL(url).port;
    expect((await rawPost(url, { host: `evil.example:${port}` })).status).toBe(403);
    expect((await rawPost(url, { host: `127.0.0.1:${port}`, origin: "http://evil.example" })).status).toBe(403);
    expect((await rawPost(url, { host: `localhost:${port}` })).status).toBe(200);
    expect((await rawPost(url, { host: `127.0.0.1:${port}`, origin: `http://localhost:${port}` })).status).toBe(200);
    expect((await rawPost(url, { host: `127.0.0.1:${port}`, "mcp-session-id": "no-such-session" })).status).toBe(404);
  });

  it("needs a bearer token when bound beyond loopback", async () => {
    expect(isLoopback("127.0.0.1") && isLoopback("::1") && isLoopback("localhost") && isLoopback("127.1.2.3")).toBe(true);
    expect(isLoopback("0.0.0.0") || isLoopback("192.168.1.4") || isLoopback("::")).toBe(false);
    expect(bindingProblem("127.0.0.1", undefined)).toBeUndefined();
    expect(bindingProblem("0.0.0.0", undefined)).toMatch(/bearer token/);
    expect(bindingProblem("0.0.0.0", "short")).toMatch(/at least 16/);
    expect(bindingProblem("0.0.0.0", "a-long-enough-token-1234")).toBeUndefined();

    // The process refuses to start without one.
    const refused = spawn(process.execPath, [...NODE_ARGS, "--http", "--host", "0.0.0.0", "--no-execute"], { cwd: workspace(), env: { ...process.env, STRATA_MCP_TOKEN: "" }, stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    refused.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
    const code = await new Promise((resolve) => refused.once("close", resolve));
    expect(code).not.toBe(0);
    expect(err).toMatch(/bearer token/);

    // Bound to every address with a token: requests need it.
    const token = "test-token-0123456789abcdef";
    const dir = workspace({ "x.txt": "x" });
    const { url } = await httpServer(["--root", dir, "--host", "0.0.0.0", "--no-execute", "--no-memories"], { STRATA_MCP_TOKEN: token });
    const local = url.replace("0.0.0.0", "127.0.0.1");
    const port = new URL(local).port;
    expect((await rawPost(local, { host: `127.0.0.1:${port}` })).status).toBe(401);
    expect((await rawPost(local, { host: `127.0.0.1:${port}`, authorization: "Bearer wrong-token-0123456789" })).status).toBe(401);
    const client = await httpClient(local, { authorization: `Bearer ${token}` });
    expect(okText(await call(client, "ls"))).toBe("/x.txt (1 bytes)");
  });

  it("cancellation over HTTP aborts the command; a client that disconnects mid-write leaves the whole file or none", async () => {
    const dir = workspace();
    const { url } = await httpServer(["--root", dir, "--unsafe-local", "--no-memories"]);
    const client = await httpClient(url);
    const controller = new AbortController();
    const running = client.callTool({ name: "execute", arguments: { command: "sleep 2 && echo late > marker.txt" } }, undefined, { signal: controller.signal });
    setTimeout(() => controller.abort(), 400);
    await expect(running).rejects.toThrow(/abort/i);
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    expect(existsSync(join(dir, "marker.txt"))).toBe(false);

    const big = "0123456789abcdef\n".repeat(120_000); // about 2 MB
    const leaving = await httpClient(url);
    const pending = leaving.callTool({ name: "write_file", arguments: { file_path: "/big.txt", content: big } }).catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await leaving.close();
    await pending;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    if (existsSync(join(dir, "big.txt"))) expect(readFileSync(join(dir, "big.txt"), "utf8")).toBe(big);
    // The server is still there for others.
    const after = await httpClient(url);
    expect(okText(await call(after, "execute", { command: "echo still here" }))).toContain("still here");
  });
});
