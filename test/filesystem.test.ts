import { spawn, spawnSync } from "node:child_process";
import { constants, writeFileSync } from "node:fs";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { FilesystemBackend } from "../backends/filesystem.js";
import { borrowWorkingDirectory, openDirPath, walkFiles } from "../backends/safe-fs.js";
import { StateBackend } from "../backends/state.js";
import { isStrataError } from "../core/errors.js";
import { fileDataBytes } from "../core/filedata.js";
import { formatRead } from "../core/format.js";
import { toSeedProtocol, type BackendProtocol } from "../core/seed.js";
import type { GrepMatch } from "../core/types.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const rgOnPath = spawnSync("rg", ["--version"]).status === 0;

let root: string;
let outside: string;
let backend: FilesystemBackend;
/** The seed protocol over `backend`. */
let seed: BackendProtocol;

beforeEach(async () => {
  const base = await fs.mkdtemp(path.join(os.tmpdir(), "strata-fs-test-"));
  root = path.join(base, "root");
  outside = path.join(base, "outside");
  await fs.mkdir(root);
  await fs.mkdir(path.join(outside, "sub"), { recursive: true });
  await fs.writeFile(path.join(outside, "secret.txt"), "TOP SECRET\n");
  await fs.writeFile(path.join(outside, "outside-only.txt"), "TOP SECRET too\n");
  await fs.writeFile(path.join(outside, "sub", "deep.txt"), "TOP SECRET deep\n");
  backend = new FilesystemBackend({ workspace: root });
  seed = toSeedProtocol(backend);
});

afterEach(async () => {
  await fs.rm(path.dirname(root), { recursive: true, force: true });
});

/** Names and contents of everything under a host directory, symlinks shown as their targets. */
async function snapshot(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await fs.readdir(dir, { withFileTypes: true, recursive: true })) {
    const full = path.join(entry.parentPath ?? entry.path, entry.name);
    const rel = path.relative(dir, full);
    if (entry.isSymbolicLink()) out[rel] = `-> ${await fs.readlink(full)}`;
    else if (entry.isFile()) out[rel] = await fs.readFile(full, "utf8");
    else out[rel] = "<dir>";
  }
  return out;
}

describe("FilesystemBackend options", () => {
  it("names its directory `workspace`, as every sandbox does, and requires it", () => {
    expect(backend.workspace).toBe(path.resolve(root));
    expect(() => new FilesystemBackend({} as never)).toThrow(expect.objectContaining({ code: "invalid_argument" }));
    expect(() => new FilesystemBackend({ rootDir: root } as never)).toThrow(/workspace/);
  });
});

describe("listing order", () => {
  it("ls answers paths in code-unit order, a directory's trailing '/' included, with and without sizes", async () => {
    // readdir answers names sorted ("a" < "a-b" < "a.txt" < "a0"), but a directory's '/' sorts after '-' and '.'.
    await fs.mkdir(path.join(root, "d", "a"), { recursive: true });
    await fs.mkdir(path.join(root, "d", "a0"));
    await fs.writeFile(path.join(root, "d", "a-b"), "x");
    await fs.writeFile(path.join(root, "d", "a.txt"), "x");
    await fs.writeFile(path.join(root, "d", "b"), "x");
    const expected = ["/d/a-b", "/d/a.txt", "/d/a/", "/d/a0/", "/d/b"];
    expect((await backend.ls("/d")).entries!.map((e) => e.path)).toEqual(expected);
    expect((await backend.ls("/d", { sizes: false })).entries!.map((e) => e.path)).toEqual(expected);
    // Names readdir already orders as their paths: kept in that order.
    for (let i = 0; i < 30; i++) await fs.writeFile(path.join(root, "d", `f${String(i).padStart(2, "0")}`), "x");
    const paths = (await backend.ls("/d", { sizes: false })).entries!.map((e) => e.path);
    expect(paths).toEqual([...paths].sort());
    expect(paths).toHaveLength(35);
  });
});

describe("listings kept while their directory is unchanged", () => {
  const pause = () => new Promise((resolve) => setTimeout(resolve, 25));
  const kinds = async (dir: string) => (await backend.ls(dir, { sizes: false })).entries!.map((e) => `${e.path} ${e.is_dir ? "dir" : "file"}`);
  const truth = async (dir: string) => (await backend.ls(dir)).entries!.map((e) => `${e.path} ${e.is_dir ? "dir" : "file"}`);

  it("a kept listing is answered again only while nothing in its directory changed: every create, delete, rename or change of kind shows", async () => {
    const dir = path.join(root, "many");
    await fs.mkdir(dir);
    for (let i = 0; i < 50; i++) await fs.writeFile(path.join(dir, `f${i}.txt`), "x");
    // Secrets (the default rules): the listing kept is the whole directory, and each answer leaves them out.
    await fs.writeFile(path.join(dir, ".env"), "KEY=1");
    await fs.mkdir(path.join(dir, ".ssh"));
    await pause();
    const secretsHidden = (listed: string[]) => expect(listed.filter((line) => /\.env|\.ssh/.test(line))).toEqual([]);
    secretsHidden(await kinds("/many")); // read afresh: the directory is not settled yet
    // Every directory looks settled to the backend: its clock runs a minute ahead.
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 60_000);
    try {
      secretsHidden(await kinds("/many")); // read and kept
      secretsHidden(await kinds("/many")); // the kept listing
      expect(await kinds("/many")).toHaveLength(50);
      const changes: Array<() => Promise<unknown>> = [
        () => fs.writeFile(path.join(dir, "new.txt"), "x"),
        () => fs.unlink(path.join(dir, "f3.txt")),
        () => fs.rename(path.join(dir, "f4.txt"), path.join(dir, "g4.txt")),
        () => fs.unlink(path.join(dir, "f5.txt")).then(() => fs.mkdir(path.join(dir, "f5.txt"))),
        () => fs.rename(path.join(dir, "f6.txt"), path.join(root, "moved-out.txt")),
        () => backend.write("/many/through-the-backend.txt", "x"),
        () => backend.delete("/many/f7.txt"),
      ];
      for (const change of changes) {
        expect(await kinds("/many")).toEqual(await truth("/many"));
        expect(await kinds("/many")).toEqual(await truth("/many"));
        await change();
        await pause();
      }
      expect(await kinds("/many")).toEqual(await truth("/many"));
      expect(await kinds("/many")).toContain("/many/f5.txt/ dir");
      // What a caller does with its answer is its own.
      const given = (await backend.ls("/many", { sizes: false })).entries!;
      given[0]!.path = "/changed";
      given.length = 1;
      expect(await kinds("/many")).toEqual(await truth("/many"));
    } finally {
      vi.useRealTimers();
    }
  });

  it("a directory replaced by another at the same path is listed afresh", async () => {
    await fs.mkdir(path.join(root, "swap"));
    await fs.writeFile(path.join(root, "swap", "old.txt"), "x");
    await fs.mkdir(path.join(root, "other"));
    await fs.writeFile(path.join(root, "other", "new.txt"), "x");
    await pause();
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 60_000);
    try {
      expect(await kinds("/swap")).toEqual(["/swap/old.txt file"]);
      await fs.rename(path.join(root, "swap"), path.join(root, "gone"));
      await fs.rename(path.join(root, "other"), path.join(root, "swap"));
      expect(await kinds("/swap")).toEqual(["/swap/new.txt file"]);
    } finally {
      vi.useRealTimers();
    }
  });
});

