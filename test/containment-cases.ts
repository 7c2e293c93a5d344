/**
 * Containment cases shared by every isolating sandbox (bubblewrap, Docker,
 * …): each runs a hostile command through `execute` and checks that it is
 * contained, that the result says so clearly, and that the host and this
 * test process are unharmed. `commandCases` (timeout, process-tree kill,
 * output cap) also run against LocalSandbox, which claims nothing more.
 *
 *   containmentCases({ name: "docker", create: (limits) => DockerSandbox.create({ ...limits }) });
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { homedir, tmpdir } from "node:os";
import nodePath from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Sandbox } from "../core/protocol.js";
import { toSeedProtocol } from "../core/seed.js";
import { dispatchPayload } from "../runtime/payloads.js";

export interface ContainmentLimits {
  /** Share the host network (only the network case asks for true). */
  network?: boolean;
  memoryMb?: number;
  maxProcesses?: number;
}

/**
 * A native sandbox; the cases call it through `toSeedProtocol` where they
 * check the seeds' shapes. Its files and commands share one path space,
 * starting at its `root` (an isolating sandbox's workspace, e.g.
 * /workspace): the cases name files by `${root}/x`, as a command sees them.
 */
export type ClosableSandbox = Sandbox;

export interface ContainmentTarget {
  name: string;
  /** A fresh sandbox with these limits; closed by the cases. */
  create: (limits: ContainmentLimits) => Promise<ClosableSandbox>;
  /**
   * The directory behind the sandbox's workspace on this host, for the
   * cases that inspect it (setuid files, host path visibility). Required by
   * those cases: a sandbox whose workspace lives elsewhere says where.
   */
  hostWorkspace?: (sandbox: ClosableSandbox) => string;
}

/** Pids of host processes whose command line contains `marker` (read from /proc; this test process excluded). */
export function processesMatching(marker: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(marker)) found.push(Number(entry));
    } catch {
      // Exited while we looked.
    }
  }
  return found;
}

/** Waits (briefly) for every process carrying `marker` to be gone; returns those still alive. */
async function survivors(marker: string, seconds = 3): Promise<number[]> {
  const deadline = Date.now() + seconds * 1000;
  let alive = processesMatching(marker);
  while (alive.length > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    alive = processesMatching(marker);
  }
  for (const pid of alive) {
    try {
      process.kill(pid, "SIGKILL"); // Leave the machine clean even when the case fails.
    } catch {
      // Gone.
    }
  }
  return alive;
}

/** The host is still fine: it can start a process, and this process did not balloon. */
function expectHostHealthy(rssBefore: number): void {
  expect(execFileSync("/bin/sh", ["-c", "echo alive"], { encoding: "utf8" })).toBe("alive\n");
  expect(process.memoryUsage().rss - rssBefore).toBeLessThan(300 * 1024 * 1024);
}

/** Unique, harmless sleep durations: their command line is the marker a leftover would carry. */
function markerSeconds(): string {
  return `1000.${String(Math.floor(Math.random() * 1e6)).padStart(6, "0")}1`;
}

/** Timeout, process-tree kill and output cap: what every sandbox, LocalSandbox included, promises. */
export function commandCases(target: ContainmentTarget): void {
  describe(`command limits: ${target.name}`, () => {
    const open: ClosableSandbox[] = [];
    const create = async (limits: ContainmentLimits = {}) => {
      const sandbox = await target.create(limits);
      open.push(sandbox);
      return sandbox;
    };
    afterEach(async () => {
      await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
    });

    it("kills `sleep 1000` and its background children at the timeout: exit 124, nothing left", async () => {
      const sandbox = toSeedProtocol(await create());
      const [a, b] = [markerSeconds(), markerSeconds()];
      const started = Date.now();
      const result = await sandbox.execute(`sleep ${a} & echo started; sleep ${b}`, { timeout: 1 });
      const elapsed = Date.now() - started;
      expect(result.exitCode).toBe(124);
      expect(result.output).toContain("started");
      expect(result.output).toMatch(/timed out after 1 s/);
      expect(elapsed).toBeLessThan(4000);
      expect(await survivors(a)).toEqual([]);
      expect(await survivors(b)).toEqual([]);
      // The sandbox is still usable.
      expect((await sandbox.execute("echo again")).output).toBe("again\n");
    });

    it("caps 1 GB of output: keeps the head, marks it truncated, and stays within memory and time", async () => {
      const sandbox = toSeedProtocol(await create());
      const rssBefore = process.memoryUsage().rss;
      const started = Date.now();
      const result = await sandbox.execute("echo head-marker; head -c 1000000000 /dev/zero | tr '\\0' x; echo done", { timeout: 60 });
      expect(Date.now() - started).toBeLessThan(30_000);
      expect(result.truncated).toBe(true);
      expect(result.output.startsWith("head-marker\nxxxx")).toBe(true);
      expect(result.output.length).toBeLessThan(2 * 1024 * 1024);
      expectHostHealthy(rssBefore);
      expect((await sandbox.execute("echo fine")).output).toBe("fine\n");
    });

    it("streams output through onOutput as it arrives", async () => {
      const sandbox = toSeedProtocol(await create());
      const chunks: string[] = [];
      const result = await sandbox.execute("echo one; sleep 0.3; echo two", { onOutput: (chunk) => chunks.push(chunk) });
      expect(chunks.join("")).toBe(result.output);
      expect(chunks.length).toBeGreaterThanOrEqual(2);
    });
  });
}

