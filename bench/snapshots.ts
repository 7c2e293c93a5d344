/**
 * Snapshots and fork at 100k files (issue 13's targets: a snapshot of 100k
 * files in < 1 ms and < 1 MB of extra memory): StateBackend, MemoryStore and
 * SqliteStore, each against a `git stash`-style baseline that copies the whole
 * tree (a deep copy of the records in memory; a copy of the database file for
 * SQLite). agentfs-sdk (0.6.4, the TypeScript SDK) has no snapshot, overlay or
 * fork: its copy-on-write overlay lives in the Rust CLI's mounts. The one
 * checkpoint its SDK allows is copying its database file, measured here at a
 * size its writes can fill in reasonable time (about 20 ms per write here).
 *
 * Each snapshot is timed alone, call by call (p50 and p99), with one file
 * overwritten before it outside the timing, so no call returns the previous id
 * for free. Extra memory is the JS heap kept per snapshot after a full GC
 * (the replaced record included), measured over 200 snapshots.
 */
import { copyFileSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { AgentFS } from "agentfs-sdk";
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import { MemoryStore } from "../stores/memory.js";
import { SqliteStore } from "../stores/sqlite.js";
import { type BenchGroup, type CaseResult, collectGarbage, type ContenderResult, type GroupContext, median, percentile } from "./harness.js";

const NAMESPACE = ["bench"];

function fileText(i: number): string {
  return `alpha beta gamma ${i}\nthe quick brown fox jumps over the lazy dog\nlast line ${i}\n`;
}

function pathOf(i: number): string {
  return `/dir${i % 100}/f${i}.txt`;
}

/** Live JS heap after a full GC, in MB. */
function heapMB(): number {
  collectGarbage();
  collectGarbage();
  return process.memoryUsage().heapUsed / 2 ** 20;
}

/**
 * Times `op` call by call (`before` runs untimed ahead of each call) and
 * measures the heap kept per call over `memoryRuns` more calls, whose answers
 * are kept alive.
 */
async function measure(
  name: string,
  options: { runs: number; memoryRuns: number; before?: (i: number) => unknown; op: () => unknown; count?: number; note?: string },
): Promise<ContenderResult> {
  const result: ContenderResult = { name, medianMs: NaN, samples: 0, count: options.count ?? 1 };
  try {
    for (let i = 0; i < 3; i++) {
      await options.before?.(i);
      await options.op();
    }
    const times: number[] = [];
    for (let i = 0; i < options.runs; i++) {
      if (i % 50 === 0) collectGarbage();
      await options.before?.(i);
      const t0 = performance.now();
      await options.op();
      times.push(performance.now() - t0);
    }
    result.medianMs = median(times);
    result.p99Ms = percentile(times, 99);
    result.samples = times.length;
    const kept: unknown[] = [];
    const start = heapMB();
    for (let i = 0; i < options.memoryRuns; i++) {
      await options.before?.(options.runs + i);
      kept.push(await options.op());
    }
    result.extraMB = Math.max(0, (heapMB() - start) / options.memoryRuns);
    kept.length = 0;
  } catch (error) {
    result.failed = error instanceof Error ? error.message : String(error);
  }
  if (options.note) result.note = options.note;
  return result;
}

/** A deep copy of every record: what a snapshot costs that copies the tree, as `git stash` writes every changed file out. */
function copyTree(files: Record<string, unknown>): Record<string, unknown> {
  return structuredClone(files);
}

/** The database file (and its WAL) copied aside: a checkpoint of a file-backed store by copying. */
function copyDatabase(path: string, to: string): number {
  let bytes = 0;
  for (const suffix of ["", "-wal"]) {
    try {
      copyFileSync(path + suffix, to + suffix);
      bytes += statSync(to + suffix).size;
    } catch (error) {
      if ((error as { code?: string }).code !== "ENOENT") throw error;
    }
  }
  return bytes;
}

export const snapshotsGroup: BenchGroup = {
  name: "snapshots",
  title: "Snapshots and fork",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const total = ctx.quick ? 10_000 : 100_000;
    const label = `${total / 1000}k files`;
    const runs = ctx.quick ? 200 : 1000;
    const memoryRuns = 200;
    const copyRuns = ctx.quick ? 3 : 5;
    const dir = mkdtempSync(join(ctx.cacheDir, "snapshots-"));
    const results: CaseResult[] = [];
    const group = this.name;
    const snapshotTarget = { kind: "absolute" as const, maxMs: 1, text: "< 1 ms" };
    const memoryNote = "extra memory: JS heap kept per snapshot after a full GC, over 200 snapshots (the record each edit replaced included)";
    try {
      ctx.log(`filling StateBackend, MemoryStore and SQLite with ${label}`);
      const state = new StateBackend();
      const memory = new StoreBackend({ store: new MemoryStore(), namespace: NAMESPACE });
      const sqlitePath = join(dir, "strata.db");
      const sqliteStore = new SqliteStore({ path: sqlitePath });
      const sqlite = new StoreBackend({ store: sqliteStore, namespace: NAMESPACE });
      const batch: Array<[string, Uint8Array]> = [];
      const encoder = new TextEncoder();
      for (let i = 0; i < total; i++) {
        const path = pathOf(i);
        const text = fileText(i);
        await state.write(path, text);
        await memory.write(path, text);
        batch.push([path, encoder.encode(text)]);
        if (batch.length === 5000 || i === total - 1) {
          const answers = await sqlite.uploadFiles(batch);
          if (answers.error || answers.files.some((a) => a.error)) throw new Error("SQLite fill failed");
          batch.length = 0;
        }
      }
      const edit = (backend: StateBackend | StoreBackend) => async (i: number) => {
        const n = (i * 7919) % total;
        await backend.write(pathOf(n), `${fileText(n)}edit ${i}\n`, { overwrite: true });
      };
      const stateFiles = { ...state.files } as Record<string, unknown>;

      ctx.log(`snapshot of ${label}`);
      const deepCopy = await measure("`git stash`-style: copy every record", { runs: copyRuns, memoryRuns: 2, op: () => copyTree(stateFiles) });
      results.push({
        group,
        name: `snapshot() of ${label}, one file changed since the last: StateBackend (time; extra memory per snapshot)`,
        strata: await measure("Strata StateBackend", { runs, memoryRuns, before: edit(state), op: () => state.snapshot() }),
        peers: [deepCopy],
        target: snapshotTarget,
        warnings: [],
        notes: [memoryNote, "The copy baseline is structuredClone of the files map: every record and its text copied, as a snapshot that copies the tree must."],
      });
      const memoryStore = memory.store as MemoryStore;
      results.push({
        group,
        name: `snapshot() of ${label}, one file changed since the last: StoreBackend over MemoryStore`,
        strata: await measure("Strata MemoryStore", { runs, memoryRuns, before: edit(memory), op: () => memory.snapshot() }),
        peers: [deepCopy],
        target: snapshotTarget,
        warnings: [],
      });
      const copyTo = join(dir, "copy.db");
      results.push({
        group,
        name: `snapshot() of ${label}, one file changed since the last: StoreBackend over SqliteStore (a file)`,
        strata: await measure("Strata SqliteStore", {
          runs: Math.min(runs, 300),
          memoryRuns,
          before: edit(sqlite),
          op: () => sqlite.snapshot(),
          note: "the id is a row on disk; each change after it keeps the replaced row in the history table",
        }),
        peers: [await measure("`git stash`-style: copy the database file", { runs: copyRuns, memoryRuns: 1, op: () => void copyDatabase(sqlitePath, copyTo) })],
        target: snapshotTarget,
        warnings: [],
      });
      results.push({
        group,
        name: `extra memory of one snapshot of ${label} (StateBackend)`,
        strata: results[0]!.strata,
        peers: [deepCopy],
        target: { kind: "memory", maxMB: 1, text: "< 1 MB" },
        warnings: [],
        notes: ["The same measurement as the snapshot case above: its heap kept per snapshot, against one deep copy of the tree."],
      });

      ctx.log(`fork of ${label}`);
      results.push({
        group,
        name: `fork() of ${label}: StateBackend (time; extra memory per fork)`,
        strata: await measure("Strata StateBackend", { runs: copyRuns, memoryRuns: 2, op: () => state.fork() }),
        peers: [deepCopy],
        warnings: [],
        notes: ["A fork copies the key table (pointers) and shares every record."],
      });
      results.push({
        group,
        name: `fork() of ${label}: MemoryStore`,
        strata: await measure("Strata MemoryStore", { runs: copyRuns, memoryRuns: 2, op: () => memoryStore.fork() }),
        peers: [deepCopy],
        warnings: [],
      });

      ctx.log(`restore across 1000 changes, ${label}`);
      const restorePair = async (backend: { snapshot(): string | Promise<string>; restore(id: string): unknown }, before: (i: number) => Promise<void>) => {
        const from = await backend.snapshot();
        for (let i = 0; i < 1000; i++) await before(i);
        const to = await backend.snapshot();
        return async () => {
          await backend.restore(from);
          await backend.restore(to);
        };
      };
      for (const [name, backend] of [
        ["StateBackend", state],
        ["MemoryStore", memory],
        ["SqliteStore", sqlite],
      ] as const) {
        const pair = await restorePair(backend, edit(backend));
        results.push({
          group,
          name: `restore() back 1000 changed files and forward again, ${label}: ${name}`,
          strata: await measure(`Strata ${name}`, { runs: 5, memoryRuns: 1, op: pair }),
          peers: name === "SqliteStore" ? [] : [deepCopy],
          warnings: [],
          notes: name === "StateBackend" ? ["Two restores per call (back, then forward), so the state is the same at every call."] : undefined,
        });
      }
      await sqliteStore.close();

      const small = ctx.quick ? 200 : 1000;
      ctx.log(`agentfs-sdk: filling ${small} files (its writes are slow)`);
      const agentPath = join(dir, "agentfs.db");
      const agentfs = await AgentFS.open({ path: agentPath });
      const smallPath = join(dir, "small.db");
      const smallStore = new SqliteStore({ path: smallPath });
      const smallBackend = new StoreBackend({ store: smallStore, namespace: NAMESPACE });
      for (let i = 0; i < small; i++) {
        await agentfs.fs.writeFile(pathOf(i), fileText(i));
        await smallBackend.write(pathOf(i), fileText(i));
      }
      const smallEdit = async (i: number) => {
        const n = (i * 7919) % small;
        await smallBackend.write(pathOf(n), `${fileText(n)}edit ${i}\n`, { overwrite: true });
      };
      results.push({
        group,
        name: `snapshot of ${small} files, one changed since the last: SqliteStore against agentfs-sdk`,
        strata: await measure("Strata SqliteStore", { runs: 200, memoryRuns: 50, before: smallEdit, op: () => smallBackend.snapshot() }),
        peers: [
          await measure("agentfs-sdk: copy its database file (its SDK has no snapshot)", {
            runs: 20,
            memoryRuns: 1,
            op: () => void copyDatabase(agentPath, join(dir, "agentfs-copy.db")),
          }),
        ],
        target: snapshotTarget,
        warnings: [],
        notes: [
          "agentfs-sdk 0.6.4 offers no snapshot, overlay or fork in its TypeScript API (its copy-on-write overlay is a mount of the Rust CLI); " +
            "copying its database file (and WAL) is the checkpoint it allows. It is filled with fewer files because each of its writes takes about 20 ms here.",
        ],
      });
      await agentfs.close();
      await smallStore.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    return results;
  },
};
