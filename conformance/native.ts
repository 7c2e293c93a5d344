/**
 * The native API's own section of the conformance suite: every operation
 * answers a result object, failures in the one shape `{ error: { code,
 * message, path? } }` with the path as a field, wrong types never throw,
 * and stat, mkdir, move and copy behave the same on every backend.
 */
import { describe, expect, it } from "vitest";
import type { ErrorCode } from "../core/errors.js";
import { isSandbox, type Backend } from "../core/protocol.js";
import type { Result } from "../core/types.js";

export interface NativeOptions {
  /** The backend as the suite sees it: `/` is the start of its path space (see `rooted`). */
  backend: () => Backend;
  /** The backend itself, and where its path space starts, for the one-path-space test. */
  unrooted: () => Backend;
  root: () => string;
  /** Directories are real: an empty one made by mkdir is listed and outlives its last file. */
  realDirectories: boolean;
  /** A symbolic link a command makes is an entry of the workspace (see ConformanceCapabilities). */
  links?: boolean;
  /** The backend is a sandbox: execute and spawn are tested. */
  execute: boolean;
  /**
   * spawn's stderr arrives apart from stdout. Docker and SSH carry a command's
   * output as one stream (their stderr channel carries the exit status), so
   * there stderr arrives merged into stdout, in order.
   */
  separateStderr: boolean;
}

const bytes = (text: string) => new TextEncoder().encode(text);
const decode = (data: Uint8Array | null | undefined) => new TextDecoder().decode(data ?? new Uint8Array());

/** The value of a result that must have succeeded. */
function ok<T extends object>(result: Result<T>, what: string): T {
  expect(result.error, what).toBeUndefined();
  return result as T;
}

function fails(result: Result<object>, code: ErrorCode, path?: string): void {
  expect(result.error, `expected ${code}`).toBeDefined();
  expect(result.error!.code).toBe(code);
  expect(result.error!.message).toBeTypeOf("string");
  if (path !== undefined) expect(result.error!.path).toBe(path);
}

