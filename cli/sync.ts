/**
 * `strata sync FROM TO`: a one-way copy between a local folder and a backend
 * URL (either way, or backend to backend). Files are copied, and the
 * directories that hold them (an empty directory is not: a store keeps none).
 * The source wins: a file missing in
 * the target or different there (size, then bytes) is written; `--delete`
 * also removes what the source lacks, so the target mirrors it; `--dry-run`
 * prints the plan and changes nothing. A progress bar on a terminal; nothing
 * but errors when piped (unless --json or --dry-run asks for the plan).
 */
import { existsSync, mkdirSync, realpathSync, statSync } from "node:fs";
import nodePath from "node:path";
import { SingleBar } from "cli-progress";
import { Command } from "commander";
import { FilesystemBackend } from "../backends/filesystem.js";
import type { Backend } from "../core/protocol.js";
import { openRoute } from "../mcp/routes.js";
import { fail, isBackendUrl, permissionOptions, permitted, printJson, report, unwrap } from "./common.js";

/** Files sent or compared per round trip. */
const BATCH = 64;

interface SyncFlags {
  delete?: boolean;
  dryRun?: boolean;
  json?: boolean;
  permissions?: string;
  yes?: boolean;
}

interface Side {
  backend: Backend | undefined;
  close(): Promise<void>;
}

interface Tree {
  files: Map<string, number | undefined>;
  dirs: Set<string>;
}

export interface SyncPlan {
  added: string[];
  updated: string[];
  deleted: string[];
  unchanged: number;
}

async function openSide(spec: string, role: "source" | "target", dryRun: boolean): Promise<Side> {
  if (isBackendUrl(spec)) {
    const route = await openRoute("/", spec, process.cwd()).catch((error: unknown) => fail("invalid_argument", error instanceof Error ? error.message : String(error)));
    return { backend: route.backend, close: () => route.close() };
  }
  const dir = nodePath.resolve(spec);
  const isDir = statSync(dir, { throwIfNoEntry: false })?.isDirectory() ?? false;
  if (!isDir) {
    if (role === "source" || existsSync(dir)) fail(existsSync(dir) ? "not_a_directory" : "file_not_found", `The local folder '${nodePath.basename(dir)}' does not exist`);
    // A target folder that is not there yet is empty; a dry run leaves it uncreated.
    if (dryRun) return { backend: undefined, close: async () => {} };
    mkdirSync(dir, { recursive: true });
  }
  return { backend: new FilesystemBackend({ workspace: dir }), close: async () => {} };
}

/** The host folder a side names (a local folder or a file: URL), real path where it exists. */
function hostFolder(spec: string): string | undefined {
  if (isBackendUrl(spec) && !spec.startsWith("file:")) return undefined;
  const dir = nodePath.resolve(spec.startsWith("file:") ? spec.slice("file:".length) : spec);
  try {
    return realpathSync(dir);
  } catch {
    return dir;
  }
}

/**
 * Two folders where one holds the other would sync into themselves: `sync . ./backup` nests a copy
 * on every run, and `sync ./sub . --delete` deletes the source. Refused before anything is opened.
 */
function refuseOverlap(fromSpec: string, toSpec: string): void {
  const from = hostFolder(fromSpec);
  const to = hostFolder(toSpec);
  if (from === undefined || to === undefined) return;
  const within = (inner: string, outer: string) => inner === outer || inner.startsWith(outer.endsWith(nodePath.sep) ? outer : outer + nodePath.sep);
  if (within(from, to) || within(to, from)) fail("invalid_argument", "The source and the target folders overlap (one holds the other); sync between separate folders");
}

async function walk(backend: Backend | undefined): Promise<Tree> {
  const tree: Tree = { files: new Map(), dirs: new Set() };
  if (!backend) return tree;
  const pending = ["/"];
  while (pending.length > 0) {
    const dir = pending.pop() as string;
    for (const entry of unwrap(await backend.ls(dir)).entries) {
      if (entry.is_dir || entry.path.endsWith("/")) {
        const path = entry.path.replace(/\/+$/, "");
        tree.dirs.add(path);
        pending.push(path);
      } else tree.files.set(entry.path, entry.size);
    }
  }
  return tree;
}

async function download(backend: Backend, paths: string[]): Promise<Map<string, Uint8Array>> {
  const out = new Map<string, Uint8Array>();
  for (const item of unwrap(await backend.downloadFiles(paths)).files) {
    if (item.error || !item.content) fail(item.error?.code ?? "io_error", item.error?.message ?? "Nothing was downloaded", item.path);
    out.set(item.path, item.content);
  }
  return out;
}

