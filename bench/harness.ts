/**
 * What every benchmark group shares: the case and result shapes, interleaved
 * timing with medians, and peak-memory measurement in a child process.
 *
 * It lives apart from bench/index.ts (the runner) because the groups need these
 * helpers and the runner imports the groups: one file would make an import cycle.
 */
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

// ---------------------------------------------------------------- shapes

export interface GroupContext {
  /** Smaller data and fewer repetitions, for a quick look. */
  quick: boolean;
  /** Timed samples per contender (warm-up runs come on top; fast contenders take up to 3 times as many). */
  reps: number;
  /** Where generated data is kept between runs (never inside the repository). */
  cacheDir: string;
  log(message: string): void;
}

/** A group of cases, registered in bench/index.ts. */
export interface BenchGroup {
  name: string;
  title: string;
  run(ctx: GroupContext): Promise<CaseResult[]>;
}

/**
 * One implementation under test. `run` performs the operation once and returns
 * the size of its answer (entries, matches, lines), which must agree across contenders.
 */
export interface Contender {
  name: string;
  run: () => number | Promise<number>;
}

export type Target =
  /** ratio = peer median / Strata median must be >= min (min 100 reads ">= 100x faster"). */
  | { kind: "ratio"; peer: string; min: number; text: string }
  /** Strata's peak extra memory must stay below maxMB. */
  | { kind: "memory"; maxMB: number; text: string }
  /** Strata's median (p50) must be at most maxMs. */
  | { kind: "absolute"; maxMs: number; text: string }
  /** Something the group checked itself (a count of round trips, say); `met` is its verdict. */
  | { kind: "check"; met: boolean; text: string };

export interface ContenderResult {
  name: string;
  /** Median of the timed samples, per operation. */
  medianMs: number;
  /** 99th percentile of per-call samples, where each sample is one call (see `latency`). */
  p99Ms?: number;
  samples: number;
  /** Size of the answer (from the warm-up run). */
  count?: number;
  /** Peak resident memory above the process's baseline while doing the operation. */
  extraMB?: number;
  /** Set when the contender could not do the operation; no ratio is given then. */
  failed?: string;
  note?: string;
}

export interface CaseResult {
  group: string;
  name: string;
  strata: ContenderResult;
  peers: ContenderResult[];
  target?: Target;
  warnings: string[];
  /** How the contenders were driven, where a reader needs to know to judge the numbers. */
  notes?: string[];
}

// ---------------------------------------------------------------- timing

let collect: (() => void) | undefined;

