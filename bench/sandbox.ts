/**
 * Sandboxes, measured against the benchmark section of "Sandboxes that
 * really isolate":
 * - the round trip of `execute("true")`, p50 and p99, for every sandbox
 *   (Bubblewrap p50 ≤ 3 ms, issue 14: a warm supervisor; Docker p50 ≤ 0.5× a raw exec of the same
 *   command on the same container);
 * - execute round trips per file operation of the derived sandboxes (at most 1 each);
 * - a 1000-file upload in one transfer;
 * - Strata's file operations against deepagents' BaseSandbox driven over the
 *   same Docker container with the same transport;
 * - grep and glob over a 5k-file tree through the sandbox, against
 *   deepagents' LocalShellBackend (which searches from the host).
 *
 * Docker and SSH need the test services (scripts/services/30-docker.sh,
 * 40-sshd.sh); their variables are read from .services/env when not set.
 *
 * Where a deepagents backend is the peer (it answers in the seed shape: `cat -n`
 * text, lsInfo, globInfo), Strata is measured through `toSeedProtocol`; against
 * raw floors and alone, through its native API.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { BaseSandbox as DeepagentsBaseSandbox, LocalShellBackend } from "deepagents";
import type Docker from "dockerode";
import { packTar } from "modern-tar";
import { unwrap } from "../core/base.js";
import type { Sandbox } from "../core/protocol.js";
import { toSeedProtocol, type SandboxBackendProtocol } from "../core/seed.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import { shellQuote } from "../sandboxes/shell.js";
import { BubblewrapSandbox, type BubblewrapSandboxOptions } from "../sandboxes/bubblewrap.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { SshSandbox } from "../sandboxes/ssh.js";
import { generatedTree, TREE_NEEDLE } from "./filesystem.js";
import {
  type BenchGroup,
  type CaseResult,
  type Contender,
  type GroupContext,
  type LatencyContender,
  compare,
  countLines,
  describeError,
  formatMs,
  latency,
  runCommand,
} from "./harness.js";

const GLOB = "**/*.ts";
const SERVICES_ENV = join(dirname(fileURLToPath(import.meta.url)), "..", ".services", "env");
/** The Docker target (issue 14): Strata's p50 at most this many times a raw exec's (met by running commands as requests on a root exec session, dropped to the user per request). */
const DOCKER_MAX_OVERHEAD = 0.5;
/** The bubblewrap target (issue 14): p50 with the default limits on, through the warm supervisor. */
const BUBBLEWRAP_MAX_P50_MS = 3;

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

type Closable = Sandbox;

/**
 * A BubblewrapSandbox that counts the commands it runs: every derived file
 * operation, like `execute` itself, runs its script through `doExecute`.
 */
class CountingBubblewrap extends BubblewrapSandbox {
  executeCalls = 0;
  constructor(options?: BubblewrapSandboxOptions) {
    super(options);
  }
  protected override doExecute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse> {
    this.executeCalls++;
    return super.doExecute(command, options);
  }
}

/** Round trips a DockerSandbox made so far: execs (less the kills that may follow a command), requests on its reused sessions, archive transfers. */
function dockerTrips(sandbox: DockerSandbox): number {
  return sandbox.stats.execs - sandbox.stats.kills + sandbox.stats.sessionRequests + sandbox.stats.putArchives + sandbox.stats.getArchives;
}

function describeDockerTrips(before: DockerSandbox["stats"], after: DockerSandbox["stats"]): string {
  const parts: string[] = [];
  const add = (n: number, what: string) => n > 0 && parts.push(`${n} ${what}${n === 1 ? "" : "s"}`);
  add(after.execs - after.kills - (before.execs - before.kills), "exec");
  add(after.sessionRequests - before.sessionRequests, "session request");
  add(after.getArchives - before.getArchives, "getArchive");
  add(after.putArchives - before.putArchives, "putArchive");
  return parts.join(" + ") || "none";
}

/**
 * deepagents' BaseSandbox over a Strata DockerSandbox's container: its
 * `execute` is Strata's (same exec, same wrapper), its uploads and downloads
 * are Strata's archive transfers; only the derived file operations differ.
 * Both address files by their path in the container (Strata's file paths
 * are the container's own, under its workspace), so paths pass unchanged.
 */
