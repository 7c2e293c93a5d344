/**
 * Over MCP: `strata mcp` and the official filesystem server
 * (`@modelcontextprotocol/server-filesystem`), each a child process driven by
 * the same SDK Client over stdio, on the generated 50k-file tree: start up,
 * list a directory, read 100 files at once, search file names, search
 * content (the peer has no content search), and edit a file.
 */
import { readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { generatedTree, TREE_NEEDLE } from "./filesystem.js";
import { type BenchGroup, type CaseResult, type Contender, type GroupContext, compare, countLines } from "./harness.js";
import { bundleCli } from "../scripts/bundle-cli.js";
import { buildPackage } from "./imports.js";

const PEER_BIN = createRequire(import.meta.url).resolve("@modelcontextprotocol/server-filesystem/dist/index.js");
const STRATA = "Strata `strata mcp` (stdio)";
const PEER = "official filesystem server (stdio)";
/** Issue 12's goal: faster than the official server on every case it can do. */
const FASTER = { kind: "ratio", peer: PEER, min: 1, text: "faster than the official server" } as const;

interface Served {
  command: string;
  args: string[];
}

/** The `strata` command as the package installs it (the bundled bin scripts/bundle-cli.ts builds, as `npx strata` runs it). */
let strataBin = "";

function strataServer(tree: string, ...extra: string[]): Served {
  // The peer answers everything in one message: so does Strata here (no output budget, nothing evicted into the tree).
  const args = [strataBin, "mcp", "--root", tree, "--no-execute", "--no-memories", "--max-output-chars", "1000000000", ...extra];
  return { command: process.execPath, args };
}

function peerServer(tree: string): Served {
  return { command: process.execPath, args: [PEER_BIN, tree] };
}

async function connect(served: Served): Promise<Client> {
  const client = new Client({ name: "strata-bench", version: "1" });
  await client.connect(new StdioClientTransport({ ...served, stderr: "ignore" }));
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<string> {
  const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
  const first = result.content[0];
  const text = first?.type === "text" ? first.text : "";
  if (result.isError) throw new Error(`${name}: ${text.slice(0, 200)}`);
  return text;
}

/** The i-th path of the generated tree (bench/filesystem.ts's layout). */
function treeFile(i: number): string {
  const ext = ["ts", "md", "txt"][i % 3];
  const nested = i % 4 === 0 ? "" : `/src/mod${Math.floor(i / 10) % 25}${i % 8 === 1 ? `/deep/level${i % 5}` : ""}`;
  return `pkg${i % 10}${nested}/file${i}.${ext}`;
}

export const mcpGroup: BenchGroup = {
  name: "mcp",
  title: "Over MCP",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const fileCount = ctx.quick ? 5_000 : 50_000;
    const label = `${fileCount / 1000}k-file tree`;
    const tree = await generatedTree(ctx, fileCount);
    ctx.log("MCP: building Strata's command (the package's JavaScript, as npm run build makes it: the bundled bin)");
    const build = join(ctx.cacheDir, "mcp-build");
    await buildPackage(build);
    await bundleCli(build);
    strataBin = join(build, "cli", "strata.js");
    const common = { group: this.name, reps: ctx.reps };
    const results: CaseResult[] = [];
    const note = "Both servers are child processes over stdio, driven by one SDK Client each; Strata runs its built JavaScript (the package's `strata` command).";

    ctx.log("MCP: start up (spawn, initialize, list tools)");
    const startUp = (served: Served, name: string): Contender => ({
      name,
      run: async () => {
        const client = await connect(served);
        const { tools } = await client.listTools();
        await client.close();
        return tools.length > 0 ? 1 : 0;
      },
    });
    results.push(
      await compare({
        ...common,
        name: "start an MCP server and list its tools",
        strata: startUp(strataServer(tree), STRATA),
        peers: [startUp(peerServer(tree), PEER)],
        target: FASTER,
        warmup: 1,
        minSampleMs: 0,
        maxSamples: 5,
        notes: [note],
      }),
    );

    const strata = await connect(strataServer(tree));
    const peer = await connect(peerServer(tree));
    try {
      const pair = (name: string, strataRun: () => Promise<number>, peerRun: () => Promise<number>) => ({
        strata: { name: STRATA, run: strataRun },
        peers: [{ name: PEER, run: peerRun }],
        name,
        target: FASTER,
      });

      ctx.log("MCP: list a directory");
      const entries = fileCount / 20 + 1;
      results.push(
        await compare({
          ...common,
          ...pair(
            `list a ${entries}-entry directory of a ${label}: names and kinds`,
            async () => countLines(await call(strata, "ls", { path: "/pkg0", sizes: false })),
            async () => countLines(await call(peer, "list_directory", { path: join(tree, "pkg0") })),
          ),
          notes: [
            note,
            "Both answer each entry's name and whether it is a directory, from the directory alone (no stat per entry): Strata's `ls` with `sizes: false` (full paths, sorted, the secrets preset's names left out), the peer's `list_directory` (`[FILE]`/`[DIR]` and the name, in directory order, also repeated as structuredContent).",
            "The directory is unchanged between calls, so Strata's FilesystemBackend answers its names from the listing it kept (ListingCache: kept while the directory's fstat stamps stay the same, for a directory last changed 3 s or more before); the peer reads the directory at every call. The next row changes the directory before every call.",
          ],
        }),
      );
      // An entry renamed before each call (by both contenders, timed alike): the directory is never settled, so no listing
      // is kept and every call reads it; the entry count stays the same.
      const [churnA, churnB] = [join(tree, "pkg0", "churn-a.txt"), join(tree, "pkg0", "churn-b.txt")];
      writeFileSync(churnA, "x");
      let renamed = false;
      const change = () => {
        renamed = !renamed;
        if (renamed) renameSync(churnA, churnB);
        else renameSync(churnB, churnA);
      };
      results.push(
        await compare({
          ...common,
          ...pair(
            `list a ${entries}-entry directory of a ${label}: names and kinds, the directory changed before each call`,
            async () => (change(), countLines(await call(strata, "ls", { path: "/pkg0", sizes: false }))),
            async () => (change(), countLines(await call(peer, "list_directory", { path: join(tree, "pkg0") }))),
          ),
          notes: [note, "Each call first renames one file in the directory (both contenders alike), so Strata's kept listing never applies: both read the directory every time."],
        }),
      );
      rmSync(renamed ? churnB : churnA);
      results.push(
        await compare({
          ...common,
          ...pair(
            `list a ${entries}-entry directory of a ${label}: with sizes`,
            async () => countLines(await call(strata, "ls", { path: "/pkg0" })),
            async () => countLines(await call(peer, "list_directory_with_sizes", { path: join(tree, "pkg0") })),
          ),
          peers: [{ name: `${PEER}, list_directory_with_sizes`, run: async () => countLines(await call(peer, "list_directory_with_sizes", { path: join(tree, "pkg0") })) - 3 }],
          target: { ...FASTER, peer: `${PEER}, list_directory_with_sizes` },
          notes: [
            note,
            "Both stat every entry for its size: Strata's default `ls` (each file's size in bytes), the peer's `list_directory_with_sizes` (sizes, then three lines of totals, not counted).",
          ],
        }),
      );

      ctx.log("MCP: read 100 files");
      const hundred = Array.from({ length: 100 }, (_, i) => treeFile(i * 7));
      results.push(
        await compare({
          ...common,
          ...pair(
            "read 100 files in one call",
            async () => (await call(strata, "read_multiple_files", { paths: hundred.map((p) => `/${p}`) })).split("\n=== ").length,
            async () => (await call(peer, "read_multiple_files", { paths: hundred.map((p) => join(tree, p)) })).split("\n---\n").length,
          ),
          notes: [note, "Strata answers line-numbered windows (read_file's format); the peer answers the raw text."],
        }),
      );

      ctx.log("MCP: search file names");
      results.push(
        await compare({
          ...common,
          ...pair(
            `search file names \`**/file1*.ts\` over a ${label}`,
            async () => countLines(await call(strata, "glob", { pattern: "**/file1*.ts" })),
            async () => countLines(await call(peer, "search_files", { path: tree, pattern: "**/file1*.ts" })),
          ),
          notes: [note, "Strata's glob and the peer's search_files (minimatch over a recursive walk)."],
        }),
      );

      ctx.log("MCP: search content");
      results.push(
        await compare({
          ...common,
          ...pair(
            `search content (files holding \`${TREE_NEEDLE}\`) over a ${label}`,
            async () => countLines(await call(strata, "grep", { pattern: TREE_NEEDLE, output_mode: "files_with_matches", head_limit: 100_000 })),
            async () => {
              throw new Error("the filesystem server has no content search");
            },
          ),
          target: undefined, // nothing to be faster than: the peer has no content search
          notes: [note],
        }),
      );

      ctx.log("MCP: edit a file");
      // Each server edits its own file (3, 6 and 9 of the tree): each run flips one line, the next flips it back.
      const flipper = (n: number, edit: (path: string, from: string, to: string) => Promise<unknown>) => {
        let flipped = false;
        return async () => {
          const [from, to] = flipped ? [`module ${n} (edited)"`, `module ${n}"`] : [`module ${n}"`, `module ${n} (edited)"`];
          flipped = !flipped;
          await edit(treeFile(n), from, to);
          return 1;
        };
      };
      const originals = [3, 6, 9].map((n) => [join(tree, treeFile(n)), readFileSync(join(tree, treeFile(n)), "utf8")] as const);
      const unsynced = await connect(strataServer(tree, "--no-fsync"));
      // The stale-file guard wants a read first.
      await call(strata, "read_file", { file_path: `/${treeFile(3)}` });
      await call(unsynced, "read_file", { file_path: `/${treeFile(9)}` });
      const peerEdit = flipper(6, (path, from, to) => call(peer, "edit_file", { path: join(tree, path), edits: [{ oldText: from, newText: to }] }));
      const guarantees =
        "Both answer a unified diff and replace the file atomically (a temp file renamed over it); Strata's edit also checks, right before the rename, that the file is still the one it read (compare-and-swap: another program's change is never overwritten), and its stale-file guard refuses an edit of a file changed since the model read it.";
      try {
        results.push(
          await compare({
            ...common,
            ...pair(
              "edit a file (one replacement, answered with its diff)",
              flipper(3, (path, from, to) => call(strata, "edit_file", { file_path: `/${path}`, old_string: from, new_string: to })),
              peerEdit,
            ),
            notes: [note, guarantees, "Strata as it runs by default: the new content is fsynced before the rename (durable across a power cut); the peer does not fsync."],
          }),
        );
        results.push(
          await compare({
            ...common,
            ...pair(
              "edit a file, same durability (`strata mcp --no-fsync`)",
              flipper(9, (path, from, to) => call(unsynced, "edit_file", { file_path: `/${path}`, old_string: from, new_string: to })),
              peerEdit,
            ),
            notes: [note, guarantees, "Neither fsyncs: atomic for readers, not durable across a power cut."],
          }),
        );
      } finally {
        await unsynced.close();
        for (const [path, text] of originals) writeFileSync(path, text);
      }
    } finally {
      await strata.close();
      await peer.close();
    }
    return results;
  },
};