/** A full GC before each sample, so garbage one contender leaves is not billed to the next. */
export function collectGarbage(): void {
  if (!collect) {
    setFlagsFromString("--expose-gc");
    collect = runInNewContext("gc") as () => void;
  }
  collect();
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export interface CompareOptions {
  group: string;
  name: string;
  strata: Contender;
  peers: Contender[];
  target?: Target;
  notes?: string[];
  reps: number;
  /** Untimed runs before sampling (JIT, caches, lazily built indexes). */
  warmup?: number;
  /** Fast operations are repeated within one sample until it lasts this long, so timer resolution does not matter. */
  minSampleMs?: number;
  /** A contender stops sampling once its samples add up to this much (after at least 3). */
  budgetMs?: number;
  /** At most this many samples per contender (default 3 × reps); for operations whose state grows with every run. */
  maxSamples?: number;
  /** A contender past its budget stops after this many samples (default 3); 1 for operations that take minutes. */
  minSamples?: number;
}

/** How long a contender may have spent and still take samples past `reps`. */
const EXTRA_SAMPLING_MS = 2000;

interface Runner {
  contender: Contender;
  result: ContenderResult;
  times: number[];
  inner: number;
  spent: number;
}

/**
 * Runs Strata and its peers on the same operation, interleaving their samples
 * round by round (order alternating) so that noise from the shared machine
 * falls on all of them alike. Checks that all answers have the same size.
 */
export async function compare(options: CompareOptions): Promise<CaseResult> {
  const { reps, warmup = 2, minSampleMs = 50, budgetMs = 20_000, maxSamples = reps * 3, minSamples = 3 } = options;
  const warnings: string[] = [];
  const runners: Runner[] = [];
  for (const contender of [options.strata, ...options.peers]) {
    const result: ContenderResult = { name: contender.name, medianMs: NaN, samples: 0 };
    const runner: Runner = { contender, result, times: [], inner: 1, spent: 0 };
    runners.push(runner);
    try {
      // The first run may build lazy indexes; only the last warm-up run says how long one run takes.
      let last = 0;
      for (let i = 0; i < Math.max(1, warmup); i++) {
        const t0 = performance.now();
        result.count = await contender.run();
        last = performance.now() - t0;
        // A slow operation needs no second warm-up run to be timed fairly, and would cost the budget twice.
        if (last > budgetMs / 10) break;
      }
      // A run longer than the whole budget is a fair sample itself: what warming up would save is lost in it.
      if (last > budgetMs) {
        runner.times.push(last);
        runner.spent += last;
      }
      runner.inner = last >= minSampleMs ? 1 : Math.min(1000, Math.ceil(minSampleMs / Math.max(last, 0.001)));
    } catch (error) {
      result.failed = describeError(error);
    }
  }

  // After `reps` rounds, cheap contenders go on sampling (up to 3 × reps): more samples steady a median on a noisy machine.
  for (let round = 0; round < maxSamples; round++) {
    const order = round % 2 === 0 ? runners : [...runners].reverse();
    for (const runner of order) {
      if (runner.result.failed) continue;
      if (runner.times.length >= minSamples && runner.spent >= budgetMs) continue;
      if (round >= reps && runner.spent >= EXTRA_SAMPLING_MS) continue;
      collectGarbage();
      const t0 = performance.now();
      try {
        for (let i = 0; i < runner.inner; i++) await runner.contender.run();
      } catch (error) {
        runner.result.failed = describeError(error);
        continue;
      }
      const elapsed = performance.now() - t0;
      runner.spent += elapsed;
      runner.times.push(elapsed / runner.inner);
    }
  }

  for (const runner of runners) {
    runner.result.samples = runner.times.length;
    if (runner.times.length > 0) runner.result.medianMs = median(runner.times);
  }
  const [strata, ...peers] = runners.map((r) => r.result);
  checkCounts(strata!, peers, warnings);
  return { group: options.group, name: options.name, strata: strata!, peers, target: options.target, warnings, notes: options.notes };
}

export function percentile(values: readonly number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export interface LatencyContender extends Contender {
  /** Timed calls (default: the case's runs); a slow contender may take fewer. */
  runs?: number;
}

/**
 * Per-call latency: each sample is one call (no batching, unlike `compare`),
 * so the tail is seen; gives p50 (as medianMs) and p99. Contenders take turns
 * call by call, so noise on the shared machine falls on all of them alike.
 */
export async function latency(options: Omit<CompareOptions, "strata" | "peers" | "reps"> & { strata: LatencyContender; peers: LatencyContender[]; runs: number }): Promise<CaseResult> {
  const { warmup = 3 } = options;
  const warnings: string[] = [];
  const entries = [options.strata, ...options.peers].map((contender) => ({
    contender,
    result: { name: contender.name, medianMs: NaN, samples: 0 } as ContenderResult,
    times: [] as number[],
    runs: contender.runs ?? options.runs,
  }));
  for (const entry of entries) {
    try {
      for (let i = 0; i < warmup; i++) entry.result.count = await entry.contender.run();
    } catch (error) {
      entry.result.failed = describeError(error);
    }
  }
  const rounds = Math.max(...entries.map((e) => e.runs));
  for (let round = 0; round < rounds; round++) {
    // One collection per round, outside the timed calls, so a GC pause is less likely to land in one.
    if (round % 10 === 0) collectGarbage();
    const order = round % 2 === 0 ? entries : [...entries].reverse();
    for (const entry of order) {
      if (entry.result.failed || entry.times.length >= entry.runs) continue;
      const t0 = performance.now();
      try {
        await entry.contender.run();
      } catch (error) {
        entry.result.failed = describeError(error);
        continue;
      }
      entry.times.push(performance.now() - t0);
    }
  }
  for (const { result, times } of entries) {
    result.samples = times.length;
    if (times.length > 0) {
      result.medianMs = median(times);
      result.p99Ms = percentile(times, 99);
    }
  }
  const [strata, ...peers] = entries.map((e) => e.result);
  checkCounts(strata!, peers, warnings);
  return { group: options.group, name: options.name, strata: strata!, peers, target: options.target, warnings, notes: options.notes };
}

/** Adds a warning for each contender whose answer differs in size from Strata's. */
export function checkCounts(strata: ContenderResult, peers: readonly ContenderResult[], warnings: string[]): void {
  if (strata.failed) warnings.push(`Strata failed: ${strata.failed}`);
  for (const peer of peers) {
    if (peer.failed) warnings.push(`${peer.name} failed: ${peer.failed}`);
    else if (!strata.failed && peer.count !== strata.count) {
      warnings.push(`result size differs: Strata ${strata.count}, ${peer.name} ${peer.count}`);
    }
  }
}

export function describeError(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.length > 160 ? `${message.slice(0, 157)}...` : message;
}

/** Counts lines of command output (a final newline does not start another). */
export function countLines(text: string): number {
  if (text === "") return 0;
  let n = 0;
  for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) n++;
  return text.endsWith("\n") ? n : n + 1;
}

// ---------------------------------------------------------------- external commands

export interface CommandOutput {
  stdout: string;
  stderr: string;
  code: number | null;
}

/** Runs a command without a shell and collects its output. */
export function runCommand(command: string, args: readonly string[], cwd?: string): Promise<CommandOutput> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => err.push(chunk));
    child.on("error", reject);
    child.on("close", (code) =>
      resolve({ stdout: Buffer.concat(out).toString("utf8"), stderr: Buffer.concat(err).toString("utf8"), code }),
    );
  });
}

