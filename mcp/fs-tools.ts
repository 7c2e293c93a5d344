/**
 * The tools the official MCP filesystem server offers that tools/ does not:
 * several files at once, the tail of a file, make directory, a listing with
 * sizes and totals, a directory tree with a depth limit and skipped folders,
 * move, file info, and the allowed roots. Each is a tools/ definition
 * (same session, guard and budget); those with structured output also carry
 * a zod output schema, and their answers a `structured` value matching it.
 */
import { canonicalPath } from "../tools/paths.js";
import { z } from "zod";
import { printable } from "../core/errors.js";
import { compileGlob, type GlobMatcher } from "../core/glob.js";
import { baseName, joinPath } from "../core/paths.js";
import type { FileInfo } from "../core/types.js";
import { ToolFailure, defineTool, ok, orFail, type ContentBlock, type ToolDefinition, type ToolOutput } from "../tools/define.js";
import { readFile, readLines } from "../tools/read-file.js";
import type { ToolSession } from "../tools/session.js";

/** A tool answer that also carries structured content (MCP `structuredContent`). */
export type StructuredOutput = ToolOutput & { structured?: Record<string, unknown> };

/** A tool definition for MCP: what tools/ defines, plus an output schema where the answer is structured. */
export interface McpToolDefinition extends ToolDefinition {
  readonly outputSchema?: z.ZodObject;
}

function withData(output: ToolOutput, structured: Record<string, unknown>): StructuredOutput {
  return { ...output, structured };
}

/** Strips the trailing '/' directory paths carry in listings. */
const bare = (path: string) => path.replace(/(.)\/$/, "$1");

// ---- read_multiple_files ----

const readMultipleSchema = z.object({
  paths: z.array(z.string()).min(1).max(100).describe("Absolute paths of the files to read (1 to 100)"),
  offset: z.number().int().min(0).optional().describe("0-based line to start at in every file. Default 0"),
  limit: z.number().int().min(1).optional().describe("Lines to read from every file. Default 2000"),
});

export const readMultipleFiles = defineTool({
  name: "read_multiple_files",
  description: [
    "Reads several files in one call, each exactly as read_file would (line numbers, paging footer, images as images).",
    "A file that cannot be read gets its error in its own section; the others are still answered.",
    "Use it to compare files or to take in several at once instead of calling read_file repeatedly.",
  ].join(" "),
  inputSchema: readMultipleSchema,
  async execute(session, input) {
    const answers = await Promise.all(
      input.paths.map((file_path) => readFile.run(session, { file_path, offset: input.offset, limit: input.limit })),
    );
    const blocks: ContentBlock[] = [];
    const sections = answers.map((answer, i) => {
      blocks.push(...(answer.blocks ?? []));
      return `=== ${printable(input.paths[i] ?? "")} ===\n${answer.isError ? `Error: ${answer.text}` : answer.text}`;
    });
    const text = sections.join("\n\n");
    if (answers.every((answer) => answer.isError)) throw new ToolFailure(answers.length === 1 ? (answers[0]?.text ?? "") : text);
    return ok(text, blocks);
  },
});

// ---- read_file_tail ----

const tailSchema = z.object({
  file_path: z.string().describe("Absolute path of the file"),
  lines: z.number().int().min(1).max(10_000).optional().describe("How many lines from the end. Default 100"),
});

export const readFileTail = defineTool({
  name: "read_file_tail",
  description: [
    "Reads the last lines of a text file (a log, for instance), with their line numbers, as read_file does.",
    "For the head of a file use read_file with limit.",
  ].join(" "),
  inputSchema: tailSchema,
  selfBudgeted: true,
  async execute(session, input) {
    return readLines(session, input.file_path, { tail: input.lines ?? 100 });
  },
});

// ---- create_directory ----

const mkdirSchema = z.object({
  path: z.string().describe("Absolute path of the directory; missing parents are created too"),
});

