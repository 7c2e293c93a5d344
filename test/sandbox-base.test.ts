/**
 * What BaseSandbox derives from the shell, beyond the conformance suite:
 * round trips per operation, the big-file paths of read and grep (over
 * 1 MiB, where the shell sends a window or grep lines instead of the file),
 * edit's compare-and-swap, and the closed state. Run over GNU coreutils
 * (LocalSandbox, bubblewrap) and BusyBox (bubblewrap with the BusyBox toolset).
 */
import { writeFileSync } from "node:fs";
import nodePath from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { toDeepAgents } from "../adapters/deepagents.js";
import { StateBackend } from "../backends/state.js";
import { formatRead } from "../core/format.js";
import { toSeedProtocol } from "../core/seed.js";
import type { ExecuteOptions, ExecuteResponse } from "../core/types.js";
import { rooted } from "../conformance/rooted.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

/** Counts execute round trips (every command and every derived operation's script goes through doExecute), and can act between two of them (to race an edit). */
interface Counting {
  trips: number;
  beforeTrip: ((trip: number) => void) | undefined;
}
class CountedLocal extends LocalSandbox implements Counting {
  trips = 0;
  beforeTrip: ((trip: number) => void) | undefined;
  protected override doExecute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse> {
    this.trips++;
    this.beforeTrip?.(this.trips);
    return super.doExecute(command, options);
  }
}
class CountedBwrap extends BubblewrapSandbox implements Counting {
  trips = 0;
  beforeTrip: ((trip: number) => void) | undefined;
  protected override doExecute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse> {
    this.trips++;
    this.beforeTrip?.(this.trips);
    return super.doExecute(command, options);
  }
}
type Counted = CountedLocal | CountedBwrap;

// LocalSandbox's file operations are FilesystemBackend's (confined on the host), not derived from its shell: only its commands are tested here.
const targets: { name: string; create: () => Counted; hostDir: (s: Counted) => string; shellTransfers: boolean; derived: boolean }[] = [
  { name: "LocalSandbox (GNU)", create: () => new CountedLocal(), hostDir: (s) => s.workspace, shellTransfers: false, derived: false },
  { name: "bubblewrap (GNU)", create: () => new CountedBwrap(), hostDir: (s) => (s as CountedBwrap).hostWorkspace, shellTransfers: false, derived: true },
  {
    name: "bubblewrap (BusyBox)",
    create: () => new CountedBwrap({ toolset: "busybox" }),
    hostDir: (s) => (s as CountedBwrap).hostWorkspace,
    shellTransfers: false,
    derived: true,
  },
];

const bytes = (text: string) => new TextEncoder().encode(text);

