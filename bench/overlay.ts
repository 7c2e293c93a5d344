/**
 * The overlay's cost over the disk it lies on: reads, writes and a grep
 * through OverlayBackend against a plain FilesystemBackend on the same
 * generated tree (bench/filesystem.ts's), with a layer already holding
 * changes, so every read first asks the layer.
 */
import { cp, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { OverlayBackend } from "../backends/overlay.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { OverlaySandbox } from "../sandboxes/overlay.js";
import { SqliteStore } from "../stores/sqlite.js";
import { generatedTree, TREE_NEEDLE } from "./filesystem.js";
import { type BenchGroup, type CaseResult, compare, type GroupContext } from "./harness.js";

/** The tree's files `file{i}` live at predictable paths; these are .ts files (i % 3 === 0) of about 400 bytes. */
function treeFile(i: number): string {
  const pkg = `pkg${i % 10}`;
  const nested = i % 4 === 0 ? "" : `/src/mod${Math.floor(i / 10) % 25}${i % 8 === 1 ? `/deep/level${i % 5}` : ""}`;
  return `/${pkg}${nested}/file${i}.ts`;
}

const OVERHEAD = 1.2;

export const overlayGroup: BenchGroup = {
  name: "overlay",
  title: "Overlay over a directory",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const fileCount = ctx.quick ? 5_000 : 50_000;
    const root = await generatedTree(ctx, fileCount);
    const common = { group: this.name, reps: ctx.reps };
    const results: CaseResult[] = [];
    const plain = new FilesystemBackend({ workspace: root, permissions: false });
    const overlay = new OverlayBackend({ workspace: root, permissions: false });
    // A layer that already holds work: 200 files changed and 50 deleted elsewhere in the tree.
    for (let i = 0; i < 200; i++) await overlay.write(`/pkg${i % 10}/layer/changed${i}.ts`, `export const changed${i} = ${i};\n`);
    // Files without the grep needle (one in 37 has it), so both backends find the same matches.
    const deleted = Array.from({ length: 60 }, (_, i) => fileCount - 3 * (i + 1) - (fileCount % 3)).filter((i) => i % 37 !== 0).slice(0, 50);
    for (const i of deleted) await overlay.delete(treeFile(i));
    const reads = Array.from({ length: 100 }, (_, i) => treeFile(i * 3 * 7));
    let r = 0;
    const lines = async (backend: FilesystemBackend | OverlayBackend) => {
      const got = await backend.read(reads[r++ % reads.length]!);
      if (got.error || got.encoding !== "utf-8") throw new Error(got.error?.message ?? "binary");
      return got.lineCount > 0 ? 1 : 0;
    };
    const notes = [
      `The overlay's layer holds 200 written and 50 deleted files when timing starts; reads cycle over 100 files of the ${fileCount / 1000}k-file tree that the layer does not hold, so each asks the layer, then the disk.`,
    ];
    ctx.log("overlay: read a file through the layer");
    results.push(
      await compare({
        ...common,
        name: "read a 14-line file (not in the layer)",
        strata: { name: "Strata OverlayBackend", run: () => lines(overlay) },
        peers: [{ name: "Strata FilesystemBackend", run: () => lines(plain) }],
        target: { kind: "ratio", peer: "Strata FilesystemBackend", min: 1 / OVERHEAD, text: `overhead ≤ ${OVERHEAD}×` },
        notes,
      }),
    );

    // Writes go to scratch space: the plain backend's into a directory of its own, the overlay's into its layer.
    const scratch = await mkdtemp(join(tmpdir(), "strata-bench-overlay-"));
    const sqliteDir = await mkdtemp(join(tmpdir(), "strata-bench-overlay-db-"));
    try {
      const plainScratch = new FilesystemBackend({ workspace: scratch, permissions: false });
      const plainNoSync = new FilesystemBackend({ workspace: scratch, permissions: false, fsync: false });
      const store = new SqliteStore({ path: join(sqliteDir, "overlay.db") });
      const persisted = new OverlayBackend({ workspace: root, store, permissions: false });
      const content = `${"export const line = 'a line of about forty bytes';\n".repeat(20)}`;
      let w = 0;
      const write = async (backend: FilesystemBackend | OverlayBackend) => {
        const got = await backend.write(`/out/w${w++ % 100}.ts`, content, { overwrite: true });
        if (got.error) throw new Error(got.error.message);
        return 1;
      };
      ctx.log("overlay: write a 1 KB file");
      results.push(
        await compare({
          ...common,
          name: "write a 1 KB file (overwrite)",
          strata: { name: "Strata OverlayBackend", run: () => write(overlay) },
          peers: [
            { name: "Strata FilesystemBackend", run: () => write(plainScratch) },
            { name: "Strata FilesystemBackend (fsync: false)", run: () => write(plainNoSync) },
            { name: "Strata OverlayBackend (layer in SQLite)", run: () => write(persisted) },
          ],
          target: { kind: "ratio", peer: "Strata FilesystemBackend", min: 1 / OVERHEAD, text: `overhead ≤ ${OVERHEAD}×` },
          notes: [
            "Writes cycle over 100 paths. A write through the overlay lands in its layer (memory, or one SQLite transaction), not on disk: the first write of a path stats it and its parent on disk (and hashes a file there, to catch a conflict at commit); later ones touch only the layer. The plain backend writes a temp file, fsyncs it (unless fsync: false) and renames it.",
          ],
        }),
      );
      await store.close();
    } finally {
      await rm(scratch, { recursive: true, force: true });
      await rm(sqliteDir, { recursive: true, force: true });
    }

    ctx.log("overlay: literal grep over the tree through the layer");
    results.push(
      await compare({
        ...common,
        name: `literal grep over a ${fileCount / 1000}k-file tree`,
        strata: { name: "Strata OverlayBackend", run: async () => (await overlay.grep(TREE_NEEDLE)).matches?.length ?? -1 },
        peers: [{ name: "Strata FilesystemBackend", run: async () => (await plain.grep(TREE_NEEDLE)).matches?.length ?? -1 }],
        target: { kind: "ratio", peer: "Strata FilesystemBackend", min: 1 / OVERHEAD, text: `overhead ≤ ${OVERHEAD}×` },
        notes: ["The overlay greps the disk, drops the matches in files its layer deletes or replaces, and adds the layer's own (none of the deleted or written files holds the needle, so the counts agree)."],
      }),
    );
    results.push(...(await commandCases(ctx, this.name)));
    return results;
  },
};

