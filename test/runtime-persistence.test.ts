import { spawn } from "node:child_process";
import { chmodSync, chownSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isStrataError } from "../core/errors.js";
import { commandRun, filesRead, PersistentSandboxRegistry, providers, type SandboxSpec } from "../runtime/index.js";
import { providerMissing, requireService } from "./support/runtime-services.js";

let root: string;
beforeEach(() => {
  root = join(mkdtempSync(join(tmpdir(), "strata-registry-")), "sandboxes");
});
afterEach(() => {
  rmSync(join(root, ".."), { recursive: true, force: true });
});

const mode = (path: string) => statSync(path).mode & 0o777;
const hoursAgo = (hours: number) => new Date(Date.now() - hours * 3_600_000);

describe("persistent sandbox registry: local directories", () => {
  it("allocates fresh private directories under <root>/local", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    const a = await registry.allocLocal();
    const b = await registry.allocLocal();
    expect(a.id).not.toBe(b.id);
    expect(a.path).toBe(join(root, "local", a.id));
    expect(statSync(a.path).isDirectory()).toBe(true);
    expect(mode(a.path)).toBe(0o700);
    expect(mode(join(root, "local"))).toBe(0o700);
    expect((await registry.listLocal()).map((entry) => entry.id).sort()).toEqual([a.id, b.id].sort());
  });

  it("ensureLocal creates or reuses a directory and keeps what is in it", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    const path = await registry.ensureLocal("project-1");
    writeFileSync(join(path, "notes.txt"), "kept");
    expect(await registry.ensureLocal("project-1")).toBe(path);
    expect(readdirSync(path)).toEqual(["notes.txt"]);
    expect(await registry.deleteLocal("project-1")).toBe(true);
    expect(await registry.deleteLocal("project-1")).toBe(false);
    expect(await registry.listLocal()).toEqual([]);
  });

  it("pruneLocal removes only directories older than the limit", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    const old = await registry.ensureLocal("old");
    const fresh = await registry.ensureLocal("fresh");
    const borderline = await registry.ensureLocal("borderline");
    writeFileSync(join(old, "file"), "x");
    utimesSync(old, hoursAgo(48), hoursAgo(48));
    utimesSync(borderline, hoursAgo(23), hoursAgo(23));
    expect(await registry.pruneLocal({ olderThanMs: 24 * 3_600_000 })).toEqual(["old"]);
    expect((await registry.listLocal()).map((entry) => entry.id).sort()).toEqual(["borderline", "fresh"]);
    expect(statSync(fresh).isDirectory()).toBe(true);
    // Using a directory (ensureLocal) marks it fresh again.
    utimesSync(borderline, hoursAgo(48), hoursAgo(48));
    await registry.ensureLocal("borderline");
    expect(await registry.pruneLocal({ olderThanMs: 24 * 3_600_000 })).toEqual([]);
  });
});