async function code(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
    return undefined;
  } catch (error) {
    return isStrataError(error) ? error.code : String(error);
  }
}

describe("symlinks are never followed", () => {
  beforeEach(async () => {
    await fs.symlink(outside, path.join(root, "out"));
    await fs.symlink("/etc", path.join(root, "etc"));
    await fs.symlink(path.join(outside, "secret.txt"), path.join(root, "secret-link.txt"));
    await fs.mkdir(path.join(root, "real"));
    await fs.writeFile(path.join(root, "real", "inside.txt"), "inside\n");
    await fs.symlink(path.join(root, "real"), path.join(root, "alias")); // points inside the root, still not followed
  });

  it("cannot read, download or edit through a symlink, to /etc or elsewhere", async () => {
    for (const p of ["/etc/passwd", "/etc/hostname", "/out/secret.txt", "/out/sub/deep.txt", "/secret-link.txt", "/alias/inside.txt"]) {
      const read = await seed.read(p);
      expect(read, p).toMatch(/^Error: Permission denied: .*symlinks are not followed/);
      expect(await code(seed.readRaw(p))).toBe("permission_denied");
      expect((await seed.downloadFiles([p]))[0]!.error).toBe("permission_denied");
      expect((await seed.edit(p, "TOP", "HACKED")).code).toBe("permission_denied");
    }
    expect(await seed.read("/real/inside.txt")).toBe("     1\tinside");
  });

  it("parallel reads (answered together, sharing directory opens) refuse symlinks on the way just as single reads do", async () => {
    await fs.mkdir(path.join(root, "real", "deeper"));
    await fs.writeFile(path.join(root, "real", "deeper", "two.txt"), "two\n");
    await fs.writeFile(path.join(root, "top.txt"), "top\n");
    await backend.readRaw("/top.txt"); // the root resolved: the synchronous path is in use from here on
    const paths = ["/real/inside.txt", "/alias/inside.txt", "/out/secret.txt", "/real/deeper/two.txt", "/etc/passwd", "/top.txt", "/real/missing.txt", "/secret-link.txt", "/real/deeper/two.txt"];
    const parallel = await Promise.all(paths.map((p) => backend.readRaw(p)));
    const alone: unknown[] = [];
    for (const p of paths) alone.push(await backend.readRaw(p));
    expect(parallel).toEqual(alone);
    expect(parallel.map((r) => r.error?.code ?? "ok")).toEqual(["ok", "permission_denied", "permission_denied", "ok", "permission_denied", "ok", "file_not_found", "permission_denied", "ok"]);
    expect(JSON.stringify(parallel)).not.toContain("TOP SECRET");
    // A read asked after a change sees it, though directories of the reads before were open.
    const [before] = await Promise.all([backend.readRaw("/real/deeper/two.txt"), backend.readRaw("/real/inside.txt")]);
    expect(before.error).toBeUndefined();
    await fs.rename(path.join(root, "real", "deeper"), path.join(root, "real", "moved"));
    const after = await Promise.all([backend.readRaw("/real/deeper/two.txt"), backend.readRaw("/real/moved/two.txt")]);
    expect(after.map((r) => r.error?.code ?? "ok")).toEqual(["file_not_found", "ok"]);
  });

  it("ls with the working directory borrowed (the strata command) answers the same, follows no link, and leaves the cwd where it was", async () => {
    for (let i = 0; i < 150; i++) await fs.writeFile(path.join(root, "real", `f${i}.txt`), "x".repeat(i));
    await fs.symlink(outside, path.join(root, "real", "link-out"));
    const plain = [await backend.ls("/"), await backend.ls("/real")];
    const cwd = process.cwd();
    borrowWorkingDirectory();
    const chdir = vi.spyOn(process, "chdir");
    try {
      const borrowed = [await backend.ls("/"), await backend.ls("/real")];
      expect(borrowed).toEqual(plain);
      expect(chdir.mock.calls.length).toBeGreaterThan(0); // the borrowing path did run (a worker thread would not)
    } finally {
      chdir.mockRestore();
      borrowWorkingDirectory(false);
    }
    expect(process.cwd()).toBe(cwd);
    const link = (plain[1]!.entries ?? []).find((e) => e.path === "/real/link-out");
    expect(link?.is_dir).toBe(false); // the link itself, not the directory it names
    expect(plain[1]!.entries).toHaveLength(152);
  });

  it("ls with sizes: false answers the same entries and kinds from the directory alone (no size, no time); secrets stay hidden; a wrong type is refused", async () => {
    await fs.writeFile(path.join(root, "real", ".env"), "KEY=1");
    await fs.mkdir(path.join(root, "real", "sub"));
    for (const dir of ["/", "/real"]) {
      const full = await backend.ls(dir);
      const kinds = await backend.ls(dir, { sizes: false });
      expect(kinds.entries).toEqual(full.entries!.map((e) => ({ path: e.path, is_dir: e.is_dir })));
    }
    const kinds = (await backend.ls("/real", { sizes: false })).entries!;
    expect(kinds.map((e) => e.path)).not.toContain("/real/.env"); // the secrets preset, as for a full listing
    expect(kinds.find((e) => e.path === "/real/sub/")?.is_dir).toBe(true);
    expect((await backend.ls("/", { sizes: false })).entries!.find((e) => e.path === "/etc")?.is_dir).toBe(false); // a link, not what it names
    expect((await backend.ls("/out/sub", { sizes: false })).error?.code).toBe("permission_denied");
    expect((await backend.ls("/", { sizes: "no" as unknown as boolean })).error?.code).toBe("invalid_argument");
  });

  it("glob with sizes: false answers the same paths from directory entries alone (no size, no time); links are not matched or followed; secrets stay hidden", async () => {
    await fs.writeFile(path.join(root, "real", ".env"), "KEY=1");
    await fs.mkdir(path.join(root, "real", "sub"));
    await fs.writeFile(path.join(root, "real", "sub", "two.txt"), "two\n");
    for (const [pattern, includeDirectories] of [["**", false], ["**", true], ["*.txt", false]] as const) {
      const full = (await backend.glob(pattern, { includeDirectories })).entries!;
      const lean = (await backend.glob(pattern, { includeDirectories, sizes: false })).entries!;
      expect(lean, `${pattern} ${includeDirectories}`).toEqual(full.map((e) => ({ path: e.path, is_dir: e.is_dir })));
    }
    const lean = (await backend.glob("**", { includeDirectories: true, sizes: false })).entries!.map((e) => e.path);
    expect(lean).toEqual(["/real/", "/real/inside.txt", "/real/sub/", "/real/sub/two.txt"]);
    expect((await backend.glob("**", { path: "/out", sizes: false })).entries ?? []).toEqual([]);
  });

  it("cannot write, upload or delete through a symlink; writing over a link is refused; deleting a link removes only the link", async () => {
    const before = await snapshot(outside);
    expect((await seed.write("/out/new.txt", "x")).code).toBe("permission_denied");
    expect((await seed.write("/out/sub/new.txt", "x")).code).toBe("permission_denied");
    expect((await seed.write("/etc/strata-test", "x")).code).toBe("permission_denied");
    expect((await seed.write("/secret-link.txt", "x", { overwrite: true })).code).toBe("permission_denied");
    expect((await seed.write("/secret-link.txt", "x")).code).toBe("already_exists");
    expect(await seed.uploadFiles([["/out/up.bin", bytes("x")], ["/secret-link.txt", bytes("x")]])).toEqual([
      { path: "/out/up.bin", error: "permission_denied" },
      { path: "/secret-link.txt", error: "permission_denied" },
    ]);
    expect((await seed.delete("/out/secret.txt")).code).toBe("permission_denied");
    expect((await seed.delete("/out/sub")).code).toBe("permission_denied");
    expect((await seed.delete("/out")).error).toBeUndefined();
    expect((await seed.delete("/secret-link.txt")).error).toBeUndefined();
    expect(await snapshot(outside)).toEqual(before);
    await expect(fs.access("/etc/strata-test")).rejects.toThrow();
  });

  it("deleting a directory that holds links removes the links, not their targets", async () => {
    await fs.mkdir(path.join(root, "tree", "inner"), { recursive: true });
    await fs.symlink(outside, path.join(root, "tree", "inner", "link-dir"));
    await fs.symlink(path.join(outside, "secret.txt"), path.join(root, "tree", "link-file"));
    const before = await snapshot(outside);
    expect((await seed.delete("/tree")).error).toBeUndefined();
    expect(await snapshot(outside)).toEqual(before);
    await expect(fs.lstat(path.join(root, "tree"))).rejects.toThrow();
  });

  it("lists links as entries, never as directories, and cannot list through them", async () => {
    const listing = await seed.lsInfo("/");
    expect(listing.map((i) => [i.path, i.is_dir])).toEqual([
      ["/alias", false],
      ["/etc", false],
      ["/out", false],
      ["/real/", true],
      ["/secret-link.txt", false],
    ]);
    expect((await seed.lsInfo("/out")).map((i) => i.path)).toEqual(["/out"]);
    expect(listing.find((i) => i.path === "/etc")!.size).toBeUndefined(); // a link's size is its target's length
    expect(await code(seed.lsInfo("/out/sub"))).toBe("permission_denied");
    expect(await code(seed.lsInfo("/etc/ssl"))).toBe("permission_denied");
    expect(await code(seed.lsInfo("/alias/x"))).toBe("permission_denied");
  });

  it.each([true, false])("glob and grep (ripgrep: %s) skip links and refuse to start at one", async (useRipgrep) => {
    const subject = toSeedProtocol(new FilesystemBackend({ workspace: root, useRipgrep }));
    expect((await subject.globInfo("**")).map((i) => i.path)).toEqual(["/real/inside.txt"]);
    expect(await subject.grepRaw("SECRET")).toEqual([]);
    expect(await subject.grepRaw("root")).toEqual([]); // /etc/passwd would match
    expect(await code(subject.grep("SECRET", "/out"))).toBe("permission_denied");
    expect(await code(subject.globInfo("*", "/out"))).toBe("permission_denied");
    expect(await code(subject.grep("SECRET", "/out/sub"))).toBe("permission_denied");
  });
});