/**
 * OverlaySandbox: opening it copies the overlay's view into a scratch
 * directory; each command then pays a listing of that scratch. Over a 5k-file
 * tree in both sizes (a copy of 50k files would take the whole budget).
 */
async function commandCases(ctx: GroupContext, group: string): Promise<CaseResult[]> {
  const fileCount = 5_000;
  const root = await generatedTree(ctx, fileCount);
  const common = { group, reps: ctx.reps };
  const results: CaseResult[] = [];
  const overlay = new OverlayBackend({ workspace: root, permissions: false });
  const bwrap = await BubblewrapSandbox.isAvailable();
  const make = (dir: string) => (bwrap ? new BubblewrapSandbox({ workspace: dir, permissions: false }) : new LocalSandbox({ workspace: dir, permissions: false }));
  const copies = await mkdtemp(join(tmpdir(), "strata-bench-overlay-copy-"));
  let c = 0;
  ctx.log("overlay: open an OverlaySandbox (copy the view)");
  try {
    results.push(
      await compare({
        ...common,
        name: `OverlaySandbox.open over a ${fileCount / 1000}k-file tree`,
        strata: {
          name: "Strata OverlaySandbox.open",
          run: async () => {
            const sandbox = await OverlaySandbox.open({ overlay, sandbox: make });
            await sandbox.close();
            return 1;
          },
        },
        peers: [
          {
            name: "cp -r of the tree (fs.cp)",
            run: async () => {
              const to = join(copies, `c${c++}`);
              await cp(root, to, { recursive: true });
              await rm(to, { recursive: true, force: true });
              return 1;
            },
          },
        ],
        notes: ["Opening reads every file of the view through the overlay, writes it into a fresh scratch directory and lists and hashes the copy; closing removes it. The peer is the plain copy a `git stash`-style snapshot would make (and its removal)."],
      }),
    );
  } finally {
    await rm(copies, { recursive: true, force: true });
  }
  const sandbox = await OverlaySandbox.open({ overlay, sandbox: make });
  const plainDir = await mkdtemp(join(tmpdir(), "strata-bench-overlay-plain-"));
  const plain = make(plainDir);
  const run = async (target: { execute: OverlaySandbox["execute"] }) => {
    const got = await target.execute("true");
    if (got.error || got.exitCode !== 0) throw new Error(got.error?.message ?? `exit ${got.exitCode}`);
    return 1;
  };
  ctx.log("overlay: execute `true` through an OverlaySandbox");
  try {
    const kind = bwrap ? "BubblewrapSandbox" : "LocalSandbox";
    results.push(
      await compare({
        ...common,
        name: `execute \`true\` over a ${fileCount / 1000}k-file view`,
        strata: { name: `Strata OverlaySandbox (over ${kind})`, run: () => run(sandbox) },
        peers: [{ name: `Strata ${kind}`, run: () => run(plain) }],
        notes: [`Each command through the overlay lists the ${fileCount / 1000}k-file scratch afterwards (stat only: nothing changed, nothing is read). The plain sandbox runs in an empty workspace of its own.`],
      }),
    );
  } finally {
    await sandbox.close();
    await plain.close();
    await rm(plainDir, { recursive: true, force: true });
  }
  return results;
}