describe("persistent sandbox registry: remote records", () => {
  it("records, loads, lists, touches and deletes", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    const record = await registry.recordRemote("docker", "0123abcd", { image: "strata-test/busybox", env: { A: "1" }, timeout: 60 });
    expect(record).toMatchObject({ version: 1, provider: "docker", remoteId: "0123abcd", spec: { image: "strata-test/busybox", env: { A: "1" }, timeout: 60 } });
    const file = join(root, "remote", `${record.id}.json`);
    expect(mode(file)).toBe(0o600);
    expect(mode(join(root, "remote"))).toBe(0o700);
    const { touchedAt: _recordedAt, ...stored } = record;
    const loaded = await registry.loadRemote(record.id);
    expect(loaded).toMatchObject(stored);
    expect(Math.abs(Date.parse(loaded!.touchedAt) - Date.parse(record.createdAt))).toBeLessThan(1000);
    const second = await registry.recordRemote("ssh", "ssh://strata@127.0.0.1:52222/home/strata/ws", null, { id: "named-1" });
    expect((await registry.listRemote()).map((r) => r.id)).toEqual([record.id, second.id]);

    utimesSync(file, hoursAgo(1), hoursAgo(1));
    expect((await registry.loadRemote(record.id))!.touchedAt).toBe(statSync(file).mtime.toISOString());
    expect(await registry.touchRemote(record.id)).toBe(true);
    const touched = await registry.loadRemote(record.id);
    expect(Date.now() - Date.parse(touched!.touchedAt)).toBeLessThan(60_000);
    expect(touched!.createdAt).toBe(record.createdAt);

    expect(await registry.deleteRemote(record.id)).toBe(true);
    expect(await registry.deleteRemote(record.id)).toBe(false);
    expect(await registry.touchRemote(record.id)).toBe(false);
    expect(await registry.loadRemote(record.id)).toBeUndefined();
    expect(readdirSync(join(root, "remote"))).toEqual(["named-1.json"]);
  });

  it("pruneRemote removes only records older than the limit", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    await registry.recordRemote("docker", "old", null, { id: "old" });
    await registry.recordRemote("docker", "new", null, { id: "new" });
    utimesSync(join(root, "remote", "old.json"), hoursAgo(2), hoursAgo(2));
    expect(await registry.pruneRemote({ olderThanMs: 3_600_000 })).toEqual(["old"]);
    expect((await registry.listRemote()).map((r) => r.id)).toEqual(["new"]);
    // Touching refreshes a record.
    utimesSync(join(root, "remote", "new.json"), hoursAgo(2), hoursAgo(2));
    await registry.touchRemote("new");
    expect(await registry.pruneRemote({ olderThanMs: 3_600_000 })).toEqual([]);
    await expect(registry.pruneRemote({ olderThanMs: -1 })).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
  });

  it("rejects ids that could leave the root", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    for (const id of ["../escape", "..", ".", ".hidden", "a/b", "a\\b", "", "x".repeat(129), "nul\0byte", "/abs"]) {
      await expect(registry.ensureLocal(id)).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
      await expect(registry.loadRemote(id)).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
      await expect(registry.recordRemote("docker", "x", null, { id })).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
      await expect(registry.deleteLocal(id)).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
    }
    expect(readdirSync(join(root, ".."))).toEqual([]); // nothing was created, inside the root or beside it
  });

  it("skips a damaged record in listings and names no host path when loading it", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    await registry.recordRemote("docker", "good", null, { id: "good" });
    writeFileSync(join(root, "remote", "bad.json"), "{ not json");
    writeFileSync(join(root, "remote", "wrong.json"), JSON.stringify({ version: 1, id: "other" }));
    expect((await registry.listRemote()).map((r) => r.id)).toEqual(["good"]);
    const error = await registry.loadRemote("bad").catch((e: Error) => e);
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toBe("Remote sandbox record 'bad' is not valid JSON");
    await expect(registry.loadRemote("wrong")).rejects.toThrow("Remote sandbox record 'wrong' is malformed");
  });

  it("uses STRATA_SANDBOX_DIR, and the constructor option over it", async () => {
    const saved = process.env.STRATA_SANDBOX_DIR;
    process.env.STRATA_SANDBOX_DIR = join(root, "from-env");
    try {
      expect(new PersistentSandboxRegistry().root).toBe(join(root, "from-env"));
      expect(new PersistentSandboxRegistry({ root: join(root, "explicit") }).root).toBe(join(root, "explicit"));
      delete process.env.STRATA_SANDBOX_DIR;
      expect(new PersistentSandboxRegistry().root).toBe(join(process.cwd(), ".strata", "sandboxes"));
    } finally {
      if (saved === undefined) delete process.env.STRATA_SANDBOX_DIR;
      else process.env.STRATA_SANDBOX_DIR = saved;
    }
  });

  it("reattach refuses unknown ids and providers whose sandboxes die with their process", async () => {
    const registry = new PersistentSandboxRegistry({ root, providers });
    await expect(registry.reattach("nothing-here")).rejects.toThrow("No remote sandbox is recorded under id 'nothing-here'");
    await registry.recordRemote("local", "/somewhere", null, { id: "local-one" });
    await expect(registry.reattach("local-one")).rejects.toThrow("Sandbox provider 'local' cannot reattach to sandboxes");
    await registry.recordRemote("nonexistent", "x", null, { id: "ghost" });
    await expect(registry.reattach("ghost")).rejects.toThrow(/'nonexistent' is not registered; available: local/);
  });
});