describe("races", () => {
  it("a directory swapped for a symlink in a tight loop never lets an operation reach outside the root", async () => {
    await fs.mkdir(path.join(root, "real", "deep", "a"), { recursive: true });
    await fs.mkdir(path.join(outside, "deep", "a"), { recursive: true });
    for (const dir of [path.join(root, "real"), outside]) {
      await fs.writeFile(path.join(dir, "target.txt"), dir === outside ? "TOP SECRET target\n" : "inside target\n");
      await fs.writeFile(path.join(dir, "victim.txt"), dir === outside ? "TOP SECRET victim\n" : "inside victim\n");
      await fs.writeFile(path.join(dir, "deep", "a", "f.txt"), dir === outside ? "TOP SECRET f\n" : "inside f\n");
    }
    await fs.symlink(outside, path.join(root, "evil"));
    const before = await snapshot(outside);

    // A separate process swaps /sw between the real directory and the symlink as fast as it can.
    const swapper = `
      const fs = require("fs"); const [root, ms] = [process.argv[1], Number(process.argv[2])];
      const sw = root + "/sw", end = Date.now() + ms; let swaps = 0;
      const move = (a, b) => { try { fs.renameSync(a, b); return true; } catch { return false; } };
      const linger = () => { const until = performance.now() + Math.random() * 0.3; while (performance.now() < until); };
      while (Date.now() < end && !fs.existsSync(root + "/stop")) {
        if (move(root + "/real", sw)) { swaps++; linger(); move(sw, root + "/real"); }
        else { try { if (!fs.lstatSync(sw).isSymbolicLink()) fs.rmSync(sw, { recursive: true, force: true }); } catch {} } // a /sw the backend made
        if (move(root + "/evil", sw)) { swaps++; linger(); move(sw, root + "/evil"); }
      }
      process.stdout.write(String(swaps));`;
    // It runs at least 1.5 s and until both sides of the race were met (a loaded machine can take longer), at most 30 s.
    const child = spawn(process.execPath, ["-e", swapper, root, "30000"], { stdio: ["ignore", "pipe", "inherit"] });
    let swapOutput = "";
    child.stdout.on("data", (chunk: Buffer) => (swapOutput += chunk.toString()));
    const exited = new Promise((resolve) => child.on("close", resolve));
    let running = true;
    void exited.then(() => (running = false));

    const seen: string[] = [];
    const started = performance.now();
    let insideReads = 0;
    let refusals = 0;
    const grepper = toSeedProtocol(new FilesystemBackend({ workspace: root, useRipgrep: false }));
    while (running) {
      const results = await Promise.all([
        seed.read("/sw/target.txt"),
        seed.read("/sw/deep/a/f.txt"),
        seed.write("/sw/target.txt", "overwritten\n", { overwrite: true }),
        seed.write("/sw/deep/a/new.txt", "new\n"),
        seed.edit("/sw/victim.txt", "victim", "edited"),
        seed.delete("/sw/victim.txt"),
        seed.delete("/sw/deep/a/f.txt"),
        seed.uploadFiles([["/sw/deep/up.txt", bytes("up")]]),
        seed.downloadFiles(["/sw/target.txt", "/sw/deep/a/f.txt"]).then((d) => d.map((x) => new TextDecoder().decode(x.content ?? new Uint8Array()))),
        seed.lsInfo("/sw").catch(String),
        seed.lsInfo("/sw/deep/a").catch(String),
        seed.globInfo("**", "/sw").catch(String),
        seed.grep("SECRET", "/sw").catch(String),
        grepper.grep("SECRET").catch(String),
        seed.grep("SECRET").catch(String),
        seed.readRaw("/sw/target.txt").catch(String),
      ]);
      if (/^ {5}1\t(inside target|overwritten)$/.test(String(results[0]))) insideReads++;
      if (String(results[0]).includes("symlinks are not followed")) refusals++;
      seen.push(JSON.stringify(results));
      if (performance.now() - started > 1500 && insideReads > 0 && refusals > 0) await fs.writeFile(path.join(root, "stop"), "");
    }
    await exited;
    for (const result of seen) {
      expect(result).not.toContain("SECRET");
      expect(result).not.toContain("outside-only");
      expect(result).not.toContain(root);
    }
    expect(await snapshot(outside)).toEqual(before);
    expect(Number(swapOutput)).toBeGreaterThan(100);
    expect(seen.length).toBeGreaterThan(10);
    expect(insideReads).toBeGreaterThan(0); // the real directory was reachable while it was in place
    expect(refusals).toBeGreaterThan(0); // and the symlink was met, and refused
  });
});

