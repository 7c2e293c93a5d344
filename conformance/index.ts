/**
 * strata-workspace/conformance — the one suite every backend runs.
 *
 *   runConformance({ name: "my backend", create: async () => new MyBackend(), destroy: (b) => b.close() });
 *
 * `create` is called before every test and must return an empty workspace.
 * Capabilities declare what a backend cannot do instead of silently skipping.
 * Every contract decision in docs/contract.md has a test here.
 */
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { EMPTY_FILE_REMINDER } from "../core/format.js";
import type { Backend } from "../core/protocol.js";
import { isSandboxBackend, toSeedProtocol, type BackendProtocol, type SandboxBackendProtocol } from "../core/seed.js";
import { describeNative } from "./native.js";
import { rooted } from "./rooted.js";
import type { ErrorCode } from "../core/errors.js";
import { isWithin } from "../core/paths.js";
import type { FileInfo } from "../core/types.js";
import { describeReliability } from "./reliability.js";

export { describeReliability, type ReliabilityOptions } from "./reliability.js";
export { describeNative, type NativeOptions } from "./native.js";
export { rooted } from "./rooted.js";
export { runStoreConformance, type StoreTarget } from "./stores.js";

export interface ConformanceCapabilities {
  /** The backend is a sandbox: `execute` is tested. */
  execute?: boolean;
  /** Writes return `filesUpdate` (checkpoint backends such as StateBackend). */
  filesUpdate?: boolean;
  /**
   * Directories the backend shows although they hold no file (a composite's
   * route mount points). Listings hide them while they are empty, so the
   * rest of the suite can expect an empty workspace to list as empty.
   */
  mountPoints?: readonly string[];
  /** Runs of the property-based comparison with StateBackend (default 25; 0 turns it off for very slow backends). */
  propertyRuns?: number;
  /** Runs of the concurrent differential fuzz (default: propertyRuns, at most 25; 0 turns it off). */
  fuzzRuns?: number;
  /** Directories are real and outlive their last file (disk, sandboxes); see describeReliability. */
  realDirectories?: boolean;
  /** A symbolic link a command makes is an entry of the workspace (default true; an overlay's layer holds none). */
  links?: boolean;
  /** The code operations answer after `close` (default `sandbox_closed`; stores answer `unavailable`). */
  closedCode?: ErrorCode;
  /** spawn's stderr arrives merged into stdout (Docker and SSH: one output stream); see NativeOptions. */
  mergedStderr?: boolean;
}

export interface ConformanceTarget<B extends Backend = Backend> {
  name: string;
  create: () => Promise<B> | B;
  /**
   * Where the backend's path space starts: a sandbox's workspace (files and
   * commands share its absolute paths). The suite's paths run under it
   * (`/a.txt` is `${root}/a.txt`), through `rooted`. Default "/".
   */
  root?: (backend: B) => string;
  destroy?: (backend: B) => Promise<void> | void;
  /** Makes the backend unusable (a sandbox's or a store's close): the "after close" section runs when given. */
  close?: (backend: B) => Promise<void> | void;
  capabilities?: ConformanceCapabilities;
}

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | null) => new TextDecoder().decode(data ?? new Uint8Array());
const allByteValues = Uint8Array.from({ length: 512 }, (_, i) => i % 256);

/** Paths no backend may accept, each with the reason it is hostile. */
export const HOSTILE_PATHS: ReadonlyArray<readonly [string, string]> = [
  ["/../etc/passwd", "parent segment at the root"],
  ["/a/../../etc/passwd", "parent segment escaping"],
  ["/a/../b", "parent segment inside"],
  ["..", "bare parent"],
  ["/a/\0b", "NUL byte"],
  ["~/secrets", "home-relative"],
  ["~", "bare tilde"],
  ["C:\\Windows\\system32", "drive letter with backslashes"],
  ["c:/windows", "drive letter"],
  ["/a\\..\\b", "backslashes"],
  [`/${"x".repeat(256)}`, "segment over 255 bytes"],
  [`/${"é".repeat(200)}`, "segment over 255 UTF-8 bytes"],
  [`/${"a/".repeat(2100)}f`, "path over 4096 characters"],
  ["", "empty"],
];

/** Names that look odd but are valid and must round-trip everywhere. */
export const VALID_ODD_NAMES: readonly string[] = [
  "/report..final.md",
  "/app/[...slug].tsx",
  "/app/(group)/page.tsx",
  "/with space/file name.txt",
  "/unicode/ünïcødé-文件-🚀.txt",
  "/quotes/it's \"quoted\".txt",
  "/colons/a:b:c.txt",
  "/dots/.hidden/.env",
  "/dots/...",
  "/dash/-rf",
  "/percent/100%.txt",
  "/dollar/$HOME.txt",
  "/brace/{a,b}.txt",
  "/star/*.txt",
];