for (const target of targets) {
  describe(`BaseSandbox over ${target.name}`, () => {
    /** A test of the file operations BaseSandbox derives from the shell. */
    // LocalSandbox derives nothing from its shell: these cases are not registered for it (not skipped).
    const derivedIt = (name: string, test: () => Promise<void>, timeout?: number) => {
      if (target.derived) it(name, test, timeout);
    };
    const open: Counted[] = [];
    const create = () => {
      const sandbox = target.create();
      open.push(sandbox);
      return sandbox;
    };
    afterEach(async () => {
      await Promise.all(open.splice(0).map((sandbox) => sandbox.close()));
    });
    /**
     * The seeds' protocol over the sandbox's workspace, seen from its root (`/x` is `${root}/x`: bubblewrap's
     * file paths are its own, under /workspace; LocalSandbox's "/" is its workspace): for the cases about something other than paths.
     */
    const inWorkspace = (native: Counted) => toSeedProtocol(rooted(native, native.root));

    derivedIt("makes one round trip per operation (edit: one on a file it last read or wrote, else two)", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      const trips = async (op: () => Promise<unknown>) => {
        const before = native.trips;
        await op();
        return native.trips - before;
      };
      expect(await trips(() => sandbox.write("/a/x.txt", "one\ntwo\n"))).toBe(1);
      expect(await trips(() => sandbox.read("/a/x.txt"))).toBe(1);
      expect(await trips(() => sandbox.readRaw("/a/x.txt"))).toBe(1);
      expect(await trips(() => sandbox.lsInfo("/a"))).toBe(1);
      expect(await trips(() => sandbox.globInfo("**/*.txt"))).toBe(1);
      expect(await trips(() => native.glob("*", { includeDirectories: true }))).toBe(1);
      expect(await trips(async () => toDeepAgents(native).glob("**"))).toBe(1);
      expect(await trips(() => sandbox.grep("two", "/", "*.txt"))).toBe(1);
      // The sandbox holds the bytes it last read or wrote: the edit is applied to them and sent as the compare-and-swap.
      expect(await trips(() => sandbox.edit("/a/x.txt", "two", "three"))).toBe(1);
      // A command may have changed any file: the copies are dropped, and the edit fetches first.
      await native.execute("true");
      expect(await trips(() => sandbox.edit("/a/x.txt", "three", "four"))).toBe(2);
      const files = Array.from({ length: 50 }, (_, i) => [`/many/${i}.txt`, bytes(`file ${i}`)] as const);
      expect(await trips(() => sandbox.uploadFiles(files))).toBe(target.shellTransfers ? 1 : 0);
      expect(await trips(() => sandbox.downloadFiles(files.map(([path]) => path)))).toBe(target.shellTransfers ? 1 : 0);
      // A directory, one: the default secrets rules end in names, and find met none of them under it (docs/permissions.md).
      // A file: one.
      expect(await trips(() => sandbox.delete("/a"))).toBe(1);
      expect(await trips(() => sandbox.delete("/many/0.txt"))).toBe(1);
    });

    derivedIt("reads a window of a file over 1 MiB exactly as formatRead would, CRLF and long lines included", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      const lines = Array.from({ length: 60_000 }, (_, i) => (i % 1000 === 7 ? "é".repeat(2500) : `line ${i} ünï`));
      const text = `${lines.join("\r\n")}\r\nlast line without newline`;
      writeFileSync(nodePath.join(target.hostDir(native), "big.txt"), text);
      for (const [offset, limit] of [
        [0, 2000],
        [30_000, 50],
        [59_990, 100],
        [60_000, 1],
      ] as const) {
        expect(await sandbox.read("/big.txt", offset, limit)).toBe(formatRead(text, "/big.txt", offset, limit));
      }
      expect(await sandbox.read("/big.txt", 60_001)).toBe("Error: Line offset 60001 exceeds the length of '/big.txt' (60001 lines)");
    });

    derivedIt("treats a big file as binary for NUL anywhere and for invalid UTF-8 in the window", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      const body = "text line\n".repeat(200_000);
      writeFileSync(nodePath.join(target.hostDir(native), "nul-at-end.log"), `${body}\0`);
      expect(await sandbox.read("/nul-at-end.log", 0, 10)).toMatch(/^Error: '\/nul-at-end.log' is a binary file \(2000001 bytes\)/);
      writeFileSync(nodePath.join(target.hostDir(native), "latin1.log"), Buffer.concat([Buffer.from("caf\xe9\n", "latin1"), Buffer.from(body)]));
      expect(await sandbox.read("/latin1.log", 0, 10)).toMatch(/binary file/);
      // grep skips the NUL file; the Latin-1 one is where big files differ (documented): its invalid byte is on a line without a match.
      expect((await sandbox.grep("text line", "/nul-at-end.log")).matches).toEqual([]);
    });

    derivedIt("refuses a read window over 16 MiB with too_large instead of loading it", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      writeFileSync(nodePath.join(target.hostDir(native), "one-line.min.js"), "a".repeat(17 * 1024 * 1024));
      expect(await sandbox.read("/one-line.min.js")).toMatch(/^Error: '\/one-line.min.js' is \d+ bytes, over the 16777216-byte limit/);
    });

    derivedIt("greps big files through grep -n, with the same results as StateBackend", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      const reference = toSeedProtocol(new StateBackend());
      const big = Array.from({ length: 100_000 }, (_, i) => (i % 9973 === 0 ? `needle at ${i}\r` : `hay ${i}`)).join("\n");
      const small = "first needle\nsecond\nneedle: again\n";
      writeFileSync(nodePath.join(target.hostDir(native), "big.log"), big);
      await reference.write("/big.log", big);
      await sandbox.write("/dir/small.txt", small);
      await reference.write("/dir/small.txt", small);
      expect(await sandbox.grep("needle", "/")).toEqual(await reference.grep("needle", "/"));
      expect(await sandbox.grep("needle", "/", "*.log", { maxCount: 3 })).toEqual(await reference.grep("needle", "/", "*.log", { maxCount: 3 }));
    });

    derivedIt("finds and lists names with newlines, colons and leading dashes", async () => {
      const sandbox = inWorkspace(create());
      for (const path of ["/odd/new\nline.txt", "/odd/a:1:b.txt", "/odd/-n", "/odd/dir\nname/inner.txt"]) {
        expect((await sandbox.write(path, `needle in ${path}\n`)).error).toBeUndefined();
      }
      const names = ["/odd/-n", "/odd/a:1:b.txt", "/odd/dir\nname/inner.txt", "/odd/new\nline.txt"];
      expect((await sandbox.globInfo("**", "/odd")).map((f) => f.path)).toEqual(names);
      expect((await sandbox.grep("needle", "/odd")).matches.map((m) => m.path)).toEqual(names);
      expect((await sandbox.lsInfo("/odd")).map((f) => f.path)).toEqual(["/odd/-n", "/odd/a:1:b.txt", "/odd/dir\nname/", "/odd/new\nline.txt"]);
    });

    derivedIt("leaves out names no virtual path can address (a command made `a\\b`) instead of failing", async () => {
      const sandbox = inWorkspace(create());
      await sandbox.execute("mkdir odd && printf 'needle\\n' > 'odd/back\\slash' && printf 'needle\\n' > odd/plain");
      expect((await sandbox.lsInfo("/odd")).map((f) => f.path)).toEqual(["/odd/plain"]);
      expect((await sandbox.globInfo("**")).map((f) => f.path)).toEqual(["/odd/plain"]);
      expect((await sandbox.grep("needle")).matches.map((m) => m.path)).toEqual(["/odd/plain"]);
    });

    derivedIt("re-applies an edit whose compare-and-swap lost to another writer, keeping that writer's content", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      // Written from outside: the sandbox holds no copy, so the edit fetches first.
      writeFileSync(nodePath.join(target.hostDir(native), "race.txt"), "alpha beta\n");
      const start = native.trips;
      native.beforeTrip = (trip) => {
        if (trip === start + 2) writeFileSync(nodePath.join(target.hostDir(native), "race.txt"), "alpha from someone else\n");
      };
      const result = await sandbox.edit("/race.txt", "alpha", "gamma");
      native.beforeTrip = undefined;
      expect(result).toMatchObject({ occurrences: 1 });
      expect(native.trips - start).toBe(4); // fetch, lost swap, fetch again, swap
      expect(await sandbox.read("/race.txt")).toBe("     1\tgamma from someone else");
    });

    derivedIt("an edit applied to the copy it last wrote loses its swap to another writer, then re-applies to that writer's content", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      await sandbox.write("/race.txt", "alpha beta\n");
      const start = native.trips;
      native.beforeTrip = (trip) => {
        if (trip === start + 1) writeFileSync(nodePath.join(target.hostDir(native), "race.txt"), "alpha from someone else\n");
      };
      const result = await sandbox.edit("/race.txt", "alpha", "gamma");
      native.beforeTrip = undefined;
      expect(result).toMatchObject({ occurrences: 1 });
      expect(native.trips - start).toBe(3); // swap from the copy (lost), fetch, swap
      expect(await sandbox.read("/race.txt")).toBe("     1\tgamma from someone else");
    });

    derivedIt("answers no_match when the other writer removed what the edit replaces", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      for (const known of [false, true]) {
        if (known) await sandbox.write("/race.txt", "alpha beta\n", { overwrite: true });
        else writeFileSync(nodePath.join(target.hostDir(native), "race.txt"), "alpha beta\n");
        const start = native.trips;
        native.beforeTrip = (trip) => {
          if (trip === start + (known ? 1 : 2)) writeFileSync(nodePath.join(target.hostDir(native), "race.txt"), "someone else\n");
        };
        const result = await sandbox.edit("/race.txt", "alpha", "gamma");
        native.beforeTrip = undefined;
        expect(result.code).toBe("no_match");
        expect(await sandbox.read("/race.txt")).toBe("     1\tsomeone else");
      }
    });

    derivedIt("keeps a file's mode across edit and overwrite", async () => {
      const sandbox = inWorkspace(create());
      await sandbox.write("/run.sh", "#!/bin/sh\necho one\n");
      await sandbox.execute("chmod 755 run.sh");
      await sandbox.edit("/run.sh", "one", "two");
      await sandbox.write("/run.sh", "#!/bin/sh\necho three\n", { overwrite: true });
      expect((await sandbox.execute("./run.sh")).output).toBe("three\n");
    });

    it("after close, answers every operation in its contract's failure shape; close is idempotent", async () => {
      const native = create();
      const sandbox = inWorkspace(native);
      await native.close();
      await native.close();
      const closed = { name: "StrataError", code: "sandbox_closed" };
      await expect(sandbox.execute("true")).rejects.toMatchObject(closed);
      await expect(sandbox.lsInfo("/")).rejects.toMatchObject(closed);
      await expect(sandbox.readRaw("/x")).rejects.toMatchObject(closed);
      await expect(sandbox.grep("x")).rejects.toMatchObject(closed);
      await expect(sandbox.globInfo("*")).rejects.toMatchObject(closed);
      expect(await sandbox.read("/x")).toMatch(/^Error: Sandbox '.*' is closed$/);
      expect(await sandbox.write("/x", "y")).toMatchObject({ code: "sandbox_closed" });
      expect(await sandbox.edit("/x", "a", "b")).toMatchObject({ code: "sandbox_closed" });
      expect(await sandbox.delete("/x")).toMatchObject({ code: "sandbox_closed" });
      expect(await sandbox.uploadFiles([["/x", bytes("y")]])).toEqual([{ path: "/x", error: "permission_denied" }]);
      expect(await sandbox.downloadFiles(["/x"])).toEqual([{ path: "/x", content: null, error: "permission_denied" }]);
      await expect(sandbox.uploadFiles("/x" as never)).rejects.toMatchObject({ code: "invalid_argument" });
    });

    it("runs in the workspace or a virtual cwd, and refuses a missing cwd with file_not_found", async () => {
      const native = create();
      const sandbox = toSeedProtocol(native);
      // Files and commands share one path space: the workspace's paths (LocalSandbox's root, "/", is its workspace).
      const root = native.root;
      const at = (path: string) => (root === "/" ? path : `${root}${path}`);
      await sandbox.write(at("/sub/dir/f.txt"), "x");
      expect((await sandbox.execute("ls")).output).toBe("sub\n");
      expect((await sandbox.execute("ls", { cwd: at("/sub/dir") })).output).toBe("f.txt\n");
      expect((await sandbox.execute("ls", { cwd: "sub/dir" })).output).toBe("f.txt\n");
      // The message names the path as the caller does, never the host directory behind it.
      await expect(sandbox.execute("ls", { cwd: at("/nope") })).rejects.toMatchObject({ code: "file_not_found", message: `File '${at("/nope")}' not found` });
      await expect(sandbox.execute("ls", { cwd: "/../etc" })).rejects.toMatchObject({ code: "invalid_path" });
      await expect(sandbox.execute("true", { timeout: -1 })).rejects.toMatchObject({ code: "invalid_argument" });
    });

    it("keeps the head of output at maxOutputBytes without cutting a character, and reports signals as 128+n", async () => {
      const sandbox = toSeedProtocol(create());
      const result = await sandbox.execute("printf 'ab€€€€'", { maxOutputBytes: 6 });
      expect(result).toEqual({ output: "ab€", exitCode: 0, truncated: true });
      expect((await sandbox.execute("kill -9 $$")).exitCode).toBe(137);
      const binary = await sandbox.execute("printf 'ok\\377\\n'");
      expect(binary.output).toBe("ok\uFFFD\n");
    });

    it("streams output with executeStream, and stops the command when the loop is left early", async () => {
      const sandbox = create();
      const stream = sandbox.executeStream("echo one; sleep 0.2; echo two");
      const seen: string[] = [];
      for await (const chunk of stream) seen.push(chunk);
      expect(seen.join("")).toBe("one\ntwo\n");
      expect(seen.length).toBeGreaterThanOrEqual(2);
      expect(await stream.result).toMatchObject({ output: "one\ntwo\n", exitCode: 0 });

      const marker = `9${String(Math.floor(Math.random() * 1e6))}`;
      const endless = sandbox.executeStream(`echo first; sleep ${marker}`);
      for await (const chunk of endless) {
        expect(chunk).toBe("first\n");
        break;
      }
      // The native result never rejects: the early exit from the loop is its failure, with the reason as its message.
      expect(await endless.result).toMatchObject({ error: { message: expect.stringMatching(/closed before the command ended/) } });
    });

    it("stops running commands on close; their calls reject with sandbox_closed", async () => {
      const native = create();
      const sandbox = toSeedProtocol(native);
      const running = sandbox.execute("sleep 30").then(
        () => "finished",
        (error: unknown) => error,
      );
      await new Promise((resolve) => setTimeout(resolve, 200));
      const started = Date.now();
      await native.close();
      expect(await running).toMatchObject({ code: "sandbox_closed" });
      expect(Date.now() - started).toBeLessThan(3000);
    });

    it("stops a command when its AbortSignal fires", async () => {
      const sandbox = toSeedProtocol(create());
      const controller = new AbortController();
      setTimeout(() => controller.abort(new Error("stop")), 300);
      const started = Date.now();
      await expect(sandbox.execute("sleep 30", { signal: controller.signal })).rejects.toThrow("stop");
      expect(Date.now() - started).toBeLessThan(5000);
    });
  });
}

