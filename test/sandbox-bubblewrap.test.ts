/**
 * What BubblewrapSandbox adds to the shared cases (sandbox-containment,
 * sandbox-base, conformance): its limits and how they are reported, its
 * view of the host, symlinks planted inside it, the BusyBox toolset.
 */
import { chmodSync, type Dirent, existsSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import nodePath from "node:path";
import { randomUUID } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { toSeedProtocol } from "../core/seed.js";
import { BubblewrapSandbox, type BubblewrapSandboxOptions } from "../sandboxes/bubblewrap.js";
import { expectOnePathSpace } from "./support/path-space.js";
import { processesMatching } from "./containment-cases.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

/** Whether this process may create v1 cgroups, so the limits should be cgroups rather than rlimits. */
const cgroupsWritable = process.getuid?.() === 0 && existsSync("/sys/fs/cgroup/pids/cgroup.procs") && existsSync("/sys/fs/cgroup/memory/cgroup.procs");

/** Directories called `name` under `root`, a few levels deep (where cgroups nest). */
function findDirs(root: string, name: string, depth = 4): string[] {
  if (depth < 0) return [];
  let entries: Dirent[];
  try {
    entries = readdirSync(root, { withFileTypes: true });
  } catch {
    return [];
  }
  return entries
    .filter((entry) => entry.isDirectory())
    .flatMap((entry) => (entry.name === name ? [nodePath.join(root, name)] : findDirs(nodePath.join(root, entry.name), name, depth - 1)));
}

describe("BubblewrapSandbox", () => {
  const open: BubblewrapSandbox[] = [];
  const sandbox = (options?: BubblewrapSandboxOptions) => {
    const created = new BubblewrapSandbox(options);
    open.push(created);
    return created;
  };
  afterEach(async () => {
    await Promise.all(open.splice(0).map((s) => s.close()));
  });
  /** The seeds' protocol over a sandbox: what these cases check (execute resolves its response or rejects). */
  const seed = toSeedProtocol;

  it("is available, and says how its limits are enforced", async () => {
    expect(await BubblewrapSandbox.isAvailable()).toBe(true);
    const s = sandbox({ cpuSeconds: 5 });
    expect(s.isolation).toBe("namespace");
    await seed(s).execute("true");
    expect(s.limits).toEqual(
      cgroupsWritable
        ? { memory: "cgroup", processes: "cgroup", cpu: "rlimit" }
        : { memory: "rlimit", processes: "rlimit", cpu: "rlimit" },
    );
  });

  it("shows the command a minimal world: /workspace, its own /proc, no host environment", async () => {
    process.env.STRATA_BWRAP_TEST_SECRET = "do-not-leak";
    try {
      const s = seed(sandbox());
      const result = await s.execute('pwd; hostname; echo "[$STRATA_BWRAP_TEST_SECRET]"; ls /; ls /proc | grep -c "^[0-9]"');
      const [pwd, hostname, secret, ...rest] = result.output.trim().split("\n");
      expect([pwd, hostname, secret]).toEqual(["/workspace", "strata", "[]"]);
      const root = rest.slice(0, -1);
      expect(root).toEqual(expect.arrayContaining(["dev", "etc", "proc", "tmp", "usr", "workspace"]));
      for (const entry of root) expect(["bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", "workspace"]).toContain(entry);
      // Its own PID namespace: the shell, ls, grep and bwrap's init, not the host's processes.
      expect(Number(rest.at(-1))).toBeLessThan(8);
    } finally {
      delete process.env.STRATA_BWRAP_TEST_SECRET;
    }
  });

  it("says when the memory limit killed a command", async () => {
    const s = seed(sandbox({ memoryMb: 128 }));
    const result = await s.execute(`awk 'BEGIN { s = "0123456789abcdef"; for (i = 0; i < 26; i++) s = s s; print length(s) }'`, { timeout: 60 });
    expect(result.exitCode).not.toBe(0);
    if (cgroupsWritable) expect(result.output).toContain("memory limit of 128 MiB was reached");
  });

  it("without cgroups, limits memory per process with RLIMIT_AS, and says so", async () => {
    const s = sandbox({ cgroups: false, memoryMb: 128 });
    const result = await seed(s).execute(`awk 'BEGIN { s = "0123456789abcdef"; for (i = 0; i < 26; i++) s = s s; print length(s) }'`, { timeout: 60 });
    expect(result.exitCode).not.toBe(0);
    expect(result.output).not.toContain("1073741824");
    // As root too: commands run as the unprivileged sandbox user, whom RLIMIT_NPROC binds.
    expect(s.limits).toEqual({ memory: "rlimit", processes: "rlimit", cpu: "none" });
    expect(findDirs("/sys/fs/cgroup", `strata-${s.id}`)).toEqual([]);
  });

  it("stops a CPU hog at cpuSeconds", async () => {
    const s = seed(sandbox({ cpuSeconds: 1 }));
    const started = Date.now();
    const result = await s.execute("while :; do :; done", { timeout: 30 });
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(result.exitCode).not.toBe(0);
    expect(result.exitCode).not.toBe(124);
  });

  it("removes its cgroups on close", async () => {
    const s = new BubblewrapSandbox();
    await seed(s).execute("true");
    const name = `strata-${s.id}`;
    expect(findDirs("/sys/fs/cgroup", name).length).toBe(cgroupsWritable ? 2 : 0);
    await s.close();
    expect(findDirs("/sys/fs/cgroup", name)).toEqual([]);
  });

  it("runs commands in parallel in one sandbox", async () => {
    const s = seed(sandbox());
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => s.execute(`sleep 0.2; echo ${i}`)));
    expect(results.map((r) => r.output)).toEqual(["0\n", "1\n", "2\n", "3\n", "4\n", "5\n"]);
  });

  it("resolves symlinks planted in the workspace inside the sandbox, never on the host", async () => {
    const secretFile = `${homedir()}/.strata-bwrap-${randomUUID()}`;
    writeFileSync(secretFile, "host secret", { mode: 0o600 });
    try {
      const native = sandbox();
      const s = seed(native);
      // The links as the command made them, named by the paths it sees (the workspace's own).
      const ws = native.workspace;
      await s.execute(`ln -s '${secretFile}' leak && ln -s / root-door`);
      // Transfers go through the host directory and never follow a link at all.
      expect((await s.downloadFiles([`${ws}/leak`]))[0]).toMatchObject({ content: null, error: "permission_denied" });
      expect(await s.read(`${ws}/leak`)).toMatch(/^Error: File '\/workspace\/leak' not found/);
      expect((await s.grep("host secret", ws)).matches).toEqual([]);
      expect(await s.read(`${ws}/root-door/etc/passwd`)).not.toContain("host secret");
      // Uploading onto the link is refused; the host file is untouched.
      expect((await s.uploadFiles([[`${ws}/leak`, new TextEncoder().encode("overwritten")]]))[0]!.error).toBe("permission_denied");
      expect(readFileSync(secretFile, "utf8")).toBe("host secret");
      expect((await s.write(`${ws}/root-door/usr/planted`, "x")).code).toBe("permission_denied");
    } finally {
      rmSync(secretFile, { force: true });
    }
  });

  it("mounts a given workspace read-write and keeps it on close", async () => {
    const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-test-"));
    try {
      writeFileSync(nodePath.join(dir, "from-host.txt"), "hello\n");
      const s = new BubblewrapSandbox({ workspace: dir });
      expect((await seed(s).execute("cat from-host.txt && echo made > by-sandbox.txt")).output).toBe("hello\n");
      await s.close();
      expect(readFileSync(nodePath.join(dir, "by-sandbox.txt"), "utf8")).toBe("made\n");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("with the BusyBox toolset, runs BusyBox applets and nothing of the host's /usr/bin", async () => {
    const s = seed(sandbox({ toolset: "busybox" }));
    const result = await s.execute("sh -c 'echo $0' ; ls --help 2>&1 | head -1; command -v perl || echo no-perl");
    expect(result.output).toMatch(/BusyBox v/);
    expect(result.output).toContain("no-perl");
  });

  it("shares one path space between files and commands: the seeds' example, and invalid_path outside /workspace", async () => {
    await expectOnePathSpace(sandbox());
  });

  it("rejects bad limits with invalid_argument", () => {
    expect(() => new BubblewrapSandbox({ memoryMb: 0 })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    expect(() => new BubblewrapSandbox({ maxProcesses: 1.5 })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    expect(() => new BubblewrapSandbox({ sandboxUser: { uid: 0, gid: 0 } })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    expect(() => new BubblewrapSandbox({ env: { "A=B": "x" } })).toThrow(expect.objectContaining({ code: "invalid_argument" }));
  });

  it("holds every file a command writes to the workspace quota (RLIMIT_FSIZE), and /tmp to it as a whole", async () => {
    const quota = 4 * 1024 * 1024;
    const native = sandbox({ quota: { maxBytes: quota } });
    const s = seed(native);
    const big = await s.execute(`head -c ${2 * quota} /dev/zero > big; echo "rc=$?"`);
    expect(big.output).toMatch(/rc=153/);
    expect(statSync(nodePath.join(native.hostWorkspace, "big")).size).toBeLessThanOrEqual(quota);
    // Many files each under the limit still fill /tmp no further than the quota (a sized tmpfs).
    const tmp = await s.execute(`for i in 1 2 3; do head -c ${quota / 2} /dev/zero > /tmp/f$i || echo failed-$i; done; du -sk /tmp`);
    expect(tmp.output).toContain("failed-");
    expect((await s.execute("echo small > small && cat small")).output).toBe("small\n");
    // Uploads are held to the whole quota (the seeds' four codes narrow quota_exceeded to permission_denied).
    const upload = await s.uploadFiles([[`${native.workspace}/up.bin`, new Uint8Array(quota)]]);
    expect(upload[0]!.error).toBe("permission_denied");
  });

  it("as root, runs commands as the sandbox user and hands a given workspace to it, never a hard-linked host file", async () => {
    if (process.getuid?.() !== 0) return expect(sandbox().sandboxUser).toBeUndefined();
    const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-owned-"));
    const outside = mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-outside-"));
    try {
      mkdirSync(nodePath.join(dir, "sub"));
      writeFileSync(nodePath.join(dir, "sub", "mine.txt"), "host\n");
      writeFileSync(nodePath.join(outside, "secret"), "root only\n", { mode: 0o600 });
      linkSync(nodePath.join(outside, "secret"), nodePath.join(dir, "hardlink"));
      const s = seed(sandbox({ workspace: dir, sandboxUser: { uid: 65533, gid: 65533 } }));
      const result = await s.execute("id -u; id -g; echo more >> sub/mine.txt && cat sub/mine.txt; cat hardlink 2>/dev/null || echo denied");
      expect(result.output).toBe("65533\n65533\nhost\nmore\ndenied\n");
      expect(lstatSync(nodePath.join(dir, "sub", "mine.txt")).uid).toBe(65533);
      expect(lstatSync(dir).uid).toBe(65533);
      // The inode shared with a file outside the workspace keeps its owner.
      expect(lstatSync(nodePath.join(outside, "secret")).uid).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
      rmSync(outside, { recursive: true, force: true });
    }
  });

  it("shows a given workspace's host path only where the kernel puts it: the root field of its mountinfo line", async () => {
    const name = `strata-private-${randomUUID()}`;
    const dir = nodePath.join(mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-")), name);
    mkdirSync(dir);
    try {
      if (process.getuid?.() === 0) {
        // The sandbox user must be able to reach the workspace; the refusal names no host path.
        const refused = await seed(sandbox({ workspace: dir }))
          .execute("true")
          .catch((error: unknown) => error);
        expect(refused).toMatchObject({ code: "permission_denied" });
        expect(String((refused as Error).message)).not.toContain(name);
        chmodSync(nodePath.dirname(dir), 0o755);
      }
      const s = seed(sandbox({ workspace: dir }));
      const result = await s.execute(
        "env; pwd -P; readlink /proc/self/cwd; cat /proc/mounts; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; echo MOUNTINFO; cat /proc/self/mountinfo",
      );
      const [before, mountinfo] = result.output.split("MOUNTINFO\n");
      expect(before).not.toContain(name);
      // mountinfo's 4th field is the mount's root within its filesystem, computed by the kernel from the
      // directory itself: bwrap cannot change it. It is the only line, and the only field, that shows it.
      const lines = mountinfo!.split("\n").filter((line) => line.includes(name));
      expect(lines).toHaveLength(1);
      const fields = lines[0]!.split(" ");
      expect(fields[4]).toBe("/workspace");
      expect(fields.filter((field) => field.includes(name))).toEqual([fields[3]]);
    } finally {
      rmSync(nodePath.dirname(dir), { recursive: true, force: true });
    }
  });
});

/** Host pids of processes whose command line holds `marker`, after waiting up to `seconds` for them to go. */
async function leftovers(marker: string, seconds = 3): Promise<number[]> {
  const deadline = Date.now() + seconds * 1000;
  let alive = processesMatching(marker);
  while (alive.length > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    alive = processesMatching(marker);
  }
  for (const pid of alive) process.kill(pid, "SIGKILL");
  return alive;
}

/** Unique, harmless sleep durations: their command line marks what a command left behind. */
const marker = () => `1000.${String(Math.floor(Math.random() * 1e6)).padStart(6, "0")}3`;

describe("BubblewrapSandbox's warm supervisor", () => {
  const open: BubblewrapSandbox[] = [];
  const sandbox = (options?: BubblewrapSandboxOptions) => {
    const created = new BubblewrapSandbox(options);
    open.push(created);
    return created;
  };
  afterEach(async () => {
    await Promise.all(open.splice(0).map((s) => s.close()));
  });

  /**
   * The host pids of the sandbox's supervisor shells: found by name and by the sandbox's own pids cgroup,
   * leaving out the slots' residents (forks of the same shell, so the same name, whose parent is a supervisor).
   */
  const supervisors = (s: BubblewrapSandbox) => {
    const named = processesMatching("strata-supervisor").filter((pid) => {
      try {
        // Not bwrap, whose arguments name the supervisor too.
        if (!readFileSync(`/proc/${pid}/cmdline`, "utf8").startsWith("/bin/sh\0")) return false;
        return readFileSync(`/proc/${pid}/cgroup`, "utf8").includes(`strata-${s.id}`);
      } catch {
        return false;
      }
    });
    const parent = (pid: number) => {
      try {
        return Number(/^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
      } catch {
        return 0;
      }
    };
    return named.filter((pid) => !named.includes(parent(pid)));
  };
  const children = (pid: number) => readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(" ").filter(Boolean).map(Number);

  it("kills what a finished command left in the background, setsid and double forks included", async () => {
    const s = toSeedProtocol(sandbox());
    const [a, b, c] = [marker(), marker(), marker()];
    const started = Date.now();
    const result = await s.execute(`sleep ${a} & (setsid sleep ${b} > /dev/null 2>&1 < /dev/null &); (sh -c 'sleep ${c} &' &); echo started`);
    expect(result).toEqual({ output: "started\n", exitCode: 0, truncated: false });
    expect(Date.now() - started).toBeLessThan(3000);
    expect(await leftovers(a)).toEqual([]);
    expect(await leftovers(b)).toEqual([]);
    expect(await leftovers(c)).toEqual([]);
    expect((await s.execute("echo next")).output).toBe("next\n");
    // Moving into an idle slot's cgroup does not save a process either.
    const d = marker();
    const moved = await s.execute(`sh -c 'for f in /dev/.strata/cg/s*/tasks; do { echo $$ > $f; } 2>/dev/null && break; done; exec sleep ${d}' & sleep 0.2; echo moved`);
    expect(moved.output).toBe("moved\n");
    expect(await leftovers(d)).toEqual([]);
  });

  it("a leftover cannot move into the cgroup of another command still running: it dies with its own command", async () => {
    const s = toSeedProtocol(sandbox());
    const e = marker();
    // A long command holds a slot of its own while the next one leaves a process behind that tries every slot's cgroup.
    const long = s.execute("sleep 4; echo long");
    await new Promise((resolve) => setTimeout(resolve, 300));
    const tried = await s.execute(
      `sh -c 'n=0; for f in /dev/.strata/cg/s*/tasks /dev/.strata/cg/tasks; do { echo $$ > $f; } 2>/dev/null && n=$((n+1)); done; echo "joined $n" > /tmp/joined-${e}; exec sleep ${e}' & sleep 0.3; cat /tmp/joined-${e}`,
    );
    expect(tried.output).toBe("joined 0\n");
    // Gone while the long command still runs, not when it ends.
    expect(await leftovers(e, 1)).toEqual([]);
    expect(await long).toEqual({ output: "long\n", exitCode: 0, truncated: false });
  });

  it("kills the whole group at the timeout, escapees included, and runs the next command", async () => {
    const s = toSeedProtocol(sandbox());
    const [a, b] = [marker(), marker()];
    const result = await s.execute(`(setsid sh -c 'sleep ${a}' &); sleep ${b}; echo not-reached`, { timeout: 1 });
    expect(result.exitCode).toBe(124);
    expect(result.output).not.toContain("not-reached");
    expect(result.output).toMatch(/timed out after 1 s/);
    expect(await leftovers(a)).toEqual([]);
    expect(await leftovers(b)).toEqual([]);
    expect((await s.execute("echo again")).output).toBe("again\n");
  });

  it("survives a fork bomb in one command: the next command works", async () => {
    const native = sandbox({ maxProcesses: 48 });
    const s = toSeedProtocol(native);
    // Each shell forks two more, then blocks opening a FIFO nobody writes: the bomb holds the limit until the timeout.
    // The command's own shell forks once, before the limit is reached, and then waits on the FIFO too: a fork it
    // attempted at the limit would fail and end it early (status 2), which is not the timeout this test is about.
    const hold = `/tmp/hold-${randomUUID()}`;
    const bomb = await s.execute(`mkfifo ${hold}; b() { b & b & read _ < ${hold}; }; b & read _ < ${hold}`, { timeout: 2 });
    expect(bomb.exitCode).toBe(124);
    // The bomb did reach the limit: forks failed.
    expect(bomb.output).toMatch(/fork/i);
    let after = await s.execute("echo after");
    // The pids freed by the kill can take a moment to be reaped; the supervisor itself stays (or restarts).
    for (let attempt = 0; attempt < 20 && after.output !== "after\n"; attempt++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      after = await s.execute("echo after");
    }
    expect(after).toEqual({ output: "after\n", exitCode: 0, truncated: false });
  });

  it("restarts transparently when its supervisor is killed: a running command says so, the next one runs", async () => {
    const native = sandbox();
    const s = toSeedProtocol(native);
    expect((await s.execute("echo warm")).output).toBe("warm\n");
    let started!: () => void;
    const begun = new Promise<void>((resolve) => (started = resolve));
    const running = s.execute("echo started; sleep 5; echo late", { timeout: 30, onOutput: started });
    await begun;
    const pids = supervisors(native);
    expect(pids.length).toBeGreaterThan(0);
    for (const pid of pids) process.kill(pid, "SIGKILL");
    const killed = await running;
    expect(killed.exitCode).toBe(137);
    expect(killed.output).toContain("supervisor ended");
    expect((await s.execute("echo next")).output).toBe("next\n");
    expect(supervisors(native).some((pid) => !pids.includes(pid))).toBe(true);
  });

  it("keeps one resident shell per slot in use: sequential commands hold one, a batch at once as many as ran at once", async () => {
    const native = sandbox();
    const s = toSeedProtocol(native);
    for (let i = 0; i < 20; i++) expect((await s.execute(`echo ${i}`)).output).toBe(`${i}\n`);
    const [supervisor] = supervisors(native);
    expect(children(supervisor!)).toHaveLength(1);
    await Promise.all(Array.from({ length: 5 }, () => s.execute("sleep 0.3")));
    expect(children(supervisor!).length).toBeGreaterThanOrEqual(2);
    expect(children(supervisor!).length).toBeLessThanOrEqual(6);
  });

  it("a resident shell stopped by someone cannot hang the next command: its slot is killed and the command runs elsewhere", async () => {
    const native = sandbox();
    const s = toSeedProtocol(native);
    await Promise.all(Array.from({ length: 3 }, () => s.execute("sleep 0.2")));
    const residents = supervisors(native).flatMap(children);
    expect(residents.length).toBeGreaterThanOrEqual(3);
    for (const pid of residents) process.kill(pid, "SIGSTOP");
    const timedOut = await s.execute("echo never", { timeout: 1 });
    expect(timedOut.exitCode).toBe(124);
    expect(timedOut.output).not.toContain("never");
    const started = Date.now();
    expect(await s.execute("echo once")).toEqual({ output: "once\n", exitCode: 0, truncated: false });
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(await Promise.all(Array.from({ length: 4 }, (_, i) => s.execute(`echo ${i}`)))).toEqual(
      Array.from({ length: 4 }, (_, i) => ({ output: `${i}\n`, exitCode: 0, truncated: false })),
    );
  }, 40_000);

  it("answers, not hangs, when every slot's resident shell is killed, the running command's included", async () => {
    const native = sandbox();
    const s = toSeedProtocol(native);
    // Several slots have residents: all of them are killed, idle ones included.
    await Promise.all(Array.from({ length: 3 }, () => s.execute("sleep 0.2")));
    let started!: () => void;
    const begun = new Promise<void>((resolve) => (started = resolve));
    const running = s.execute("echo started; sleep 1; echo done", { timeout: 30, onOutput: started });
    await begun;
    const residents = supervisors(native).flatMap(children);
    expect(residents.length).toBeGreaterThan(0);
    for (const pid of residents) process.kill(pid, "SIGKILL");
    const result = await running;
    expect(result.exitCode).toBe(137);
    expect(result.output).toMatch(/^started\ndone\n/);
    expect(result.output).toContain("lost its exit code");
    expect((await s.execute("echo next")).output).toBe("next\n");
    expect(await Promise.all(Array.from({ length: 4 }, (_, i) => s.execute(`echo ${i}`)))).toEqual(
      Array.from({ length: 4 }, (_, i) => ({ output: `${i}\n`, exitCode: 0, truncated: false })),
    );
  });

  it("runs 10 commands at once, each with its own stdin, output, stderr and exit code", async () => {
    const s = toSeedProtocol(sandbox());
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => s.execute(`cat; echo " err${i}" >&2; sleep 0.${i}; exit ${i}`, { stdin: `in${i}` })),
    );
    expect(results).toEqual(Array.from({ length: 10 }, (_, i) => ({ output: `in${i} err${i}\n`, exitCode: i, truncated: false })));
    // And more than one batch of slots at once.
    const many = await Promise.all(Array.from({ length: 40 }, (_, i) => s.execute(`echo ${i}`)));
    expect(many.map((r) => r.output)).toEqual(Array.from({ length: 40 }, (_, i) => `${i}\n`));
  });

  it("gives a command the environment, working directory and identity a bwrap per command gives", async () => {
    const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-bwrap-parity-"));
    try {
      if (process.getuid?.() === 0) chmodSync(dir, 0o755);
      mkdirSync(nodePath.join(dir, "sub"));
      const probe = "env | sort; pwd; id; ulimit -t; ls -a /; ls /proc/self/fd";
      const options = { cwd: "sub", env: { EXTRA: "it's \"quoted\"\nand multi-line", PATH: "/usr/bin:/bin" } };
      const warm = await toSeedProtocol(sandbox({ workspace: dir, cpuSeconds: 7 })).execute(probe, options);
      const cold = await toSeedProtocol(sandbox({ workspace: dir, cpuSeconds: 7, warm: false })).execute(probe, options);
      expect(warm.exitCode).toBe(0);
      expect(warm).toEqual(cold);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("refuses a command over Linux's argument limit as a bwrap per command does", async () => {
    const s = toSeedProtocol(sandbox());
    await expect(s.execute(`echo ${"x".repeat(200 * 1024)}`)).rejects.toMatchObject({ code: "invalid_argument" });
    expect((await s.execute(`echo ${"x".repeat(100 * 1024)} | wc -c`)).output).toBe(`${100 * 1024 + 1}\n`);
  });
});