export function runConformance<B extends Backend>(target: ConformanceTarget<B>): void {
  const caps = target.capabilities ?? {};
  /** The backend behind each view the reliability section creates, for its close and destroy. */
  const closers = new WeakMap<B, B>();

  describe(`conformance: ${target.name}`, () => {
    /** The backend under test, and the seed protocol over it: most sections pin the seeds' shapes, exactly as docs/contract.md states them. */
    let created: B;
    let native: B;
    let backend: BackendProtocol;
    const create = async (): Promise<{ created: B; view: B }> => {
      const made = await target.create();
      return { created: made, view: rooted(made, target.root?.(made) ?? "/") };
    };
    beforeEach(async () => {
      ({ created, view: native } = await create());
      backend = toSeedProtocol(native);
    });
    afterEach(async () => {
      await target.destroy?.(created);
    });

    const write = async (path: string, content: string) => {
      const result = await backend.write(path, content);
      expect(result.error, `write ${path}`).toBeUndefined();
      return result;
    };
    const expectCode = (result: { error?: string; code?: ErrorCode }, code: ErrorCode) => {
      expect(result.error, `expected ${code}`).toBeTypeOf("string");
      expect(result.code).toBe(code);
    };
    const expectThrowsCode = async (promise: Promise<unknown>, code: ErrorCode) => {
      await expect(promise).rejects.toMatchObject({ name: "StrataError", code });
    };
    const paths = (infos: { path: string }[]) => infos.map((i) => i.path);
    const ls = (dir: string, subject: BackendProtocol = backend) => listWithoutEmptyMounts(subject, dir, caps.mountPoints ?? []);

    describe("paths", () => {
      it("normalises '//', '.', a trailing '/' and a missing leading '/'", async () => {
        await write("//a/./b//c.txt", "x");
        expect(await backend.read("/a/b/c.txt")).toBe("     1\tx");
        expect(await backend.read("a/b/c.txt/")).toBe("     1\tx");
        expect(paths(await ls("/a/./"))).toEqual(["/a/b/"]);
      });

      it.each(HOSTILE_PATHS.map(([path, why]) => ({ path, why })))("rejects a path with $why everywhere, writing nothing", async ({ path }) => {
        expectCode(await backend.write(path, "x"), "invalid_path");
        expectCode(await backend.edit(path, "x", "y"), "invalid_path");
        expectCode(await backend.delete(path), "invalid_path");
        expect(await backend.read(path)).toMatch(/^Error: Invalid path/);
        await expectThrowsCode(backend.readRaw(path), "invalid_path");
        await expectThrowsCode(backend.lsInfo(path), "invalid_path");
        await expectThrowsCode(backend.grep("x", path), "invalid_path");
        expect(await backend.grepRaw("x", path)).toMatch(/^Error: Invalid path/);
        expect(await backend.uploadFiles([[path, bytes("x")]])).toEqual([{ path, error: "invalid_path" }]);
        expect(await backend.downloadFiles([path])).toEqual([{ path, content: null, error: "invalid_path" }]);
        expect(await ls("/")).toEqual([]);
      });

      it("never echoes control characters of a hostile path raw", async () => {
        const result = await backend.write("/a/\0\n\u001b[31mred", "x");
        expect(result.error).not.toMatch(/[\u0000\u001b]/);
      });

      it.each(VALID_ODD_NAMES)("accepts %j and round-trips it through write, read, ls, glob, grep, edit, download", async (path) => {
        await write(path, "needle\n");
        expect(await backend.read(path)).toBe("     1\tneedle");
        const dir = path.slice(0, path.lastIndexOf("/")) || "/";
        expect(paths(await ls(dir))).toContain(path);
        expect(paths(await backend.globInfo("**", "/"))).toEqual([path]);
        expect(await backend.grepRaw("needle", "/")).toEqual([{ path, line: 1, text: "needle" }]);
        expect((await backend.edit(path, "needle", "pin")).occurrences).toBe(1);
        expect(text((await backend.downloadFiles([path]))[0]!.content)).toBe("pin\n");
      });
    });

    describe("write", () => {
      it("creates a file, creating parents, and reports the path", async () => {
        const result = await write("/deep/er/file.txt", "hello");
        expect(result.path).toBe("/deep/er/file.txt");
        if (caps.filesUpdate) expect(result.filesUpdate?.["/deep/er/file.txt"]).toMatchObject({ content: "hello", encoding: "utf-8" });
        expect(await backend.read("/deep/er/file.txt")).toBe("     1\thello");
      });

      it("fails with already_exists on an existing file and keeps its content", async () => {
        await write("/f.txt", "original");
        const result = await backend.write("/f.txt", "clobber");
        expectCode(result, "already_exists");
        expect(result.error).toContain("/f.txt");
        expect(await backend.read("/f.txt")).toBe("     1\toriginal");
      });

      it("replaces an existing file with overwrite", async () => {
        await write("/f.txt", "one");
        const result = await backend.write("/f.txt", "two", { overwrite: true });
        expect(result.error).toBeUndefined();
        expect(await backend.read("/f.txt")).toBe("     1\ttwo");
      });

      it("refuses to write over a directory (is_directory) or under a file (not_a_directory)", async () => {
        await write("/dir/inner.txt", "x");
        expectCode(await backend.write("/dir", "y"), "is_directory");
        expectCode(await backend.write("/dir", "y", { overwrite: true }), "is_directory");
        expectCode(await backend.write("/dir/inner.txt/child", "y"), "not_a_directory");
        expectCode(await backend.write("/", "y"), "is_directory");
        expect(await backend.uploadFiles([["/", bytes("y")]])).toEqual([{ path: "/", error: "is_directory" }]);
        expect(await backend.read("/dir/inner.txt")).toBe("     1\tx");
      });

      it("writes an empty file", async () => {
        await write("/empty.txt", "");
        expect(await backend.read("/empty.txt")).toBe(EMPTY_FILE_REMINDER);
        expect((await ls("/"))[0]).toMatchObject({ path: "/empty.txt", size: 0 });
      });

      it("stores content exactly: CRLF, tabs, trailing spaces, no final newline, unicode", async () => {
        const content = "a\r\n\tb  \r\nc 🚀 ünï\r\nlast";
        await write("/exact.txt", content);
        const [download] = await backend.downloadFiles(["/exact.txt"]);
        expect(text(download!.content)).toBe(content);
        expect((await ls("/"))[0]!.size).toBe(bytes(content).length);
      });
    });

    describe("read", () => {
      const lines = (n: number) => Array.from({ length: n }, (_, i) => `line ${i + 1}`).join("\n");

      it("renders cat -n style with %6d and a tab", async () => {
        await write("/r.txt", "alpha\nbeta\n");
        expect(await backend.read("/r.txt")).toBe("     1\talpha\n     2\tbeta");
      });

      it("takes a 0-based offset and a limit", async () => {
        await write("/r.txt", lines(10));
        expect(await backend.read("/r.txt", 3, 2)).toBe("     4\tline 4\n     5\tline 5");
        expect(await backend.read("/r.txt", 9, 5)).toBe("    10\tline 10");
      });

      it("defaults to 2000 lines", async () => {
        await write("/long.txt", lines(2500));
        const out = (await backend.read("/long.txt")).split("\n");
        expect(out).toHaveLength(2000);
        expect(out[1999]).toBe("  2000\tline 2000");
      });

      it("numbers past 999999 without breaking the column", async () => {
        await write("/wide.txt", `${"\n".repeat(1_000_000)}end`);
        expect(await backend.read("/wide.txt", 1_000_000, 1)).toBe("1000001\tend");
      });

      it("errors when the offset is past the end", async () => {
        await write("/r.txt", lines(3));
        const out = await backend.read("/r.txt", 3);
        expect(out).toMatch(/^Error: Line offset 3 exceeds/);
        expect(out).toContain("3 lines");
      });

      it("rejects a negative or fractional offset and a non-positive limit", async () => {
        await write("/r.txt", lines(3));
        expect(await backend.read("/r.txt", -1)).toMatch(/^Error: offset/);
        expect(await backend.read("/r.txt", 1.5)).toMatch(/^Error: offset/);
        expect(await backend.read("/r.txt", 0, 0)).toMatch(/^Error: limit/);
      });

      it("returns the seeds' system reminder for an empty file", async () => {
        await write("/e.txt", "");
        expect(await backend.read("/e.txt")).toBe(EMPTY_FILE_REMINDER);
      });

      it("cuts lines longer than 2000 characters and says so", async () => {
        await write("/wide.txt", `${"x".repeat(5000)}\nshort`);
        const [first, second] = (await backend.read("/wide.txt")).split("\n");
        expect(first).toBe(`     1\t${"x".repeat(2000)}… [line truncated: 5000 characters]`);
        expect(second).toBe("     2\tshort");
      });

      it("reads a single huge line (1 MB) without error", async () => {
        await write("/huge.txt", "y".repeat(1_000_000));
        expect(await backend.read("/huge.txt")).toBe(`     1\t${"y".repeat(2000)}… [line truncated: 1000000 characters]`);
      });

      it("shows CRLF files without the carriage returns", async () => {
        await write("/crlf.txt", "one\r\ntwo\r\n");
        expect(await backend.read("/crlf.txt")).toBe("     1\tone\n     2\ttwo");
      });

      it("reports a missing file, a directory and a binary file as errors", async () => {
        expect(await backend.read("/missing.txt")).toMatch(/^Error: File '\/missing.txt' not found/);
        await write("/d/f.txt", "x");
        expect(await backend.read("/d")).toMatch(/^Error: '\/d' is a directory/);
        await backend.uploadFiles([["/bin.dat", allByteValues]]);
        expect(await backend.read("/bin.dat")).toMatch(/^Error: '\/bin.dat' is a binary file \(512 bytes\)/);
      });

      it("readRaw returns a v2 record and throws typed errors", async () => {
        await write("/raw.txt", "raw\n");
        expect(await backend.readRaw("/raw.txt")).toMatchObject({ content: "raw\n", encoding: "utf-8" });
        await backend.uploadFiles([["/raw.bin", allByteValues]]);
        expect(await backend.readRaw("/raw.bin")).toMatchObject({ encoding: "base64" });
        await expectThrowsCode(backend.readRaw("/nope"), "file_not_found");
        await write("/dir/x", "x");
        await expectThrowsCode(backend.readRaw("/dir"), "is_directory");
      });
    });

    describe("edit", () => {
      it("replaces a unique string and reports one occurrence", async () => {
        await write("/e.py", "def f():\n    return 1\n");
        const result = await backend.edit("/e.py", "return 1", "return 2");
        expect(result).toMatchObject({ path: "/e.py", occurrences: 1 });
        expect(result.error).toBeUndefined();
        expect(await backend.read("/e.py")).toBe("     1\tdef f():\n     2\t    return 2");
      });

      it("refuses an ambiguous edit, says how many, and changes nothing", async () => {
        await write("/e.txt", "x = 1\nx = 1\nx = 1\n");
        const result = await backend.edit("/e.txt", "x = 1", "x = 2");
        expectCode(result, "ambiguous_match");
        expect(result.error).toContain("3 times");
        expect(text((await backend.downloadFiles(["/e.txt"]))[0]!.content)).toBe("x = 1\nx = 1\nx = 1\n");
      });

      it("replaces every occurrence with replaceAll and counts them", async () => {
        await write("/e.txt", "a-a-a");
        expect((await backend.edit("/e.txt", "a", "bb", true)).occurrences).toBe(3);
        expect(await backend.read("/e.txt")).toBe("     1\tbb-bb-bb");
      });

      it("errors on a missing string, an identical replacement, an empty old string, a missing file", async () => {
        await write("/e.txt", "content");
        expectCode(await backend.edit("/e.txt", "absent", "x"), "no_match");
        expectCode(await backend.edit("/e.txt", "content", "content"), "invalid_argument");
        expectCode(await backend.edit("/e.txt", "", "x"), "invalid_argument");
        expectCode(await backend.edit("/none.txt", "a", "b"), "file_not_found");
        expect(await backend.read("/e.txt")).toBe("     1\tcontent");
      });

      it("edits CRLF files with LF-written strings and keeps CRLF", async () => {
        await write("/crlf.txt", "one\r\ntwo\r\nthree\r\n");
        expect((await backend.edit("/crlf.txt", "one\ntwo", "uno\ndos")).occurrences).toBe(1);
        expect(text((await backend.downloadFiles(["/crlf.txt"]))[0]!.content)).toBe("uno\r\ndos\r\nthree\r\n");
      });

      it("treats $ patterns in the replacement literally", async () => {
        await write("/d.txt", "price");
        await backend.edit("/d.txt", "price", "$& $1 $$");
        expect(await backend.read("/d.txt")).toBe("     1\t$& $1 $$");
      });

      it("refuses to edit a binary file", async () => {
        await backend.uploadFiles([["/b.bin", allByteValues]]);
        expectCode(await backend.edit("/b.bin", "a", "b"), "binary_file");
      });
    });

    describe("delete", () => {
      it("removes a file, a directory tree, and refuses '/' and missing paths", async () => {
        await write("/keep.txt", "k");
        await write("/gone.txt", "g");
        await write("/tree/a/b.txt", "b");
        await write("/tree/c.txt", "c");
        expect((await backend.delete("/gone.txt")).error).toBeUndefined();
        expect((await backend.delete("/tree")).error).toBeUndefined();
        expect(paths(await ls("/"))).toEqual(["/keep.txt"]);
        expectCode(await backend.delete("/gone.txt"), "file_not_found");
        expectCode(await backend.delete("/"), "permission_denied");
        expect(paths(await ls("/"))).toEqual(["/keep.txt"]);
      });
    });

    describe("ls", () => {
      it("is non-recursive, sorted, with directories ending in '/'", async () => {
        await write("/b.txt", "bb");
        await write("/a/nested/deep.txt", "x");
        await write("/a/file.txt", "x");
        await write("/c/x.txt", "x");
        const root = await ls("/");
        expect(paths(root)).toEqual(["/a/", "/b.txt", "/c/"]);
        expect(root.map((i) => i.is_dir)).toEqual([true, false, true]);
        expect(root[1]!.size).toBe(2);
        expect(paths(await ls("/a"))).toEqual(["/a/file.txt", "/a/nested/"]);
      });

      it("lists a missing directory as empty and a file as itself", async () => {
        await write("/f.txt", "x");
        expect(await ls("/nothing/here")).toEqual([]);
        expect(paths(await ls("/f.txt"))).toEqual(["/f.txt"]);
      });

      it("handles deep trees", async () => {
        const deep = `/${Array.from({ length: 40 }, (_, i) => `d${i}`).join("/")}/leaf.txt`;
        await write(deep, "leaf");
        expect(await backend.read(deep)).toBe("     1\tleaf");
        expect(paths(await backend.globInfo("**/leaf.txt"))).toEqual([deep]);
        expect(paths(await ls(deep.slice(0, deep.lastIndexOf("/"))))).toEqual([deep]);
      });

      it("lists many entries", async () => {
        await backend.uploadFiles(Array.from({ length: 300 }, (_, i) => [`/many/f${String(i).padStart(3, "0")}.txt`, bytes(`${i}`)] as const));
        const listed = await ls("/many");
        expect(listed).toHaveLength(300);
        expect(listed[0]!.path).toBe("/many/f000.txt");
        expect(listed[299]!.path).toBe("/many/f299.txt");
      });
    });

    describe("glob", () => {
      beforeEach(async () => {
        await backend.uploadFiles(
          ["/a.ts", "/b.js", "/src/c.ts", "/src/d.tsx", "/src/lib/e.ts", "/src/lib/f1.md", "/src/lib/f2.md", "/docs/.hidden.ts", "/docs/read me.md", "/test/x.test.ts"].map(
            (p) => [p, bytes("content\n")] as const,
          ),
        );
      });

      it("matches a pattern without '/' against basenames at any depth", async () => {
        expect(paths(await backend.globInfo("*.ts"))).toEqual(["/a.ts", "/docs/.hidden.ts", "/src/c.ts", "/src/lib/e.ts", "/test/x.test.ts"]);
      });

      it("matches a pattern with '/' relative to the search path", async () => {
        expect(paths(await backend.globInfo("src/*.ts"))).toEqual(["/src/c.ts"]);
        expect(paths(await backend.globInfo("lib/*.ts", "/src"))).toEqual(["/src/lib/e.ts"]);
        expect(paths(await backend.globInfo("*.ts", "/src"))).toEqual(["/src/c.ts", "/src/lib/e.ts"]);
      });

      it("supports **, ?, [abc], [!a], {a,b}", async () => {
        expect(paths(await backend.globInfo("**/*.ts", "/src"))).toEqual(["/src/c.ts", "/src/lib/e.ts"]);
        expect(paths(await backend.globInfo("src/**/f?.md"))).toEqual(["/src/lib/f1.md", "/src/lib/f2.md"]);
        expect(paths(await backend.globInfo("f[2].md"))).toEqual(["/src/lib/f2.md"]);
        expect(paths(await backend.globInfo("[!a].ts"))).toEqual(["/src/c.ts", "/src/lib/e.ts"]);
        expect(paths(await backend.globInfo("*.{js,tsx}"))).toEqual(["/b.js", "/src/d.tsx"]);
      });

      it("matches dotfiles, names with spaces, and absolute patterns", async () => {
        expect(paths(await backend.globInfo(".*"))).toEqual(["/docs/.hidden.ts"]);
        expect(paths(await backend.globInfo("read me.md"))).toEqual(["/docs/read me.md"]);
        expect(paths(await backend.globInfo("/src/lib/*.md", "/"))).toEqual(["/src/lib/f1.md", "/src/lib/f2.md"]);
      });

      it("returns files only, with sizes, and nothing for a missing path", async () => {
        const found = await backend.globInfo("**");
        expect(found).toHaveLength(10);
        expect(found.every((f) => f.is_dir !== true && f.size === 8)).toBe(true);
        expect(await backend.globInfo("*.ts", "/missing")).toEqual([]);
      });

      it("rejects bad globs with invalid_argument and '..' with invalid_path", async () => {
        await expectThrowsCode(backend.globInfo("src/[abc"), "invalid_argument");
        await expectThrowsCode(backend.globInfo("{a,b"), "invalid_argument");
        await expectThrowsCode(backend.globInfo(""), "invalid_argument");
        await expectThrowsCode(backend.globInfo("../*"), "invalid_path");
      });
    });

    describe("grep", () => {
      it("is literal, 1-based, whole lines, sorted by path then line", async () => {
        await write("/b.txt", "x\na.b(c)*\nno\na.b(c)* again");
        await write("/a.txt", "axbxc\na.b(c)*");
        expect(await backend.grepRaw("a.b(c)*")).toEqual([
          { path: "/a.txt", line: 2, text: "a.b(c)*" },
          { path: "/b.txt", line: 2, text: "a.b(c)*" },
          { path: "/b.txt", line: 4, text: "a.b(c)* again" },
        ]);
      });

      it("reports one match per line, strips CR, finds the last line without a newline", async () => {
        await write("/crlf.txt", "hit hit\r\nmiss\r\nhit");
        expect(await backend.grepRaw("hit")).toEqual([
          { path: "/crlf.txt", line: 1, text: "hit hit" },
          { path: "/crlf.txt", line: 3, text: "hit" },
        ]);
      });

      it("is case-sensitive and handles unicode", async () => {
        await write("/u.txt", "Straße\nSTRASSE\n日本語テキスト");
        expect(await backend.grepRaw("ß")).toEqual([{ path: "/u.txt", line: 1, text: "Straße" }]);
        expect(await backend.grepRaw("本語")).toEqual([{ path: "/u.txt", line: 3, text: "日本語テキスト" }]);
        expect(await backend.grepRaw("strasse")).toEqual([]);
      });

      it("searches under a path, or a single file", async () => {
        await write("/in/one.txt", "needle");
        await write("/out/two.txt", "needle");
        expect(paths(await backend.grepRaw("needle", "/in") as { path: string }[])).toEqual(["/in/one.txt"]);
        expect(paths(await backend.grepRaw("needle", "/out/two.txt") as { path: string }[])).toEqual(["/out/two.txt"]);
        expect(await backend.grepRaw("needle", "/nowhere")).toEqual([]);
      });

      it("filters files with the same glob dialect as globInfo", async () => {
        await backend.uploadFiles(["/a.ts", "/src/b.ts", "/src/c.md", "/src/lib/d.ts"].map((p) => [p, bytes("needle\n")] as const));
        for (const [glob, path] of [["*.ts", "/"], ["src/*.ts", "/"], ["**/*.ts", "/src"], ["*.{md,ts}", "/src/lib"]] as const) {
          const grepped = paths((await backend.grep("needle", path, glob)).matches);
          expect(grepped, `${glob} under ${path}`).toEqual(paths(await backend.globInfo(glob, path)));
        }
      });

      it("skips binary files", async () => {
        await backend.uploadFiles([
          ["/bin.dat", Uint8Array.from([...bytes("needle"), 0, 1, 2, ...bytes("\nneedle")])],
          ["/latin1.txt", Uint8Array.from([...bytes("needle "), 0xe9, 0xff])],
          ["/text.txt", bytes("needle")],
        ]);
        expect(await backend.grepRaw("needle")).toEqual([{ path: "/text.txt", line: 1, text: "needle" }]);
      });

      it("caps results with maxCount and marks them truncated", async () => {
        await write("/m.txt", "hit\n".repeat(10));
        await write("/n.txt", "hit\n");
        const capped = await backend.grep("hit", "/", null, { maxCount: 4 });
        expect(capped.truncated).toBe(true);
        expect(capped.matches.map((m) => m.line)).toEqual([1, 2, 3, 4]);
        const all = await backend.grep("hit", "/", null, { maxCount: 11 });
        expect(all).toMatchObject({ truncated: false });
        expect(all.matches).toHaveLength(11);
      });

      it("finds a match inside a huge line and in many files", async () => {
        await write("/huge.txt", `${"z".repeat(500_000)}needle${"z".repeat(500_000)}`);
        await backend.uploadFiles(Array.from({ length: 200 }, (_, i) => [`/many/${i}.txt`, bytes(`row\nneedle ${i}\n`)] as const));
        const result = await backend.grep("needle");
        expect(result.matches).toHaveLength(201);
        expect(result.matches[0]!.path).toBe("/huge.txt");
        expect(result.matches.filter((m) => m.path.startsWith("/many/")).every((m) => m.line === 2)).toBe(true);
      });

      it("rejects empty and multi-line patterns, bad globs and a bad maxCount", async () => {
        await expectThrowsCode(backend.grep(""), "invalid_argument");
        await expectThrowsCode(backend.grep("a\nb"), "invalid_argument");
        await expectThrowsCode(backend.grep("a", "/", "[x"), "invalid_argument");
        await expectThrowsCode(backend.grep("a", "/", null, { maxCount: 0 }), "invalid_argument");
        expect(await backend.grepRaw("")).toMatch(/^Error: /);
      });

      it("treats patterns that look like options or regex as text", async () => {
        await write("/opts.txt", "-e --help\n^$\n[a-z]+\n\\d");
        expect((await backend.grep("-e --help")).matches).toHaveLength(1);
        expect((await backend.grep("^$")).matches).toHaveLength(1);
        expect((await backend.grep("[a-z]+")).matches).toHaveLength(1);
        expect((await backend.grep("\\d")).matches).toHaveLength(1);
      });
    });

    describe("upload and download", () => {
      it("round-trips every byte value", async () => {
        expect(await backend.uploadFiles([["/all.bin", allByteValues]])).toEqual([{ path: "/all.bin", error: null }]);
        const [download] = await backend.downloadFiles(["/all.bin"]);
        expect(download!.error).toBeNull();
        expect(Array.from(download!.content!)).toEqual(Array.from(allByteValues));
      });

      it("round-trips an empty file, a large file and invalid UTF-8", async () => {
        const large = Uint8Array.from({ length: 3 * 1024 * 1024 + 7 }, (_, i) => (i * 7919) % 251);
        const invalid = Uint8Array.from([0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28]);
        await backend.uploadFiles([
          ["/empty.bin", new Uint8Array()],
          ["/large.bin", large],
          ["/invalid.txt", invalid],
        ]);
        const [empty, big, bad] = await backend.downloadFiles(["/empty.bin", "/large.bin", "/invalid.txt"]);
        expect(empty!.content).toHaveLength(0);
        expect(Buffer.from(big!.content!).equals(Buffer.from(large))).toBe(true);
        expect(Array.from(bad!.content!)).toEqual(Array.from(invalid));
      });

      it("answers per item, in input order, with the four codes", async () => {
        await write("/dir/f.txt", "x");
        const uploads = await backend.uploadFiles([
          ["/ok1.txt", bytes("1")],
          ["/../bad", bytes("2")],
          ["/dir", bytes("3")],
          ["/ok2.txt", bytes("4")],
        ]);
        expect(uploads).toEqual([
          { path: "/ok1.txt", error: null },
          { path: "/../bad", error: "invalid_path" },
          { path: "/dir", error: "is_directory" },
          { path: "/ok2.txt", error: null },
        ]);
        const downloads = await backend.downloadFiles(["/ok2.txt", "/missing", "/dir", "/a/\0", "/ok1.txt"]);
        expect(downloads.map((d) => [d.path, d.error])).toEqual([
          ["/ok2.txt", null],
          ["/missing", "file_not_found"],
          ["/dir", "is_directory"],
          ["/a/\0", "invalid_path"],
          ["/ok1.txt", null],
        ]);
        expect(text(downloads[0]!.content)).toBe("4");
        expect(text(downloads[4]!.content)).toBe("1");
      });

      it("overwrites on upload and serves uploaded text to read and grep", async () => {
        await write("/u.txt", "old");
        await backend.uploadFiles([["/u.txt", bytes("new\nline")]]);
        expect(await backend.read("/u.txt")).toBe("     1\tnew\n     2\tline");
        expect(await backend.grepRaw("line")).toEqual([{ path: "/u.txt", line: 2, text: "line" }]);
      });

      it("refuses to upload under a file", async () => {
        await write("/file", "x");
        expect(await backend.uploadFiles([["/file/child", bytes("y")]])).toEqual([{ path: "/file/child", error: "invalid_path" }]);
      });
    });

    if (caps.propertyRuns !== 0) {
      describe("agrees with StateBackend on generated trees", () => {
        const segment = fc.constantFrom("a", "b", "src", "x.ts", "y.md", ".env", "my file", "ü", "[id]", "a..b");
        const filePath = fc.array(segment, { minLength: 1, maxLength: 4 }).map((s) => `/${s.join("/")}`);
        const content = fc.array(fc.constantFrom("needle", "hay", "NEEDLE", "needle\r", "", "ü needle 🚀"), { maxLength: 5 }).map((l) => l.join("\n"));
        const tree = fc.uniqueArray(fc.tuple(filePath, content), { minLength: 1, maxLength: 12, selector: ([p]) => p });
        const globs = fc.constantFrom("*", "**", "*.ts", "**/*.md", "src/**", "a/*", "*.{ts,md}", "[ab]", "?", ".*", "**/b/*");
        const dirs = fc.constantFrom("/", "/a", "/src", "/a/b", "/missing");

        it("ls, glob, grep and read match the reference", async () => {
          await fc.assert(
            fc.asyncProperty(tree, globs, dirs, async (files, glob, dir) => {
              const made = await create();
              const subject = toSeedProtocol(made.view);
              try {
                const reference = toSeedProtocol(new StateBackend());
                // Upload one by one: a path that is a prefix of another fails the same way on both.
                // A mount point and its ancestors are directories by design; files cannot sit there.
                const placeable = files.filter(([path]) => !(caps.mountPoints ?? []).some((mount) => isWithin(path, mount)));
                for (const [path, body] of placeable) {
                  const [mine] = await subject.uploadFiles([[path, bytes(body)]]);
                  const [theirs] = await reference.uploadFiles([[path, bytes(body)]]);
                  expect(mine).toEqual(theirs);
                }
                expect(await ls(dir, subject).then(paths)).toEqual(await reference.lsInfo(dir).then(paths));
                expect(await subject.globInfo(glob, dir).then(paths)).toEqual(await reference.globInfo(glob, dir).then(paths));
                expect(await subject.grepRaw("needle", dir, glob)).toEqual(await reference.grepRaw("needle", dir, glob));
                for (const [path] of placeable) expect(await subject.read(path, 0, 3)).toEqual(await reference.read(path, 0, 3));
              } finally {
                await target.destroy?.(made.created);
              }
            }),
            { numRuns: caps.propertyRuns ?? 25 },
          );
        });
      });
    }

    describeNative({
      backend: () => native,
      unrooted: () => created,
      root: () => target.root?.(created) ?? "/",
      realDirectories: caps.realDirectories ?? caps.execute === true,
      execute: caps.execute === true,
      links: caps.links !== false,
      separateStderr: caps.mergedStderr !== true,
    });

    describeReliability({
      backend: () => native,
      create: async () => {
        const made = await create();
        closers.set(made.view, made.created);
        return made.view;
      },
      destroy: async (view) => target.destroy?.(closers.get(view) ?? view),
      close: target.close ? async (view) => target.close!(closers.get(view) ?? view) : undefined,
      closedCode: caps.closedCode ?? "sandbox_closed",
      fuzzRuns: caps.fuzzRuns ?? Math.min(caps.propertyRuns ?? 25, 25),
      realDirectories: caps.realDirectories ?? caps.execute === true,
      execute: caps.execute === true,
    });

    if (caps.execute) {
      describe("execute", () => {
        const sandbox = () => {
          expect(isSandboxBackend(backend)).toBe(true);
          return backend as unknown as SandboxBackendProtocol;
        };

        it("has an id and runs a command in the workspace", async () => {
          expect(sandbox().id).toBeTypeOf("string");
          await write("/hello.txt", "from the file tools");
          const result = await sandbox().execute("cat hello.txt");
          expect(result).toEqual({ output: "from the file tools", exitCode: 0, truncated: false });
        });

        it("combines stdout and stderr and returns the exit code", async () => {
          const result = await sandbox().execute("echo out; echo err >&2; exit 3");
          expect(result.exitCode).toBe(3);
          expect(result.output).toContain("out");
          expect(result.output).toContain("err");
        });

        it("sees files the command writes through the file tools", async () => {
          await sandbox().execute("mkdir -p made && printf 'a\\nb\\n' > made/by-shell.txt");
          expect(await backend.read("/made/by-shell.txt")).toBe("     1\ta\n     2\tb");
        });

        it("kills a command past its timeout with exit code 124", async () => {
          const started = Date.now();
          const result = await sandbox().execute("sleep 30", { timeout: 1 });
          expect(result.exitCode).toBe(124);
          expect(result.output).toMatch(/timed out/i);
          expect(Date.now() - started).toBeLessThan(15_000);
        });

        it("takes stdin, env and cwd", async () => {
          await write("/sub/marker.txt", "m");
          const result = await sandbox().execute('cat; printf "%s" "$GREETING"; ls', { stdin: "piped ", env: { GREETING: "hi " }, cwd: "/sub" });
          expect(result.output).toBe("piped hi marker.txt\n");
        });
      });
    }
  });
}

/** A listing without the mount-point directories that exist only because of a route and hold no file. */
async function listWithoutEmptyMounts(backend: BackendProtocol, dir: string, mountPoints: readonly string[]): Promise<FileInfo[]> {
  const listed = await backend.lsInfo(dir);
  if (mountPoints.length === 0) return listed;
  const kept: FileInfo[] = [];
  for (const info of listed) {
    const path = info.path.replace(/\/$/, "");
    const holdsMount = info.is_dir && mountPoints.some((mount) => isWithin(path, mount));
    if (!holdsMount || (await backend.globInfo("**", path)).length > 0) kept.push(info);
  }
  return kept;
}