describe("persistent sandbox registry: links and other users' directories", () => {
  const refused = (error: unknown) => isStrataError(error, "permission_denied") && !(error as Error).message.includes(root);
  /** A directory outside the registry that a link or a mistake points at: mode 0755, a file, an old subdirectory. */
  function victim(): { path: string; snapshot: () => unknown } {
    const path = join(root, "..", "victim");
    mkdirSync(join(path, "project"), { recursive: true });
    writeFileSync(join(path, "keep.txt"), "precious");
    writeFileSync(join(path, "old.json"), JSON.stringify({ version: 1, id: "old", provider: "docker", remoteId: "x", spec: null, createdAt: "2020-01-01T00:00:00.000Z" }));
    // Registry-looking leftovers, so a registry that followed the link would find something to prune.
    writeFileSync(join(path, ".project.created"), "");
    chmodSync(path, 0o755);
    utimesSync(join(path, "project"), hoursAgo(48), hoursAgo(48));
    utimesSync(join(path, "old.json"), hoursAgo(48), hoursAgo(48));
    const snapshot = () => ({
      mode: mode(path),
      names: readdirSync(path).sort(),
      keep: readFileSync(join(path, "keep.txt"), "utf8"),
      modes: readdirSync(path).map((name) => mode(join(path, name))),
    });
    return { path, snapshot };
  }

  it("a symlinked local/ is refused by every local operation, and its target is untouched", async () => {
    const target = victim();
    const before = target.snapshot();
    mkdirSync(root, { mode: 0o700 });
    symlinkSync(target.path, join(root, "local"));
    const registry = new PersistentSandboxRegistry({ root });
    await expect(registry.allocLocal()).rejects.toSatisfy(refused);
    await expect(registry.ensureLocal("project")).rejects.toSatisfy(refused);
    await expect(registry.listLocal()).rejects.toSatisfy(refused);
    await expect(registry.pruneLocal({ olderThanMs: 0 })).rejects.toSatisfy(refused);
    await expect(registry.deleteLocal("project")).rejects.toSatisfy(refused);
    await expect(registry.touchLocal("project")).rejects.toSatisfy(refused);
    expect(target.snapshot()).toEqual(before);
    expect(lstatSync(join(root, "local")).isSymbolicLink()).toBe(true);
  });

  it("a symlinked remote/ is refused by every record operation, and its target is untouched", async () => {
    const target = victim();
    const before = target.snapshot();
    mkdirSync(root, { mode: 0o700 });
    symlinkSync(target.path, join(root, "remote"));
    const registry = new PersistentSandboxRegistry({ root });
    await expect(registry.recordRemote("docker", "c1", null, { id: "new" })).rejects.toSatisfy(refused);
    await expect(registry.loadRemote("old")).rejects.toSatisfy(refused);
    await expect(registry.listRemote()).rejects.toSatisfy(refused);
    await expect(registry.touchRemote("old")).rejects.toSatisfy(refused);
    await expect(registry.pruneRemote({ olderThanMs: 0 })).rejects.toSatisfy(refused);
    await expect(registry.deleteRemote("old")).rejects.toSatisfy(refused);
    expect(target.snapshot()).toEqual(before);
  });

  it("a local/, remote/ or root owned by another user is refused and left as it was", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    await registry.ensureLocal("mine");
    await registry.recordRemote("docker", "c1", null, { id: "mine" });
    for (const name of ["local", "remote"]) {
      const dir = join(root, name);
      chownSync(dir, 65534, 65534);
      chmodSync(dir, 0o755);
      const before = readdirSync(dir).sort();
      const attempts: Array<() => Promise<unknown>> =
        name === "local"
          ? [() => registry.ensureLocal("other"), () => registry.allocLocal(), () => registry.listLocal(), () => registry.pruneLocal({ olderThanMs: 0 }), () => registry.deleteLocal("mine")]
          : [() => registry.recordRemote("docker", "c2", null, { id: "other" }), () => registry.loadRemote("mine"), () => registry.pruneRemote({ olderThanMs: 0 }), () => registry.deleteRemote("mine")];
      for (const attempt of attempts) await expect(attempt()).rejects.toSatisfy(refused);
      expect(readdirSync(dir).sort()).toEqual(before);
      expect(mode(dir)).toBe(0o755);
      expect(statSync(dir).uid).toBe(65534);
      chownSync(dir, process.getuid!(), process.getgid!());
    }
    chownSync(root, 65534, 65534);
    await expect(registry.ensureLocal("mine")).rejects.toSatisfy(refused);
    await expect(registry.listRemote()).rejects.toSatisfy(refused);
  });

  it("pruneLocal and listLocal leave alone a directory the registry did not make, and links in local/", async () => {
    const target = victim();
    const before = target.snapshot();
    const registry = new PersistentSandboxRegistry({ root });
    const made = await registry.ensureLocal("made");
    const planted = join(root, "local", "planted");
    mkdirSync(planted);
    writeFileSync(join(planted, "work.txt"), "not the registry's");
    symlinkSync(target.path, join(root, "local", "linked"));
    for (const path of [made, planted]) utimesSync(path, hoursAgo(48), hoursAgo(48));
    expect((await registry.listLocal()).map((entry) => entry.id)).toEqual(["made"]);
    expect(await registry.pruneLocal({ olderThanMs: 3_600_000 })).toEqual(["made"]);
    expect(readFileSync(join(planted, "work.txt"), "utf8")).toBe("not the registry's");
    expect(lstatSync(join(root, "local", "linked")).isSymbolicLink()).toBe(true);
    expect(target.snapshot()).toEqual(before);
    // Using a link's id is refused rather than followed.
    await expect(registry.ensureLocal("linked")).rejects.toSatisfy(refused);
    expect(await registry.touchLocal("linked")).toBe(true); // touches the link itself
    expect(target.snapshot()).toEqual(before);
  });

  it("a record that is a symbolic link is not read through, touched through or pruned through", async () => {
    const target = victim();
    const before = target.snapshot();
    const registry = new PersistentSandboxRegistry({ root });
    await registry.recordRemote("docker", "c1", null, { id: "real" });
    symlinkSync(join(target.path, "old.json"), join(root, "remote", "old.json"));
    await expect(registry.loadRemote("old")).rejects.toSatisfy(refused);
    expect((await registry.listRemote()).map((r) => r.id)).toEqual(["real"]);
    await registry.touchRemote("old");
    expect(await registry.pruneRemote({ olderThanMs: 3_600_000 })).toEqual([]);
    expect(target.snapshot()).toEqual(before);
    expect(statSync(join(target.path, "old.json")).mtime.getTime()).toBeLessThan(Date.now() - 3_600_000);
  });
});