export const createDirectory = defineTool({
  name: "create_directory",
  description:
    "Creates a directory and any missing parents. An existing directory is fine (nothing changes). Some workspaces (in memory, databases) keep no empty directories: there it appears with its first file.",
  inputSchema: mkdirSchema,
  async execute(session, input) {
    const made = orFail(await session.backend.mkdir(input.path, { recursive: true }));
    return ok(`Directory '${printable(bare(made.path))}' is ready.`);
  },
});

// ---- list_directory_with_sizes ----

const entrySchema = z.object({
  name: z.string(),
  type: z.enum(["file", "directory"]),
  size: z.number().optional(),
  modifiedAt: z.string().optional(),
});

const listSizesSchema = z.object({
  path: z.string().optional().describe("Absolute path of the directory. Default: the workspace root"),
  sort_by: z.enum(["name", "size"]).optional().describe("Order of the entries: by name (default) or by size, largest first"),
});

const listSizesOutput = z.object({
  path: z.string(),
  entries: z.array(entrySchema),
  files: z.number(),
  directories: z.number(),
  totalBytes: z.number(),
});

const listDirectoryWithSizesDefinition = defineTool({
  name: "list_directory_with_sizes",
  description:
    "Lists a directory (not recursive) with each file's size, sorted by name or by size, and totals: how many files and directories, and the bytes the files hold.",
  inputSchema: listSizesSchema,
  async execute(session, input) {
    const path = input.path ?? session.root;
    const listing = orFail(await session.backend.ls(path));
    const entries = listing.entries.filter((entry) => !session.isEvicted(bare(entry.path))).map(toEntry);
    if (input.sort_by === "size") entries.sort((a, b) => (b.size ?? -1) - (a.size ?? -1) || a.name.localeCompare(b.name));
    const files = entries.filter((entry) => entry.type === "file");
    const totalBytes = files.reduce((sum, entry) => sum + (entry.size ?? 0), 0);
    const lines = entries.map((entry) => (entry.type === "directory" ? `[DIR]  ${entry.name}/` : `[FILE] ${entry.name} (${formatSize(entry.size ?? 0)})`));
    lines.push("", `${files.length} files, ${entries.length - files.length} directories, ${formatSize(totalBytes)} in files`);
    return withData(ok(lines.join("\n")), { path, entries, files: files.length, directories: entries.length - files.length, totalBytes });
  },
});
export const listDirectoryWithSizes: McpToolDefinition = { ...listDirectoryWithSizesDefinition, outputSchema: listSizesOutput };

function toEntry(info: FileInfo): z.infer<typeof entrySchema> {
  const entry: z.infer<typeof entrySchema> = { name: baseName(bare(info.path)), type: info.is_dir ? "directory" : "file" };
  if (!info.is_dir) entry.size = info.size ?? 0;
  if (info.modified_at) entry.modifiedAt = info.modified_at;
  return entry;
}

function formatSize(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}

// ---- directory_tree ----

/** Entries a tree answers at most; a larger tree is cut with a marker. */
const MAX_TREE_ENTRIES = 5_000;
/** Folders skipped unless `exclude` is given. */
const DEFAULT_EXCLUDE = ["node_modules", ".git", ".strata"];

const treeSchema = z.object({
  path: z.string().optional().describe("Absolute path of the directory. Default: the workspace root"),
  max_depth: z.number().int().min(1).max(20).optional().describe("Levels below path to show. Default 3"),
  exclude: z
    .array(z.string())
    .optional()
    .describe(`Names or glob patterns of entries to skip, e.g. ["dist", "*.log"]. Default ${JSON.stringify(DEFAULT_EXCLUDE)}; [] skips nothing`),
});

interface TreeNode {
  name: string;
  type: "file" | "directory";
  size?: number;
  children?: TreeNode[];
}

