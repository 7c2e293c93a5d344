/**
 * SshSandbox against a hostile network, a hostile command and other users of
 * the machine, on the real OpenSSH server (scripts/services/40-sshd.sh, on
 * this host): host-key checks, uploads that never follow a planted link,
 * dropped and stalled connections, close() stopping remote work, secrets
 * kept out of `ps`, and timeouts a timer cannot honour.
 *
 * A fault test kills (or stops) only the sshd processes serving its own
 * connection, found by the client's local port with `ss`.
 */
import { execFileSync } from "node:child_process";
import { createHmac, randomBytes, randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isStrataError } from "../core/errors.js";
import { toSeedProtocol } from "../core/seed.js";
import { MAX_TIMEOUT_SECONDS } from "../core/limits.js";
import { SshSandbox, type SshSandboxOptions } from "../sandboxes/ssh.js";
import { rejection, SshWorkspaces } from "./support/sandbox-services.js";

const workspaces = new SshWorkspaces("ssh-threats");
const { root } = workspaces;
const { options } = workspaces.service;
const localDir = mkdtempSync(join(tmpdir(), "strata-ssh-threats-"));
const bytes = (text: string) => new TextEncoder().encode(text);

/** A sandbox on a fresh, empty remote workspace. */
const fresh = (extra: Partial<SshSandboxOptions> = {}) => workspaces.fresh(extra);

afterAll(async () => {
  await workspaces.cleanUp();
  rmSync(localDir, { recursive: true, force: true });
});

/** The sshd processes serving this sandbox's current connection (and nothing else): by the client's local port. */
function serverPids(sandbox: SshSandbox): number[] {
  const localPort = (sandbox.client as unknown as { _sock: { localPort: number } })._sock.localPort;
  const lines = execFileSync("ss", ["-tnpH", "state", "established", `( sport = :${options.port} and dport = :${localPort} )`], { encoding: "utf8" });
  const pids = [...lines.matchAll(/pid=(\d+)/g)].map((match) => Number(match[1]));
  expect(pids.length).toBeGreaterThan(0);
  return [...new Set(pids)];
}

function signalServer(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // Already gone with its sibling.
    }
  }
}