/** What an isolating sandbox contains beyond commandCases. */
export function containmentCases(target: ContainmentTarget): void {
  commandCases(target);

  describe(`containment: ${target.name}`, () => {
    const open: ClosableSandbox[] = [];
    const create = async (limits: ContainmentLimits = {}) => {
      const sandbox = await target.create(limits);
      open.push(sandbox);
      return sandbox;
    };
    afterEach(async () => {
      await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
    });

    it("at the timeout, also kills what left the process group (setsid): nothing survives the command", async () => {
      const sandbox = toSeedProtocol(await create());
      const [a, b] = [markerSeconds(), markerSeconds()];
      const result = await sandbox.execute(`setsid sleep ${a} > /dev/null 2>&1 < /dev/null & sleep ${b}`, { timeout: 1 });
      expect(result.exitCode).toBe(124);
      expect(await survivors(a)).toEqual([]);
      expect(await survivors(b)).toEqual([]);
    });

    it("contains a fork bomb: the process count stays at the limit, the host can still fork", async () => {
      const native = await create({ maxProcesses: 64 });
      const sandbox = toSeedProtocol(native);
      const marker = `bomb${randomUUID().replace(/-/g, "")}`;
      // Every process of the bomb is a forked `sh <marker>.sh`, so the host can count them. Each forks two
      // more, then blocks opening a FIFO nobody writes (no CPU spent): a shell whose fork fails dies, the
      // others stay, so the bomb holds the limit. `exec` spares the main shell a fork of its own. Ten
      // levels deep at most (1023 processes), so a sandbox that fails this case does not take the host down.
      // The main shell waits up to 20 s; the test stops it (abort) two seconds after it has seen the bomb
      // at work: more than ten of its processes at once, or a shell saying it cannot fork (the limit
      // bound it; BusyBox's shells then die of the interrupted FIFO open, so the count can fall between
      // two samples on a loaded machine).
      await sandbox.write(
        `${native.root}/${marker}.sh`,
        'mkfifo /tmp/hold\nb() { if [ "$1" -lt 10 ]; then b $(($1 + 1)) & b $(($1 + 1)) & fi; read _ < /tmp/hold; }\nb 1 &\nexec sleep 20\n',
      );
      const rssBefore = process.memoryUsage().rss;
      const started = Date.now();
      let peak = 0;
      let forkRefused = false;
      let running = true;
      let seenAt: number | undefined;
      const stop = new AbortController();
      const run = sandbox
        .execute(`sh ${marker}.sh`, {
          timeout: 30,
          signal: stop.signal,
          onOutput: (chunk) => (forkRefused ||= /can't fork|Resource temporarily unavailable/i.test(chunk)),
        })
        .catch(() => undefined) // an aborted command may reject; what matters is what survives it
        .finally(() => (running = false));
      while (running) {
        peak = Math.max(peak, processesMatching(marker).length);
        if (peak > 10 || forkRefused) seenAt ??= Date.now();
        if (seenAt !== undefined && Date.now() - seenAt > 2000) stop.abort();
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      await run;
      expect(Date.now() - started).toBeLessThan(35_000);
      expect(peak > 10 || forkRefused, `the bomb never got going (peak ${peak}, no fork refused): nothing was tested`).toBe(true);
      expect(peak).toBeLessThanOrEqual(64);
      expectHostHealthy(rssBefore);
      expect(await survivors(marker)).toEqual([]);
      expect((await sandbox.execute("echo after")).output).toBe("after\n");
    });

    it("contains a memory bomb: the command dies, the host and this process do not", async () => {
      const sandbox = toSeedProtocol(await create({ memoryMb: 256 }));
      const rssBefore = process.memoryUsage().rss;
      // Doubles a string until the limit stops it (about 2 GiB if nothing did).
      const result = await sandbox.execute(`awk 'BEGIN { s = "0123456789abcdef"; for (i = 0; i < 27; i++) s = s s; print length(s) }'`, { timeout: 60 });
      expect(result.exitCode).not.toBe(0);
      expect(result.output).not.toMatch(/^2147483648$/m);
      expectHostHealthy(rssBefore);
      expect((await sandbox.execute("echo after")).output).toBe("after\n");
    });

    describe("network", () => {
      let server: Server;
      let port = 0;
      let connections = 0;
      const sockets = new Set<Socket>();
      afterAll(async () => {
        for (const socket of sockets) socket.destroy();
        if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
      });

      const listen = async () => {
        if (port) return;
        server = createServer((socket) => {
          connections++;
          sockets.add(socket);
          socket.end("hello-from-host\n");
        });
        await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
        port = (server.address() as { port: number }).port;
      };
      // Whatever client the sandbox's userland has: perl (Debian's perl-base), nc, or BusyBox's nc.
      const connect = (p: number) =>
        `if command -v perl >/dev/null; then perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:${p}", Timeout => 3) or die "connect failed: $!\\n"; print <$s>'; ` +
        `else echo | nc -w 3 127.0.0.1 ${p} || echo "connect failed"; fi`;

      it("cannot reach a listener on the host's loopback without network", async () => {
        await listen();
        const before = connections;
        const sandbox = toSeedProtocol(await create({ network: false }));
        const result = await sandbox.execute(connect(port), { timeout: 20 });
        expect(result.output).not.toContain("hello-from-host");
        expect(result.output).toMatch(/connect failed|refused|unreachable|timed out/i);
        expect(connections).toBe(before);
      });

      it("reaches it with network: true (the probe works)", async () => {
        await listen();
        const sandbox = toSeedProtocol(await create({ network: true }));
        const result = await sandbox.execute(connect(port), { timeout: 20 });
        expect(result.output).toContain("hello-from-host");
      });
    });

    it("cannot write outside the workspace: system dirs are read-only, /tmp is private", async () => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      const name = `strata-outside-${randomUUID()}`;
      const result = await sandbox.execute(
        `for f in /usr/${name} /etc/${name} /${name} /bin/${name}; do echo x > "$f" && echo "wrote $f"; done; echo x > /tmp/${name} && echo tmp-ok; echo x > ${native.root}/inside && echo inside-ok`,
      );
      expect(result.output).not.toMatch(/wrote \//);
      expect(result.output).toContain("tmp-ok");
      expect(result.output).toContain("inside-ok");
      for (const dir of ["/usr", "/etc", "", "/bin", "/tmp"]) expect(existsSync(`${dir}/${name}`)).toBe(false);
      expect(new TextDecoder().decode((await sandbox.downloadFiles([`${native.root}/inside`]))[0]!.content!)).toBe("x\n");
    });

    it("cannot read host secrets: /etc/shadow and a file in the home directory are not there", async () => {
      const secret = `secret-${randomUUID()}`;
      const file = `${homedir()}/.strata-containment-${randomUUID()}`;
      writeFileSync(file, secret, { mode: 0o600 });
      try {
        const sandbox = toSeedProtocol(await create());
        const result = await sandbox.execute(`cat /etc/shadow '${file}'; echo end`);
        expect(result.output).not.toContain(secret);
        expect(result.output).toContain("end");
        const listing = await sandbox.execute(`ls -a '${homedir()}' /root /home 2>/dev/null; echo end`);
        expect(listing.output).not.toContain(file.slice(file.lastIndexOf("/") + 1));
        // Only root can read the host's shadow file to compare; anyone can check the sandbox printed none of it.
        const shadow = existsSync("/etc/shadow") && process.getuid?.() === 0 ? readFileSync("/etc/shadow", "utf8").split("\n")[0]! : "root:";
        expect(result.output).not.toContain(shadow);
      } finally {
        rmSync(file, { force: true });
      }
    });
  });

  hostEscapeCases(target);
}

/**
 * A shared library whose constructor drops a file in a host directory the
 * sandbox cannot see: if any host process (a launcher, a helper) loads it,
 * the file appears. Built here with the system C compiler.
 */
export interface EnvProbe {
  /** Host directory holding the library, a shell script and fake tools, all readable by any user. */
  dir: string;
  library: string;
  /** A shell script that drops a marker too (for BASH_ENV, ENV). */
  script: string;
  /** A directory of executables named like the launcher's tools, each dropping a marker, then failing. */
  fakeBin: string;
  /** A directory of copies of the library under the names of the launcher's libraries (for LD_LIBRARY_PATH). */
  fakeLib: string;
  /** Markers dropped so far. */
  hits: () => string[];
  remove: () => void;
}

export function buildEnvProbe(): EnvProbe {
  const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-env-probe-"));
  chmodSync(dir, 0o755);
  const markers = nodePath.join(dir, "markers");
  mkdirSync(markers);
  // Any host user may drop a marker: a launcher that changed user must still be caught.
  chmodSync(markers, 0o1777);
  const source = nodePath.join(dir, "probe.c");
  writeFileSync(
    source,
    `#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void strata_probe(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lib-%d", MARKER_DIR, (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT, 0666);
  if (fd >= 0) close(fd);
}
`,
  );
  const library = nodePath.join(dir, "probe.so");
  execFileSync("cc", ["-shared", "-fPIC", `-DMARKER_DIR="${markers}"`, "-o", library, source]);
  const script = nodePath.join(dir, "probe.sh");
  writeFileSync(script, `: > "${markers}/script-$$"\n`, { mode: 0o755 });
  const fakeBin = nodePath.join(dir, "bin");
  mkdirSync(fakeBin, { mode: 0o755 });
  for (const tool of ["sh", "bash", "dash", "env", "bwrap", "setpriv", "prlimit", "docker", "ssh", "nsenter", "unshare"]) {
    writeFileSync(nodePath.join(fakeBin, tool), `#!/bin/sh\n: > "${markers}/bin-${tool}-$$"\nexit 99\n`, { mode: 0o755 });
  }
  const fakeLib = nodePath.join(dir, "lib");
  mkdirSync(fakeLib, { mode: 0o755 });
  for (const name of ["libselinux.so.1", "libcap.so.2", "libcap-ng.so.0", "libsmartcols.so.1", "libpcre2-8.so.0"]) {
    writeFileSync(nodePath.join(fakeLib, name), readFileSync(library), { mode: 0o755 });
  }
  return { dir, library, script, fakeBin, fakeLib, hits: () => readdirSync(markers), remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** What a launcher must never do with a caller's env, and what a sandbox must never leave on the host. */
export function hostEscapeCases(target: ContainmentTarget): void {
  describe(`host escapes: ${target.name}`, () => {
    const open: ClosableSandbox[] = [];
    const create = async (limits: ContainmentLimits = {}) => {
      const sandbox = await target.create(limits);
      open.push(sandbox);
      return sandbox;
    };
    const hostDir = (sandbox: ClosableSandbox) => {
      expect(target.hostWorkspace, `${target.name} must say where its workspace lives on the host (hostWorkspace)`).toBeDefined();
      return target.hostWorkspace!(sandbox);
    };
    let probe: EnvProbe;
    beforeAll(() => {
      probe = buildEnvProbe();
    });
    afterAll(() => probe?.remove());
    afterEach(async () => {
      await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
    });

    const hostileEnvs = () => ({
      LD_PRELOAD: probe.library,
      LD_AUDIT: probe.library,
      LD_LIBRARY_PATH: probe.fakeLib,
      BASH_ENV: probe.script,
      ENV: probe.script,
      PATH: `${probe.fakeBin}:/usr/bin:/bin`,
    });

    it("the probe works: a host process started with the hostile env drops markers", () => {
      const before = probe.hits().length;
      execFileSync("/bin/true", { env: { LD_PRELOAD: probe.library } });
      expect(probe.hits().length).toBeGreaterThan(before);
      rmSync(nodePath.join(probe.dir, "markers"), { recursive: true });
      mkdirSync(nodePath.join(probe.dir, "markers"));
      chmodSync(nodePath.join(probe.dir, "markers"), 0o1777);
    });

    it("caller env (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH, BASH_ENV, ENV, PATH) reaches the command, never a host process", async () => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      for (const [name, value] of Object.entries(hostileEnvs())) {
        const result = await sandbox.execute(`printf '%s\\n' "[$${name}]"`, { env: { [name]: value } });
        expect(result.output, name).toContain(`[${value}]`);
        expect(probe.hits(), name).toEqual([]);
      }
      // All at once, and through the runtime's command.run payload too.
      const all = await sandbox.execute('echo "[$LD_PRELOAD]"', { env: hostileEnvs() });
      expect(all.output).toContain(`[${probe.library}]`);
      const viaPayload = await dispatchPayload(native, { type: "command.run", cmd: 'echo "[$LD_PRELOAD]"', env: hostileEnvs() });
      expect(JSON.stringify(viaPayload)).toContain(probe.library);
      expect(probe.hits()).toEqual([]);
    });

    it("a library the command drops in its workspace, preloaded by its host path, runs in the sandbox only", async () => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      expect((await sandbox.uploadFiles([[`${native.root}/probe.so`, readFileSync(probe.library)]]))[0]!.error).toBeNull();
      const hostPath = nodePath.join(hostDir(native), "probe.so");
      const result = await sandbox.execute('echo "[$LD_PRELOAD]"', { env: { LD_PRELOAD: hostPath } });
      expect(result.output).toContain(`[${hostPath}]`);
      const inside = await sandbox.execute("true", { env: { LD_PRELOAD: `${native.root}/probe.so` } });
      expect(inside.exitCode).toBe(0);
      expect(probe.hits()).toEqual([]);
    });

    it("rejects env names with '=' or NUL and values with NUL: invalid_argument", async () => {
      const sandbox = toSeedProtocol(await create());
      const envs: Record<string, string>[] = [{ "A=B": "x" }, { "A\0B": "x" }, { "": "x" }, { A: "x\0y" }];
      for (const env of envs) {
        await expect(sandbox.execute("true", { env })).rejects.toMatchObject({ code: "invalid_argument" });
      }
      expect(probe.hits()).toEqual([]);
    });

    it("files a command makes setuid or setgid are never setuid/setgid root on the host", async () => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      const result = await sandbox.execute(
        "cp /bin/true t4 && chmod 4755 t4; cp /bin/true t6 && chmod 6755 t6; cp /bin/true t2 && chmod 2755 t2; mkdir d && chmod 2775 d; ls -ln t4 t6 t2",
      );
      expect(result.exitCode, result.output).toBe(0);
      const dir = hostDir(native);
      for (const name of ["t4", "t6", "t2", "d"]) {
        const stat = lstatSync(nodePath.join(dir, name));
        const setuidRoot = (stat.mode & 0o4000) !== 0 && stat.uid === 0;
        const setgidRoot = (stat.mode & 0o2000) !== 0 && stat.gid === 0;
        expect({ name, setuidRoot, setgidRoot }).toEqual({ name, setuidRoot: false, setgidRoot: false });
        if (process.getuid?.() === 0) expect(stat.uid, name).not.toBe(0);
      }
    });

    it("a file uploaded from the host stays editable by commands", async () => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      const bytes = new TextEncoder().encode("from host\n");
      expect((await sandbox.uploadFiles([[`${native.root}/deep/er/up.txt`, bytes]]))[0]!.error).toBeNull();
      const result = await sandbox.execute("echo from sandbox >> deep/er/up.txt && touch deep/er/new && mv deep/er/up.txt deep/er/moved && cat deep/er/moved");
      expect(result.output).toBe("from host\nfrom sandbox\n");
      expect(result.exitCode).toBe(0);
      expect((await sandbox.edit(`${native.root}/deep/er/moved`, "from sandbox", "edited")).error).toBeFalsy();
    });

    // Each place a command can look, probed on its own. /proc/*/mountinfo is left out on purpose: the
    // kernel shows a bind mount's root there (docs/security.md); the sandboxes' own tests pin it.
    const hostPathProbes: Record<string, string> = {
      env: "env",
      "pwd -P": "pwd -P",
      "/proc/self/cwd": "readlink /proc/self/cwd",
      "/proc/mounts": "cat /proc/mounts",
      "/proc/self/mountstats": "cat /proc/self/mountstats",
      "command lines, environments and open files": "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; tr '\\0' '\\n' < $p/environ; ls -l $p/fd 2>/dev/null; done; true",
    };
    it.each(Object.keys(hostPathProbes))("shows no host path of the workspace in %s", async (place) => {
      const native = await create();
      const sandbox = toSeedProtocol(native);
      const dir = hostDir(native);
      const result = await sandbox.execute(hostPathProbes[place]!);
      expect(result.exitCode, result.output).toBe(0);
      expect(result.output, "the probe saw nothing: nothing was tested").toContain(place === "/proc/mounts" || place === "/proc/self/mountstats" ? " / " : "/workspace");
      expect(result.output).not.toContain(dir);
    });
  });
}