const treeNodeSchema: z.ZodType<TreeNode> = z.lazy(() =>
  z.object({
    name: z.string(),
    type: z.enum(["file", "directory"]),
    size: z.number().optional(),
    children: z.array(treeNodeSchema).optional(),
  }),
);

const treeOutput = z.object({ path: z.string(), tree: z.array(treeNodeSchema), entries: z.number(), truncated: z.boolean() });

const directoryTreeDefinition = defineTool({
  name: "directory_tree",
  description: [
    "Shows a directory and what lies under it as an indented tree, down to max_depth levels (default 3),",
    "skipping node_modules, .git and .strata unless exclude says otherwise. Directories end in '/'; a directory deeper",
    `than max_depth is shown with '…'. At most ${MAX_TREE_ENTRIES} entries. Use glob to find files by name.`,
  ].join(" "),
  inputSchema: treeSchema,
  async execute(session, input) {
    const root = input.path ?? session.root;
    const depth = input.max_depth ?? 3;
    let skip: GlobMatcher[];
    try {
      skip = (input.exclude ?? DEFAULT_EXCLUDE).map((pattern) => compileGlob(pattern, "/"));
    } catch (error) {
      throw new ToolFailure(`Invalid exclude pattern: ${error instanceof Error ? error.message : String(error)}`);
    }
    const rootListing = orFail(await session.backend.ls(root));
    const state = { count: 0, truncated: false };
    const tree = await walk(session, rootListing.entries, depth - 1, skip, state);
    const lines: string[] = [];
    render(tree, "", lines);
    if (state.truncated) lines.push(`[… tree cut at ${MAX_TREE_ENTRIES} entries; narrow path, max_depth or exclude …]`);
    const text = lines.length === 0 ? `'${printable(root)}' is empty.` : lines.join("\n");
    return withData(ok(text), { path: root, tree, entries: state.count, truncated: state.truncated });
  },
});
export const directoryTree: McpToolDefinition = { ...directoryTreeDefinition, outputSchema: treeOutput };

async function walk(
  session: ToolSession,
  entries: FileInfo[],
  depthLeft: number,
  skip: GlobMatcher[],
  state: { count: number; truncated: boolean },
): Promise<TreeNode[]> {
  const nodes: { node: TreeNode; path: string }[] = [];
  for (const entry of entries) {
    const path = bare(entry.path);
    if (session.isEvicted(path) || skip.some((matches) => matches(path))) continue;
    if (state.count >= MAX_TREE_ENTRIES) {
      state.truncated = true;
      break;
    }
    state.count++;
    const node: TreeNode = { name: baseName(path), type: entry.is_dir ? "directory" : "file" };
    if (!entry.is_dir) node.size = entry.size ?? 0;
    nodes.push({ node, path });
  }
  if (depthLeft > 0) {
    // One level at a time, its directories listed together.
    await Promise.all(
      nodes
        .filter(({ node }) => node.type === "directory")
        .map(async ({ node, path }) => {
          const listing = await session.backend.ls(path);
          node.children = listing.error ? [] : await walk(session, listing.entries, depthLeft - 1, skip, state);
        }),
    );
  }
  return nodes.map(({ node }) => node);
}

function render(nodes: TreeNode[], indent: string, lines: string[]): void {
  for (const node of nodes) {
    if (node.type === "file") {
      lines.push(`${indent}${node.name}`);
      continue;
    }
    lines.push(`${indent}${node.name}/${node.children === undefined ? " …" : ""}`);
    if (node.children) render(node.children, `${indent}  `, lines);
  }
}

// ---- move_file ----

const moveSchema = z.object({
  source: z.string().describe("Absolute path of the file or directory to move"),
  destination: z.string().describe("Absolute path it moves to (not an existing directory to move it into: the full new path)"),
  overwrite: z.boolean().optional().describe("Replace what is at destination. Default false: an existing destination is an error"),
});

