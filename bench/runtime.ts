/**
 * Runtime: the cold start of each built-in provider, measured as the wall
 * time of `provider.open()` → first `execute("true")` → `provider.close()`,
 * one sandbox after another. The figures are written to
 * runtime/cold-start.json, which `provider.capabilities().coldStart` reports;
 * a provider that cannot run here keeps its previous figure (or none).
 *
 * Docker and SSH need the test services (scripts/services/30-docker.sh,
 * 40-sshd.sh); their variables are read from .services/env when not set.
 */
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { cpus, release, totalmem, type } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { providers, type SandboxSpec } from "../runtime/index.js";
import { type BenchGroup, type CaseResult, type GroupContext, describeError, median, percentile } from "./harness.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const COLD_START_FILE = join(ROOT, "runtime", "cold-start.json");

/** Copies the STRATA_* variables of .services/env into process.env where they are not set. */
function loadServiceEnv(): void {
  let text: string;
  try {
    text = readFileSync(join(ROOT, ".services", "env"), "utf8");
  } catch {
    return;
  }
  for (const match of text.matchAll(/^export (STRATA_[A-Z0-9_]+)='(.*)'$/gm)) {
    process.env[match[1]!] ??= match[2]!;
  }
}

function specFor(provider: string): SandboxSpec {
  if (provider === "docker") return { image: process.env.STRATA_DOCKER_IMAGE ?? process.env.STRATA_DOCKER_IMAGE_BUSYBOX };
  return {};
}

/** What the figure depends on besides the machine. */
function setupOf(provider: string): string {
  switch (provider) {
    case "docker":
      return `image ${specFor(provider).image}, daemon on a unix socket, network none`;
    case "ssh":
      return `sshd at ${process.env.STRATA_SSH_HOST}, public-key login, a fresh workspace made and removed per sandbox`;
    case "bubblewrap":
      return "bwrap with the host's /usr, one-time probe done in the warm-up";
    default:
      return "a host process, a fresh temporary workspace per sandbox";
  }
}

export function machine(): string {
  const cpu = cpus();
  return `${cpu.length} × ${cpu[0]?.model.trim() ?? "unknown CPU"}, ${Math.round(totalmem() / 2 ** 30)} GiB, ${type()} ${release()}, Node ${process.version}`;
}

interface Figure {
  p50Ms: number;
  p95Ms: number;
  runs: number;
  measuredAt: string;
  machine: string;
  setup: string;
}

export const runtimeGroup: BenchGroup = {
  name: "runtime",
  title: "Runtime: provider cold start (open → first execute → close)",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    loadServiceEnv();
    const runs = ctx.quick ? 5 : 20;
    const results: CaseResult[] = [];
    const figures: Record<string, Figure> = {};
    for (const name of providers.listNames()) {
      const provider = providers.get(name);
      if (!provider.isAvailable()) {
        ctx.log(`${name}: not available here, not measured`);
        continue;
      }
      const once = async () => {
        const started = performance.now();
        const handle = await provider.open(specFor(name));
        try {
          const response = await handle.sandbox.execute("true");
          if (response.error) throw new Error(`first command failed: ${response.error.message}`);
          if (response.exitCode !== 0) throw new Error(`first command failed: ${response.output.trim()}`);
        } finally {
          await provider.close(handle);
        }
        return performance.now() - started;
      };
      try {
        await once(); // warm-up: module loading, bubblewrap's one-time probe, the daemon's image cache
        const times: number[] = [];
        for (let i = 0; i < runs; i++) times.push(await once());
        const figure: Figure = { p50Ms: round(median(times)), p95Ms: round(percentile(times, 95)), runs, measuredAt: new Date().toISOString().slice(0, 10), machine: machine(), setup: setupOf(name) };
        figures[name] = figure;
        ctx.log(`${name}: p50 ${figure.p50Ms} ms, p95 ${figure.p95Ms} ms over ${runs} runs`);
        results.push({
          group: this.name,
          name: `cold start (open → first execute → close), ${name}`,
          strata: { name: `${name} provider`, medianMs: median(times), samples: runs, note: `p95 ${figure.p95Ms} ms` },
          peers: [],
          warnings: [],
        });
      } catch (error) {
        ctx.log(`${name}: failed, not measured: ${describeError(error)}`);
      }
    }
    writeColdStart(figures);
    ctx.log(`wrote ${COLD_START_FILE.slice(ROOT.length + 1)}`);
    return results;
  },
};

/** Merges new figures over the stored ones; written whole (temp + rename). */
function writeColdStart(figures: Record<string, Figure>): void {
  let stored: { providers?: Record<string, Figure> } = {};
  try {
    stored = JSON.parse(readFileSync(COLD_START_FILE, "utf8")) as typeof stored;
  } catch {
    // first measurement
  }
  const merged = {
    $comment: "Written by `npm run bench -- --only runtime` (bench/runtime.ts); read by SandboxProvider.capabilities(). Do not edit by hand.",
    method: "wall time of provider.open() → first execute('true') → provider.close(), sandboxes one after another, after one warm-up",
    providers: { ...stored.providers, ...figures },
  };
  const temp = `${COLD_START_FILE}.${process.pid}.tmp`;
  writeFileSync(temp, `${JSON.stringify(merged, null, 2)}\n`);
  renameSync(temp, COLD_START_FILE);
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