describe("persistent sandbox registry: two processes at once", () => {
  const worker = fileURLToPath(new URL("./fixtures/runtime-registry-worker.ts", import.meta.url));

  /** Starts one worker per argument list, releases them together, and returns their reports. */
  async function runTogether(argLists: string[][]): Promise<Array<Record<string, unknown>>> {
    const children = argLists.map((args) => spawn(process.execPath, ["--import", "tsx", worker, ...args], { stdio: ["pipe", "pipe", "pipe"] }));
    const outputs = children.map((child) => {
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      const ready = new Promise<void>((resolve) => child.stdout.on("data", () => stdout.includes("ready\n") && resolve()));
      const done = new Promise<string>((resolve, reject) =>
        child.on("close", (code) => (code === 0 ? resolve(stdout) : reject(new Error(`worker exited ${code}: ${stderr.slice(-1000)}`)))),
      );
      return { ready, done };
    });
    await Promise.all(outputs.map((output) => output.ready));
    for (const child of children) child.stdin.end("go\n");
    const texts = await Promise.all(outputs.map((output) => output.done));
    return texts.map((text) => JSON.parse(text.trim().split("\n").at(-1)!) as Record<string, unknown>);
  }

  it("keeps every record whole while two processes write, touch, list and delete", async () => {
    const reports = await runTogether([
      [root, "p1", "churn", "40"],
      [root, "p2", "churn", "40"],
    ]);
    for (const report of reports) expect(report.failures).toEqual([]);
    const registry = new PersistentSandboxRegistry({ root });
    const expected = [...(reports[0]!.kept as string[]), ...(reports[1]!.kept as string[]), "shared"].sort();
    const records = await registry.listRemote();
    expect(records.map((r) => r.id).sort()).toEqual(expected);
    for (const record of records.filter((r) => r.id !== "shared")) {
      expect(record.remoteId).toBe(`container-${record.id}`);
    }
    // No temporary or half-removed files are left behind, and all records are private.
    expect(readdirSync(join(root, "remote")).filter((name) => name.startsWith("."))).toEqual([]);
    for (const name of readdirSync(join(root, "remote"))) expect(mode(join(root, "remote", name))).toBe(0o600);
    const locals = (await registry.listLocal()).map((entry) => entry.id).sort();
    expect(locals).toEqual([...(reports[0]!.locals as string[]), ...(reports[1]!.locals as string[]), "shared-local"].sort());
  });

  it("two pruners remove each old entry exactly once and spare the fresh ones", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    const old: string[] = [];
    for (let i = 0; i < 30; i++) {
      await registry.recordRemote("docker", `c${i}`, null, { id: `r${i}` });
      await registry.ensureLocal(`l${i}`);
      if (i % 3 !== 0) {
        utimesSync(join(root, "remote", `r${i}.json`), hoursAgo(5), hoursAgo(5));
        utimesSync(join(root, "local", `l${i}`), hoursAgo(5), hoursAgo(5));
        old.push(String(i));
      }
    }
    const reports = await runTogether([
      [root, "a", "prune"],
      [root, "b", "prune"],
    ]);
    for (const report of reports) expect(report.failures).toEqual([]);
    const removedRemote = reports.flatMap((report) => report.removedRemote as string[]);
    const removedLocal = reports.flatMap((report) => report.removedLocal as string[]);
    expect(removedRemote.sort()).toEqual(old.map((i) => `r${i}`).sort());
    expect(removedLocal.sort()).toEqual(old.map((i) => `l${i}`).sort());
    const fresh = Array.from({ length: 10 }, (_, k) => String(k * 3));
    expect((await registry.listRemote()).map((r) => r.id).sort()).toEqual(fresh.map((i) => `r${i}`).sort());
    expect((await registry.listLocal()).map((e) => e.id).sort()).toEqual(fresh.map((i) => `l${i}`).sort());
    // No half-removed directories are left, and only the fresh ones keep the registry's marker.
    const hidden = readdirSync(join(root, "local")).filter((name) => name.startsWith("."));
    expect(hidden.sort()).toEqual(fresh.map((i) => `.l${i}.created`).sort());
  });
});