describe("an edit's content", () => {
  it("is the text the file holds after the edit, or absent: never text the file cannot hold (a lone surrogate is written as U+FFFD)", async () => {
    for (const [i, newString] of ["B", "\ud800", "\udc00x", "\u{1F600}"].entries()) {
      const file = path.join(root, `e${i}.txt`);
      await fs.writeFile(file, "abc\n");
      const edited = await backend.edit(`/e${i}.txt`, "b", newString);
      expect(edited.error).toBeUndefined();
      const disk = await fs.readFile(file, "utf8");
      if (edited.content !== undefined) expect(edited.content, JSON.stringify(newString)).toBe(disk);
      else expect(disk, JSON.stringify(newString)).toContain("\uFFFD");
    }
  });
});

describe("atomic writes", () => {
  it("concurrent creators of one path: exactly one wins, the file holds its content", async () => {
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => seed.write("/race.txt", `writer ${i}`)));
    const winners = results.filter((r) => r.error === undefined);
    expect(winners).toHaveLength(1);
    expect(results.filter((r) => r.code === "already_exists")).toHaveLength(19);
    const content = await fs.readFile(path.join(root, "race.txt"), "utf8");
    expect(results[Number(content.split(" ")[1])]!.error).toBeUndefined();
  });

  it("never clobbers a file another process creates at the same moment", async () => {
    for (let round = 0; round < 100; round++) {
      const name = `f${round}.txt`;
      const theirs = fs.writeFile(path.join(root, name), "theirs", { flag: "wx" }).then(
        () => true,
        () => false,
      );
      const ours = seed.write(`/${name}`, "ours");
      const [theirsWon, ourResult] = await Promise.all([theirs, ours]);
      const oursWon = ourResult.error === undefined;
      expect(oursWon !== theirsWon, `round ${round}`).toBe(true);
      expect(await fs.readFile(path.join(root, name), "utf8")).toBe(oursWon ? "ours" : "theirs");
    }
  });

  it("readers see the old or the new content, never a torn file; no temp files are left", async () => {
    const size = 2 * 1024 * 1024;
    await seed.write("/big.txt", "a".repeat(size));
    let writing = true;
    const writer = (async () => {
      for (let i = 0; i < 20; i++) await seed.write("/big.txt", (i % 2 ? "a" : "b").repeat(size), { overwrite: true });
      writing = false;
    })();
    let reads = 0;
    while (writing) {
      const content = await fs.readFile(path.join(root, "big.txt"), "utf8");
      expect(content.length).toBe(size);
      expect(content === "a".repeat(size) || content === "b".repeat(size)).toBe(true);
      reads++;
    }
    await writer;
    expect(reads).toBeGreaterThan(0);
    expect(await fs.readdir(root)).toEqual(["big.txt"]);
  });

  it("an edit of a small file never overwrites a change another program made before it checks (fsync on and off); it lands, or answers conflict or no_match", async () => {
    for (const fsync of [true, false]) {
      const subject = new FilesystemBackend({ workspace: root, fsync });
      const outcomes = new Set<string>();
      for (let round = 0; round < 150; round++) {
        const host = path.join(root, "small.txt");
        await fs.writeFile(host, `v${round} head\n`);
        const edit = subject.edit("/small.txt", "head", "edited");
        // Another program writes at some point during the edit (a different size, so the check sees it even within one
        // mtime tick), all at once: a write still under way while the edit checks and renames is the window no check closes.
        await new Promise((resolve) => (round % 3 === 0 ? resolve(undefined) : round % 3 === 1 ? setImmediate(resolve) : setTimeout(resolve, 0)));
        writeFileSync(host, `foreign ${round}\n`);
        const result = await edit;
        outcomes.add(result.error?.code ?? "ok");
        expect(["ok", "conflict", "no_match"], `round ${round}: ${result.error?.message}`).toContain(result.error?.code ?? "ok");
        expect(await fs.readFile(host, "utf8"), `fsync ${fsync}, round ${round}`).toBe(`foreign ${round}\n`);
      }
      expect(outcomes.has("ok") || outcomes.has("conflict")).toBe(true);
    }
    expect((await fs.readdir(root)).filter((name) => name.startsWith(".strata-"))).toEqual([]);
  });

  it("edit and overwrite keep the file's permission bits", async () => {
    await seed.write("/script.sh", "echo one\n");
    await fs.chmod(path.join(root, "script.sh"), 0o750);
    expect((await seed.edit("/script.sh", "one", "two")).occurrences).toBe(1);
    expect((await fs.stat(path.join(root, "script.sh"))).mode & 0o777).toBe(0o750);
    await seed.write("/script.sh", "echo three\n", { overwrite: true });
    expect((await fs.stat(path.join(root, "script.sh"))).mode & 0o777).toBe(0o750);
    expect(await fs.readFile(path.join(root, "script.sh"), "utf8")).toBe("echo three\n");
  });

  it("an edit keeps permission bits the umask would strip, and read-only ones (the new file is created with the mode, chmodded only when it differs)", async () => {
    for (const mode of [0o666, 0o777, 0o444, 0o600, 0o640]) {
      await seed.write("/moded.txt", "alpha\n", { overwrite: true });
      await fs.chmod(path.join(root, "moded.txt"), mode);
      expect((await seed.edit("/moded.txt", "alpha", "beta")).occurrences, `mode ${mode.toString(8)}`).toBe(1);
      expect((await fs.stat(path.join(root, "moded.txt"))).mode & 0o777, `mode ${mode.toString(8)}`).toBe(mode);
      expect(await fs.readFile(path.join(root, "moded.txt"), "utf8")).toBe("beta\n");
      await fs.chmod(path.join(root, "moded.txt"), 0o644);
    }
    expect((await fs.readdir(root)).filter((name) => name.startsWith(".strata-"))).toEqual([]);
  });

  it("reads a file whole whatever its size, an empty one included", async () => {
    for (const size of [0, 1, 4095, 4096, 65_537, 1024 * 1024]) {
      const text = "x".repeat(size);
      await seed.write("/sized.txt", text, { overwrite: true });
      const read = await backend.readRaw("/sized.txt");
      if (read.error) throw new Error(read.error.message);
      expect(new TextDecoder().decode(fileDataBytes(read.data)), `size ${size}`).toBe(text);
      const downloaded = await backend.downloadFiles(["/sized.txt"]);
      if (downloaded.error) throw new Error(downloaded.error.message);
      expect(downloaded.files[0]?.content?.length, `size ${size}`).toBe(size);
    }
  });
});