/** A sandbox with no side channel for transfers: its uploads and downloads go through its own shell (BaseSandbox's helpers). */
class ShellTransfers extends BubblewrapSandbox {
  protected override doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>) {
    return this.uploadThroughShell(files);
  }
  protected override doDownload(paths: readonly string[]) {
    return this.downloadThroughShell(paths);
  }
}

describe("BaseSandbox's transfers through the shell", () => {
  it("upload files in one round trip, never through a linked directory, and download them back", async () => {
    for (const toolset of ["host", "busybox"] as const) {
      const sandbox = new ShellTransfers({ toolset });
      try {
        expect((await sandbox.execute("mkdir kept && ln -s kept via")).exitCode).toBe(0);
        const answers = await sandbox.uploadFiles([
          ["/workspace/d/a.txt", bytes("a")],
          ["/workspace/via/planted.txt", bytes("no")],
          ["/workspace/kept", bytes("no")],
        ]);
        expect(answers.files!.map((a) => a.error?.code ?? null)).toEqual([null, "permission_denied", "is_directory"]);
        expect((await sandbox.execute("ls -A kept | wc -l; cat d/a.txt")).output).toBe("0\na");
        const [down] = (await sandbox.downloadFiles(["/workspace/d/a.txt"])).files!;
        expect(new TextDecoder().decode(down!.content!)).toBe("a");
      } finally {
        await sandbox.close();
      }
    }
  });
});
