/**
 * createMcpServer in process (the SDK's in-memory transport): the tools the
 * filesystem server offers that tools/ does not (tree depth and exclusions,
 * sizes and sorting, tail, several files, make directory, move, file info,
 * roots) over StateBackend and FilesystemBackend; execute offered only where
 * commands run; the call's signal reaching the native API; sessions apart.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import type { Backend } from "../core/protocol.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { createMcpServer, type Workspace } from "../mcp/server.js";
import { runWithSignal, withCallSignal } from "../mcp/signal.js";

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0).reverse()) await step();
});
const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function connect(workspace: Backend | Workspace): Promise<Client> {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const server = createMcpServer(workspace);
  await server.connect(serverSide);
  const client = new Client({ name: "in-process", version: "1" });
  await client.connect(clientSide);
  cleanup.push(async () => {
    await client.close();
    await server.close();
  });
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown> = {}): Promise<CallToolResult> {
  return (await client.callTool({ name, arguments: args })) as CallToolResult;
}

function text(result: CallToolResult): string {
  const first = result.content[0];
  return first?.type === "text" ? first.text : "";
}

async function filled(backend: Backend): Promise<Backend> {
  const files: Record<string, string> = {
    "/src/a.ts": "a\n",
    "/src/lib/b.ts": "bb\n",
    "/src/lib/deep/c.ts": "ccc\n",
    "/node_modules/pkg/index.js": "x",
    "/big.log": Array.from({ length: 300 }, (_, i) => `entry ${i + 1}`).join("\n"),
    "/dist/out.js": "y",
  };
  for (const [path, content] of Object.entries(files)) {
    const written = await backend.write(path, content);
    if (written.error) throw new Error(written.error.message);
  }
  return backend;
}

const kinds: Record<string, () => Backend> = {
  StateBackend: () => new StateBackend(),
  FilesystemBackend: () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-mcp-tools-"));
    dirs.push(dir);
    return new FilesystemBackend({ workspace: dir });
  },
};

describe.each(Object.keys(kinds))("MCP tools over %s", (kind) => {
  it("directory_tree: depth limit, node_modules skipped by default, exclude patterns", async () => {
    const client = await connect(await filled(kinds[kind]!()));
    expect(text(await call(client, "directory_tree", { max_depth: 2 }))).toBe(["big.log", "dist/", "  out.js", "src/", "  a.ts", "  lib/ …"].join("\n"));
    const all = await call(client, "directory_tree", { max_depth: 5, exclude: ["dist", "*.log", "node_modules"] });
    expect(text(all)).toBe(["src/", "  a.ts", "  lib/", "    b.ts", "    deep/", "      c.ts"].join("\n"));
    expect(all.structuredContent).toMatchObject({ path: "/", entries: 6, truncated: false });
    expect(text(await call(client, "directory_tree", { exclude: [], max_depth: 1 }))).toContain("node_modules/ …");
    expect((await call(client, "directory_tree", { exclude: [""] })).isError).toBe(true);
  });

  it("list_directory_with_sizes sorts by size and totals; read_file_tail and read_multiple_files", async () => {
    const client = await connect(await filled(kinds[kind]!()));
    const sized = await call(client, "list_directory_with_sizes", { path: "/src/lib", sort_by: "size" });
    expect(sized.structuredContent).toMatchObject({ files: 1, directories: 1, totalBytes: 3 });
    const bySize = await call(client, "list_directory_with_sizes", { sort_by: "size" });
    const names = (bySize.structuredContent as { entries: { name: string }[] }).entries.map((entry) => entry.name);
    expect(names[0]).toBe("big.log");
    expect(text(await call(client, "read_file_tail", { file_path: "/big.log", lines: 3 }))).toMatch(/^\s+298\tentry 298\n\s+299\tentry 299\n\s+300\tentry 300\n\n\[Lines 298-300 of 300/);
    const many = text(await call(client, "read_multiple_files", { paths: ["/src/a.ts", "/src/lib/b.ts"] }));
    expect(many).toMatch(/=== \/src\/a.ts ===\n\s+1\ta\n[\s\S]*=== \/src\/lib\/b.ts ===\n\s+1\tbb/);
    const none = await call(client, "read_multiple_files", { paths: ["/nope.txt"] });
    expect(none.isError).toBe(true);
  });

  it("create_directory, move_file (overwrite only when asked), get_file_info", async () => {
    const backend = await filled(kinds[kind]!());
    const client = await connect(backend);
    expect((await call(client, "create_directory", { path: "/made/here" })).isError).toBe(false);
    expect((await call(client, "create_directory", { path: "/src/a.ts" })).isError).toBe(true);
    expect((await call(client, "move_file", { source: "/src/a.ts", destination: "/made/here/a.ts" })).isError).toBe(false);
    expect((await backend.stat("/src/a.ts")).error?.code).toBe("file_not_found");
    const clash = await call(client, "move_file", { source: "/dist/out.js", destination: "/made/here/a.ts" });
    expect(text(clash)).toMatch(/exists/);
    // Overwriting is guarded like write_file: a destination not read in this session (or changed since) is refused.
    const unread = await call(client, "move_file", { source: "/dist/out.js", destination: "/made/here/a.ts", overwrite: true });
    expect(text(unread)).toMatch(/has not been read in this session/);
    expect((await backend.stat("/dist/out.js")).error).toBeUndefined();
    expect((await call(client, "read_file", { file_path: "/made/here/a.ts" })).isError).toBe(false);
    expect((await call(client, "move_file", { source: "/dist/out.js", destination: "/made/here/a.ts", overwrite: true })).isError).toBe(false);
    const info = await call(client, "get_file_info", { path: "/made/here/a.ts" });
    expect(info.structuredContent).toMatchObject({ path: "/made/here/a.ts", type: "file", size: 1 });
    expect((await call(client, "get_file_info", { path: "/src" })).structuredContent).toMatchObject({ type: "directory" });
    const missing = await call(client, "get_file_info", { path: "/nothing" });
    expect(missing.isError).toBe(true);
    expect(missing.structuredContent).toBeUndefined();
  });
});

describe("createMcpServer", () => {
  it("offers execute only where commands run (a composite over files does not)", async () => {
    const sandbox = new LocalSandbox();
    cleanup.push(() => sandbox.close());
    const names = async (backend: Backend) => (await (await connect(backend)).listTools()).tools.map((tool) => tool.name);
    expect(await names(sandbox)).toContain("execute");
    expect(await names(new CompositeBackend({ default: new StateBackend(), routes: { "/m": new StateBackend() } }))).not.toContain("execute");
    expect(await names(new CompositeBackend({ default: sandbox, routes: { "/m": new StateBackend() } }))).toContain("execute");
    expect(await names(new StateBackend())).not.toContain("execute");
  });

  it("list_allowed_roots answers the workspace's roots", async () => {
    const client = await connect({ backend: new StateBackend(), roots: [{ path: "/", description: "scratch" }, { path: "/m", description: "memories" }] });
    const roots = await call(client, "list_allowed_roots");
    expect(roots.structuredContent).toEqual({ roots: [{ path: "/", description: "scratch" }, { path: "/m", description: "memories" }] });
  });

  it("two sessions over one backend keep separate stale-file guards", async () => {
    const backend = new StateBackend();
    await backend.write("/f.txt", "one");
    const [a, b] = [await connect(backend), await connect(backend)];
    await call(a, "read_file", { file_path: "/f.txt" });
    expect(text(await call(b, "edit_file", { file_path: "/f.txt", old_string: "one", new_string: "two" }))).toMatch(/has not been read/);
    expect((await call(a, "edit_file", { file_path: "/f.txt", old_string: "one", new_string: "two" })).isError).toBe(false);
  });

  it("withCallSignal hands the call's signal to every operation, merged with one the caller gave", async () => {
    const seen: Array<AbortSignal | undefined> = [];
    const backend = new StateBackend();
    const spy = new Proxy(backend, {
      get(target, key) {
        const value: unknown = Reflect.get(target, key, target);
        if (key !== "write" && key !== "ls") return typeof value === "function" ? value.bind(target) : value;
        return (...args: unknown[]) => {
          seen.push((args[key === "write" ? 2 : 1] as { signal?: AbortSignal } | undefined)?.signal);
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
    const view = withCallSignal(spy);
    const controller = new AbortController();
    await runWithSignal(controller.signal, async () => {
      await view.ls();
      await view.write("/a.txt", "a");
    });
    expect(seen).toEqual([controller.signal, controller.signal]);
    const own = new AbortController();
    await runWithSignal(controller.signal, () => view.ls("/", { signal: own.signal }));
    own.abort();
    expect(seen[2]?.aborted).toBe(true);
    controller.abort();
    const refused = await runWithSignal(controller.signal, () => view.write("/b.txt", "b"));
    expect(refused.error?.code).toBe("aborted");
    expect((await backend.stat("/b.txt")).error?.code).toBe("file_not_found");
    // Outside a call the view is the backend.
    expect((await view.write("/c.txt", "c")).error).toBeUndefined();
  });
});
