/**
 * SshSandbox against the real OpenSSH server (scripts/services/40-sshd.sh):
 * user strata-ssh on 127.0.0.1, key login only. Each test gets a fresh
 * workspace directory under one directory for the file, removed at the end.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import ssh2 from "ssh2";
import { afterAll, describe, expect, it } from "vitest";
import { isStrataError } from "../core/errors.js";
import { toSeedProtocol } from "../core/seed.js";
import { SshSandbox, type SshSandboxOptions } from "../sandboxes/ssh.js";
import { commandCases } from "./containment-cases.js";
import { rejection, SshWorkspaces } from "./support/sandbox-services.js";
import { abortAtEveryMoment } from "./support/aborts.js";

const workspaces = new SshWorkspaces("ssh-test");
const { root } = workspaces;
const { options } = workspaces.service;
const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | null) => new TextDecoder().decode(data ?? new Uint8Array());

/** A sandbox on a fresh, empty remote workspace. */
const fresh = (extra: Partial<SshSandboxOptions> = {}) => workspaces.fresh(extra);

afterAll(async () => {
  await workspaces.cleanUp();
});

/** Processes of the remote user whose command line mentions `marker`, polled until none is left or `seconds` pass. */
async function remoteProcesses(sandbox: SshSandbox, marker: string, seconds = 3): Promise<string[]> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const { output } = await toSeedProtocol(sandbox).execute(`ps -u ${options.username} -o pid=,stat=,args=`);
    const found = output.split("\n").filter((line) => line.includes(marker) && !/^\s*\d+\s+Z/.test(line));
    if (found.length === 0 || Date.now() > deadline) return found;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("SshSandbox execute", () => {
  it("runs a command in the workspace and reports output, exit code and truncation", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    expect(await sandbox.execute("echo hello; pwd")).toEqual({ output: `hello\n${native.workspace}\n`, exitCode: 0, truncated: false });
    expect((await sandbox.execute("whoami")).output).toBe(`${options.username}\n`);
  });

  it("reports exit codes: explicit, failing command, missing command, killed by a signal", async () => {
    const sandbox = toSeedProtocol(await fresh());
    expect((await sandbox.execute("exit 3")).exitCode).toBe(3);
    expect((await sandbox.execute("false")).exitCode).toBe(1);
    expect((await sandbox.execute("no-such-command-here")).exitCode).toBe(127);
    expect((await sandbox.execute("kill -9 $$")).exitCode).toBe(137);
  });

  it("combines stdout and stderr in the order they were written", async () => {
    const sandbox = toSeedProtocol(await fresh());
    const result = await sandbox.execute("for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done");
    expect(result.output).toBe("out1\nerr1\nout2\nerr2\nout3\nerr3\nout4\nerr4\nout5\nerr5\n");
  });

  it("feeds stdin, text or bytes, and gives end-of-file after it", async () => {
    const sandbox = toSeedProtocol(await fresh());
    expect((await sandbox.execute("cat; echo end", { stdin: "line one\nline two\n" })).output).toBe("line one\nline two\nend\n");
    const big = new Uint8Array(3 * 1024 * 1024).fill(120);
    expect((await sandbox.execute("wc -c", { stdin: big })).output.trim()).toBe(String(big.length));
    expect((await sandbox.execute("cat; echo none", { timeout: 10 })).output).toBe("none\n");
  });

  it("passes environment variables exactly, the call's over the sandbox's", async () => {
    const sandbox = toSeedProtocol(await fresh({ env: { A: "from-sandbox", B: "kept" } }));
    const value = `spaces  'quotes' "double" $HOME \`tick\`\nnew line`;
    const result = await sandbox.execute('printf "%s|%s|%s" "$A" "$B" "$ODD"', { env: { A: "from-call", ODD: value } });
    expect(result.output).toBe(`from-call|kept|${value}`);
    await expect(sandbox.execute("true", { env: { "A;rm": "x" } })).rejects.toMatchObject({ code: "invalid_argument" });
  });

  it("runs in a virtual cwd; a missing or hostile cwd is a typed error", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    await sandbox.execute("mkdir -p sub/deeper");
    // A cwd is a path in the sandbox's one path space: the remote workspace's absolute paths, or relative to it.
    expect((await sandbox.execute("pwd", { cwd: `${native.workspace}/sub/deeper` })).output).toBe(`${native.workspace}/sub/deeper\n`);
    expect((await sandbox.execute("pwd", { cwd: "sub/deeper" })).output).toBe(`${native.workspace}/sub/deeper\n`);
    const missing = await rejection(sandbox.execute("pwd", { cwd: `${native.workspace}/nope` }));
    expect(isStrataError(missing, "file_not_found")).toBe(true);
    // The message names the path as the caller gave it, the one the command would have seen.
    expect((missing as Error).message).toBe(`File '${native.workspace}/nope' not found`);
    await expect(sandbox.execute("pwd", { cwd: "/../etc" })).rejects.toMatchObject({ code: "invalid_path" });
    await expect(sandbox.execute("pwd", { cwd: "/etc" })).rejects.toMatchObject({ code: "invalid_path" });
  });

  it("kills the whole remote process tree at the timeout (exit 124), even a child that left the group", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const marker = `47${Math.floor(Math.random() * 1e6)}`;
    const started = Date.now();
    const result = await sandbox.execute(`sleep ${marker}1 & setsid sleep ${marker}2 & echo started; sleep ${marker}3`, { timeout: 1 });
    expect(Date.now() - started).toBeLessThan(4000);
    expect(result.exitCode).toBe(124);
    expect(result.output).toMatch(/^started\n\n\[Command timed out after 1 s/);
    expect(await remoteProcesses(native, marker)).toEqual([]);
  });

  it("does not wait for a background child that keeps the output open", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const marker = `58${Math.floor(Math.random() * 1e6)}`;
    const started = Date.now();
    expect(await sandbox.execute(`sleep ${marker} & echo back`)).toEqual({ output: "back\n", exitCode: 0, truncated: false });
    expect(Date.now() - started).toBeLessThan(1500);
    expect(await remoteProcesses(native, marker)).toEqual([]);
  });

  it("caps output at the sandbox's limit, keeping the head", async () => {
    const sandbox = toSeedProtocol(await fresh({ maxOutputBytes: 1000 }));
    const capped = await sandbox.execute("echo first; head -c 5000 /dev/zero | tr '\\0' y; echo; echo last");
    expect(capped).toEqual({ output: `first\n${"y".repeat(994)}`, exitCode: 0, truncated: true });
  });

  it("rejects with the abort reason and kills the command when aborted", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const marker = `81${Math.floor(Math.random() * 1e6)}`;
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("stop it")), 300);
    await expect(sandbox.execute(`sleep ${marker}`, { signal: controller.signal })).rejects.toThrow("stop it");
    expect(await remoteProcesses(native, marker)).toEqual([]);
  });

  it("an abort at any moment of a command's start leaves nothing of it running, later either", async () => {
    const native = await fresh();
    const marker = `83${Math.floor(Math.random() * 1e6)}`;
    await abortAtEveryMoment(toSeedProtocol(native), marker, [0, 0, 2, 5, 10, 15, 20, 30, 45, 60]);
    expect(await remoteProcesses(native, marker)).toEqual([]);
  });

  it("a close() at any moment of a command's start answers sandbox_closed and leaves nothing of it running", async () => {
    const observer = await fresh();
    const marker = `84${Math.floor(Math.random() * 1e6)}`;
    for (const delay of [0, 1, 3, 6, 10, 20, 40]) {
      const native = await fresh();
      await native.execute("true");
      const running = native.execute(`sleep ${marker}`);
      setTimeout(() => void native.close(), delay);
      expect((await running).error?.code).toBe("sandbox_closed");
    }
    await new Promise((resolve) => setTimeout(resolve, 1500));
    expect(await remoteProcesses(observer, marker)).toEqual([]);
  });

  it("runs more commands at once than the server's session limit allows, queueing the rest", async () => {
    const sandbox = toSeedProtocol(await fresh());
    const results = await Promise.all(Array.from({ length: 30 }, (_, i) => sandbox.execute(`sleep 0.1; echo ${i}`)));
    expect(results.map((r) => r.output)).toEqual(Array.from({ length: 30 }, (_, i) => `${i}\n`));
  });
});