/** Processes of the remote user whose command line mentions `marker`, seen from another sandbox, polled until none is left. */
async function remoteProcesses(marker: string, seconds = 3): Promise<string[]> {
  const observer = toSeedProtocol(await fresh());
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const { output } = await observer.execute(`ps -u ${options.username} -o pid=,stat=,args=`);
    const found = output.split("\n").filter((line) => line.includes(marker) && !/^\s*\d+\s+Z/.test(line));
    if (found.length === 0 || Date.now() > deadline) return found;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** grep's matches, whether it answers a list or `{ matches }`. */
function matchCount(result: unknown): number {
  return Array.isArray(result) ? result.length : (result as { matches: unknown[] }).matches.length;
}

const elapsed = (started: number) => (Date.now() - started) / 1000;

describe("SshSandbox host key", () => {
  const hostLine = options.hostKey!.trim();
  const [keyType, keyBlob] = hostLine.split(/\s+/);
  const hostName = `[${options.host}]:${options.port}`;

  it("refuses to connect without a way to check the server's key, naming the options", async () => {
    const { hostKey: _dropped, ...withoutKey } = options;
    const error = await rejection(SshSandbox.connect({ ...withoutKey, workspace: `${root}/x` }));
    expect(isStrataError(error, "invalid_argument")).toBe(true);
    expect((error as Error).message).toMatch(/hostKey or knownHosts.*insecureAcceptAnyHostKey/);
  });

  it("refuses a wrong key before any command runs: the workspace is never made", async () => {
    const workspace = `${root}/never-made-${randomUUID()}`;
    const stranger = readFileSync(`${process.env.STRATA_SSH_KEY}.pub`, "utf8");
    const error = await rejection(SshSandbox.connect({ ...options, hostKey: stranger, workspace }));
    expect(isStrataError(error, "permission_denied")).toBe(true);
    expect((error as Error).message).toMatch(/host key does not match/);
    const checker = toSeedProtocol(await fresh());
    expect((await checker.execute(`test -e '${workspace}' && echo made || echo absent`)).output).toBe("absent\n");
  });

  it("accepts a known_hosts file, plain or hashed, and refuses one that lists another key or only other hosts", async () => {
    const withoutKey = { hostKey: undefined };
    const file = (name: string, content: string) => {
      const path = join(localDir, name);
      writeFileSync(path, content);
      return path;
    };
    const salt = randomBytes(20);
    const hashed = `|1|${salt.toString("base64")}|${createHmac("sha1", salt).update(hostName).digest("base64")}`;
    for (const knownHosts of [
      file("plain", `# comment\nother.example ${keyType} AAAAother\n${hostName} ${keyType} ${keyBlob}\n`),
      file("hashed", `${hashed} ${keyType} ${keyBlob}\n`),
    ]) {
      const sandbox = toSeedProtocol(await fresh({ ...withoutKey, knownHosts }));
      expect((await sandbox.execute("echo in")).output).toBe("in\n");
    }
    const stranger = readFileSync(`${process.env.STRATA_SSH_KEY}.pub`, "utf8").trim().split(/\s+/);
    const wrong = file("wrong", `${hostName} ${stranger[0]} ${stranger[1]}\n`);
    await expect(fresh({ ...withoutKey, knownHosts: wrong })).rejects.toMatchObject({ code: "permission_denied" });
    const otherHost = file("other", `[${options.host}]:1 ${keyType} ${keyBlob}\n`);
    await expect(fresh({ ...withoutKey, knownHosts: otherHost })).rejects.toMatchObject({ code: "permission_denied" });
    const revoked = file("revoked", `${hostName} ${keyType} ${keyBlob}\n@revoked * ${keyType} ${keyBlob}\n`);
    await expect(fresh({ ...withoutKey, knownHosts: revoked })).rejects.toMatchObject({ code: "permission_denied" });
    const missing = await rejection(fresh({ ...withoutKey, knownHosts: join(localDir, "no-such-file") }));
    expect(isStrataError(missing, "invalid_argument")).toBe(true);
    expect((missing as Error).message).not.toContain(localDir);
  });

  it("connects to any server only when asked by the loudly named opt-out", async () => {
    const sandbox = toSeedProtocol(await fresh({ hostKey: undefined, insecureAcceptAnyHostKey: true }));
    expect((await sandbox.execute("echo in")).output).toBe("in\n");
  });
});

describe("SshSandbox uploads", () => {
  it("replaces a symlink at the target instead of writing through it, as write does", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const ws = native.workspace;
    const outside = `${root}/outside-${randomUUID()}.txt`;
    await sandbox.execute(`echo precious > '${outside}' && ln -s '${outside}' up.txt && ln -s '${outside}' wr.txt`);
    expect(await sandbox.uploadFiles([[`${ws}/up.txt`, bytes("uploaded")]])).toEqual([{ path: `${ws}/up.txt`, error: null }]);
    expect((await sandbox.write(`${ws}/wr.txt`, "written", { overwrite: true })).error).toBeUndefined();
    const { output } = await sandbox.execute(`cat '${outside}'; for f in up.txt wr.txt; do test -L $f && echo "$f link" || echo "$f file: $(cat $f)"; done`);
    expect(output).toBe("precious\nup.txt file: uploaded\nwr.txt file: written\n");
  });

  it("refuses a symlinked parent directory, whether it leads out of the workspace or stays inside", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const ws = native.workspace;
    const outside = `${root}/outside-dir-${randomUUID()}`;
    await sandbox.execute(`mkdir -p '${outside}' real && ln -s '${outside}' out && ln -s real alias && ln -s ../.. up`);
    const responses = await sandbox.uploadFiles([
      [`${ws}/out/planted.txt`, bytes("no")],
      [`${ws}/out/deeper/planted.txt`, bytes("no")],
      [`${ws}/up/planted.txt`, bytes("no")],
      // Inside, too: a change never passes through a link, so the permission rules hold on the path as given.
      [`${ws}/alias/kept.txt`, bytes("inside")],
      // The outside directory by its own path: outside the workspace, so not a path the sandbox's files take.
      [`${outside}/planted.txt`, bytes("no")],
    ]);
    expect(responses.map((r) => r.error)).toEqual(["permission_denied", "permission_denied", "permission_denied", "permission_denied", "invalid_path"]);
    const { output } = await sandbox.execute(`ls -A '${outside}' | wc -l; ls ../.. | grep -c planted; ls -A real | wc -l`);
    expect(output).toBe("0\n0\n0\n");
  });

  it("replaces atomically: a reader holding the old file sees it whole, the mode is kept, no temporary file is left", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const path = `${native.workspace}/f.bin`;
    const size = 4 * 1024 * 1024;
    await sandbox.uploadFiles([[path, new Uint8Array(size).fill(97)]]);
    await sandbox.execute("chmod 751 f.bin");
    // The reader opens the file, then waits for the upload to finish before reading it through its descriptor.
    const reader = sandbox.execute("exec 3<f.bin; echo opened; while [ ! -e done ]; do sleep 0.05; done; tr -d a <&3 | wc -c; wc -c <&3", { timeout: 30 });
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await sandbox.uploadFiles([[path, new Uint8Array(size).fill(98)]])).toEqual([{ path, error: null }]);
    await sandbox.execute("touch done");
    // In-place writes would show 'b's (or a truncated file) through the reader's descriptor.
    expect((await reader).output).toBe("opened\n0\n0\n");
    const { output } = await sandbox.execute("stat -c %a f.bin; tr -d b < f.bin | wc -c; ls -A");
    expect(output).toBe("751\n0\ndone\nf.bin\n");
  });
});