class DeepagentsOverDocker extends DeepagentsBaseSandbox {
  readonly id: string;
  /** The container's Strata sandbox in the seed shape deepagents expects (rejecting execute, four-code transfer errors). */
  private readonly seed: SandboxBackendProtocol;
  constructor(private readonly strata: DockerSandbox) {
    super();
    this.id = `deepagents-${strata.id.slice(0, 12)}`;
    this.seed = toSeedProtocol(strata);
  }
  async execute(command: string): Promise<{ output: string; exitCode: number | null; truncated: boolean }> {
    const { output, exitCode, truncated } = await this.seed.execute(command);
    return { output, exitCode, truncated };
  }
  async uploadFiles(files: Array<[string, Uint8Array]>) {
    const responses = await this.seed.uploadFiles(files);
    return responses.map((r, i) => ({ path: files[i]![0], error: r.error }));
  }
  async downloadFiles(paths: string[]) {
    const responses = await this.seed.downloadFiles(paths);
    return responses.map((r, i) => ({ path: paths[i]!, content: r.content, error: r.error }));
  }
}

/** A raw exec through dockerode: the least a client does (create, start, demultiplex the output, inspect the exit code). */
async function rawDockerodeExec(docker: Docker, container: Docker.Container, cmd: string[]): Promise<number> {
  const exec = await container.exec({ Cmd: cmd, AttachStdout: true, AttachStderr: true, Tty: false });
  const stream = await exec.start({ hijack: true, stdin: false });
  let bytes = 0;
  const sink = new Writable({
    write(chunk: Uint8Array, _encoding, done) {
      bytes += chunk.length;
      done();
    },
  });
  docker.modem.demuxStream(stream, sink, sink);
  await new Promise<void>((resolve, reject) => stream.on("end", resolve).on("close", resolve).on("error", reject));
  const { ExitCode } = await exec.inspect();
  if (ExitCode !== 0) throw new Error(`raw exec exited ${String(ExitCode)}`);
  return bytes;
}

const encoder = new TextEncoder();
const text = (s: string) => encoder.encode(s);

/** Small files for the file-operation cases: 10 directories of 20 files, one file in 7 holding the needle. */
function opsFixture(prefix: string): [string, Uint8Array][] {
  const files: [string, Uint8Array][] = [];
  for (let d = 0; d < 10; d++) {
    for (let f = 0; f < 20; f++) {
      const n = d * 20 + f;
      files.push([`${prefix}/src/d${d}/f${f}.txt`, text(`line one ${n}\n${n % 7 === 0 ? TREE_NEEDLE : "nothing"} here\nlast line\n`)]);
    }
  }
  files.push([`${prefix}/read.txt`, text(Array.from({ length: 100 }, (_, i) => `read line ${i}`).join("\n") + "\n")]);
  return files;
}

interface Opened {
  name: string;
  sandbox: Closable;
  /** Where the sandbox's file paths start: its workspace (LocalSandbox's is "/"). */
  root: string;
}

