/**
 * Sandboxes: a command's round trip, and grep and glob over a 5k-file tree
 * done through the sandbox. Strata's sandboxes derive their file operations
 * from `execute` (a shell script inside the sandbox); deepagents'
 * LocalShellBackend runs commands on the host and searches from the host
 * (ripgrep, fast-glob); just-bash interprets the command in this process.
 *
 * BubblewrapSandbox runs where `bwrap` works; DockerSandbox where the test
 * daemon and image are set up (scripts/services/30-docker.sh writes them to
 * .services/env, read here when the variables are not already set).
 */
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { LocalShellBackend } from "deepagents";
import { Bash } from "just-bash";
import type { SandboxBackendProtocol } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { generatedTree, TREE_NEEDLE } from "./filesystem.js";
import { type BenchGroup, type CaseResult, type Contender, type GroupContext, compare, describeError } from "./harness.js";

const GLOB = "**/*.ts";
const SERVICES_ENV = join(dirname(fileURLToPath(import.meta.url)), "..", ".services", "env");

/** A variable from the environment, else from .services/env (`export NAME='value'` lines). */
function serviceVariable(name: string): string | undefined {
  if (process.env[name]) return process.env[name];
  try {
    const line = readFileSync(SERVICES_ENV, "utf8")
      .split("\n")
      .filter((l) => l.startsWith(`export ${name}=`))
      .pop();
    return line?.slice(`export ${name}=`.length).replace(/^'(.*)'$/, "$1");
  } catch {
    return undefined;
  }
}

interface Opened {
  name: string;
  sandbox: SandboxBackendProtocol & { close(): Promise<void> };
  /** Whether its workspace is the generated tree (Docker's is inside the container). */
  onTree: boolean;
}

async function openSandboxes(root: string, log: (m: string) => void): Promise<Opened[]> {
  const opened: Opened[] = [{ name: "Strata LocalSandbox", sandbox: new LocalSandbox({ workspace: root }), onTree: true }];
  try {
    const bwrap = new BubblewrapSandbox({ workspace: root });
    const probe = await bwrap.execute("echo ok");
    if (probe.exitCode !== 0) throw new Error(probe.output.trim());
    opened.push({ name: "Strata BubblewrapSandbox", sandbox: bwrap, onTree: true });
  } catch (error) {
    log(`BubblewrapSandbox left out: ${describeError(error)}`);
  }
  const host = serviceVariable("STRATA_DOCKER_HOST");
  const image = serviceVariable("STRATA_DOCKER_IMAGE_GNU");
  if (host && image) {
    try {
      opened.push({ name: "Strata DockerSandbox", sandbox: await DockerSandbox.create({ image, docker: host }), onTree: false });
    } catch (error) {
      log(`DockerSandbox left out: ${describeError(error)}`);
    }
  } else {
    log("DockerSandbox left out: no STRATA_DOCKER_HOST / STRATA_DOCKER_IMAGE_GNU (run scripts/services/30-docker.sh)");
  }
  return opened;
}

export const sandboxGroup: BenchGroup = {
  name: "sandbox",
  title: "Sandboxes",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const fileCount = 5_000;
    const tree = `${fileCount / 1000}k-file tree`;
    const root = await generatedTree(ctx, fileCount);
    // The workspace is the generated tree; a sandbox given a workspace leaves it in place on close.
    const sandboxes = await openSandboxes(root, ctx.log);
    const deepagents = await LocalShellBackend.create({ rootDir: root, virtualMode: true });
    const bash = new Bash();
    const common = { group: this.name, reps: ctx.reps };
    const results: CaseResult[] = [];
    const echo = (name: string, run: () => Promise<string>): Contender => ({ name, run: async () => (await run()).trim().length });
    const deepagentsEcho = echo("deepagents LocalShellBackend", async () => (await deepagents.execute("echo hello")).output);
    try {
      for (const { name, sandbox } of sandboxes) {
        ctx.log(`execute round trip: ${name}`);
        results.push(
          await compare({
            ...common,
            name: `execute \`echo hello\` (round trip), ${name.replace("Strata ", "")}`,
            strata: echo(name, async () => (await sandbox.execute("echo hello")).output),
            peers: [
              deepagentsEcho,
              ...(name === "Strata LocalSandbox" ? [echo("just-bash (interpreted, no process)", async () => (await bash.exec("echo hello")).stdout)] : []),
            ],
          }),
        );
      }

      for (const { name, sandbox, onTree } of sandboxes) {
        if (!onTree) continue;
        ctx.log(`grep and glob through ${name} over the ${tree}`);
        results.push(
          await compare({
            ...common,
            name: `literal grep through the sandbox, ${tree}, ${name.replace("Strata ", "")}`,
            strata: { name, run: async () => (await sandbox.grep(TREE_NEEDLE, "/")).matches.length },
            peers: [{ name: "deepagents LocalShellBackend", run: async () => (await deepagents.grep(TREE_NEEDLE, "/")).matches?.length ?? -1 }],
            notes: [
              "Strata's sandboxes derive grep and glob from a shell script run inside the sandbox (the same in bubblewrap, " +
                "Docker or over SSH); deepagents' LocalShellBackend searches from the host process (rg, fast-glob), which " +
                "only works when the sandbox is the host.",
            ],
          }),
          await compare({
            ...common,
            name: `glob \`${GLOB}\` through the sandbox, ${tree}, ${name.replace("Strata ", "")}`,
            strata: { name, run: async () => (await sandbox.globInfo(GLOB, "/")).length },
            peers: [{ name: "deepagents LocalShellBackend", run: async () => (await deepagents.glob(GLOB, "/")).files?.length ?? -1 }],
          }),
        );
      }
      return results;
    } finally {
      for (const { sandbox } of sandboxes) await sandbox.close();
      await deepagents.close();
    }
  },
};
