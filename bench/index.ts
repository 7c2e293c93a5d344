/**
 * `npm run bench`: runs the same workloads against Strata and its peers in one
 * run and prints, per case, both medians and the ratio (peer / Strata, so > 1
 * means Strata is faster), then writes the table to bench/results.md.
 *
 *   npm run bench                          every group, full sizes (~10 min on 2 cores)
 *   npm run bench -- --quick               smaller data, fewer repetitions
 *   npm run bench -- --only state,filesystem
 *   npm run bench -- --reps 9 --out /tmp/bench.md
 *
 * A partial run (--only or --quick) prints its table but writes a file only with --out,
 * so it never overwrites the full results.
 */
import { writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import {
  type BenchGroup,
  type CaseResult,
  type ContenderResult,
  defaultCacheDir,
  formatMB,
  formatMs,
  formatRatio,
  type GroupContext,
} from "./harness.js";

/**
 * Every group, loaded only when selected (a group may need a service, such as
 * dockerd, that a run of other groups should not). To add one: write
 * bench/<name>.ts exporting a BenchGroup, and add a line here.
 */
const GROUPS: ReadonlyArray<{ name: string; load: () => Promise<BenchGroup> }> = [
  { name: "state", load: async () => (await import("./state.js")).stateGroup },
  { name: "filesystem", load: async () => (await import("./filesystem.js")).filesystemGroup },
  { name: "overlay", load: async () => (await import("./overlay.js")).overlayGroup },
  { name: "store", load: async () => (await import("./store.js")).storeGroup },
  { name: "snapshots", load: async () => (await import("./snapshots.js")).snapshotsGroup },
  { name: "sandbox", load: async () => (await import("./sandbox.js")).sandboxGroup },
  { name: "runtime", load: async () => (await import("./runtime.js")).runtimeGroup },
  { name: "import", load: async () => (await import("./imports.js")).importGroup },
  { name: "mcp", load: async () => (await import("./mcp.js")).mcpGroup },
];

interface Options {
  only?: string[];
  quick: boolean;
  reps?: number;
  out?: string;
}

function parseArgs(argv: readonly string[]): Options {
  const options: Options = { quick: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = () => {
      const next = argv[++i];
      if (next === undefined) throw new Error(`${arg} needs a value`);
      return next;
    };
    if (arg === "--quick") options.quick = true;
    else if (arg === "--only") options.only = value().split(",").filter(Boolean);
    else if (arg === "--reps") options.reps = Number(value());
    else if (arg === "--out") options.out = value();
    else if (arg === "--help" || arg === "-h") {
      console.log("usage: npm run bench -- [--quick] [--only group[,group]] [--reps N] [--out file.md]");
      console.log(`groups: ${GROUPS.map((g) => g.name).join(", ")}`);
      process.exit(0);
    } else throw new Error(`unknown argument ${arg} (try --help)`);
  }
  if (options.reps !== undefined && (!Number.isInteger(options.reps) || options.reps < 1)) throw new Error("--reps needs a positive integer");
  for (const name of options.only ?? []) {
    if (!GROUPS.some((g) => g.name === name)) throw new Error(`unknown group ${name}; groups: ${GROUPS.map((g) => g.name).join(", ")}`);
  }
  return options;
}

// ---------------------------------------------------------------- table

interface Row {
  group: string;
  caseName: string;
  strata: string;
  peer: string;
  peerValue: string;
  ratio: string;
  target: string;
  met: string;
}

function cell(result: ContenderResult): string {
  if (result.failed && !Number.isFinite(result.medianMs)) return `failed: ${result.failed}`;
  // A figure that is not a time (bytes held, say) is the note alone.
  if (!Number.isFinite(result.medianMs) && result.note) return result.note;
  let text = result.p99Ms === undefined ? formatMs(result.medianMs) : `p50 ${formatMs(result.medianMs)}, p99 ${formatMs(result.p99Ms)}`;
  if (result.extraMB !== undefined) text += `, +${formatMB(result.extraMB)} peak`;
  if (result.failed) text += ` (failed: ${result.failed})`;
  if (result.note) text += ` (${result.note})`;
  return text;
}

function ratioOf(strata: ContenderResult, peer: ContenderResult): number {
  if (strata.failed || peer.failed) return NaN;
  return peer.medianMs / strata.medianMs;
}

function rowsOf(result: CaseResult, quick: boolean): Row[] {
  const { strata, target } = result;
  const peers = result.peers.length > 0 ? result.peers : [undefined];
  return peers.map((peer, i) => {
    const ratio = peer ? ratioOf(strata, peer) : NaN;
    let targetText = "";
    let met = "";
    if (target?.kind === "ratio" && peer?.name === target.peer) {
      targetText = target.text;
      met = Number.isFinite(ratio) ? (ratio >= target.min ? "✅ met" : "❌ not met") : "❌ no result";
    } else if (target?.kind === "memory" && i === 0) {
      targetText = target.text;
      met = strata.extraMB !== undefined && !strata.failed ? (strata.extraMB < target.maxMB ? "✅ met" : "❌ not met") : "❌ no result";
    } else if (target?.kind === "absolute" && i === 0) {
      targetText = target.text;
      met = Number.isFinite(strata.medianMs) && !strata.failed ? (strata.medianMs <= target.maxMs ? "✅ met" : "❌ not met") : "❌ no result";
    } else if (target?.kind === "check" && i === 0) {
      targetText = target.text;
      met = target.met ? "✅ met" : "❌ not met";
    }
    if (met && result.warnings.some((w) => w.startsWith("result size differs"))) met += " ⚠";
    // Targets are set for the full sizes; at quick sizes the figure is only indicative.
    if (met && quick) met += " (quick sizes)";
    return {
      group: i === 0 ? result.group : "″",
      caseName: i === 0 ? result.name : "″",
      strata: i === 0 ? cell(strata) : "″",
      peer: peer?.name ?? "—",
      peerValue: peer ? cell(peer) : "—",
      ratio: formatRatio(ratio),
      target: targetText,
      met,
    };
  });
}

const HEADER = ["Group", "Case", "Strata (median)", "Peer", "Peer (median)", "Ratio peer/Strata", "Target", "Met"];

function markdownTable(results: readonly CaseResult[], quick: boolean): string {
  const escape = (text: string) => text.replaceAll("|", "\\|");
  const lines = [`| ${HEADER.join(" | ")} |`, `| ${HEADER.map(() => "---").join(" | ")} |`];
  for (const row of results.flatMap((r) => rowsOf(r, quick))) {
    lines.push(`| ${[row.group, row.caseName, row.strata, row.peer, row.peerValue, row.ratio, row.target, row.met].map(escape).join(" | ")} |`);
  }
  return lines.join("\n");
}

function consoleTable(results: readonly CaseResult[], quick: boolean): string {
  const rows = [HEADER, ...results.flatMap((r) => rowsOf(r, quick)).map((r) => [r.group, r.caseName, r.strata, r.peer, r.peerValue, r.ratio, r.target, r.met])];
  const widths = HEADER.map((_, c) => Math.max(...rows.map((r) => [...r[c]!].length)));
  return rows.map((r) => r.map((text, c) => text + " ".repeat(widths[c]! - [...text].length)).join("  ")).join("\n");
}

function warningsOf(results: readonly CaseResult[]): string[] {
  return results.flatMap((r) => r.warnings.map((w) => `${r.name}: ${w}`));
}

/** Each note once, with the first case it belongs to. */
function notesOf(results: readonly CaseResult[]): string[] {
  const seen = new Set<string>();
  return results.flatMap((r) => (r.notes ?? []).filter((n) => !seen.has(n) && seen.add(n)).map((n) => `${r.name}: ${n}`));
}

function report(results: readonly CaseResult[], options: Options, reps: number, seconds: number): string {
  const cpu = cpus();
  const groups = [...new Set(results.map((r) => r.group))].join(", ");
  const warnings = warningsOf(results);
  const notes = notesOf(results);
  return [
    "<!-- generated by `npm run bench` (bench/index.ts); do not edit by hand -->",
    "",
    `Measured ${new Date().toISOString().slice(0, 10)} on ${cpu.length} × ${cpu[0]?.model.trim() ?? "unknown CPU"}, ` +
      `${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}; groups: ${groups}; ` +
      `${options.quick ? "quick sizes" : "full sizes"}; medians of ${reps} timed samples per contender after warm-up ` +
      `(up to ${reps * 3} for fast ones, at least 3 for slow ones; samples interleaved between contenders); ` +
      `whole run ${Math.round(seconds)} s on a shared machine. ` +
      "Ratio = peer median / Strata median: above 1 means Strata is faster.",
    "",
    markdownTable(results, options.quick),
    "",
    ...(notes.length > 0 ? ["Notes:", "", ...notes.map((n) => `- ${n}`), ""] : []),
    ...(warnings.length > 0 ? ["Warnings:", "", ...warnings.map((w) => `- ${w}`), ""] : []),
  ].join("\n");
}

// ---------------------------------------------------------------- main

async function main(): Promise<void> {
  const options = parseArgs(process.argv.slice(2));
  const reps = options.reps ?? (options.quick ? 3 : 7);
  const started = performance.now();
  const ctx: GroupContext = {
    quick: options.quick,
    reps,
    cacheDir: defaultCacheDir(),
    log: (message) => console.log(`  · ${message}`),
  };
  const selected = GROUPS.filter((g) => !options.only || options.only.includes(g.name));
  const results: CaseResult[] = [];
  for (const entry of selected) {
    const group = await entry.load();
    console.log(`\n▶ ${group.name}: ${group.title}`);
    const t0 = performance.now();
    const groupResults = await group.run(ctx);
    for (const result of groupResults) {
      const samples = (r: ContenderResult) => (r.samples > 0 ? ` [${r.samples} sample${r.samples === 1 ? "" : "s"}]` : "");
      console.log(`  ${result.name}: Strata ${cell(result.strata)}${samples(result.strata)}`);
      for (const peer of result.peers) {
        console.log(`      vs ${peer.name}: ${cell(peer)}${samples(peer)}  → ${formatRatio(ratioOf(result.strata, peer))}`);
      }
      for (const warning of result.warnings) console.log(`      ⚠ ${warning}`);
    }
    console.log(`  (${group.name} took ${Math.round((performance.now() - t0) / 1000)} s)`);
    results.push(...groupResults);
  }
  const seconds = (performance.now() - started) / 1000;
  console.log(`\n${consoleTable(results, options.quick)}\n`);
  const warnings = warningsOf(results);
  if (warnings.length > 0) console.log(`Warnings:\n${warnings.map((w) => `  ⚠ ${w}`).join("\n")}\n`);

  const partial = options.quick || options.only !== undefined;
  const out = options.out ?? (partial ? undefined : join(dirname(fileURLToPath(import.meta.url)), "results.md"));
  if (out) {
    writeFileSync(out, report(results, options, reps, seconds));
    console.log(`wrote ${relative(process.cwd(), out) || out}`);
  } else {
    console.log("partial run: no results file written (pass --out file.md to write one)");
  }
  console.log(`total ${Math.round(seconds)} s`);
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? (error.stack ?? error.message) : error);
  process.exit(1);
});