/** Whether a command can be started (e.g. `rg --version`). */
export async function commandAvailable(command: string, args: readonly string[] = ["--version"]): Promise<boolean> {
  try {
    return (await runCommand(command, args)).code === 0;
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------- generated data

/** Generated data lives under the OS temp directory, reused across runs, never in the repository. */
export function defaultCacheDir(): string {
  return process.env.STRATA_BENCH_CACHE ?? join(tmpdir(), "strata-bench");
}

/**
 * Returns `dir` after making sure `build(dir)` has completed there once. A
 * marker file written beside `dir` (not inside it, so searches never see it)
 * records completion; an interrupted build is redone.
 */
export async function cached(dir: string, build: (dir: string) => Promise<void> | void, log: (m: string) => void): Promise<string> {
  const marker = `${dir}.done`;
  try {
    readFileSync(marker);
    return dir;
  } catch {
    // not built yet
  }
  log(`generating ${dir} (once; reused by later runs)`);
  mkdirSync(dirname(dir), { recursive: true });
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  await build(dir);
  writeFileSync(marker, new Date().toISOString());
  return dir;
}

// ---------------------------------------------------------------- memory

export interface MemoryStatus {
  /** Resident set size now (VmRSS). */
  rssMB: number;
  /** Peak resident set size since start or since the last resetPeak (VmHWM). */
  peakMB: number;
}

/** Reads VmRSS and VmHWM of a process from /proc (Linux). */
export function memoryStatus(pid: number | "self" = "self"): MemoryStatus | undefined {
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return undefined;
  }
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
  return { rssMB: kb("VmRSS") / 1024, peakMB: kb("VmHWM") / 1024 };
}

/**
 * Resets this process's peak RSS (VmHWM) to its current RSS by writing 5 to
 * /proc/self/clear_refs (Linux >= 4.0), so a later peak belongs to what ran
 * in between. Returns false where that is not possible.
 */
export function resetPeak(): boolean {
  try {
    writeFileSync("/proc/self/clear_refs", "5");
    return true;
  } catch {
    return false;
  }
}

/** Handed to a task running in a child process. */
export interface MemoryProbe {
  /** Resets the peak and returns the RSS it starts from; peakExtraMB is measured from here. */
  start(): number;
  /** Peak RSS above the value start() returned. Conservative (too high) where the peak cannot be reset. */
  peakExtraMB(): number;
}

function createProbe(): MemoryProbe {
  let baseline = 0;
  let resettable = false;
  return {
    start() {
      collectGarbage();
      resettable = resetPeak();
      baseline = memoryStatus()?.rssMB ?? process.memoryUsage().rss / 2 ** 20;
      return baseline;
    },
    peakExtraMB() {
      const peak = resettable ? memoryStatus()?.peakMB : undefined;
      return (peak ?? process.resourceUsage().maxRSS / 1024) - baseline;
    },
  };
}

/** A function a child process runs: exported from a module, given JSON arguments, returning JSON. */
export type ChildTask<A, R> = (args: A, probe: MemoryProbe) => Promise<R>;

export interface ChildOutcome<R> {
  result?: R;
  /** Why there is no result: killed by the guard, crashed, or threw. */
  failed?: string;
  /** The highest RSS the parent saw while polling (a cross-check of the child's own figure). */
  polledPeakMB: number;
}

const CHILD_ENTRY = join(dirname(fileURLToPath(import.meta.url)), "child.ts");
const RESULT_MARKER = "\u0000strata-bench-result\u0000";

/**
 * Runs `exportName` from `modulePath` in a fresh Node process, so its memory
 * is its own and a peer that loads a whole file cannot take the benchmark
 * down: the child is killed when its RSS passes memLimitMB or it runs past
 * timeoutMs.
 */
export function runInChild<A, R>(
  modulePath: string,
  exportName: string,
  args: A,
  limits: { memLimitMB: number; timeoutMs: number },
): Promise<ChildOutcome<R>> {
  return new Promise((resolve) => {
    // From the repository root, where `--import tsx` resolves to the project's tsx.
    const child = spawn(process.execPath, ["--import", "tsx", CHILD_ENTRY, modulePath, exportName, JSON.stringify(args)], {
      cwd: dirname(dirname(CHILD_ENTRY)),
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    let polledPeakMB = 0;
    let killedFor: string | undefined;
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString("utf8")).slice(-2000)));
    const kill = (reason: string) => {
      killedFor ??= reason;
      child.kill("SIGKILL");
    };
    const poll = setInterval(() => {
      const status = child.pid === undefined ? undefined : memoryStatus(child.pid);
      if (!status) return;
      polledPeakMB = Math.max(polledPeakMB, status.rssMB);
      if (status.rssMB > limits.memLimitMB) kill(`killed by the guard at ${Math.round(status.rssMB)} MB RSS (limit ${limits.memLimitMB} MB)`);
    }, 20);
    const timer = setTimeout(() => kill(`killed by the guard after ${limits.timeoutMs / 1000} s`), limits.timeoutMs);
    child.on("close", (code, signal) => {
      clearInterval(poll);
      clearTimeout(timer);
      const at = stdout.lastIndexOf(RESULT_MARKER);
      if (killedFor) return resolve({ failed: killedFor, polledPeakMB });
      if (at === -1) {
        const last = stderr.trim().split("\n").slice(-3).join(" | ");
        return resolve({ failed: `child exited (${signal ?? code}): ${last}`, polledPeakMB });
      }
      const payload = JSON.parse(stdout.slice(at + RESULT_MARKER.length)) as { result?: R; error?: string };
      resolve(payload.error !== undefined ? { failed: payload.error, polledPeakMB } : { result: payload.result as R, polledPeakMB });
    });
  });
}