describe("no host path in any result or error", () => {
  it("covers every error path, including filesystem errors", async () => {
    await seed.write("/file.txt", "x");
    await seed.write("/dir/inner.txt", "x");
    await seed.uploadFiles([["/bin.dat", Uint8Array.from([0, 1, 2, 255])]]);
    await fs.symlink("/etc", path.join(root, "link"));
    spawnSync("mkfifo", [path.join(root, "fifo")]);
    const outputs: unknown[] = [];
    const collect = async (promise: Promise<unknown>) => {
      try {
        outputs.push(await promise);
      } catch (error) {
        outputs.push(error instanceof Error ? [error.message, String(error.cause ?? "")] : error);
      }
    };
    for (const p of ["/missing.txt", "/dir", "/bin.dat", "/file.txt/child", "/link/passwd", "/link", "/fifo", "/", "/dir/inner.txt/x/y"]) {
      await collect(seed.read(p));
      await collect(seed.readRaw(p));
      await collect(seed.write(p, "y"));
      await collect(seed.write(p, "y", { overwrite: true }));
      await collect(seed.edit(p, "x", "y"));
      await collect(seed.delete(`${p}/nope`));
      await collect(seed.lsInfo(`${p}/sub`));
      await collect(seed.grep("x", p));
      await collect(seed.globInfo("*", p));
      await collect(seed.uploadFiles([[`${p}/u`, bytes("u")]]));
      await collect(seed.downloadFiles([p]));
    }
    const broken = toSeedProtocol(new FilesystemBackend({ workspace: path.join(root, "file.txt", "below-a-file") }));
    await collect(broken.read("/x"));
    await collect(broken.lsInfo("/"));
    const text = JSON.stringify(outputs);
    expect(text).toContain("not found");
    expect(text).toContain("is a directory");
    expect(text).toContain("binary file");
    expect(text).toContain("symlinks are not followed");
    expect(text).toContain("Permission denied: '/fifo'");
    expect(text).toContain("cannot be opened");
    for (const hostPath of [root, await fs.realpath(root), os.tmpdir(), "/proc/", "strata-fs-test"]) expect(text).not.toContain(hostPath);
  });
});