describe("SshSandbox when the connection drops", () => {
  const big = new Uint8Array(50 * 1024 * 1024).fill(120);

  it("answers a 50 MB upload cut mid-way per item, within seconds, and the next call reconnects", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const pids = serverPids(native);
    const started = Date.now();
    const path = `${native.workspace}/big.bin`;
    const upload = sandbox.uploadFiles([[path, big]]);
    setTimeout(() => signalServer(pids, "SIGKILL"), 150);
    expect(await upload).toEqual([{ path, error: "permission_denied" }]);
    expect(elapsed(started)).toBeLessThan(10);
    expect(await sandbox.execute("echo back")).toMatchObject({ output: "back\n", exitCode: 0 });
    expect(native.stats.connections).toBe(2);
    // The cut file never replaced anything: the target does not exist.
    expect((await sandbox.execute("test -e big.bin && echo there || echo absent")).output).toBe("absent\n");
    // What the cut transfer left is a temporary name, which listings leave out.
    const listed = await sandbox.lsInfo(native.workspace);
    expect(listed).toEqual([]);
    expect(JSON.stringify(listed)).not.toContain(".strata-");
  });

  it("answers a 50 MB download cut mid-way per item (never a throw), and the next call reconnects", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    await sandbox.execute("head -c 52428800 /dev/zero > big.bin");
    const pids = serverPids(native);
    const path = `${native.workspace}/big.bin`;
    const download = sandbox.downloadFiles([path, path]);
    setTimeout(() => signalServer(pids, "SIGKILL"), 100);
    const started = Date.now();
    expect(await download).toEqual([
      { path, content: null, error: "permission_denied" },
      { path, content: null, error: "permission_denied" },
    ]);
    expect(elapsed(started)).toBeLessThan(10);
    const [again] = await sandbox.downloadFiles([path]);
    expect(again!.content?.length).toBe(52428800);
  });

  it("rejects a command cut mid-run with unavailable (not an exit code), and the next call reconnects", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const pids = serverPids(native);
    const running = sandbox.execute("echo started; sleep 5");
    setTimeout(() => signalServer(pids, "SIGKILL"), 300);
    const error = await rejection(running);
    expect(isStrataError(error, "unavailable")).toBe(true);
    expect((await sandbox.execute("echo back")).output).toBe("back\n");
    const missing = `${native.workspace}/missing`;
    expect(await sandbox.downloadFiles([missing])).toEqual([{ path: missing, content: null, error: "file_not_found" }]);
  });

  it("gives up on a server that stops answering at the keepalive limit: unavailable, then a new connection", async () => {
    const native = await fresh({ keepaliveIntervalSeconds: 1 });
    const sandbox = toSeedProtocol(native);
    const pids = serverPids(native);
    const started = Date.now();
    const running = sandbox.execute("sleep 20", { timeout: 60 });
    const stalled = `${native.workspace}/stalled.bin`;
    const upload = sandbox.uploadFiles([[stalled, big]]);
    await new Promise((resolve) => setTimeout(resolve, 100));
    signalServer(pids, "SIGSTOP");
    try {
      expect(isStrataError(await rejection(running), "unavailable")).toBe(true);
      expect(await upload).toEqual([{ path: stalled, error: "permission_denied" }]);
      expect(elapsed(started)).toBeLessThan(10);
    } finally {
      signalServer(pids, "SIGKILL");
    }
    expect((await sandbox.execute("echo back")).output).toBe("back\n");
  });
});