/** Used by bench/child.ts: runs the task and prints its result after the marker. */
export async function childMain(argv: readonly string[]): Promise<void> {
  const [modulePath, exportName, json] = argv;
  let payload: { result?: unknown; error?: string };
  try {
    const mod = (await import(pathToFileURL(modulePath!).href)) as Record<string, unknown>;
    const task = mod[exportName!];
    if (typeof task !== "function") throw new Error(`${modulePath} has no export ${exportName}`);
    payload = { result: await (task as ChildTask<unknown, unknown>)(JSON.parse(json!), createProbe()) };
  } catch (error) {
    payload = { error: describeError(error) };
  }
  process.stdout.write(RESULT_MARKER + JSON.stringify(payload));
}

// ---------------------------------------------------------------- formatting

export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return "—";
  if (ms >= 1000) return `${(ms / 1000).toFixed(ms >= 10_000 ? 1 : 2)} s`;
  if (ms >= 100) return `${ms.toFixed(0)} ms`;
  if (ms >= 10) return `${ms.toFixed(1)} ms`;
  if (ms >= 1) return `${ms.toFixed(2)} ms`;
  return `${(ms * 1000).toFixed(ms >= 0.1 ? 0 : 1)} µs`;
}

export function formatMB(mb: number): string {
  return `${mb >= 100 ? mb.toFixed(0) : mb.toFixed(1)} MB`;
}

export function formatRatio(ratio: number): string {
  if (!Number.isFinite(ratio)) return "—";
  if (ratio >= 100) return `${ratio.toFixed(0)}×`;
  if (ratio >= 10) return `${ratio.toFixed(1)}×`;
  return `${ratio.toFixed(2)}×`;
}