describe("read streams large files", () => {
  // Over the 8 MiB whole-file limit, with CRLF, long lines, unicode, blank lines, a CR at a chunk edge.
  const lines: string[] = [];
  for (let i = 0, length = 0; length < 20 * 1024 * 1024; i++) {
    if (i % 997 === 0) lines.push(`${"long ".repeat(1000)}${i}`);
    else if (i % 7 === 0) lines.push("");
    else if (i % 5 === 0) lines.push(`crlf ${i} ünï 🚀\r`);
    else lines.push(`line ${i} ${"x".repeat(i % 120)}`);
    length += lines.at(-1)!.length + 1;
  }
  const text = lines.join("\n");

  it.each([
    ["no final newline", text],
    ["a final newline", `${text}\n`],
    ["a final CRLF", `${text}\r\n`],
  ])("matches formatRead exactly with %s", async (_, content) => {
    await fs.writeFile(path.join(root, "big.txt"), content);
    const total = lines.length;
    const windows: Array<[number, number]> = [
      [0, 2000],
      [1, 5],
      [996, 3],
      [12_345, 100],
      [Math.floor(total / 2), 2000],
      [total - 3, 10],
      [total - 1, 1],
      [total, 1],
      [total + 5, 10],
    ];
    // Windows starting right after each 1 MiB chunk edge.
    const buffer = Buffer.from(content);
    for (let edge = 1 << 20; edge < buffer.length; edge += 1 << 20) {
      let line = 0;
      for (let i = buffer.indexOf(10); i !== -1 && i < edge; i = buffer.indexOf(10, i + 1)) line++;
      windows.push([Math.max(0, line - 1), 3]);
    }
    for (const [offset, limit] of windows) {
      const expected = (() => {
        try {
          return formatRead(content, "/big.txt", offset, limit);
        } catch (error) {
          return `Error: ${(error as Error).message}`;
        }
      })();
      expect(await seed.read("/big.txt", offset, limit), `offset ${offset} limit ${limit}`).toBe(expected);
    }
  });

  it("holds only the requested lines: a window deep in a 50 MB file", async () => {
    const handle = await fs.open(path.join(root, "huge.log"), "w");
    const block = Array.from({ length: 10_000 }, (_, i) => `entry ${i} ${"y".repeat(40)}`).join("\n") + "\n";
    for (let i = 0; i < 100; i++) await handle.write(block); // ~53 MB, 1,000,000 lines
    await handle.close();
    const before = process.memoryUsage();
    const out = await seed.read("/huge.log", 999_900, 100);
    const after = process.memoryUsage();
    expect(out.split("\n")).toHaveLength(100);
    expect(out.split("\n")[0]).toBe(`999901\tentry 9900 ${"y".repeat(40)}`);
    expect(after.arrayBuffers + after.heapUsed - (before.arrayBuffers + before.heapUsed)).toBeLessThan(50 * 1024 * 1024);
  });

  it("reports a large binary file and keeps CRLF handling for a CR split across chunks", async () => {
    await fs.writeFile(path.join(root, "blob.bin"), Buffer.concat([Buffer.alloc(9 * 1024 * 1024, 65), Buffer.from([0])]));
    expect(await seed.read("/blob.bin")).toMatch(/^Error: '\/blob.bin' is a binary file \(9437185 bytes\)/);
    const edge = Buffer.concat([Buffer.alloc((1 << 20) - 1, 97), Buffer.from("\r\nafter\r\n"), Buffer.alloc(9 << 20, 98)]);
    await fs.writeFile(path.join(root, "edge.txt"), edge);
    expect(await seed.read("/edge.txt", 1, 1)).toBe("     2\tafter");
    expect((await seed.read("/edge.txt", 0, 1)).endsWith("… [line truncated: 1048575 characters]")).toBe(true);
  });
});