describe("persistent sandbox registry: reattach from another process", () => {
  const recorder = fileURLToPath(new URL("./fixtures/runtime-recorder.ts", import.meta.url));

  /** Runs the recorder in a child process; it opens, writes, records and detaches. */
  function recordInChild(provider: string, spec: SandboxSpec): Promise<{ id: string; remoteId: string; pid: number }> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, ["--import", "tsx", recorder, root, provider, JSON.stringify(spec)], { stdio: ["ignore", "pipe", "pipe"] });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
      child.on("close", (code) => (code === 0 ? resolve(JSON.parse(stdout.trim())) : reject(new Error(`recorder exited ${code}: ${stderr.slice(-1500)}`))));
    });
  }

  it("a Docker sandbox recorded by one process is reattached and used by another", async () => {
    const image = requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh");
    requireService("STRATA_DOCKER_HOST", "30-docker.sh");
    const docker = providers.get("docker");
    if (!docker.isAvailable()) providerMissing("docker", "no daemon socket", "30-docker.sh");

    const recorded = await recordInChild("docker", { image, env: { RECORDED: "yes" } });
    const registry = new PersistentSandboxRegistry({ root, providers });
    expect(await registry.loadRemote(recorded.id)).toMatchObject({ provider: "docker", remoteId: recorded.remoteId, spec: { image } });

    const handle = await registry.reattach(recorded.id);
    try {
      expect(handle.remoteId).toBe(recorded.remoteId);
      expect(handle.spec.env).toEqual({ RECORDED: "yes" });
      expect(await handle.dispatch(filesRead({ path: "from-first-process.txt" }))).toMatchObject({ data: `written by pid ${recorded.pid}\n` });
      expect(await handle.dispatch(commandRun({ cmd: 'echo "$RECORDED"; cat from-first-process.txt' }))).toMatchObject({
        stdout: `yes\nwritten by pid ${recorded.pid}\n`,
        exitCode: 0,
      });
    } finally {
      // Closing a reattached handle removes the container (detach is how to keep it).
      await docker.close(handle);
    }
    await expect(docker.reattach!(recorded.remoteId)).rejects.toThrow(/does not exist/);
    expect(await registry.deleteRemote(recorded.id)).toBe(true);
  });

  it("an SSH sandbox recorded by one process is reattached by another; close removes the workspace it made", async () => {
    requireService("STRATA_SSH_HOST", "40-sshd.sh");
    const ssh = providers.get("ssh");
    if (!ssh.isAvailable()) providerMissing("ssh", "no STRATA_SSH_* configuration", "40-sshd.sh");

    const recorded = await recordInChild("ssh", {});
    expect(recorded.remoteId).toMatch(/^ssh:\/\/strata-ssh@127\.0\.0\.1:\d+\/tmp\/strata-[0-9a-f-]+$/);
    const registry = new PersistentSandboxRegistry({ root, providers });
    expect(await registry.loadRemote(recorded.id)).toMatchObject({ created: true });
    const handle = await registry.reattach(recorded.id);
    expect(handle.created).toBe(true);
    let workspace = "";
    try {
      expect(await handle.dispatch(filesRead({ path: `${new URL(recorded.remoteId).pathname}/from-first-process.txt` }))).toMatchObject({
        data: `written by pid ${recorded.pid}\n`,
      });
      const pwd = await handle.dispatch(commandRun({ cmd: "pwd; stat -c %a ." }));
      expect(pwd).toMatchObject({ exitCode: 0 });
      if (pwd.type === "command_result") {
        workspace = pwd.stdout.split("\n")[0]!;
        expect(workspace).toBe(new URL(recorded.remoteId).pathname);
        expect(pwd.stdout).toBe(`${workspace}\n700\n`);
      }
    } finally {
      await ssh.close(handle);
    }
    // A fresh sandbox on the same machine no longer finds the workspace.
    const probe = await ssh.open({});
    try {
      expect(await probe.dispatch(commandRun({ cmd: `test -e '${workspace}' && echo still-there || echo gone` }))).toMatchObject({ stdout: "gone\n" });
    } finally {
      await ssh.close(probe);
    }
  });
});