describe("SshSandbox close", () => {
  it("kills the running remote command and answers its call, and one still queued, with sandbox_closed", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const marker = `93${Math.floor(Math.random() * 1e6)}`;
    // Seven commands: six hold the channels, the seventh waits in the queue.
    const calls = Array.from({ length: 7 }, (_, i) => rejection(sandbox.execute(`sleep ${marker}${i}`)));
    await new Promise((resolve) => setTimeout(resolve, 500));
    const started = Date.now();
    await native.close();
    expect(elapsed(started)).toBeLessThan(6);
    for (const error of await Promise.all(calls)) expect(isStrataError(error, "sandbox_closed")).toBe(true);
    expect(await remoteProcesses(marker)).toEqual([]);
  });
});

describe("SshSandbox keeps secrets out of argv", () => {
  /** Every argv on this host (sshd runs here), sampled until `until` settles. */
  /** Takes `ps` samples (into `samples`, which the caller may watch) until `until` settles. */
  async function sampleArgs(until: Promise<unknown>, samples: string[] = []): Promise<string[]> {
    let done = false;
    void until.finally(() => (done = true)).catch(() => undefined);
    while (!done) {
      samples.push(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" }));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    return samples;
  }

  it("sends env values over stdin: ps shows neither the value nor the sandbox's own env", async () => {
    const secret = `xyz${randomUUID().replace(/-/g, "")}`;
    const sandbox = toSeedProtocol(await fresh({ env: { SANDBOX_SECRET: `${secret}-sandbox` } }));
    const visible = `sleep 2.${Math.floor(Math.random() * 1e6)}`;
    const run = sandbox.execute(`${visible}; printf '%s|%s' "$SECRET" "$SANDBOX_SECRET"`, { env: { SECRET: secret } });
    const samples = await sampleArgs(run);
    expect((await run).output).toBe(`${secret}|${secret}-sandbox`);
    // The sampler sees the remote user's processes (the command itself is there), but never the secret.
    expect(samples.some((sample) => sample.includes(visible))).toBe(true);
    expect(samples.filter((sample) => sample.includes(secret))).toEqual([]);
  });

  it("sends grep patterns over stdin: ps never shows the pattern", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const ws = native.workspace;
    const pattern = `pw-${randomUUID()}`;
    await sandbox.uploadFiles(Array.from({ length: 200 }, (_, i) => [`${ws}/d${i % 20}/f${i}.txt`, bytes(`line\n${i % 50 === 0 ? pattern : "other"}\n`)] as const));
    // Searches go on until the sampler has looked 20 times: a fixed span of time held too few samples when ps itself
    // was slow on a loaded machine (each sample blocks the event loop for as long as ps runs).
    const samples: string[] = [];
    const searches = (async () => {
      let found = 0;
      do found = matchCount(await sandbox.grep(pattern, ws));
      while (samples.length < 20);
      return found;
    })();
    await sampleArgs(searches, samples);
    expect(await searches).toBe(4);
    expect(samples.length).toBeGreaterThanOrEqual(20);
    expect(samples.filter((sample) => sample.includes(pattern))).toEqual([]);
  });

  it("passes env values with newlines, carriage returns, quotes and the splice variable's own name exactly", async () => {
    const sandbox = toSeedProtocol(await fresh());
    const value = `a\nb\r\nc '"$strata_nl"' $(id) \`id\` \\ ${"z".repeat(100_000)}\n`;
    const result = await sandbox.execute('printf "%s" "$V"; cat', { env: { V: value }, stdin: "then stdin\n" });
    expect(result.output).toBe(`${value}then stdin\n`);
  });
});

describe("SshSandbox timeouts", () => {
  it("refuses a timeout no timer can honour, and honours the largest one", async () => {
    const sandbox = toSeedProtocol(await fresh());
    await expect(sandbox.execute("true", { timeout: MAX_TIMEOUT_SECONDS + 1 })).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(sandbox.execute("true", { timeout: 2_592_000 })).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(fresh({ timeout: 2_592_000 })).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(fresh({ connectTimeoutSeconds: 2_592_000 })).rejects.toMatchObject({ code: "invalid_argument" });
    expect(await sandbox.execute("sleep 0.2; echo ran", { timeout: MAX_TIMEOUT_SECONDS })).toMatchObject({ output: "ran\n", exitCode: 0 });
    const patient = toSeedProtocol(await fresh({ timeout: MAX_TIMEOUT_SECONDS }));
    expect(await patient.execute("sleep 0.2; echo ran")).toMatchObject({ output: "ran\n", exitCode: 0 });
  });
});