export function describeNative(options: NativeOptions): void {
  const b = () => options.backend();
  const put = async (path: string, content: string) => ok(await b().write(path, content), `write ${path}`);
  const content = async (path: string) => {
    const [file] = ok(await b().downloadFiles([path]), "download").files;
    expect(file!.error, `download ${path}`).toBeNull();
    return decode(file!.content);
  };
  const exists = async (path: string) => !(await b().stat(path)).error;

  describe("native API", () => {
    it("answers every operation with a result object", async () => {
      expect(ok(await b().write("/n/a.md", "one\r\ntwo\nthree"), "write")).toMatchObject({ path: "/n/a.md" });
      expect(ok(await b().read("/n/a.md", { offset: 1, limit: 1 }), "read")).toEqual({
        path: "/n/a.md",
        encoding: "utf-8",
        content: "two",
        mimeType: "text/markdown",
        totalLines: 3,
        offset: 1,
        lineCount: 1,
      });
      expect(ok(await b().read("/n/a.md"), "read").content).toBe("one\ntwo\nthree");
      expect(ok(await b().readRaw("/n/a.md"), "readRaw").data).toMatchObject({ content: "one\r\ntwo\nthree", encoding: "utf-8" });
      expect(ok(await b().edit("/n/a.md", "t", "T", { replaceAll: true }), "edit")).toMatchObject({ path: "/n/a.md", occurrences: 2 });
      expect(ok(await b().ls("/n"), "ls").entries.map((e) => e.path)).toEqual(["/n/a.md"]);
      expect(ok(await b().glob("*.md", { path: "/" }), "glob").entries.map((e) => e.path)).toEqual(["/n/a.md"]);
      expect(ok(await b().grep("hree", { path: "/n", glob: "*.md", maxCount: 5 }), "grep")).toEqual({
        matches: [{ path: "/n/a.md", line: 3, text: "Three" }],
        truncated: false,
      });
      expect(ok(await b().stat("/n/a.md"), "stat")).toMatchObject({ path: "/n/a.md", is_dir: false, size: 14 });
      expect(ok(await b().stat("/n"), "stat dir")).toMatchObject({ path: "/n/", is_dir: true });
      expect(ok(await b().uploadFiles([["/n/b.bin", Uint8Array.of(0, 1, 2)]]), "upload").files).toEqual([{ path: "/n/b.bin", error: null, seedError: null }]);
      const [download] = ok(await b().downloadFiles(["/n/b.bin"]), "download").files;
      expect(download).toMatchObject({ path: "/n/b.bin", error: null, seedError: null });
      expect([...download!.content!]).toEqual([0, 1, 2]);
      expect(ok(await b().read("/n/b.bin"), "read binary")).toMatchObject({ encoding: "binary", size: 3, mimeType: "application/octet-stream" });
      expect(ok(await b().delete("/n"), "delete")).toMatchObject({ path: "/n" });
      expect(await exists("/n/a.md")).toBe(false);
    });

    it("reads an empty file as no lines, and refuses an offset past the end", async () => {
      await put("/empty.txt", "");
      expect(ok(await b().read("/empty.txt"), "read")).toMatchObject({ content: "", totalLines: 0, lineCount: 0 });
      await put("/two.txt", "a\nb\n");
      fails(await b().read("/two.txt", { offset: 2 }), "invalid_argument", "/two.txt");
    });

    it("answers each failure code in the one shape, the path as a field", async () => {
      await put("/f.txt", "x x");
      await put("/d/in.txt", "y");
      fails(await b().read("/missing.txt"), "file_not_found", "/missing.txt");
      fails(await b().read("//d/./"), "is_directory", "/d");
      fails(await b().write("/f.txt", "again"), "already_exists", "/f.txt");
      fails(await b().write("/f.txt/child", "z"), "not_a_directory");
      fails(await b().edit("/f.txt", "absent", "z"), "no_match", "/f.txt");
      fails(await b().edit("/f.txt", "x", "z"), "ambiguous_match", "/f.txt");
      fails(await b().write("/a/../etc/passwd", "z"), "invalid_path");
      fails(await b().delete("/"), "permission_denied");
      await put("/bin.dat", "\0binary");
      fails(await b().edit("/bin.dat", "binary", "text"), "binary_file", "/bin.dat");
      const uploads = ok(await b().uploadFiles([["/f.txt/under", bytes("z")], ["/d", bytes("z")], ["/ok.txt", bytes("z")]]), "upload").files;
      expect(uploads.map((u) => [u.error?.code ?? null, u.seedError])).toEqual([
        ["not_a_directory", "invalid_path"],
        ["is_directory", "is_directory"],
        [null, null],
      ]);
      const downloads = ok(await b().downloadFiles(["/nope", "/d"]), "download").files;
      expect(downloads.map((d) => [d.error?.code, d.seedError, d.content])).toEqual([
        ["file_not_found", "file_not_found", null],
        ["is_directory", "is_directory", null],
      ]);
    });

    it("never throws, whatever the types: a wrong argument is invalid_argument or invalid_path", async () => {
      const loose = b() as unknown as Record<string, (...args: unknown[]) => Promise<Result<object>>>;
      const hostile = JSON.parse('{"toString":1}') as unknown;
      const calls: Array<[string, unknown[]]> = [
        ["ls", [42]],
        ["read", [hostile]],
        ["read", ["/f", 5]],
        ["read", ["/f", { offset: -1 }]],
        ["readRaw", [null]],
        ["write", ["/f", 42]],
        ["write", ["/f", "x", { overwrite: "yes" }]],
        ["edit", ["/f", 1, "x"]],
        ["edit", ["/f", "a", "b", true]],
        ["delete", [[]]],
        ["grep", [42]],
        ["grep", ["x", { path: 42 }]],
        ["grep", ["x", { maxCount: 0 }]],
        ["glob", [{}]],
        ["glob", ["[", { path: "/" }]],
        ["glob", ["*", { includeDirectories: "yes" }]],
        ["glob", ["*", { sizes: "no" }]],
        ["stat", [undefined]],
        ["mkdir", ["/d", "recursive"]],
        ["move", ["/a", 42]],
        ["copy", [42, "/b"]],
        ["uploadFiles", ["not an array"]],
        ["downloadFiles", [null]],
        ["ls", ["/", { signal: "stop" }]],
      ];
      for (const [method, args] of calls) {
        const result = await loose[method]!.apply(b(), args);
        expect(result.error?.code, `${method}(${args.map((a) => JSON.stringify(a)).join(", ")})`).toMatch(/^invalid_(argument|path)$/);
      }
      const items = ok(await loose.uploadFiles!.apply(b(), [[["/u", "not bytes"], [42, bytes("x")]]]) as Result<{ files: { error: { code: string } | null }[] }>, "upload").files;
      expect(items.map((i) => i.error?.code)).toEqual(["invalid_argument", "invalid_path"]);
    });

    it("answers aborted for an aborted signal and changes nothing", async () => {
      const signal = AbortSignal.abort();
      fails(await b().write("/aborted.txt", "x", { signal }), "aborted");
      fails(await b().read("/aborted.txt", { signal }), "aborted");
      fails(await b().grep("x", { signal }), "aborted");
      expect(await exists("/aborted.txt")).toBe(false);
    });

    it("globs directories too with includeDirectories, in the same dialect, never the search path itself", async () => {
      await put("/gd/src/a.ts", "a");
      await put("/gd/src/lib/b.ts", "b");
      await put("/gd/docs/readme.md", "r");
      const paths = async (pattern: string, options: { path?: string; includeDirectories?: boolean }) =>
        ok(await b().glob(pattern, options), `glob ${pattern}`).entries.map((e) => e.path);
      expect(await paths("*", { path: "/gd", includeDirectories: true })).toEqual([
        "/gd/docs/",
        "/gd/docs/readme.md",
        "/gd/src/",
        "/gd/src/a.ts",
        "/gd/src/lib/",
        "/gd/src/lib/b.ts",
      ]);
      expect(await paths("*", { path: "/gd" })).toEqual(["/gd/docs/readme.md", "/gd/src/a.ts", "/gd/src/lib/b.ts"]);
      expect(await paths("src/*", { path: "/gd", includeDirectories: true })).toEqual(["/gd/src/a.ts", "/gd/src/lib/"]);
      expect(await paths("**", { path: "/gd/src", includeDirectories: true })).toEqual(["/gd/src/a.ts", "/gd/src/lib/", "/gd/src/lib/b.ts"]);
      expect(await paths("lib", { path: "/gd", includeDirectories: true })).toEqual(["/gd/src/lib/"]);
      expect(await paths("lib", { path: "/gd" })).toEqual([]);
      expect(await paths("/gd/s*", { includeDirectories: true })).toEqual(["/gd/src/"]);
      expect(await paths("**", { path: "/gd/missing", includeDirectories: true })).toEqual([]);
      const [dir] = ok(await b().glob("docs", { path: "/gd", includeDirectories: true }), "glob docs").entries;
      expect(dir).toMatchObject({ path: "/gd/docs/", is_dir: true });
      if (options.realDirectories) {
        ok(await b().mkdir("/gd/empty"), "mkdir");
        expect(await paths("e*", { path: "/gd", includeDirectories: true })).toEqual(["/gd/empty/"]);
      }
    });

    it("globs the same paths and kinds with sizes: false as with sizes", async () => {
      await put("/gs/a.ts", "a");
      await put("/gs/src/b.ts", "bb");
      await put("/gs/src/c.md", "c");
      for (const [pattern, includeDirectories] of [["**", true], ["**", false], ["*.ts", false], ["src", true]] as const) {
        const full = ok(await b().glob(pattern, { path: "/gs", includeDirectories }), `glob ${pattern}`).entries;
        const lean = ok(await b().glob(pattern, { path: "/gs", includeDirectories, sizes: false }), `glob ${pattern} sizes: false`).entries;
        expect(lean.map((e) => [e.path, e.is_dir === true]), `${pattern} ${includeDirectories}`).toEqual(full.map((e) => [e.path, e.is_dir === true]));
      }
      expect(ok(await b().glob("*.ts", { path: "/gs" }), "glob").entries.map((e) => e.size)).toEqual([1, 2]);
    });

    describe("stat, mkdir, move, copy", () => {
      it("stats a file, a directory and the root, and answers file_not_found", async () => {
        await put("/s/f.txt", "hello");
        expect(ok(await b().stat("/s/f.txt"), "stat")).toMatchObject({ path: "/s/f.txt", is_dir: false, size: 5 });
        expect(ok(await b().stat("/s/"), "stat")).toMatchObject({ path: "/s/", is_dir: true });
        expect(ok(await b().stat("/"), "stat")).toMatchObject({ is_dir: true });
        fails(await b().stat("/s/none"), "file_not_found", "/s/none");
      });

      it("makes directories, with parents when recursive", async () => {
        fails(await b().mkdir("/m/deep/er"), "file_not_found");
        ok(await b().mkdir("/m/deep/er", { recursive: true }), "mkdir -p");
        ok(await b().mkdir("/m/deep/er", { recursive: true }), "mkdir -p again");
        if (options.realDirectories) {
          expect(ok(await b().stat("/m/deep/er"), "stat")).toMatchObject({ is_dir: true });
          expect(ok(await b().ls("/m/deep"), "ls").entries.map((e) => e.path)).toEqual(["/m/deep/er/"]);
          fails(await b().mkdir("/m/deep/er"), "already_exists");
        }
        await put("/m/file", "x");
        fails(await b().mkdir("/m/file"), "already_exists", "/m/file");
        fails(await b().mkdir("/m/file/sub", { recursive: true }), "not_a_directory");
        ok(await b().write("/m/deep/er/f.txt", "in"), "write into it");
      });

      it("moves a file: the content lands at the target and leaves the source", async () => {
        await put("/mv/a.txt", "A");
        expect(ok(await b().move("/mv/a.txt", "/mv/sub/b.txt"), "move")).toMatchObject({ from: "/mv/a.txt", to: "/mv/sub/b.txt" });
        expect(await exists("/mv/a.txt")).toBe(false);
        expect(await content("/mv/sub/b.txt")).toBe("A");
        await put("/mv/c.txt", "C");
        fails(await b().move("/mv/c.txt", "/mv/sub/b.txt"), "already_exists", "/mv/sub/b.txt");
        expect(await content("/mv/c.txt")).toBe("C");
        expect(await content("/mv/sub/b.txt")).toBe("A");
        ok(await b().move("/mv/c.txt", "/mv/sub/b.txt", { overwrite: true }), "move over");
        expect(await content("/mv/sub/b.txt")).toBe("C");
        fails(await b().move("/mv/none", "/mv/x"), "file_not_found", "/mv/none");
      });

      if (options.realDirectories)
        it("keeps a tree's empty directories when it moves or copies it", async () => {
          ok(await b().mkdir("/tree/empty/deeper", { recursive: true }), "mkdir");
          await put("/tree/f.txt", "f");
          ok(await b().copy("/tree", "/tree2"), "copy");
          ok(await b().move("/tree", "/tree3"), "move");
          for (const root of ["/tree2", "/tree3"]) expect(ok(await b().stat(`${root}/empty/deeper`), "stat")).toMatchObject({ is_dir: true });
          expect(await exists("/tree")).toBe(false);
        });

      it("moves and copies a directory tree whole, and refuses to put a tree into itself", async () => {
        await put("/t/a.txt", "a");
        await put("/t/sub/b.txt", "b");
        ok(await b().copy("/t", "/copy"), "copy tree");
        expect(await content("/copy/sub/b.txt")).toBe("b");
        expect(await content("/t/sub/b.txt")).toBe("b");
        fails(await b().move("/t", "/t/inside"), "invalid_argument");
        ok(await b().move("/t", "/moved"), "move tree");
        expect(ok(await b().glob("**", { path: "/moved" }), "glob").entries.map((e) => e.path)).toEqual(["/moved/a.txt", "/moved/sub/b.txt"]);
        expect(await exists("/t")).toBe(false);
        await put("/bin/x", "\0\x01");
        ok(await b().copy("/bin/x", "/bin/y"), "copy binary");
        expect([...ok(await b().downloadFiles(["/bin/y"]), "download").files[0]!.content!]).toEqual([0, 1]);
      });

      it("refuses to put a tree onto a directory that is not empty, and changes nothing", async () => {
        await put("/src/a.txt", "new a");
        await put("/dst/a.txt", "old a");
        await put("/dst/keep.txt", "keep");
        fails(await b().copy("/src", "/dst", { overwrite: true }), "already_exists", "/dst");
        fails(await b().move("/src", "/dst", { overwrite: true }), "already_exists", "/dst");
        expect(await content("/dst/a.txt")).toBe("old a");
        expect(await content("/dst/keep.txt")).toBe("keep");
        expect(await content("/src/a.txt")).toBe("new a");
      });

      it("two crossing moves (a to b, b to a) leave one file, as some serial order would", async () => {
        for (let round = 0; round < 5; round++) {
          await put(`/x${round}/a`, "A");
          await put(`/x${round}/b`, "B");
          await Promise.all([b().move(`/x${round}/a`, `/x${round}/b`, { overwrite: true }), b().move(`/x${round}/b`, `/x${round}/a`, { overwrite: true })]);
          const left = ok(await b().glob("*", { path: `/x${round}` }), "glob").entries.map((e) => e.path);
          expect(left, `round ${round}`).toHaveLength(1);
        }
      });

      it("a write racing a move of its file is never lost once acknowledged", async () => {
        for (let round = 0; round < 8; round++) {
          await put(`/w${round}/src.txt`, "v1");
          const [, written] = await Promise.all([
            b().move(`/w${round}/src.txt`, `/w${round}/dst.txt`),
            (async () => {
              for (let i = 0; i < round; i++) await Promise.resolve();
              return b().write(`/w${round}/src.txt`, "v2", { overwrite: true });
            })(),
          ]);
          if (written.error) continue;
          const texts: string[] = [];
          for (const name of ["src.txt", "dst.txt"]) {
            const [file] = ok(await b().downloadFiles([`/w${round}/${name}`]), "download").files;
            if (file!.content) texts.push(decode(file!.content));
          }
          expect(texts, `round ${round}`).toContain("v2");
        }
      });

      it("5 concurrent moves of one file: exactly one lands, and the file exists exactly once", async () => {
        await put("/race/src.txt", "only once");
        const results = await Promise.all(Array.from({ length: 5 }, (_, i) => b().move("/race/src.txt", `/race/dst${i}.txt`)));
        const landed = results.filter((r) => !r.error);
        expect(landed).toHaveLength(1);
        for (const failed of results.filter((r) => r.error)) expect(failed.error!.code).toMatch(/^(file_not_found|conflict|busy)$/);
        const files = ok(await b().glob("**", { path: "/race" }), "glob").entries.map((e) => e.path);
        expect(files).toEqual([(landed[0] as { to: string }).to]);
        expect(await content(files[0]!)).toBe("only once");
      });
    });

    if (options.execute) it("gives files and commands one path space: the workspace's absolute paths", async () => {
      const sandbox = options.unrooted();
      if (!isSandbox(sandbox)) throw new Error("not a sandbox");
      const root = options.root();
      // LocalSandbox (root "/") runs commands on the host: its files' "/" is the workspace, the
      // commands' working directory, so relative paths agree and absolute ones are host paths (docs/sandboxes.md).
      const base = root === "/" ? "" : root;
      ok(await sandbox.write(`${base}/space/app.sh`, "echo ran\n"), "write");
      expect(ok(await sandbox.execute("sh space/app.sh"), "run by a relative path").output).toBe("ran\n");
      ok(await sandbox.execute("echo made > space/by-shell.txt"), "command writes");
      expect(ok(await sandbox.read("space/by-shell.txt"), "relative read").content).toBe("made");
      expect(ok(await sandbox.ls(`${base}/space`), "ls").entries.map((e) => e.path)).toEqual([`${base}/space/app.sh`, `${base}/space/by-shell.txt`]);
      expect(ok(await sandbox.execute("cat by-shell.txt", { cwd: `${base}/space` }), "cwd").output).toBe("made\n");
      if (root === "/") return;
      expect(ok(await sandbox.execute(`sh ${root}/space/app.sh && pwd`), "run by the same absolute path").output).toBe(`ran\n${root}\n`);
      fails(await sandbox.write("/etc/strata-outside.txt", "x"), "invalid_path", "/etc/strata-outside.txt");
      fails(await sandbox.read("/etc/passwd"), "invalid_path", "/etc/passwd");
      expect((await sandbox.read("/etc/passwd")).error?.message).toContain("'/etc/passwd'");
      fails(await sandbox.read(`${root}/missing.txt`), "file_not_found", `${root}/missing.txt`);
      expect(ok(await sandbox.ls(), "ls of the workspace").entries.map((e) => e.path)).toContain(`${root}/space/`);
      fails(await sandbox.execute("pwd", { cwd: "/etc" }), "invalid_path", "/etc");
      fails(await sandbox.spawn("pwd", { cwd: "/etc" }), "invalid_path", "/etc");
      const [upload] = ok(await sandbox.uploadFiles([["/outside.txt", bytes("x")]]), "upload").files;
      expect(upload!.error).toMatchObject({ code: "invalid_path", path: "/outside.txt" });
      const [download] = ok(await sandbox.downloadFiles([`${root}/missing.txt`]), "download").files;
      expect(download!.error).toMatchObject({ code: "file_not_found", path: `${root}/missing.txt`, message: `File '${root}/missing.txt' not found` });
    });

    if (options.execute) it("moves and copies keep what commands see: modes, links and empty directories", async () => {
      const sandbox = b();
      if (!isSandbox(sandbox)) throw new Error("not a sandbox");
      ok(await sandbox.execute("mkdir -p kit/empty && printf 'echo ran\\n' > kit/run.sh && chmod 755 kit/run.sh && ln -s run.sh kit/link"), "prepare");
      ok(await sandbox.copy("/kit", "/kit2"), "copy");
      ok(await sandbox.move("/kit", "/kit3"), "move");
      for (const dir of ["kit2", "kit3"]) {
        expect(ok(await sandbox.execute(`./${dir}/link && [ -d ${dir}/empty ] && [ -L ${dir}/link ] && echo kept`), dir).output).toBe("ran\nkept\n");
      }
      expect(await exists("/kit")).toBe(false);
    });

    if (options.execute && options.links !== false) it("lists links that loop (to their own directory, to each other) as entries, never leaves them out", async () => {
      const sandbox = b();
      if (!isSandbox(sandbox)) throw new Error("not a sandbox");
      ok(await sandbox.execute("mkdir loops && : > loops/f && ln -s . loops/self && ln -s loop2 loops/loop1 && ln -s loop1 loops/loop2"), "prepare");
      const names = ok(await sandbox.ls("/loops"), "ls").entries.map((e) => e.path.replace(/\/$/, ""));
      expect(names).toEqual(["/loops/f", "/loops/loop1", "/loops/loop2", "/loops/self"]);
    });

    if (options.execute && options.links !== false) it("never passes a change through a linked directory: write, edit, delete, mkdir, move, copy and upload refuse it", async () => {
      const sandbox = b();
      if (!isSandbox(sandbox)) throw new Error("not a sandbox");
      // The permission rules are checked on the path as given: a change through /via/… would reach /kept/… unchecked.
      ok(await sandbox.execute("mkdir -p kept/sub && echo old > kept/f && echo old > kept/sub/g && echo mine > mine.txt && ln -s kept via"), "prepare");
      const denied = (result: Result<object>, path: string) => fails(result, "permission_denied", path);
      denied(await sandbox.write("/via/new.txt", "x"), "/via/new.txt");
      denied(await sandbox.write("/via/f", "x", { overwrite: true }), "/via/f");
      denied(await sandbox.edit("/via/f", "old", "new"), "/via/f");
      denied(await sandbox.delete("/via/f"), "/via/f");
      denied(await sandbox.delete("/via/sub"), "/via/sub");
      denied(await sandbox.mkdir("/via/made"), "/via/made");
      expect((await sandbox.move("/via/f", "/moved")).error?.code).toBe("permission_denied");
      expect((await sandbox.move("/mine.txt", "/via/mine.txt")).error?.code).toBe("permission_denied");
      expect((await sandbox.copy("/mine.txt", "/via/copied.txt")).error?.code).toBe("permission_denied");
      const [upload] = ok(await sandbox.uploadFiles([["/via/up.txt", bytes("x")]]), "upload").files;
      expect(upload!.error?.code).toBe("permission_denied");
      expect(ok(await sandbox.execute("cd kept && find . | LC_ALL=C sort && cat f sub/g && cat ../mine.txt"), "after").output).toBe(".\n./f\n./sub\n./sub/g\nold\nold\nmine\n");
      // The link itself is the change's own object: deleting it removes the link, never what it points at.
      ok(await sandbox.delete("/via"), "delete the link");
      expect(ok(await sandbox.execute("[ -L via ] || [ -e via ] || echo gone; cat kept/f"), "after delete").output).toBe("gone\nold\n");
    });

    if (options.execute) it("runs commands in the files' path space and spawns with live streams", async () => {
      const sandbox = b();
      expect(isSandbox(sandbox)).toBe(true);
      if (!isSandbox(sandbox)) return;
      await put("/spawn/in.txt", "from a file");
      const run = ok(await sandbox.execute("cat spawn/in.txt"), "execute");
      expect(run).toMatchObject({ output: "from a file", exitCode: 0 });
      const process = ok(await sandbox.spawn("cat; echo err >&2; exit 3"), "spawn");
      const writer = process.stdin.getWriter();
      await writer.write(bytes("streamed "));
      await writer.write(bytes("input"));
      await writer.close();
      const [stdout, stderr] = await Promise.all([new Response(process.stdout).text(), new Response(process.stderr).text()]);
      if (options.separateStderr) {
        expect(stdout).toBe("streamed input");
        expect(stderr).toBe("err\n");
      } else {
        expect(stdout).toBe("streamed inputerr\n");
        expect(stderr).toBe("");
      }
      expect(await process.wait()).toEqual({ exitCode: 3 });
      // A reader that cancels its stream drops the rest; nothing else notices.
      const chatty = ok(await sandbox.spawn("for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done"), "spawn chatty");
      const reader = chatty.stdout.getReader();
      await reader.read();
      await reader.cancel();
      expect(await chatty.wait()).toEqual({ exitCode: 0 });
      // After the end, stdin refuses writes instead of swallowing them.
      const done = ok(await sandbox.spawn("true"), "spawn true");
      await done.wait();
      await expect(done.stdin.getWriter().write(bytes("late"))).rejects.toBeDefined();
      // A callback that throws loses its own chunk, never the command.
      expect(ok(await sandbox.execute("echo still here", { onData: () => { throw new Error("caller bug"); } }), "execute").output).toBe("still here\n");
      const sleeper = ok(await sandbox.spawn("sleep 30"), "spawn sleep");
      const started = Date.now();
      await sleeper.kill();
      expect((await sleeper.wait()).error?.code).toBe("aborted");
      expect(Date.now() - started).toBeLessThan(10_000);
    });
  });
}
