/**
 * The promises BaseSandbox's derived file operations make under attack, on
 * GNU and BusyBox userlands (bubblewrap with either toolset, and the Docker
 * gnu and busybox images): exactly one of concurrent create-only writes wins;
 * concurrent edits all land; an acknowledged overwrite is never undone by an
 * edit; a file write losing to a directory answers is_directory (nothing is
 * linked into it); of concurrent deletes exactly one wins; lock directories
 * and temporary files never show and never stay; a
 * failed write takes back the directories it made; big-file grep equals
 * core's; the workspace quota holds; bad execute arguments are
 * invalid_argument. On those and on SSH: close() in the middle of a big
 * overwrite leaves the old file or the whole new one, never a prefix; an
 * acknowledged upload is never undone by a racing edit.
 */
import { createHash, randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { MAX_TIMEOUT_SECONDS } from "../core/limits.js";
import { toSeedProtocol } from "../core/seed.js";
import { rooted } from "../conformance/rooted.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import type { Quota } from "../core/limits.js";
import type { BaseSandbox } from "../sandboxes/base.js";

type BaseSandboxOptions = { quota?: Quota };
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { SshSandbox } from "../sandboxes/ssh.js";
import { SharedContainer, dockerService, sshService } from "./support/sandbox-services.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

/** Bubblewrap whose commands can be given a file size limit of 0 (a write that fails after making its directories) and counted. */
class HostileBwrap extends BubblewrapSandbox {
  noFileSpace = false;
  trips = 0;
  protected override doExecute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse> {
    this.trips++;
    return super.doExecute(this.noFileSpace ? `ulimit -f 0\n${command}` : command, options);
  }
}

const { images, socket } = dockerService();
const containers = Object.entries(images).map(([name, image]) => [name, new SharedContainer(image)] as const);
afterAll(() => Promise.all(containers.map(([, shared]) => shared.dispose())));

interface Target {
  name: string;
  create: (options?: BaseSandboxOptions) => Promise<BaseSandbox>;
  hostile?: () => HostileBwrap;
}
const targets: Target[] = [
  ...(["host", "busybox"] as const).map((toolset) => ({
    name: `bubblewrap (${toolset === "host" ? "GNU" : "BusyBox"})`,
    create: async (options: BaseSandboxOptions = {}) => new BubblewrapSandbox({ toolset, ...options }),
    hostile: () => new HostileBwrap({ toolset }),
  })),
  ...containers.map(([name, shared]) => ({
    name: `Docker (${name})`,
    create: (options: BaseSandboxOptions = {}) => shared.fresh({ docker: socket, ...options }),
  })),
];

const bytes = (text: string) => new TextEncoder().encode(text);
/**
 * The seeds' protocol over a sandbox's workspace, seen from its root (`/x` is
 * `${root}/x`, where its commands see it): these cases are about atomicity,
 * locks and quotas, not paths.
 */
const inWorkspace = (sandbox: BaseSandbox) => toSeedProtocol(rooted(sandbox, sandbox.root));
const decode = (data: Uint8Array | null) => new TextDecoder().decode(data ?? new Uint8Array());
const lockName = (path: string) => `.strata-lock-${createHash("sha256").update(path).digest("hex").slice(0, 32)}`;

for (const target of targets) {
  describe(`sandbox file operations under attack: ${target.name}`, () => {
    const open: BaseSandbox[] = [];
    const create = async (options?: BaseSandboxOptions) => {
      const sandbox = await target.create(options);
      open.push(sandbox);
      return sandbox;
    };
    afterEach(async () => {
      await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
    });

    /** Names of the workspace's leftovers: temporary files and lock directories, anywhere. */
    const leftovers = async (sandbox: BaseSandbox) => (await toSeedProtocol(sandbox).execute("find . -name '.strata-*'")).output;

    it("10 concurrent create-only writes: exactly one wins, the others answer already_exists", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      for (let round = 0; round < 3; round++) {
        const path = `/new/dir${round}/once.txt`;
        const results = await Promise.all(Array.from({ length: 10 }, (_, i) => sandbox.write(path, `writer ${i}\n`)));
        const winners = results.flatMap((result, i) => (result.error === undefined ? [i] : []));
        expect(winners).toHaveLength(1);
        for (const result of results) if (result.error !== undefined) expect(result.code).toBe("already_exists");
        expect(await sandbox.read(path)).toBe(`     1\twriter ${winners[0]}`);
      }
      expect(await leftovers(native)).toBe("");
    });

    it("10 concurrent edits of different lines all land", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      const lines = Array.from({ length: 10 }, (_, i) => `line ${i} old`);
      expect((await sandbox.write("/race.txt", `${lines.join("\n")}\n`)).error).toBeUndefined();
      const results = await Promise.all(lines.map((_, i) => sandbox.edit("/race.txt", `line ${i} old`, `line ${i} new`)));
      expect(results.map((result) => result.error)).toEqual(lines.map(() => undefined));
      const [download] = await sandbox.downloadFiles(["/race.txt"]);
      expect(decode(download!.content)).toBe(lines.map((_, i) => `line ${i} new\n`).join(""));
      expect(await leftovers(native)).toBe("");
    });

    it("a file write losing to a directory at its path answers is_directory and leaves nothing inside it", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      for (let round = 0; round < 10; round++) {
        const [file, nested] = await Promise.all([sandbox.write(`/fd${round}`, "file"), sandbox.write(`/fd${round}/child`, "nested")]);
        expect([file.error, nested.error].filter((error) => error === undefined)).toHaveLength(1);
        if (file.error === undefined) {
          expect(nested.code).toBe("not_a_directory");
        } else {
          expect(file.code).toBe("is_directory");
          expect((await sandbox.lsInfo(`/fd${round}`)).map((info) => info.path)).toEqual([`/fd${round}/child`]);
        }
        // Overwrite onto whatever won: a file is replaced, a directory refuses (mv -T never moves into it).
        const overwrite = await sandbox.write(`/fd${round}`, "again", { overwrite: true });
        if (file.error === undefined) expect(overwrite.error).toBeUndefined();
        else expect(overwrite.code).toBe("is_directory");
      }
      expect(await leftovers(native)).toBe("");
    });

    it("concurrent deletes of one directory: exactly one answers ok, the others file_not_found", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      for (let round = 0; round < 8; round++) {
        expect((await sandbox.write(`/gone${round}/a/b.txt`, "x")).error).toBeUndefined();
        expect((await sandbox.write(`/gone${round}/c.txt`, "y")).error).toBeUndefined();
        const results = await Promise.all(Array.from({ length: 4 }, () => sandbox.delete(`/gone${round}`)));
        expect(results.filter((result) => result.error === undefined)).toHaveLength(1);
        for (const result of results) if (result.error !== undefined) expect(result.code).toBe("file_not_found");
        expect(await sandbox.lsInfo("/")).toEqual([]);
        expect(await sandbox.globInfo("**")).toEqual([]);
      }
      expect(await leftovers(native)).toBe("");
    });

    it("an edit racing an overwrite never brings the old content back", async () => {
      const sandbox = inWorkspace(await create());
      for (let round = 0; round < 8; round++) {
        const path = `/overwrite-${round}.txt`;
        expect((await sandbox.write(path, "old text\n")).error).toBeUndefined();
        const [edited, overwritten] = await Promise.all([
          sandbox.edit(path, "old", "edited"),
          sandbox.write(path, "replacement\n", { overwrite: true }),
        ]);
        expect(overwritten.error).toBeUndefined();
        expect(await sandbox.read(path)).toBe("     1\treplacement");
        if (edited.error !== undefined) expect(edited.code).toBe("no_match");
      }
    });

    it("never shows lock directories or temporary files in ls, glob or grep, even mid-flight", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      await sandbox.write("/seen.txt", "needle\n");
      const writes = Promise.all(
        Array.from({ length: 12 }, (_, i) => sandbox.write("/seen.txt", `needle ${i}\n`.repeat(20_000), { overwrite: true })),
      );
      for (let i = 0; i < 4; i++) {
        expect((await sandbox.lsInfo("/")).map((info) => info.path)).toEqual(["/seen.txt"]);
        expect((await sandbox.globInfo("**")).map((info) => info.path)).toEqual(["/seen.txt"]);
        expect(new Set((await sandbox.grep("needle")).matches.map((match) => match.path))).toEqual(new Set(["/seen.txt"]));
      }
      expect((await writes).every((result) => result.error === undefined)).toBe(true);
      expect(await leftovers(native)).toBe("");
    });

    it("breaks a lock left by a killed writer once it is stale, and waits for a live one", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      await sandbox.write("/locked.txt", "before\n");
      // A lock as a writer killed mid-swap leaves it: 10 minutes old.
      await sandbox.execute(`mkdir ${lockName("/locked.txt")} && touch -t 200001010000 ${lockName("/locked.txt")}`);
      expect(await sandbox.write("/locked.txt", "after\n", { overwrite: true })).toMatchObject({ path: "/locked.txt" });
      expect(await sandbox.read("/locked.txt")).toBe("     1\tafter");
      // A live lock (fresh) is waited for, not broken: the edit lands once it is released.
      await sandbox.execute(`mkdir ${lockName("/locked.txt")}`);
      const edit = sandbox.edit("/locked.txt", "after", "edited");
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(await sandbox.read("/locked.txt")).toBe("     1\tafter");
      await sandbox.execute(`rmdir ${lockName("/locked.txt")}`);
      expect((await edit).error).toBeUndefined();
      expect(await sandbox.read("/locked.txt")).toBe("     1\tedited");
      expect(await leftovers(native)).toBe("");
    });

    it("greps files over 1 MiB exactly as core does, a lone trailing CR included", async () => {
      const sandbox = inWorkspace(await create());
      const reference = toSeedProtocol(new StateBackend());
      const body = Array.from({ length: 120_000 }, (_, i) => (i % 5000 === 0 ? `needle ${i}\r` : `hay ${i}`)).join("\n");
      for (const [path, text] of [
        ["/cr-last.log", `${body}\nneedle last\r`],
        ["/crlf-last.log", `${body}\nneedle last\r\n`],
        ["/plain-last.log", `${body}\nneedle last`],
      ] as const) {
        expect((await sandbox.uploadFiles([[path, bytes(text)]]))[0]!.error).toBeNull();
        await reference.write(path, text);
      }
      const mine = await sandbox.grep("needle", "/");
      expect(mine).toEqual(await reference.grep("needle", "/"));
      expect(mine.matches.find((m) => m.path === "/cr-last.log" && m.text.startsWith("needle last"))?.text).toBe("needle last\r");
    });

    it("reads a huge window of a big file: every number reaches the shell as an integer", async () => {
      const sandbox = inWorkspace(await create());
      const big = Array.from({ length: 150_000 }, (_, i) => `row ${i}`).join("\n");
      await sandbox.uploadFiles([["/big.txt", bytes(big)]]);
      expect(await sandbox.read("/big.txt", 149_998, 1e21)).toBe("149999\trow 149998\n150000\trow 149999");
      expect(await sandbox.read("/big.txt", 149_999, Number.MAX_SAFE_INTEGER)).toBe("150000\trow 149999");
    });

    it("refuses bad execute arguments with invalid_argument before anything runs", async () => {
      const native = await create();
      const sandbox = inWorkspace(native);
      const run = sandbox.execute.bind(sandbox) as (...args: unknown[]) => Promise<unknown>;
      const invalid = { name: "StrataError", code: "invalid_argument" };
      await expect(run("echo ran > ran.txt", { timeout: 30 * 24 * 3600 })).rejects.toMatchObject(invalid);
      await expect(run("echo ran > ran.txt", { timeout: MAX_TIMEOUT_SECONDS + 1 })).rejects.toMatchObject(invalid);
      // A bare number where the options belong: the native execute refuses it (the seeds' execute(cmd, timeout) takes it as the timeout).
      expect(await (native.execute.bind(native) as (...args: unknown[]) => Promise<unknown>)("echo ran > ran.txt", 30)).toMatchObject({
        error: { code: "invalid_argument" },
      });
      await expect(run("echo ran > ran.txt", { cwd: "/a\0b" })).rejects.toMatchObject(invalid);
      await expect(run("echo ran > ran.txt", { env: { ["A\0B"]: "x" } })).rejects.toMatchObject(invalid);
      await expect(run("echo ran > ran.txt", { maxOutputBytes: 1.5 })).rejects.toMatchObject(invalid);
      await expect(run(["echo"])).rejects.toMatchObject(invalid);
      expect(await sandbox.read("/ran.txt")).toMatch(/^Error: File '\/ran.txt' not found/);
    });

    it("runs 15 commands sharing one caller signal without a listener leak warning", async () => {
      const sandbox = inWorkspace(await create());
      const warnings: string[] = [];
      const onWarning = (warning: Error) => warnings.push(warning.name);
      process.on("warning", onWarning);
      try {
        const shared = new AbortController();
        const results = await Promise.all(Array.from({ length: 15 }, (_, i) => sandbox.execute(`echo ${i}`, { signal: shared.signal })));
        expect(results.map((r) => r.output)).toEqual(Array.from({ length: 15 }, (_, i) => `${i}\n`));
        await new Promise((resolve) => setTimeout(resolve, 50));
      } finally {
        process.off("warning", onWarning);
      }
      expect(warnings).not.toContain("MaxListenersExceededWarning");
    });

    it("keeps the workspace quota on write, edit and upload, measured again after a command", async () => {
      const native = await create({ quota: { maxFiles: 3, maxBytes: 512 * 1024 } });
      const sandbox = inWorkspace(native);
      for (const name of ["a", "b", "c"]) expect((await sandbox.write(`/${name}.txt`, "x")).error).toBeUndefined();
      expect(await sandbox.write("/d.txt", "x")).toMatchObject({ code: "quota_exceeded" });
      expect(await sandbox.uploadFiles([["/d.txt", bytes("x")]])).toEqual([{ path: "/d.txt", error: "permission_denied" }]);
      // Replacing a file adds none.
      expect((await sandbox.write("/a.txt", "y", { overwrite: true })).error).toBeUndefined();
      expect(await sandbox.write("/a.txt", "z".repeat(600 * 1024), { overwrite: true })).toMatchObject({ code: "quota_exceeded" });
      expect(await sandbox.edit("/b.txt", "x", "x".repeat(600 * 1024))).toMatchObject({ code: "quota_exceeded" });
      expect(await sandbox.read("/b.txt")).toBe("     1\tx");
      // A command frees room; the next write sees it.
      await sandbox.execute("rm c.txt");
      expect((await sandbox.write("/d.txt", "x")).error).toBeUndefined();
      expect(await sandbox.read("/d.txt")).toBe("     1\tx");
      expect(await leftovers(native)).toBe("");
    });

    if (target.hostile) {
      it("a failed write removes the directories it created, and only those", async () => {
        const native = target.hostile!();
        open.push(native);
        const sandbox = inWorkspace(native);
        await sandbox.write("/kept/old.txt", "x");
        native.noFileSpace = true;
        expect((await sandbox.write("/fresh/deeper/f.txt", "content")).code).toBe("io_error");
        expect((await sandbox.write("/kept/new/f.txt", "content")).code).toBe("io_error");
        native.noFileSpace = false;
        expect((await sandbox.lsInfo("/")).map((info) => info.path)).toEqual(["/kept/"]);
        expect((await sandbox.lsInfo("/kept")).map((info) => info.path)).toEqual(["/kept/old.txt"]);
        expect(await leftovers(native)).toBe("");
      });

      it("stays one round trip per write after a command, measuring usage in the same script", async () => {
        const native = target.hostile!();
        open.push(native);
        const sandbox = inWorkspace(native);
        await sandbox.execute("true");
        const before = native.trips;
        expect((await sandbox.write("/one.txt", "x")).error).toBeUndefined();
        expect((await sandbox.write("/two.txt", "x")).error).toBeUndefined();
        expect(native.trips - before).toBe(2);
      });
    }
  });
}