describe("SshSandbox files", () => {
  it("uploads 1000 files over one SFTP session, then one command renames them all under their locks", async () => {
    // Without a quota: the default one measures the workspace with a command first.
    const native = await fresh({ quota: false });
    const sandbox = toSeedProtocol(native);
    const files = Array.from({ length: 1000 }, (_, i) => [`${native.workspace}/batch/d${i % 10}/file-${i}.txt`, bytes(`content ${i}\n`)] as const);
    const before = { ...native.stats };
    expect(await sandbox.uploadFiles(files)).toEqual(files.map(([path]) => ({ path, error: null })));
    expect(native.stats.execs - before.execs).toBe(1);
    expect(native.stats.sftpSessions).toBe(1);
    expect((await sandbox.execute("find batch -type f | wc -l")).output.trim()).toBe("1000");
    const back = await sandbox.downloadFiles(files.map(([path]) => path));
    expect(back.every((r, i) => r.error === null && text(r.content) === `content ${i}\n`)).toBe(true);
    expect(native.stats.sftpSessions).toBe(1);
  });

  it("answers a mixed batch per item, in order, and never replaces a directory", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const ws = native.workspace;
    await sandbox.uploadFiles([
      [`${ws}/dir/inside.txt`, bytes("keep me")],
      [`${ws}/plain.txt`, bytes("a file")],
    ]);
    const responses = await sandbox.uploadFiles([
      [`${ws}/ok-1.txt`, bytes("one")],
      [`${ws}/dir`, bytes("would clobber a directory")],
      [`${ws}/../escape.txt`, bytes("no")],
      [`${ws}/plain.txt/child.txt`, bytes("under a file")],
      [`${ws}/plain.txt/deeper/child.txt`, bytes("under a file, deeper")],
      [ws, bytes("the workspace itself")],
      ["/outside.txt", bytes("outside the workspace")],
      [`${ws}/ok-2.txt`, bytes("two")],
    ]);
    expect(responses).toEqual([
      { path: `${ws}/ok-1.txt`, error: null },
      { path: `${ws}/dir`, error: "is_directory" },
      { path: `${ws}/../escape.txt`, error: "invalid_path" },
      { path: `${ws}/plain.txt/child.txt`, error: "invalid_path" },
      { path: `${ws}/plain.txt/deeper/child.txt`, error: "invalid_path" },
      { path: ws, error: "is_directory" },
      { path: "/outside.txt", error: "invalid_path" },
      { path: `${ws}/ok-2.txt`, error: null },
    ]);
    const back = await sandbox.downloadFiles([`${ws}/dir/inside.txt`, `${ws}/plain.txt`, `${ws}/ok-1.txt`, `${ws}/ok-2.txt`]);
    expect(back.map((r) => text(r.content))).toEqual(["keep me", "a file", "one", "two"]);
  });

  it("round-trips every byte value and overwrites on upload", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const path = `${native.workspace}/bin.dat`;
    const all = Uint8Array.from({ length: 256 * 4 }, (_, i) => i % 256);
    await sandbox.uploadFiles([[path, bytes("old content that is longer than nothing")]]);
    expect(await sandbox.uploadFiles([[path, all]])).toEqual([{ path, error: null }]);
    expect((await sandbox.downloadFiles([path]))[0]!.content).toEqual(all);
    expect((await sandbox.execute("wc -c < bin.dat")).output.trim()).toBe("1024");
  });

  it("downloads: missing, directory, under a file, unreadable, hostile path, and follows a symlink", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    const ws = native.workspace;
    await sandbox.uploadFiles([[`${ws}/real/target.txt`, bytes("through the link")]]);
    await sandbox.execute("ln -s real/target.txt link.txt && echo secret > locked.txt && chmod 000 locked.txt");
    const responses = await sandbox.downloadFiles([
      `${ws}/missing.txt`,
      `${ws}/real`,
      `${ws}/real/target.txt/x`,
      `${ws}/locked.txt`,
      `${ws}/a/../b`,
      `${ws}/link.txt`,
    ]);
    expect(responses.map((r) => [r.path, r.error])).toEqual([
      [`${ws}/missing.txt`, "file_not_found"],
      [`${ws}/real`, "is_directory"],
      [`${ws}/real/target.txt/x`, "file_not_found"],
      [`${ws}/locked.txt`, "permission_denied"],
      [`${ws}/a/../b`, "invalid_path"],
      [`${ws}/link.txt`, null],
    ]);
    expect(text(responses[5]!.content)).toBe("through the link");
  });
});