describe("grep: ripgrep and the JS engine agree", () => {
  it("on a generated tree with CRLF, binary, invalid UTF-8, BOM, unicode, spaces, dotfiles, deep dirs and big files", async () => {
    const files: Array<[string, Uint8Array]> = [
      ["/a.txt", bytes("needle\nhay\nneedle again")],
      ["/crlf.txt", bytes("needle\r\nhay\r\n-e needle\r\n")],
      ["/bin.dat", Uint8Array.from([...bytes("needle\n"), 0, ...bytes("needle")])],
      ["/late-nul.txt", Uint8Array.from([...bytes("needle\n".repeat(50_000)), 0])],
      ["/latin1.txt", Uint8Array.from([...bytes("needle "), 0xe9])],
      ["/bom.txt", bytes("\uFEFFneedle first\nneedle")],
      ["/utf16.txt", Uint8Array.from([0xff, 0xfe, ...Buffer.from("needle", "utf16le")])],
      ["/ünï/文件 🚀.md", bytes("ß needle ß\n日本 needle")],
      ["/with space/file name.txt", bytes("a needle b")],
      ["/.hidden/.env", bytes("NEEDLE\nneedle")],
      ["/.gitignore", bytes("*.txt\nneedle\n")],
      ["/report..final.md", bytes("needle")],
      ["/app/[...slug].tsx", bytes("// needle")],
      ["/-rf", bytes("needle -rf")],
      ["/new\nline.txt", bytes("needle in a newline name")],
      // rg prints one path a line: names whose newline is followed by what looks like another path, or that end in one.
      ["/nl\n./a.txt", bytes("needle behind a newline and ./")],
      ["/a.txt\n", bytes("needle in a name ending in a newline")],
      ["/dir\n./x/y.txt", bytes("needle under a directory with a newline")],
      ["/e\n.", bytes("needle in a name ending in a newline and a dot")],
      [`/${Array.from({ length: 30 }, (_, i) => `d${i}`).join("/")}/leaf.ts`, bytes("deep needle")],
      ["/empty.txt", new Uint8Array()],
      ["/cr-only.txt", bytes("needle\rstill one line\rneedle")],
    ];
    for (let i = 0; i < 50; i++) files.push([`/many/${i}.ts`, bytes(`${"filler\n".repeat(i)}needle ${i}\n`)]);
    // Over the whole-file limit: matches on both sides of 1 MiB chunk edges, CRLF, a huge line.
    const big = Array.from({ length: 800_000 }, (_, i) => (i % 9_999 === 0 ? `needle at ${i}\r` : `line ${i}`)).join("\n");
    files.push(["/big/huge.log", bytes(`${big}\n${"z".repeat(3_000_000)}needle${"z".repeat(100)}`)]);

    // The tree holds a dotfile named .env, which the default secrets preset would hide: compared with StateBackend, so rules are off.
    const jsBackend = new FilesystemBackend({ workspace: root, useRipgrep: false, permissions: false });
    const rgBackend = new FilesystemBackend({ workspace: root, permissions: false });
    const jsEngine = toSeedProtocol(jsBackend);
    const rgEngine = toSeedProtocol(rgBackend);
    const reference = toSeedProtocol(new StateBackend());
    for (const [p, content] of files) {
      expect((await rgEngine.uploadFiles([[p, content]]))[0]!.error, p).toBeNull();
      await reference.uploadFiles([[p, content]]);
    }
    if (rgOnPath || process.env.STRATA_SERVICES_REQUIRED === "1") expect(await rgBackend.usesRipgrep()).toBe(true);
    expect(await jsBackend.usesRipgrep()).toBe(false);

    const cases: Array<[string, string | null, string | null, number | undefined]> = [
      ["needle", null, null, undefined],
      ["needle", "/", "*.ts", undefined],
      ["needle", "/many", "**/1*.ts", undefined],
      ["needle", null, "*.{md,tsx,txt}", undefined],
      ["needle", null, null, 7],
      ["needle", "/big", null, 3],
      ["-e needle", null, null, undefined],
      ["\uFEFFneedle", null, null, undefined],
      ["ß needle", null, null, undefined],
      ["NEEDLE", null, null, undefined],
      ["needle at 799920", null, null, undefined],
      ["zneedlez", null, null, undefined],
      ["absent", null, null, undefined],
      ["needle", "/a.txt", null, undefined],
      ["needle", "/nowhere", null, undefined],
    ];
    for (const [pattern, where, glob, maxCount] of cases) {
      const label = `${pattern} in ${where} glob ${glob} max ${maxCount}`;
      const expected = await reference.grep(pattern, where, glob, { maxCount });
      expect(await jsEngine.grep(pattern, where, glob, { maxCount }), `js: ${label}`).toEqual(expected);
      expect(await rgEngine.grep(pattern, where, glob, { maxCount }), `rg: ${label}`).toEqual(expected);
    }
    const all = (await rgEngine.grep("needle")).matches;
    const paths = new Set(all.map((m: GrepMatch) => m.path));
    for (const skipped of ["/bin.dat", "/late-nul.txt", "/latin1.txt", "/utf16.txt"]) expect(paths.has(skipped)).toBe(false);
    expect(all.filter((m) => m.path === "/big/huge.log").map((m) => m.line)).toEqual([
      ...Array.from({ length: 81 }, (_, k) => k * 9_999 + 1),
      800_001,
    ]);
    expect(all.find((m) => m.path === "/crlf.txt")).toEqual({ path: "/crlf.txt", line: 1, text: "needle" });
    expect(paths.has("/new\nline.txt")).toBe(true);
  });
});

describe("glob", () => {
  it("walks only the pattern's root, returns files with sizes, skips links and special files", async () => {
    await seed.uploadFiles([
      ["/src/a.ts", bytes("aa")],
      ["/src/lib/b.ts", bytes("bbb")],
      ["/docs/c.md", bytes("c")],
    ]);
    await fs.symlink(path.join(root, "src"), path.join(root, "src-link"));
    await fs.symlink(path.join(root, "src", "a.ts"), path.join(root, "src", "a-link.ts"));
    spawnSync("mkfifo", [path.join(root, "src", "pipe.ts")]);
    const found = await seed.globInfo("**/*.ts");
    expect(found.map((f) => [f.path, f.size, f.is_dir])).toEqual([
      ["/src/a.ts", 2, false],
      ["/src/lib/b.ts", 3, false],
    ]);
    expect(found[0]!.modified_at).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect((await seed.globInfo("src/lib/*")).map((f) => f.path)).toEqual(["/src/lib/b.ts"]);
  });

  it("finds every file of a wide, deep tree (directories read ahead on the thread pool), in order, with no descriptor left open", async () => {
    const expected: string[] = [];
    for (let d = 0; d < 60; d++) {
      const dir = path.join(root, `d${d}`, ...(d % 3 === 0 ? ["x", "y", "z"] : []));
      await fs.mkdir(dir, { recursive: true });
      for (let f = 0; f < 3; f++) {
        await fs.writeFile(path.join(dir, `f${f}.ts`), "x");
        expected.push(`/${path.relative(root, path.join(dir, `f${f}.ts`))}`);
      }
      await fs.writeFile(path.join(dir, "skip.md"), "x");
    }
    await fs.mkdir(path.join(root, "empty", "dirs", "only"), { recursive: true });
    const before = (await fs.readdir("/proc/self/fd")).length;
    for (const sizes of [false, true]) {
      const found = await backend.glob("**/*.ts", { sizes });
      expect(found.entries?.map((f) => f.path)).toEqual([...expected].sort());
    }
    expect((await backend.glob("**/z", { includeDirectories: true, sizes: false })).entries?.length).toBe(20);
    expect((await fs.readdir("/proc/self/fd")).length).toBe(before);
  });

  it("a walk left early (a callback throws) closes every descriptor it opened", async () => {
    for (let d = 0; d < 80; d++) {
      await fs.mkdir(path.join(root, `d${d}`, "sub"), { recursive: true });
      await fs.writeFile(path.join(root, `d${d}`, "sub", "f.txt"), "x");
    }
    const before = (await fs.readdir("/proc/self/fd")).length;
    const start = await openDirPath(root, []);
    let seen = 0;
    try {
      await expect(
        walkFiles(start, "/", {
          file: () => {
            if (++seen === 40) throw new Error("stop");
          },
        }),
      ).rejects.toThrow("stop");
    } finally {
      await start.close();
    }
    expect((await fs.readdir("/proc/self/fd")).length).toBe(before);
  });
});