/**
 * Two sandboxes on one workspace: `observer` stays open, `second()` opens
 * another on the same workspace (to be closed mid-operation).
 */
interface SharedWorkspace {
  observer: BaseSandbox;
  second: () => Promise<BaseSandbox>;
  dispose: () => Promise<void>;
}
const ssh = sshService();
const sshRoot = `${ssh.home}/atomic-${randomUUID()}`;
afterAll(async () => {
  const cleaner = await SshSandbox.connect({ ...ssh.options, workspace: ssh.home });
  await cleaner.execute(`rm -rf -- '${sshRoot}'`);
  await cleaner.close();
});
const sharedTargets: { name: string; rounds: number; open: () => Promise<SharedWorkspace> }[] = [
  ...(["host", "busybox"] as const).map((toolset) => ({
    name: `bubblewrap (${toolset === "host" ? "GNU" : "BusyBox"})`,
    rounds: 60,
    open: async (): Promise<SharedWorkspace> => {
      const dir = mkdtempSync(nodePath.join(tmpdir(), "strata-atomic-"));
      const observer = new BubblewrapSandbox({ toolset, workspace: dir });
      return {
        observer,
        second: async () => new BubblewrapSandbox({ toolset, workspace: dir }),
        dispose: async () => {
          await observer.close();
          rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  })),
  ...containers.map(([name, shared]) => ({
    name: `Docker (${name})`,
    rounds: 25,
    open: async (): Promise<SharedWorkspace> => {
      const observer = await shared.fresh({ docker: socket });
      return {
        observer,
        second: () => DockerSandbox.attach(observer.id, { docker: socket, workspace: observer.workspace }),
        dispose: () => observer.close(),
      };
    },
  })),
  {
    name: "SSH",
    rounds: 60,
    open: async (): Promise<SharedWorkspace> => {
      const workspace = `${sshRoot}/${randomUUID()}`;
      const observer = await SshSandbox.connect({ ...ssh.options, workspace });
      return { observer, second: () => SshSandbox.connect({ ...ssh.options, workspace }), dispose: () => observer.close() };
    },
  },
];

for (const target of sharedTargets) {
  describe(`sandbox writes cut short and raced by uploads: ${target.name}`, () => {
    let shared: SharedWorkspace | undefined;
    afterEach(async () => {
      await shared?.dispose();
      shared = undefined;
    });

    it("close() in the middle of a big overwrite leaves the old file or the whole new one, never a prefix", async () => {
      shared = await target.open();
      const observer = inWorkspace(shared.observer);
      const old = "GOOD CONTENT\n";
      const big = `${"N".repeat(32 * 1024 * 1024 - 4)}END\n`;
      let cut = 0;
      for (const delay of [20, 60, 100, 150, 250, 400]) {
        const path = `/torn-${delay}.txt`;
        expect((await observer.write(path, old)).error).toBeUndefined();
        const writer = await shared.second();
        const pending = inWorkspace(writer).write(path, big, { overwrite: true });
        await new Promise((resolve) => setTimeout(resolve, delay));
        await writer.close();
        const result = await pending;
        const [download] = await observer.downloadFiles([path]);
        const content = download!.content!;
        // The outcome of a write cut by close() is unknown (it may have landed just before the kill), but it is never torn.
        if (content.length === old.length) {
          expect(decode(content)).toBe(old);
          expect(result.code).toBe("sandbox_closed");
        } else {
          expect(content.length).toBe(big.length);
          expect(Buffer.from(content.buffer, content.byteOffset, content.length).equals(Buffer.from(big))).toBe(true);
        }
        if (result.error !== undefined) {
          expect(result.code).toBe("sandbox_closed");
          cut++;
        }
      }
      expect(cut).toBeGreaterThan(0);
    });

    it("an acknowledged upload stays until the next acknowledged change while edits race it", async () => {
      shared = await target.open();
      const sandbox = inWorkspace(shared.observer);
      const base = "A0\nA1\nA2\n";
      expect((await sandbox.write("/raced.txt", `${base}U-start\n`)).error).toBeUndefined();
      let done = false;
      const lost: string[] = [];
      const edits: Record<string, number> = {};
      const uploader = (async () => {
        try {
          for (let i = 0; i < target.rounds; i++) {
            const [upload] = await sandbox.uploadFiles([["/raced.txt", bytes(`${base}U${i}\n`)]]);
            expect(upload!.error).toBeNull();
            // Editors change only A/B lines: an edit that lands after this upload keeps U<i>; one that read older content must lose its swap.
            const now = decode((await sandbox.downloadFiles(["/raced.txt"]))[0]!.content);
            if (!now.includes(`\nU${i}\n`)) lost.push(`after upload U${i} was acknowledged the file holds ${JSON.stringify(now)}`);
          }
        } finally {
          done = true;
        }
      })();
      const editors = [0, 1, 2].map(async (k) => {
        while (!done) {
          const now = decode((await sandbox.downloadFiles(["/raced.txt"]))[0]!.content);
          const from = now.includes(`A${k}\n`) ? `A${k}\n` : `B${k}\n`;
          const result = await sandbox.edit("/raced.txt", from, from.startsWith("A") ? `B${k}\n` : `A${k}\n`);
          edits[result.code ?? "ok"] = (edits[result.code ?? "ok"] ?? 0) + 1;
        }
      });
      await Promise.all([uploader, ...editors]);
      expect(lost).toEqual([]);
      expect(decode((await sandbox.downloadFiles(["/raced.txt"]))[0]!.content)).toMatch(new RegExp(`\nU${target.rounds - 1}\n$`));
      // An edit that loses its compare-and-swap on every retry answers conflict (the contract's word for it, and it changes
      // nothing); under load, with three editors and an uploader on one file, one can run out of retries.
      expect(Object.keys(edits).filter((code) => code !== "ok" && code !== "no_match" && code !== "conflict")).toEqual([]);
      expect(edits.ok).toBeGreaterThan(0);
      expect((await sandbox.execute("find . -name '.strata-*'")).output).toBe("");
    }, 120_000);
  });
}