export const sandboxGroup: BenchGroup = {
  name: "sandbox",
  title: "Sandboxes",
  async run(ctx: GroupContext): Promise<CaseResult[]> {
    const fileCount = 5_000;
    const tree = `${fileCount / 1000}k-file tree`;
    const root = await generatedTree(ctx, fileCount);
    const results: CaseResult[] = [];
    const cleanups: (() => Promise<unknown>)[] = [];
    const runs = ctx.quick ? 50 : 200;
    const dockerRuns = ctx.quick ? 30 : 100;
    const group = this.name;

    const open = async <T extends { close(): Promise<void> }>(name: string, make: () => Promise<T>): Promise<T | undefined> => {
      try {
        const made = await make();
        cleanups.push(() => made.close());
        return made;
      } catch (error) {
        ctx.log(`${name} left out: ${describeError(error)}`);
        return undefined;
      }
    };
    /** The sandbox once a command ran in it; closed if none could. */
    const probed = async <T extends Closable>(sandbox: T): Promise<T> => {
      try {
        const probe = await sandbox.execute("echo ok");
        if (probe.error) throw new Error(probe.error.message);
        if (probe.exitCode !== 0) throw new Error(probe.output.trim());
        return sandbox;
      } catch (error) {
        await sandbox.close().catch(() => undefined);
        throw error;
      }
    };

    try {
      // ---- sandboxes
      // The workspace is the generated tree; a sandbox given a workspace leaves it in place on close.
      const local = new LocalSandbox({ workspace: root });
      cleanups.push(() => local.close());
      // A fresh temporary workspace (removed on close), so the uploads below never land in the cached tree.
      const bwrap = await open("BubblewrapSandbox", () => probed(new CountingBubblewrap()));
      const bwrapNoCgroups = await open("BubblewrapSandbox (cgroups: false)", () => probed(new BubblewrapSandbox({ cgroups: false })));
      const bwrapCold = await open("BubblewrapSandbox (warm: false)", () => probed(new BubblewrapSandbox({ warm: false })));
      const dockerHost = serviceVariable("STRATA_DOCKER_HOST");
      const images = { busybox: serviceVariable("STRATA_DOCKER_IMAGE_BUSYBOX"), gnu: serviceVariable("STRATA_DOCKER_IMAGE_GNU") };
      const dockers: { label: string; sandbox: DockerSandbox }[] = [];
      for (const [label, image] of Object.entries(images)) {
        if (!dockerHost || !image) {
          ctx.log(`DockerSandbox (${label}) left out: STRATA_DOCKER_HOST / STRATA_DOCKER_IMAGE_${label.toUpperCase()} not set (run scripts/services/30-docker.sh)`);
          continue;
        }
        const sandbox = await open(`DockerSandbox (${label})`, () => DockerSandbox.create({ image, docker: dockerHost }));
        if (sandbox) dockers.push({ label, sandbox });
      }
      const sshKey = serviceVariable("STRATA_SSH_KEY");
      const sshHostKey = serviceVariable("STRATA_SSH_HOST_KEY");
      const sshWorkspace = `/tmp/strata-bench-${randomUUID()}`;
      const ssh =
        serviceVariable("STRATA_SSH_HOST") && sshKey
          ? await open("SshSandbox", async () => {
              const connected = await SshSandbox.connect({
                  host: serviceVariable("STRATA_SSH_HOST")!,
                  port: Number(serviceVariable("STRATA_SSH_PORT") ?? 22),
                  username: serviceVariable("STRATA_SSH_USER") ?? "",
                  privateKey: readFileSync(sshKey),
                  hostKey: sshHostKey ? readFileSync(sshHostKey, "utf8").trim() : undefined,
                workspace: sshWorkspace,
              });
              return probed(connected);
            })
          : (ctx.log("SshSandbox left out: STRATA_SSH_HOST / STRATA_SSH_KEY not set (run scripts/services/40-sshd.sh)"), undefined);
      // Pushed after its close, so it runs before it (cleanups run in reverse).
      if (ssh) cleanups.push(() => ssh.execute(`cd / && rm -rf -- ${shellQuote(sshWorkspace)}`, { timeout: 60 }));

      // ---- 1. execute round trip, p50 and p99
      const trueOf = (name: string, sandbox: Closable, n = runs): LatencyContender => ({
        name,
        runs: n,
        run: async () => {
          const response = await sandbox.execute("true");
          if (response.error) throw new Error(response.error.message);
          if (response.exitCode !== 0) throw new Error(`exit ${String(response.exitCode)}: ${response.output.trim()}`);
          return response.output.length;
        },
      });
      const roundTrip = (what: string) => `execute \`true\` round trip (p50, p99), ${what}`;
      ctx.log("execute round trips: local, bubblewrap");
      const spawned = (name: string, command: string, args: string[]): LatencyContender => ({
        name,
        run: async () => {
          const out = await runCommand(command, args);
          if (out.code !== 0) throw new Error(`${command} exited ${String(out.code)}: ${out.stderr.trim()}`);
          return out.stdout.length;
        },
      });
      // The floor under the bubblewrap figure: the same namespaces, the host's / read-only, no wrapper, no limits, no cgroup join.
      const rawBwrap = spawned("raw `bwrap … /bin/sh -c true` (floor: same namespaces, no wrapper, no limits)", "bwrap", [
        ...["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent", "--new-session"],
        ...["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/sh", "-c", "true"],
      ]);
      results.push(
        await latency({
          group,
          name: roundTrip("LocalSandbox"),
          runs,
          strata: trueOf("Strata LocalSandbox", local),
          peers: [spawned("raw spawn of `/bin/sh -c true` (floor)", "/bin/sh", ["-c", "true"])],
          notes: ["The raw rows are floors for reading the figures, not targets: the process spawn (and bwrap's namespaces) that any sandbox of that kind pays."],
        }),
      );
      // Both bubblewrap configurations and the floor in one interleaved run, so load on the shared machine falls on all alike
      // and their difference is the cgroup join's cost; reported as one row per configuration, each with its target.
      const bwraps = [
        ...(bwrap ? [{ label: "default: warm supervisor, cgroups", contender: trueOf("Strata BubblewrapSandbox (default)", bwrap) }] : []),
        ...(bwrapCold ? [{ label: "warm: false", contender: trueOf("Strata BubblewrapSandbox (warm: false)", bwrapCold) }] : []),
        ...(bwrapNoCgroups ? [{ label: "cgroups: false", contender: trueOf("Strata BubblewrapSandbox (cgroups: false)", bwrapNoCgroups) }] : []),
      ];
      if (bwraps.length > 0) {
        ctx.log("execute round trips: bubblewrap");
        const rawSpawn = spawned("raw spawn of `/bin/sh -c true` (floor of any Node spawn)", "/bin/sh", ["-c", "true"]);
        const together = await latency({ group, name: "", runs, strata: bwraps[0]!.contender, peers: [...bwraps.slice(1).map((b) => b.contender), rawBwrap, rawSpawn] });
        const measured = [together.strata, ...together.peers];
        const floors = measured.slice(-2);
        const byLabel = new Map(bwraps.map(({ label }, i) => [label, measured[i]!]));
        const limits = bwrap?.limits;
        const cold = byLabel.get("warm: false");
        const noCgroups = byLabel.get("cgroups: false");
        bwraps.forEach(({ label }, i) => {
          const notes =
            label === "cgroups: false"
              ? [
                  "Without a pids cgroup nothing can find what a command left running, so this configuration keeps a bwrap per command; " +
                    "memory is limited per process (RLIMIT_AS), not per sandbox.",
                  ...(cold && noCgroups
                    ? [
                        `warm: false minus cgroups: false: ${formatMs(cold.medianMs - noCgroups.medianMs)} per command at p50, sampled interleaved: ` +
                          "the two cold configurations differ only by the cgroup join (a write of 0 to each cgroup's tasks file) against prlimit's rlimits.",
                      ]
                    : []),
                ]
              : label === "warm: false"
                ? ["A bwrap per command (the launcher joins the cgroups, prlimit sets rlimits, bwrap builds the namespaces): what every command cost before the warm supervisor."]
                : [
                    `Limits in force with the default options here: memory by ${limits?.memory ?? "?"}, processes by ${limits?.processes ?? "?"}.`,
                    "A warm supervisor (a sh loop started once inside the sandbox's bwrap) keeps a resident shell per slot, moved into the " +
                      "slot's pids cgroup once; it forks each command, which execs `/bin/sh -c`. Node talks to it over FIFOs, so a command pays " +
                      "no bwrap start, no Node spawn and no cgroup move.",
                    "All bubblewrap configurations and both floors were sampled interleaved, call by call, so they saw the same load on this " +
                      "shared 2-core machine; the floors move with it.",
                  ];
          results.push({
            group,
            name: roundTrip(`BubblewrapSandbox (${label})`),
            strata: measured[i]!,
            peers: floors,
            ...(label === "cgroups: false" || label === "warm: false"
              ? {}
              : { target: { kind: "absolute" as const, maxMs: BUBBLEWRAP_MAX_P50_MS, text: `p50 ≤ ${BUBBLEWRAP_MAX_P50_MS} ms` } }),
            warnings: together.warnings,
            notes,
          });
        });
      }
      for (const { label, sandbox } of dockers) {
        ctx.log(`execute round trips: docker (${label})`);
        const cmd = ["/bin/sh", "-c", "true"];
        const dockerodePeer = `raw exec through dockerode (\`sh -c true\`)`;
        const cliHost = `unix://${dockerHost!.replace(/^unix:\/\//, "")}`;
        results.push(
          await latency({
            group,
            name: roundTrip(`DockerSandbox (${label} image)`),
            runs: dockerRuns,
            strata: trueOf("Strata DockerSandbox", sandbox, dockerRuns),
            peers: [
              { name: dockerodePeer, run: () => rawDockerodeExec(sandbox.client, sandbox.container, cmd) },
              {
                name: "`docker exec` CLI (`sh -c true`)",
                runs: Math.ceil(dockerRuns / 2),
                run: async () => {
                  const out = await runCommand("docker", ["--host", cliHost, "exec", sandbox.id, ...cmd]);
                  if (out.code !== 0) throw new Error(`docker exec exited ${String(out.code)}: ${out.stderr.trim()}`);
                  return out.stdout.length;
                },
              },
            ],
            target: { kind: "ratio", peer: dockerodePeer, min: 1 / DOCKER_MAX_OVERHEAD, text: `p50 ≤ ${DOCKER_MAX_OVERHEAD}× raw docker exec` },
            notes: [
              "All three run the same command on the same container. The target compares with the raw dockerode exec (create exec, " +
                "start with a hijacked stream, demultiplex, inspect for the exit code: the least any client of the Engine API does), " +
                "not with the `docker exec` CLI, whose figure is mostly the CLI process's own start-up (a Go binary, config load, " +
                "API version negotiation); that comparison would flatter Strata. The raw forms run `sh -c true`, since an agent's " +
                "command is a shell string; Strata runs it as a request on a root exec session kept open, started by root in a process group " +
                "of its own and dropped to the unprivileged default user for the command only (setpriv; on BusyBox, whose setpriv has no " +
                "--reuid, nsenter -S from a root session started with the user's group; root waits for it and reports its status), after " +
                "locking the files its permission rules deny (a second request on a root session). An image with neither takes an exec " +
                "per command, so its row would stay near 1×.",
            ],
          }),
        );
      }
      if (ssh) {
        ctx.log("execute round trips: ssh");
        results.push(
          await latency({
            group,
            name: roundTrip("SshSandbox (sshd on 127.0.0.1, one connection)"),
            runs,
            strata: trueOf("Strata SshSandbox", ssh),
            peers: [
              {
                name: "raw ssh2 exec of `true` on the same connection (floor)",
                run: () =>
                  new Promise<number>((resolve, reject) => {
                    ssh.client!.exec("true", (error, channel) => {
                      if (error) return reject(error);
                      let bytes = 0;
                      channel.on("data", (chunk: Buffer) => (bytes += chunk.length));
                      channel.stderr.on("data", (chunk: Buffer) => (bytes += chunk.length));
                      channel.on("close", () => resolve(bytes));
                    });
                  }),
              },
            ],
          }),
        );
      }

      // ---- 2. round trips per file operation
      const opsCount = async (name: string, sandbox: Closable, trips: () => number, prefix: string) => {
        const counts: [string, number][] = [];
        const failures: string[] = [];
        const count = async (op: string, run: () => Promise<{ error?: { message: string } }>) => {
          const before = trips();
          const result = await run();
          counts.push([op, trips() - before]);
          if (result.error) failures.push(`${op} failed: ${result.error.message}`);
        };
        const fixture = opsFixture(prefix);
        await count("upload batch (201 files)", () => sandbox.uploadFiles(fixture));
        await count("ls", () => sandbox.ls(`${prefix}/src/d1`));
        await count("read", () => sandbox.read(`${prefix}/read.txt`));
        await count("write", () => sandbox.write(`${prefix}/new.txt`, "new\n"));
        await count("edit", () => sandbox.edit(`${prefix}/new.txt`, "new", "old"));
        await count("grep", () => sandbox.grep(TREE_NEEDLE, { path: prefix }));
        await count("glob", () => sandbox.glob("**/*.txt", { path: prefix }));
        await count("download batch (201 files)", () => sandbox.downloadFiles(fixture.map(([path]) => path)));
        await count("delete", () => sandbox.delete(prefix));
        // At most one: an operation served on the host side (BubblewrapSandbox's download, read straight from the workspace's
        // directory) takes none, which beats one.
        const met = counts.every(([, n]) => n <= 1);
        results.push({
          group,
          name: `round trips per file op, ${name}: ${counts.map(([op, n]) => `${op} ${n}`).join(" · ")}`,
          strata: { name, medianMs: NaN, samples: 1 },
          peers: [],
          target: { kind: "check", met, text: "at most 1 round trip per op" },
          warnings: failures,
          notes: [
            "Counted on a real sandbox by observing its round trips while each operation runs once on small files " +
              "(Bubblewrap: commands run, counted by a subclass's doExecute; Docker: daemon requests from DockerSandbox.stats, execs plus " +
              "archive transfers, requests on its reused exec sessions). edit is 1 here because the file was just written: the edit " +
              "is applied to the copy kept then and sent as the compare-and-swap write; on a file the sandbox has not read or written " +
              "since its last command it takes 2 (fetch with checksum, then the swap). A Docker upload measures the workspace for the " +
              "quota in its own request; deleting a directory checks it for names the permission rules could refuse in the same " +
              "script (a rule ending in `**`, or a tree the user cannot see whole, takes a listing first: one request more).",
          ],
        });
      };
      if (bwrap) {
        ctx.log("round trips per file op: bubblewrap");
        await opsCount("BubblewrapSandbox", bwrap, () => bwrap.executeCalls, `${bwrap.workspace}/count`);
      }
      const gnu = dockers.find((d) => d.label === "gnu") ?? dockers[0];
      if (gnu) {
        ctx.log(`round trips per file op: docker (${gnu.label})`);
        await opsCount(`DockerSandbox (${gnu.label})`, gnu.sandbox, () => dockerTrips(gnu.sandbox), `${gnu.sandbox.workspace}/count`);
      }

      // ---- 3. a 1000-file upload in one transfer
      const thousand = (prefix: string): [string, Uint8Array][] =>
        Array.from({ length: 1000 }, (_, i) => [`${prefix}/d${i % 10}/f${i}.txt`, text(`file ${i}\n`)] as [string, Uint8Array]);
      const uploadContender = (name: string, sandbox: DockerSandbox | SshSandbox, label: string): Contender => {
        let n = 0;
        return {
          name,
          run: async () => {
            const { files } = unwrap(await sandbox.uploadFiles(thousand(`${sandbox.workspace}/up-${label}-${n++}`)));
            const failed = files.filter((r) => r.error);
            if (failed.length > 0) throw new Error(`${failed.length} uploads failed, first: ${failed[0]!.error!.message}`);
            return files.length;
          },
        };
      };
      const uploadCase = `uploadFiles of 1000 small files (one call)`;
      if (gnu) {
        ctx.log("1000-file upload: docker");
        const { sandbox } = gnu;
        const before = { ...sandbox.stats };
        await sandbox.uploadFiles(thousand(`${sandbox.workspace}/up-probe`));
        const requests = describeDockerTrips(before, sandbox.stats);
        // One request carries the whole batch (a session's up to 1 MiB, else an exec); one more measures the quota first. The
        // archive API unpacks as root and through planted links, so it is not used.
        const trips = sandbox.stats.execs - sandbox.stats.kills - (before.execs - before.kills) + sandbox.stats.sessionRequests - before.sessionRequests;
        const oneTransfer = trips === 1 && sandbox.stats.putArchives === before.putArchives && sandbox.stats.getArchives === before.getArchives;
        let raw = 0;
        const result = await compare({
          group,
          name: `${uploadCase}, DockerSandbox (${gnu.label}): ${requests}`,
          reps: ctx.reps,
          maxSamples: ctx.reps,
          strata: uploadContender("Strata DockerSandbox", sandbox, "strata"),
          peers: [
            {
              name: "raw dockerode putArchive of the same 1000 files (tar built per call)",
              run: async () => {
                const prefix = `up-raw-${raw++}`;
                const tar = await packTar(
                  thousand(prefix).map(([path, body]) => ({ header: { name: path, size: body.length, type: "file" as const, mode: 0o644, mtime: new Date() }, body })),
                );
                await sandbox.container.putArchive(Buffer.from(tar), { path: sandbox.workspace, noOverwriteDirNonDir: true });
                return 1000;
              },
            },
          ],
          target: { kind: "check", met: oneTransfer, text: "one transfer (1 request for the batch, the quota kept in it; no archive request)" },
          notes: ["Daemon requests counted with DockerSandbox.stats around one upload of the 1000 files into a fresh directory."],
        });
        results.push(result);
      }
      if (ssh) {
        ctx.log("1000-file upload: ssh");
        const before = { ...ssh.stats };
        await ssh.uploadFiles(thousand(`${ssh.workspace}/up-probe`));
        const execs = ssh.stats.execs - before.execs;
        const sessions = ssh.stats.sftpSessions - before.sftpSessions;
        results.push(
          await compare({
            group,
            name: `${uploadCase}, SshSandbox: ${execs} execs, ${sessions} new SFTP sessions (1000 pipelined SFTP writes)`,
            reps: ctx.reps,
            maxSamples: ctx.reps,
            strata: uploadContender("Strata SshSandbox", ssh, "strata"),
            peers: [],
            notes: [
              "SshSandbox uploads over the connection's one SFTP session (opened once, reused), up to 64 writes in flight: " +
                "no exec and no new channel per file, but SFTP has no multi-file request, so it is one session rather than one request.",
            ],
          }),
        );
      }
      if (bwrap) {
        ctx.log("1000-file upload: bubblewrap");
        const before = bwrap.executeCalls;
        await bwrap.uploadFiles(thousand(`${bwrap.workspace}/up-probe`));
        const calls = bwrap.executeCalls - before;
        let n = 0;
        results.push(
          await compare({
            group,
            name: `${uploadCase}, BubblewrapSandbox: ${calls} execute round trip${calls === 1 ? "" : "s"}`,
            reps: 3,
            // Seconds per call: a few samples tell enough.
            warmup: 1,
            maxSamples: 3,
            strata: {
              name: "Strata BubblewrapSandbox",
              run: async () => unwrap(await bwrap.uploadFiles(thousand(`${bwrap.workspace}/up-${n++}`))).files.filter((r) => !r.error).length,
            },
            peers: [],
            target: { kind: "check", met: calls <= 1, text: "one transfer (at most one round trip)" },
            notes: [
              "BubblewrapSandbox writes uploads straight into the host directory behind /workspace through FilesystemBackend's " +
                "descriptor walk (no symlink followed), so no execute round trip is needed at all.",
            ],
          }),
        );
      }

      // ---- 4. Strata vs deepagents' BaseSandbox on the same container
      if (gnu) {
        ctx.log(`Strata vs deepagents BaseSandbox on docker (${gnu.label})`);
        const strata = gnu.sandbox;
        // deepagents answers in the seed shape, so Strata's side is measured through toSeedProtocol.
        const seed = toSeedProtocol(strata);
        // The peer's commands run on a second DockerSandbox over the same container and workspace, without permission rules:
        // deepagents hides nothing from commands, so its execute should not pay Strata's secret lock (a request per command).
        const peerSandbox = await DockerSandbox.attach(strata.id, { docker: dockerHost, workspace: strata.workspace, permissions: false });
        const deepagents = new DeepagentsOverDocker(peerSandbox);
        cleanups.push(() => peerSandbox.close());
        // Both sides name the files by their path in the container.
        const ws = strata.workspace;
        const fixture = opsFixture(`${ws}/vs`);
        const dels = (who: string): [string, Uint8Array][] => Array.from({ length: 300 }, (_, i) => [`${ws}/vs/del/${who}${i}.txt`, text("x\n")]);
        const setup = await strata.uploadFiles([
          ...fixture,
          ...dels("s"),
          ...dels("d"),
          [`${ws}/vs/edit-s.txt`, text("value: 0\n")],
          [`${ws}/vs/edit-d.txt`, text("value: 0\n")],
        ]);
        if (setup.error || setup.files.some((r) => r.error)) throw new Error("could not set up the Strata-vs-deepagents files");
        const counter = () => {
          let n = 0;
          return () => n++;
        };
        const trips = async (run: () => Promise<unknown>) => {
          const both = () => {
            const total = { ...strata.stats };
            for (const key of Object.keys(total) as (keyof typeof total)[]) total[key] += peerSandbox.stats[key];
            return total;
          };
          const before = both();
          await run();
          return describeDockerTrips(before, both());
        };
        const sEdit = counter();
        const dEdit = counter();
        const sWrite = counter();
        const dWrite = counter();
        const sDel = counter();
        const dDel = counter();
        const ops: { op: string; strata: () => Promise<number>; deepagents: () => Promise<number> }[] = [
          {
            op: "ls (20 entries)",
            strata: async () => (await seed.lsInfo(`${ws}/vs/src/d1`)).length,
            deepagents: async () => (await deepagents.ls(`${ws}/vs/src/d1`)).files?.length ?? -1,
          },
          {
            op: "read (100 lines)",
            strata: async () => countLines(await seed.read(`${ws}/vs/read.txt`)),
            deepagents: async () => {
              const r = await deepagents.read(`${ws}/vs/read.txt`);
              return typeof r.content === "string" ? countLines(r.content) : -1;
            },
          },
          {
            op: "write (new file)",
            strata: async () => ((await seed.write(`${ws}/vs/new/s${sWrite()}.txt`, "hello\n")).error ? -1 : 1),
            deepagents: async () => ((await deepagents.write(`${ws}/vs/new/d${dWrite()}.txt`, "hello\n")).error ? -1 : 1),
          },
          {
            op: "edit",
            strata: async () => {
              const n = sEdit();
              const r = await seed.edit(`${ws}/vs/edit-s.txt`, `value: ${n}`, `value: ${n + 1}`);
              if (r.error) throw new Error(r.error);
              return r.occurrences ?? -1;
            },
            deepagents: async () => {
              const n = dEdit();
              const r = await deepagents.edit(`${ws}/vs/edit-d.txt`, `value: ${n}`, `value: ${n + 1}`);
              if (r.error) throw new Error(r.error);
              return r.occurrences ?? -1;
            },
          },
          {
            op: "grep (201 files)",
            strata: async () => (await seed.grep(TREE_NEEDLE, `${ws}/vs/src`)).matches.length,
            deepagents: async () => (await deepagents.grep(TREE_NEEDLE, `${ws}/vs/src`)).matches?.length ?? -1,
          },
          {
            op: "glob `**/*.txt` (200 files)",
            strata: async () => (await seed.globInfo("**/*.txt", `${ws}/vs/src`)).length,
            deepagents: async () => (await deepagents.glob("**/*.txt", `${ws}/vs/src`)).files?.length ?? -1,
          },
          {
            op: "delete (a file)",
            strata: async () => ((await seed.delete(`${ws}/vs/del/s${sDel()}.txt`)).error ? -1 : 1),
            deepagents: async () => ((await deepagents.delete(`${ws}/vs/del/d${dDel()}.txt`)).error ? -1 : 1),
          },
        ];
        for (const { op, strata: s, deepagents: d } of ops) {
          const strataTrips = await trips(s);
          const deepagentsTrips = await trips(d);
          const result = await compare({
            group,
            name: `${op}, same Docker container (${gnu.label})`,
            reps: ctx.reps,
            maxSamples: ctx.reps * 2,
            budgetMs: 5_000,
            strata: { name: "Strata DockerSandbox", run: s },
            peers: [{ name: "deepagents BaseSandbox (same exec, same archive API)", run: d }],
            notes: [
              "deepagents' BaseSandbox (node_modules/deepagents) needs no python: its operations are POSIX shell (find, awk, grep, stat) " +
                "run through `execute`, and write/edit/readRaw go through uploadFiles/downloadFiles. The subclass here runs its " +
                "`execute` through Strata's DockerSandbox.execute (same exec, same wrapper) and its uploads/downloads through " +
                "Strata's archive transfers, on the same container, so only the derived operations differ. Round trips counted with DockerSandbox.stats.",
              "deepagents reads 500 lines by default and Strata 2000; the file has 100, so both return it whole. deepagents' edit takes two " +
                "round trips (download, then upload); Strata's takes one when it read or wrote the file whole since its last command (the " +
                "edit is applied to that copy and sent as the compare-and-swap write), else two (fetch with checksum, then the swap); the " +
                "trips shown are the first call's. Strata's commands lock the files its permission rules deny first; the peer's sandbox has " +
                "no rules (deepagents hides nothing), so its commands skip that request. Strata does " +
                "more per call: its write refuses to overwrite and checks the parents, its edit fails with `conflict` on a concurrent " +
                "change instead of overwriting it, its grep and glob sort and its grep skips binary files; deepagents' write " +
                "(putArchive) overwrites unchecked and its delete takes two execs (test, then rm).",
            ],
          });
          result.strata.note = strataTrips;
          result.peers[0]!.note = deepagentsTrips;
          results.push(result);
        }
      }

      // ---- grep and glob over the generated tree, against deepagents' LocalShellBackend (host-side search)
      const bwrapTree = bwrap ? await open("BubblewrapSandbox on the tree", () => probed(new BubblewrapSandbox({ workspace: root }))) : undefined;
      const onTree: Opened[] = [
        { name: "LocalSandbox", sandbox: local, root: "/" },
        ...(bwrapTree ? [{ name: "BubblewrapSandbox", sandbox: bwrapTree, root: bwrapTree.workspace }] : []),
      ];
      const hostBackend = await LocalShellBackend.create({ rootDir: root, virtualMode: true });
      cleanups.push(() => hostBackend.close());
      for (const { name, sandbox, root: searchRoot } of onTree) {
        ctx.log(`grep and glob through ${name} over the ${tree}`);
        // Against deepagents (the seed shape): Strata through toSeedProtocol.
        const seed = toSeedProtocol(sandbox);
        results.push(
          await compare({
            group,
            reps: ctx.reps,
            name: `literal grep through the sandbox, ${tree}, ${name}`,
            strata: { name: `Strata ${name}`, run: async () => (await seed.grep(TREE_NEEDLE, searchRoot)).matches.length },
            peers: [
              { name: "deepagents LocalShellBackend", run: async () => (await hostBackend.grep(TREE_NEEDLE, "/")).matches?.length ?? -1 },
              {
                name: "rg in the same sandbox",
                // The command a caller would run through execute: one rg over the workspace (the commands' working directory), lines counted.
                run: async () => Number(unwrap(await sandbox.execute(`rg -F -n --hidden --no-ignore -- ${shellQuote(TREE_NEEDLE)} . | wc -l`)).output.trim()),
              },
            ],
            target: { kind: "ratio", peer: "rg in the same sandbox", min: 1 / 1.2, text: "within 1.2× of rg in the sandbox" },
            notes: [
              "deepagents' LocalShellBackend searches from the host process (rg, fast-glob), which only works when the sandbox " +
                "is the host. Strata's LocalSandbox searches on the host too, through FilesystemBackend (ripgrep proposes the files, " +
                "each is re-read through descriptors that never follow a symlink); BubblewrapSandbox, Docker and SSH search with a " +
                "shell script run inside the sandbox, which asks rg for the candidate files where the sandbox has it (bubblewrap " +
                "sees the host's). The rg row is `rg -F -n` run through execute in the same sandbox.",
            ],
          }),
          await compare({
            group,
            reps: ctx.reps,
            name: `glob \`${GLOB}\` through the sandbox, ${tree}, ${name}`,
            strata: { name: `Strata ${name}`, run: async () => (await seed.globInfo(GLOB, searchRoot)).length },
            peers: [{ name: "deepagents LocalShellBackend", run: async () => (await hostBackend.glob(GLOB, "/")).files?.length ?? -1 }],
          }),
        );
      }
      return results;
    } finally {
      for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
    }
  },
};