export const moveFile = defineTool({
  name: "move_file",
  description:
    "Moves or renames a file or a directory tree, all of it or (on failure) none of it. The destination must not exist unless overwrite is true.",
  inputSchema: moveSchema,
  async execute(session, input) {
    if (!input.overwrite) {
      const moved = orFail(await session.backend.move(input.source, input.destination, { overwrite: false }));
      return ok(`Moved '${printable(moved.from)}' to '${printable(moved.to)}'.`);
    }
    // Replacing a file is an overwrite: the stale-file guard applies, under the destination's change lock.
    return session.exclusive(canonicalPath(session, input.destination), async () => {
      const existing = await session.backend.readRaw(input.destination);
      if (!existing.error) {
        const stale = await session.staleReason(existing.path, existing.data, "overwrite");
        if (stale) throw new ToolFailure(stale);
      }
      const moved = orFail(await session.backend.move(input.source, input.destination, { overwrite: true }));
      session.forget(moved.from);
      session.forget(moved.to);
      return ok(`Moved '${printable(moved.from)}' to '${printable(moved.to)}'.`);
    });
  },
});

// ---- get_file_info ----

const infoSchema = z.object({ path: z.string().describe("Absolute path of a file or directory") });
const infoOutput = z.object({
  path: z.string(),
  type: z.enum(["file", "directory"]),
  size: z.number().optional(),
  modifiedAt: z.string().optional(),
});

const getFileInfoDefinition = defineTool({
  name: "get_file_info",
  description: "Tells what is at a path: a file (its size in bytes and when it was last modified) or a directory. A missing path is an error.",
  inputSchema: infoSchema,
  async execute(session, input) {
    const info = orFail(await session.backend.stat(input.path));
    const data: z.infer<typeof infoOutput> = { path: bare(info.path), type: info.is_dir ? "directory" : "file" };
    if (!info.is_dir) data.size = info.size ?? 0;
    if (info.modified_at) data.modifiedAt = info.modified_at;
    const lines = [`path: ${data.path}`, `type: ${data.type}`];
    if (data.size !== undefined) lines.push(`size: ${data.size} bytes`);
    if (data.modifiedAt) lines.push(`modified: ${data.modifiedAt}`);
    return withData(ok(lines.join("\n")), data);
  },
});
export const getFileInfo: McpToolDefinition = { ...getFileInfoDefinition, outputSchema: infoOutput };

// ---- list_allowed_roots ----

/** One place the tools can reach, as the model addresses it. */
export interface AllowedRoot {
  path: string;
  description: string;
}

const rootsOutput = z.object({ roots: z.array(z.object({ path: z.string(), description: z.string() })) });

/** `list_allowed_roots` over the roots `describe` answers (they change when the client's roots do). */
export function listAllowedRoots(describe: () => AllowedRoot[]): McpToolDefinition {
  const definition = defineTool({
    name: "list_allowed_roots",
    description:
      "Lists the places the file tools can reach, as absolute paths to use in file_path and path arguments, with what each holds. Nothing outside them is reachable.",
    inputSchema: z.object({}),
    async execute() {
      const roots = describe();
      return withData(ok(roots.map((root) => `${root.path}  ${root.description}`).join("\n")), { roots });
    },
  });
  return { ...definition, outputSchema: rootsOutput };
}

/** The roots of a workspace: its root, and each route given. */
export function rootsOf(root: string, routes: Readonly<Record<string, string>> = {}, rootDescription = "the workspace"): AllowedRoot[] {
  return [{ path: root, description: rootDescription }, ...Object.entries(routes).map(([path, description]) => ({ path: joinPath("/", path.replace(/^\/+/, "")), description }))];
}

/** The MCP-only definitions, in the order they are offered after tools/'s. */
export const mcpToolDefinitions: readonly McpToolDefinition[] = [
  readMultipleFiles,
  readFileTail,
  listDirectoryWithSizes,
  directoryTree,
  createDirectory,
  moveFile,
  getFileInfo,
];
