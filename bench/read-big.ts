/**
 * Child-process tasks for the large-file read case (see runInChild): each
 * opens one backend over the big file's directory, reads the same window of
 * lines, and reports the time and peak memory the reads cost that process.
 * Kept apart from filesystem.ts so a child loads only the backend it measures.
 */
import type { ChildTask, MemoryProbe } from "./harness.js";

export interface ReadArgs {
  root: string;
  path: string;
  offset: number;
  limit: number;
  reps: number;
  budgetMs: number;
}

export interface ReadOutcome {
  /** Peak RSS above the baseline during the first read. */
  extraMB: number;
  firstMs: number;
  /** Later reads (the first is a warm-up for timing). */
  times: number[];
  /** `cat -n` lines returned, or the error the backend gave. */
  lines?: string[];
  error?: string;
}

type ReadOnce = () => Promise<{ lines: string[] } | { error: string }>;

async function timedReads(read: ReadOnce, args: ReadArgs, probe: MemoryProbe): Promise<ReadOutcome> {
  probe.start();
  let t0 = performance.now();
  const first = await read();
  const firstMs = performance.now() - t0;
  const extraMB = probe.peakExtraMB();
  if ("error" in first) return { extraMB, firstMs, times: [], error: first.error };
  const times: number[] = [];
  let spent = firstMs;
  while (times.length < args.reps && (times.length < 3 || spent < args.budgetMs)) {
    t0 = performance.now();
    await read();
    const elapsed = performance.now() - t0;
    spent += elapsed;
    times.push(elapsed);
  }
  return { extraMB, firstMs, times, lines: first.lines };
}

export const strataRead: ChildTask<ReadArgs, ReadOutcome> = async (args, probe) => {
  const { FilesystemBackend } = await import("../backends/filesystem.js");
  const { toSeedProtocol } = await import("../core/seed.js");
  // deepagents is read in the seed shape (its lines numbered as `cat -n`), so Strata is too: the seeds' read through toSeedProtocol.
  const backend = toSeedProtocol(new FilesystemBackend({ workspace: args.root, virtualMode: true }));
  return timedReads(
    async () => {
      const text = await backend.read(args.path, args.offset, args.limit);
      return text.startsWith("Error:") ? { error: text } : { lines: text.split("\n") };
    },
    args,
    probe,
  );
};

export const deepagentsRead: ChildTask<ReadArgs, ReadOutcome> = async (args, probe) => {
  const { FilesystemBackend } = await import("deepagents");
  const backend = new FilesystemBackend({ rootDir: args.root, virtualMode: true });
  return timedReads(
    async () => {
      const result = await backend.read(args.path, args.offset, args.limit);
      if (result.error !== undefined || typeof result.content !== "string") return { error: result.error ?? "no text content" };
      // deepagents returns the raw lines; number them as Strata does so the two can be compared.
      return { lines: result.content.split("\n").map((line, i) => `${String(args.offset + i + 1).padStart(6, " ")}\t${line}`) };
    },
    args,
    probe,
  );
};