function same(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

/** Compares the trees and, unless `dryRun`, makes the target match: answers what changed (or would). */
export async function syncBackends(source: Backend, target: Backend | undefined, options: { delete?: boolean; dryRun?: boolean; onProgress?: (done: number, total: number) => void }): Promise<SyncPlan> {
  const [from, to] = await Promise.all([walk(source), walk(target)]);
  const plan: SyncPlan = { added: [], updated: [], deleted: [], unchanged: 0 };
  const sourcePaths = [...from.files.keys()].sort();
  const total = sourcePaths.length;
  let done = 0;
  options.onProgress?.(0, total);
  for (let i = 0; i < sourcePaths.length; i += BATCH) {
    const batch = sourcePaths.slice(i, i + BATCH);
    const bytes = await download(source, batch);
    const sameSize = target ? batch.filter((p) => to.files.has(p) && (to.files.get(p) === from.files.get(p) || to.files.get(p) === undefined)) : [];
    const theirs = target && sameSize.length > 0 ? await download(target, sameSize) : new Map<string, Uint8Array>();
    const writes: Array<[string, Uint8Array]> = [];
    for (const path of batch) {
      const mine = bytes.get(path) as Uint8Array;
      const other = theirs.get(path);
      if (!to.files.has(path)) plan.added.push(path);
      else if (other && same(mine, other)) {
        plan.unchanged++;
        continue;
      } else plan.updated.push(path);
      writes.push([path, mine]);
    }
    if (!options.dryRun && target && writes.length > 0) {
      // A directory in the target where the source has a file goes first (only when mirroring).
      for (const [path] of writes) if (to.dirs.has(path) && options.delete) unwrap(await target.delete(path));
      for (const item of unwrap(await target.uploadFiles(writes)).files) if (item.error) fail(item.error.code, item.error.message, item.path);
    }
    done += batch.length;
    options.onProgress?.(done, total);
  }
  if (options.delete) {
    const gone = (path: string) => !from.files.has(path) && !from.dirs.has(path);
    // Only the topmost directory the source lacks: deleting it takes what is under it.
    const dirs = [...to.dirs].filter((d) => gone(d) && ![...to.dirs].some((o) => o !== d && gone(o) && d.startsWith(`${o}/`)));
    const files = [...to.files.keys()].filter((f) => gone(f) && !dirs.some((d) => f.startsWith(`${d}/`)));
    for (const path of [...dirs.map((d) => `${d}/`), ...files].sort()) {
      plan.deleted.push(path);
      if (!options.dryRun && target) unwrap(await target.delete(path.replace(/\/$/, "")));
    }
  }
  return plan;
}

export function syncCommand(): Command {
  return permissionOptions(new Command("sync"))
    .description("copy a local folder into a backend or back, one way: the source wins")
    .argument("<from>", "a local folder or a backend URL (memory:, sqlite:PATH, postgres://…, redis://…, file:DIR)")
    .argument("<to>", "a local folder or a backend URL")
    .option("--delete", "also remove from the target what the source lacks (a mirror)")
    .option("-n, --dry-run", "print what would change (+ add, ~ update, - delete) and change nothing")
    .option("--json", "print the plan as JSON")
    .addHelpText("after", "\nExamples:\n  strata sync ./notes sqlite:.strata/notes.db\n  strata sync sqlite:.strata/notes.db ./notes --delete --dry-run")
    .action(async (fromSpec: string, toSpec: string, flags: SyncFlags) => {
      const sides: Side[] = [];
      let bar: SingleBar | undefined;
      try {
        refuseOverlap(fromSpec, toSpec);
        const source = await openSide(fromSpec, "source", flags.dryRun === true);
        sides.push(source);
        const target = await openSide(toSpec, "target", flags.dryRun === true);
        sides.push(target);
        const showBar = process.stderr.isTTY && !flags.json && !flags.dryRun;
        if (showBar) bar = new SingleBar({ format: "sync [{bar}] {value}/{total} files", stream: process.stderr, hideCursor: true });
        // The rules hold on both sides: reading the source, changing the target.
        const plan = await syncBackends(permitted(source.backend as Backend, flags), target.backend && permitted(target.backend, flags), {
          delete: flags.delete,
          dryRun: flags.dryRun,
          onProgress: (done, total) => {
            if (!bar) return;
            if (done === 0) bar.start(total, 0);
            else bar.update(done);
          },
        });
        bar?.stop();
        if (flags.json) printJson({ dryRun: flags.dryRun === true, ...plan });
        else if (flags.dryRun) {
          for (const path of plan.added) process.stdout.write(`+ ${path}\n`);
          for (const path of plan.updated) process.stdout.write(`~ ${path}\n`);
          for (const path of plan.deleted) process.stdout.write(`- ${path}\n`);
        } else if (showBar) {
          process.stderr.write(`synced: ${plan.added.length} added, ${plan.updated.length} updated, ${plan.deleted.length} deleted, ${plan.unchanged} unchanged\n`);
        }
      } catch (error) {
        bar?.stop();
        process.exitCode = report(error, flags.json === true);
      } finally {
        for (const side of sides) await side.close();
      }
    });
}