describe("SshSandbox lifecycle", () => {
  it("creates a nested workspace that is missing, and a new connection sees the same files", async () => {
    const workspace = `${root}/${randomUUID()}/nested/deeper`;
    const first = await SshSandbox.connect({ ...options, workspace });
    await toSeedProtocol(first).uploadFiles([[`${workspace}/kept.txt`, bytes("still here")]]);
    await first.close();
    const again = await SshSandbox.connect({ ...options, workspace });
    workspaces.track(again);
    expect(again.id).toBe(first.id);
    expect(text((await toSeedProtocol(again).downloadFiles([`${workspace}/kept.txt`]))[0]!.content)).toBe("still here");
  });

  it("fails every operation with sandbox_closed after close, and close is idempotent", async () => {
    const native = await fresh();
    const sandbox = toSeedProtocol(native);
    await native.close();
    await native.close();
    await expect(sandbox.execute("echo hi")).rejects.toMatchObject({ code: "sandbox_closed" });
    // The seeds' per-item answers have four codes and never throw; a closed sandbox's file channel is permission_denied.
    const path = `${native.workspace}/a`;
    expect(await sandbox.uploadFiles([[path, bytes("x")]])).toEqual([{ path, error: "permission_denied" }]);
    expect(await sandbox.downloadFiles([path])).toEqual([{ path, content: null, error: "permission_denied" }]);
    const closed = await rejection(sandbox.lsInfo(native.workspace));
    expect(isStrataError(closed, "sandbox_closed")).toBe(true);
    expect((closed as Error).message).not.toContain(native.workspace);
  });

  it("refuses a server whose host key is not the expected one", async () => {
    const other = readFileSync(`${process.env.STRATA_SSH_KEY}.pub`, "utf8");
    await expect(SshSandbox.connect({ ...options, hostKey: other, workspace: `${root}/x` })).rejects.toMatchObject({ code: "permission_denied" });
  });

  it("reports refused credentials and an unreachable server as typed errors", async () => {
    // ssh2 generates an ed25519 key it cannot parse back about once in 300 tries; take one it can.
    let stranger = ssh2.utils.generateKeyPairSync("ed25519");
    while (ssh2.utils.parseKey(stranger.private) instanceof Error) stranger = ssh2.utils.generateKeyPairSync("ed25519");
    const refused = await rejection(SshSandbox.connect({ ...options, privateKey: stranger.private, workspace: `${root}/x` }));
    expect((refused as { code?: string }).code, String((refused as Error).cause)).toBe("permission_denied");
    await expect(SshSandbox.connect({ ...options, port: 1, workspace: `${root}/x` })).rejects.toMatchObject({ code: "unavailable" });
    await expect(SshSandbox.connect({ ...options, workspace: "relative/dir" })).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(SshSandbox.connect({ ...options, privateKey: "not a key", workspace: `${root}/x` })).rejects.toMatchObject({
      code: "invalid_argument",
    });
  });
});

// The command limits every sandbox promises: timeout and process-tree kill, output cap, streaming.
commandCases({ name: "ssh", create: async () => fresh() });