describe("special files", () => {
  it("refuses to read a FIFO without blocking, and lists it", async () => {
    spawnSync("mkfifo", [path.join(root, "pipe")]);
    expect(await seed.read("/pipe")).toBe("Error: Permission denied: '/pipe'");
    expect((await seed.downloadFiles(["/pipe"]))[0]!.error).toBe("permission_denied");
    expect(await seed.grepRaw("x")).toEqual([]);
    expect((await seed.lsInfo("/")).map((i) => i.path)).toEqual(["/pipe"]);
  });
});

describe("hostile names on disk", () => {
  it.each(["/new\nline.txt", "/tab\there.md", "/ünï/文件 🚀.txt", "/report..final.md", "/app/[...slug].tsx", "/-rf", "/ lead and trail ", "/back`tick`$(x)"])(
    "%j round-trips",
    async (p) => {
      expect((await seed.write(p, "needle\n")).error).toBeUndefined();
      expect(await fs.readFile(path.join(root, ...p.slice(1).split("/")), "utf8")).toBe("needle\n");
      expect(await seed.read(p)).toBe("     1\tneedle");
      expect((await seed.globInfo("**")).map((f) => f.path)).toEqual([p]);
      expect(await seed.grepRaw("needle")).toEqual([{ path: p, line: 1, text: "needle" }]);
      expect(await toSeedProtocol(new FilesystemBackend({ workspace: root, useRipgrep: false })).grepRaw("needle")).toEqual([{ path: p, line: 1, text: "needle" }]);
      expect((await seed.delete(p)).error).toBeUndefined();
    },
  );
});

describe("maxFileSize", () => {
  it("refuses larger writes, uploads and edits, and still reads a larger file", async () => {
    const small = toSeedProtocol(new FilesystemBackend({ workspace: root, maxFileSize: 10 }));
    expect((await small.write("/big.txt", "12345678901")).code).toBe("too_large");
    expect(await small.uploadFiles([["/big.bin", new Uint8Array(11)]])).toEqual([{ path: "/big.bin", error: "permission_denied" }]);
    expect((await small.write("/ok.txt", "1234567890")).error).toBeUndefined();
    expect((await small.edit("/ok.txt", "0", "00")).code).toBe("too_large");
    expect(await fs.readFile(path.join(root, "ok.txt"), "utf8")).toBe("1234567890");
    await fs.writeFile(path.join(root, "host.txt"), "a line longer than ten bytes\n");
    expect(await small.read("/host.txt")).toBe("     1\ta line longer than ten bytes");
    await expect(fs.access(path.join(root, "big.txt"))).rejects.toThrow();
  });
});

describe("host-path mode (virtualMode: false)", () => {
  it("takes host paths under the root, answers in host paths, refuses everything outside", async () => {
    const host = toSeedProtocol(new FilesystemBackend({ workspace: root, virtualMode: false }));
    const file = path.join(root, "src", "a.ts");
    expect(await host.write(file, "needle\n")).toEqual({ path: file, filesUpdate: null });
    expect(await host.read(file)).toBe("     1\tneedle");
    expect(await host.lsInfo(root)).toMatchObject([{ path: `${path.join(root, "src")}/`, is_dir: true }]);
    expect((await host.globInfo("**/*.ts", root)).map((f) => f.path)).toEqual([file]);
    expect((await host.globInfo(`${root}/src/*.ts`)).map((f) => f.path)).toEqual([file]);
    expect(await host.grepRaw("needle")).toEqual([{ path: file, line: 1, text: "needle" }]);
    expect(await host.read("/a.ts")).toMatch(/^Error: Invalid path '\/a.ts': it lies outside the workspace/);
    expect((await host.write(path.join(outside, "x.txt"), "x")).code).toBe("invalid_path");
    expect((await host.write(`${root}/../outside/x.txt`, "x")).code).toBe("invalid_path");
    expect((await host.delete(root)).code).toBe("permission_denied");
    await expect(fs.access(path.join(outside, "x.txt"))).rejects.toThrow();
    expect(await toSeedProtocol(new FilesystemBackend({ workspace: root })).read("/src/a.ts")).toBe("     1\tneedle");
  });
});

describe("performance sanity", () => {
  it("globs a 5,000-file tree quickly with few open descriptors", async () => {
    for (let d = 0; d < 50; d++) {
      const dir = path.join(root, `pkg${d}`, "src", "lib");
      await fs.mkdir(dir, { recursive: true });
      await Promise.all(Array.from({ length: 100 }, (_, f) => fs.writeFile(path.join(dir, `f${f}.${f % 2 ? "ts" : "js"}`), "x")));
    }
    const started = performance.now();
    const found = await seed.globInfo("**/*.ts");
    const elapsed = performance.now() - started;
    expect(found).toHaveLength(2500);
    expect(elapsed).toBeLessThan(5000);
    const fds = await fs.readdir("/proc/self/fd");
    expect(fds.length).toBeLessThan(100); // nothing leaked
    expect(constants.O_NOFOLLOW).toBeGreaterThan(0);
  });
});