describe("persistent sandbox registry: only what the provider created is destroyed", () => {
  it("records created from the handle; a hand-made or older record is not created", async () => {
    const registry = new PersistentSandboxRegistry({ root });
    expect(await registry.recordRemote("ssh", "ssh://u@h:22/some/dir", null, { id: "by-hand" })).toMatchObject({ created: false });
    expect(await registry.recordRemote("docker", "c1", null, { id: "made", created: true })).toMatchObject({ created: true });
    expect(await registry.loadRemote("made")).toMatchObject({ created: true });
    await expect(registry.recordRemote("docker", "c1", null, { created: "yes" as never })).rejects.toSatisfy((error) => isStrataError(error, "invalid_argument"));
    // A record written before the flag existed reads as not created, so it is never destroyed.
    const older = { version: 1, id: "older", provider: "ssh", remoteId: "ssh://u@h:22/w", spec: null, createdAt: new Date().toISOString() };
    writeFileSync(join(root, "remote", "older.json"), JSON.stringify(older));
    expect(await registry.loadRemote("older")).toMatchObject({ created: false });
  });

  it("SSH: reattaching a workspace recorded by hand and closing it leaves the workspace alone", async () => {
    requireService("STRATA_SSH_HOST", "40-sshd.sh");
    const ssh = providers.get("ssh");
    if (!ssh.isAvailable()) providerMissing("ssh", "no STRATA_SSH_* configuration", "40-sshd.sh");
    const probe = await ssh.open({});
    const dir = `/tmp/strata-not-ours-${process.pid}-${Date.now()}`;
    try {
      expect(await probe.dispatch(commandRun({ cmd: `mkdir -p ${dir} && echo precious > ${dir}/keep.txt` }))).toMatchObject({ exitCode: 0 });
      const url = `ssh://${process.env.STRATA_SSH_USER}@${process.env.STRATA_SSH_HOST}:${process.env.STRATA_SSH_PORT ?? 22}${dir}`;
      const registry = new PersistentSandboxRegistry({ root, providers });
      // With a spec that names no workspace: the provider used to take that as "mine".
      for (const spec of [null, {}]) {
        const record = await registry.recordRemote("ssh", url, spec);
        const handle = await registry.reattach(record.id);
        expect(handle.created).toBe(false);
        expect(await handle.dispatch(filesRead({ path: `${dir}/keep.txt` }))).toMatchObject({ data: "precious\n" });
        await ssh.close(handle);
        expect(await probe.dispatch(commandRun({ cmd: `cat ${dir}/keep.txt` }))).toMatchObject({ stdout: "precious\n", exitCode: 0 });
      }
      // Recorded as created, the same workspace is the provider's to remove.
      const owned = await registry.recordRemote("ssh", url, null, { created: true });
      await ssh.close(await registry.reattach(owned.id));
      expect(await probe.dispatch(commandRun({ cmd: `test -e ${dir} && echo still-there || echo gone` }))).toMatchObject({ stdout: "gone\n" });
    } finally {
      await probe.dispatch(commandRun({ cmd: `rm -rf ${dir}` }));
      await ssh.close(probe);
    }
  });

  it("Docker: reattaching a container recorded by hand and closing it leaves the container running", async () => {
    const image = requireService("STRATA_DOCKER_IMAGE_BUSYBOX", "30-docker.sh");
    const docker = providers.get("docker");
    if (!docker.isAvailable()) providerMissing("docker", "no daemon socket", "30-docker.sh");
    const original = await docker.open({ image });
    try {
      expect(original.created).toBe(true);
      const registry = new PersistentSandboxRegistry({ root, providers });
      const record = await registry.recordRemote("docker", original.remoteId!, { image });
      const handle = await registry.reattach(record.id);
      expect(handle.created).toBe(false);
      await docker.close(handle);
      expect(await original.dispatch(commandRun({ cmd: "echo alive" }))).toMatchObject({ stdout: "alive\n", exitCode: 0 });
    } finally {
      await docker.close(original);
    }
    await expect(docker.reattach!(original.remoteId!)).rejects.toThrow(/does not exist/);
  });
});
