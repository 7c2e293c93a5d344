import { mkdtempSync, rmSync, writeFileSync, mkdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { FilesystemBackend } from "../backends/filesystem.js";
import { withPermissions } from "../backends/permissions.js";
import { StateBackend } from "../backends/state.js";
import { PermissionPolicy, SECRETS_PRESET, readOnly, type PermissionRequest, type PermissionRule } from "../core/permissions.js";
import type { Backend } from "../core/protocol.js";
import { search } from "../core/search.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const dirs: string[] = [];
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-perm-"));
  dirs.push(dir);
  return dir;
}
afterAll(() => dirs.forEach((dir) => rmSync(dir, { recursive: true, force: true })));

async function seeded(files: Record<string, string>, rules: readonly PermissionRule[], ask?: (request: PermissionRequest) => unknown): Promise<{ backend: Backend; inner: StateBackend }> {
  const inner = new StateBackend();
  for (const [path, content] of Object.entries(files)) expect((await inner.write(path, content)).error).toBeUndefined();
  return { inner, backend: withPermissions(inner, { rules, ask: ask as never }) };
}

describe("PermissionPolicy.refusalNames", () => {
  it("names what every refusing rule's match bears (its last segment), or nothing when a rule cannot be put so", () => {
    const names = new PermissionPolicy([...SECRETS_PRESET]).refusalNames("delete")!;
    expect(names).toContain(".env*");
    expect(names).toContain("config");
    expect(names).toContain("credentials");
    expect(names).toContain(".ssh");
    expect(new PermissionPolicy([...SECRETS_PRESET]).refusalNames("execute")).toEqual([]);
    expect(new PermissionPolicy([{ action: "allow", paths: "**" }]).refusalNames("delete")).toEqual([]);
    expect(new PermissionPolicy([{ action: "ask", operations: "delete", paths: "/a/*.log" }]).refusalNames("delete")).toEqual(["*.log"]);
    expect(new PermissionPolicy([{ action: "deny", operations: "delete", paths: "?.txt" }]).refusalNames("delete")).toEqual(["*.txt"]);
    for (const paths of ["/docs/**", "**", "*.{pem,key}", "[ab].txt", "a\\*"]) {
      expect(new PermissionPolicy([{ action: "deny", operations: "delete", paths }]).refusalNames("delete")).toBeUndefined();
    }
    expect(new PermissionPolicy([{ action: "deny", operations: "delete" }]).refusalNames("delete")).toBeUndefined();
    // A rule on a directory covers what lies under it: its name, met below the tree's root, is enough to fall back.
    expect(new PermissionPolicy([readOnly("/docs")]).refusalNames("delete")).toEqual(["docs"]);
  });
});

describe("PermissionPolicy", () => {
  it("deny > ask > allow among the rules that match; no rule allows", () => {
    const policy = new PermissionPolicy([
      { action: "allow", paths: "**" },
      { action: "ask", operations: "write", paths: "/docs/**" },
      { name: "no drafts", action: "deny", paths: "*.draft" },
    ]);
    expect(policy.check("read", "/src/a.ts").action).toBe("allow");
    expect(policy.check("write", "/docs/a.md").action).toBe("ask");
    expect(policy.check("write", "/docs/a.draft")).toMatchObject({ action: "deny", pattern: "*.draft", rule: { name: "no drafts" } });
    expect(new PermissionPolicy([]).check("delete", "/x").action).toBe("allow");
  });

  it("a rule on a directory covers what is under it; dir/** covers dir; a bare name matches at any depth, an absolute one one place", () => {
    const policy = new PermissionPolicy([{ action: "deny", paths: [".ssh", "secret/**", "/top"] }]);
    for (const path of ["/.ssh", "/.ssh/id_rsa", "/a/b/.ssh/config", "/secret", "/secret/x/y", "/top", "/top/z"]) expect(policy.check("read", path).action, path).toBe("deny");
    for (const path of ["/a/secret/x", "/a/top", "/ssh", "/.sshx"]) expect(policy.check("read", path).action, path).toBe("allow");
  });

  it("relative patterns start at the root it is given (a sandbox's workspace)", () => {
    const policy = new PermissionPolicy([{ action: "deny", paths: "private/**" }], "/workspace");
    expect(policy.check("read", "/workspace/private/a").action).toBe("deny");
    expect(policy.check("read", "/workspace/public/private/a").action).toBe("allow");
  });

  it("refuses malformed rules with invalid_argument", () => {
    expect(() => new PermissionPolicy([{ action: "block" } as never])).toThrow(/action must be/);
    expect(() => new PermissionPolicy([{ action: "deny", operations: ["list"] } as never])).toThrow(/operations must name/);
    expect(() => new PermissionPolicy([{ action: "deny", paths: "a/[b" }])).toThrow(/paths/);
    expect(() => new PermissionPolicy("deny" as never)).toThrow(/array/);
  });

  it("readOnly is a deny of every changing operation under its paths", () => {
    expect(readOnly("/docs/**")).toEqual({ name: "read-only", action: "deny", operations: ["write", "edit", "delete"], paths: "/docs/**" });
  });
});

  it("actionChecker answers check's action for every path (its directory memo and the literal head/tail shortcut of bare names change nothing)", () => {
    const rules: PermissionRule[] = [
      ...SECRETS_PRESET,
      { action: "ask", operations: ["read", "write"], paths: ["/docs/**", "*.draft", "a*a", "x?z", "[ab]c.txt", "*.{log,tmp}", "lit\\*eral"] },
      { action: "allow", paths: "**/keep" },
      { action: "deny", operations: "read", paths: "deep/**/hidden" },
    ];
    const names = [".env", ".env.local", "env", "id_rsa", "id_rsa.pub", "key.pem", ".pem", "pem", "a", "aa", "aba", "xyz", "xz", "ac.txt", "cc.txt", "b.log", "c.tmp", "lit*eral", "litXeral", "keep", "hidden", ".ssh", "config", "credentials", "a.draft", "draft"];
    const dirs = ["", "/docs", "/deep/x", "/.ssh", "/home/.aws", "/p/.git", "/q/.kube", "/src/mod1"];
    for (const operation of ["read", "write", "delete", "execute"] as const) {
      for (const root of ["/", "/workspace"]) {
        const policy = new PermissionPolicy(rules, root);
        const action = policy.actionChecker(operation);
        for (const dir of dirs) {
          for (const name of names) {
            for (const path of [`${root === "/" ? "" : root}${dir}/${name}`, `${dir}/${name}`, `${dir}/${name}/`]) {
              expect(action(path), `${operation} ${path} (root ${root})`).toBe(policy.check(operation, path).action);
            }
          }
        }
        expect(action("/")).toBe(policy.check(operation, "/").action);
      }
    }
  });

  it("listingDenial answers whether check denies, for a listing's children and for any other path; nameDenial for a child's name", () => {
    const rules: PermissionRule[] = [
      ...SECRETS_PRESET,
      { action: "ask", operations: ["read", "write"], paths: ["/docs/**", "*.draft"] },
      { action: "deny", operations: "read", paths: ["deep/**/hidden", "/locked/**", "x?z"] },
      { action: "allow", paths: "**/keep" },
    ];
    const names = [".env", ".env.local", "env", "id_rsa", "key.pem", "pem", "xyz", "xz", "keep", "hidden", ".ssh", "config", "credentials", "a.draft", "file1.ts"];
    const dirs = ["/", "/docs", "/deep/x", "/.ssh", "/home/.aws", "/p/.git", "/locked", "/locked/in", "/src/mod1"];
    for (const operation of ["read", "write", "execute"] as const) {
      for (const root of ["/", "/workspace"]) {
        const policy = new PermissionPolicy(rules, root);
        for (const dir of dirs) {
          const denied = policy.listingDenial(operation, dir);
          const children = names.flatMap((name) => [`${dir === "/" ? "" : dir}/${name}`, `${dir === "/" ? "" : dir}/${name}/`]);
          // Not children: the directory itself (ls of a file lists the file), deeper paths, a sibling sharing the prefix.
          const others = [dir, `${dir === "/" ? "" : dir}/.ssh/id`, `${dir === "/" ? "" : dir}/a/.env`, `${dir}x/.env`, "/.env", "/deep/y/hidden"];
          for (const path of [...children, ...others]) {
            expect(denied(path), `${operation} ${path} listing ${dir} (root ${root})`).toBe(policy.check(operation, path).action === "deny");
          }
          const deniedName = policy.nameDenial(operation, dir);
          for (const name of names) {
            expect(deniedName(name), `${operation} name ${name} listing ${dir} (root ${root})`).toBe(policy.check(operation, `${dir === "/" ? "" : dir}/${name}`).action === "deny");
          }
        }
      }
    }
  });

describe("PermissionPolicy's literal gate", () => {
  it("answers the same verdicts as the patterns alone, regex characters in literals included", () => {
    const rules: PermissionRule[] = [
      ...SECRETS_PRESET,
      { action: "ask", operations: ["read", "write"], paths: ["*.draft", "a+b*", "$HOME*", "(x)*.txt", "**/.cfg/se.cret", "^x*", "m*m", "n*", "é*", "*ü", "😀*"] },
      { action: "ask", operations: "write", paths: "/docs/**" },
      { action: "deny", operations: "read", paths: ["deep/**/hidden", "*.p|q"] },
    ];
    // A pattern with neither a literal head nor a tail (and matching none of these names) leaves its rule ungated.
    const ungated = rules.map((rule) => ({ ...rule, paths: [...(typeof rule.paths === "string" ? [rule.paths] : (rule.paths ?? [])), "[q][q][q]"] }));
    const names = [".env", "id_rsa.pub", "key.pem", "kEY.PEM", "a+b.ts", "aab", "$HOME.txt", "HOME", "(x)1.txt", "x1.txt", "se.cret", "seXcret", "^xy", "xy", "a.p|q", "a.pq", "hidden", "config", "plain.ts", "m", "mm", "mam", "ma", "n", "n\nm", "éclair", "eclair", "menü", "menu", "😀.txt", "😁.txt", "ü"];
    const dirs = ["", "/docs", "/deep/x", "/.cfg", "/home/.aws", "/p/.git", "/src"];
    for (const root of ["/", "/workspace"]) {
      const gated = new PermissionPolicy(rules, root);
      const plain = new PermissionPolicy(ungated, root);
      for (const operation of ["read", "write"] as const) {
        for (const dir of dirs) {
          for (const name of names) {
            const path = `${dir}/${name}`;
            const want = plain.check(operation, path);
            const got = gated.check(operation, path);
            expect([got.action, got.pattern], `${operation} ${path} (root ${root})`).toEqual([want.action, want.pattern]);
          }
        }
      }
    }
    expect(new PermissionPolicy(rules).check("read", "/a+b.ts").action).toBe("ask");
    expect(new PermissionPolicy(rules).check("read", "/x/.cfg/se.cret").action).toBe("ask");
    expect(new PermissionPolicy(rules).check("read", "/x/.cfg/seXcret").action).toBe("allow");
    // Heads and tails outside ASCII pass the gate as ASCII ones do.
    expect(new PermissionPolicy(rules).check("read", "/d/éclair").action).toBe("ask");
    expect(new PermissionPolicy(rules).check("read", "/d/menü").action).toBe("ask");
    expect(new PermissionPolicy(rules).check("read", "/d/😀.txt").action).toBe("ask");
    expect(new PermissionPolicy(rules).check("read", "/d/😁.txt").action).toBe("allow");
  });
});

describe("withPermissions", () => {
  it("a denied read says which rule denied it; never an empty file", async () => {
    const { backend } = await seeded({ "/.env": "TOKEN=1", "/a.txt": "fine" }, SECRETS_PRESET);
    for (const answer of [await backend.read("/.env"), await backend.readRaw("/.env"), await backend.stat("/.env")]) {
      expect(answer.error).toEqual({ code: "permission_denied", path: "/.env", message: "Permission denied: read of '/.env' is denied by rule 'secrets' (pattern '.env*')" });
    }
    expect((await backend.read("/a.txt")).content).toBe("fine");
  });

  it("listings and searches leave out what is denied; a denied directory is an error, not an empty listing", async () => {
    const { backend } = await seeded({ "/.env": "needle", "/.ssh/id_rsa": "needle", "/src/a.ts": "needle", "/src/.env.local": "needle" }, SECRETS_PRESET);
    expect((await backend.ls("/")).entries!.map((e) => e.path)).toEqual(["/src/"]);
    expect((await backend.ls("/src")).entries!.map((e) => e.path)).toEqual(["/src/a.ts"]);
    expect((await backend.ls("/.ssh")).error?.code).toBe("permission_denied");
    expect((await backend.glob("**")).entries!.map((e) => e.path)).toEqual(["/src/a.ts"]);
    expect((await backend.glob("*", { path: "/.ssh" })).error?.code).toBe("permission_denied");
    expect((await backend.grep("needle")).matches!.map((m) => m.path)).toEqual(["/src/a.ts"]);
    expect((await backend.grep("needle", { path: "/.ssh" })).error?.code).toBe("permission_denied");
  });

  it("the tools' search (regex, case folding) leaves out a file an ask rule keeps, rather than failing whole", async () => {
    const { backend } = await seeded({ "/a.txt": "Needle here\n", "/private/b.txt": "needle there\n" }, [{ action: "ask", operations: "read", paths: "/private/**" }], () => false);
    const found = await search(backend, { pattern: "NEEDLE", ignoreCase: true, outputMode: "files_with_matches" });
    expect(found).toMatchObject({ mode: "files_with_matches", files: ["/a.txt"] });
  });

  it("a search asks an ask rule once, listing the files, however many files and batches it reads", async () => {
    const files: Record<string, string> = { "/a.txt": "needle\n", "/notes/x.txt": "needle\n" };
    // 120 files under the rule: more than one batch of reads (core/search reads 50 at a time).
    for (let i = 0; i < 120; i++) files[`/private/f${String(i).padStart(3, "0")}.txt`] = i % 2 === 0 ? "needle\n" : "hay\n";
    const rules: PermissionRule[] = [
      { name: "private", action: "ask", operations: "read", paths: "/private/**" },
      { name: "notes", action: "ask", operations: "read", paths: "/notes/**" },
    ];
    for (const answer of [true, false]) {
      const asked: PermissionRequest[] = [];
      const { backend } = await seeded(files, rules, (request) => (asked.push(request), answer));
      const expected = answer ? 62 : 1;
      // A regex (every candidate read: the listing, then batches), a literal (the native grep first), and case folding.
      for (const options of [{ pattern: "ne+dle", regex: true }, { pattern: "needle" }, { pattern: "NEEDLE", ignoreCase: true }]) {
        asked.length = 0;
        const found = await search(backend, { ...options, outputMode: "files_with_matches" });
        expect(found.error).toBeUndefined();
        expect((found as { files: string[] }).files).toHaveLength(expected);
        expect(asked.map((r) => r.rule.name).sort()).toEqual(["notes", "private"]);
        const privateAsk = asked.find((r) => r.rule.name === "private")!;
        expect(privateAsk.operation).toBe("read");
        expect(privateAsk.paths!.length).toBeGreaterThan(1);
        expect(privateAsk.paths![0]).toBe(privateAsk.path);
        expect(privateAsk.paths!.every((p) => p.startsWith("/private/"))).toBe(true);
      }
      // The native grep: once per rule, listing the files with matches.
      asked.length = 0;
      const grep = await backend.grep("needle");
      expect(new Set(grep.matches!.map((m) => m.path)).size).toBe(expected);
      expect(asked).toHaveLength(2);
      expect(asked.find((r) => r.rule.name === "private")!.paths).toHaveLength(60);
      // A batch read: once per rule too.
      asked.length = 0;
      const download = await backend.downloadFiles(["/private/f000.txt", "/private/f001.txt", "/a.txt", "/notes/x.txt"]);
      expect(download.files!.map((f) => f.error?.code ?? "ok")).toEqual(answer ? ["ok", "ok", "ok", "ok"] : ["permission_denied", "permission_denied", "ok", "permission_denied"]);
      expect(asked).toHaveLength(2);
    }
  });

  it("the shared answer is the search's own: separate searches ask again, and a caller's signal shares nothing", async () => {
    const asked: string[] = [];
    const { backend } = await seeded({ "/p/a.txt": "x\n", "/p/b.txt": "x\n" }, [{ action: "ask", operations: "read", paths: "/p/**" }], (request) => (asked.push(request.path), true));
    await search(backend, { pattern: "x" });
    await search(backend, { pattern: "x" });
    expect(asked).toHaveLength(2);
    asked.length = 0;
    const signal = new AbortController().signal;
    await backend.downloadFiles(["/p/a.txt"], { signal });
    await backend.downloadFiles(["/p/b.txt"], { signal });
    expect(asked).toEqual(["/p/a.txt", "/p/b.txt"]);
  });

  it("a tree that cannot be listed is not moved or deleted unchecked", async () => {
    class Unlistable extends StateBackend {
      override glob(): never {
        return Promise.resolve({ error: { code: "timeout", message: "the listing took too long" } }) as never;
      }
    }
    const inner = new Unlistable();
    await inner.write("/dir/a.txt", "a");
    const backend = withPermissions(inner, { rules: SECRETS_PRESET });
    const refused = await backend.delete("/dir");
    expect(refused.error?.code).toBe("timeout");
    expect(refused.error?.message).toMatch(/could not be checked against the permission rules/);
    expect((await backend.move("/dir", "/moved")).error?.code).toBe("timeout");
    expect((await inner.readRaw("/dir/a.txt")).error).toBeUndefined();
  });

  it("grep's maxCount counts only what is shown", async () => {
    const files: Record<string, string> = {};
    for (let i = 0; i < 5; i++) files[`/a${i}/.env`] = "needle";
    files["/z1.txt"] = "needle";
    files["/z2.txt"] = "needle";
    const { backend } = await seeded(files, SECRETS_PRESET);
    expect(await backend.grep("needle", { maxCount: 1 })).toEqual({ matches: [{ path: "/z1.txt", line: 1, text: "needle" }], truncated: true });
    expect(await backend.grep("needle", { maxCount: 2 })).toEqual({ matches: [{ path: "/z1.txt", line: 1, text: "needle" }, { path: "/z2.txt", line: 1, text: "needle" }], truncated: false });
  });

  it("changes are checked per operation: write, edit, delete, mkdir, upload", async () => {
    const { backend, inner } = await seeded({ "/docs/a.md": "text", "/src/a.ts": "code" }, [readOnly("/docs/**")]);
    expect((await backend.write("/docs/b.md", "x")).error?.message).toBe("Permission denied: write of '/docs/b.md' is denied by rule 'read-only' (pattern '/docs/**')");
    expect((await backend.edit("/docs/a.md", "text", "x")).error?.code).toBe("permission_denied");
    expect((await backend.delete("/docs/a.md")).error?.code).toBe("permission_denied");
    expect((await backend.delete("/docs")).error?.code).toBe("permission_denied");
    expect((await backend.mkdir("/docs/sub")).error?.code).toBe("permission_denied");
    expect((await backend.read("/docs/a.md")).content).toBe("text");
    expect((await backend.write("/src/b.ts", "new")).error).toBeUndefined();
    const uploaded = await backend.uploadFiles([
      ["/docs/c.md", bytes("x")],
      ["/src/c.ts", bytes("y")],
    ]);
    expect(uploaded.files!.map((f) => f.error?.code ?? null)).toEqual(["permission_denied", null]);
    expect(uploaded.files![0]!.error!.message).toContain("rule 'read-only'");
    expect((await inner.read("/docs/a.md")).content).toBe("text");
    expect((await inner.stat("/docs/c.md")).error?.code).toBe("file_not_found");
  });

  it("downloads answer per item; the denied ones name the rule", async () => {
    const { backend } = await seeded({ "/.env": "S", "/a.txt": "A" }, SECRETS_PRESET);
    const answer = await backend.downloadFiles(["/.env", "/a.txt", "/missing"]);
    expect(answer.files!.map((f) => [f.error?.code ?? null, f.content && new TextDecoder().decode(f.content)])).toEqual([
      ["permission_denied", null],
      [null, "A"],
      ["file_not_found", null],
    ]);
    expect(answer.files![0]!.error!.message).toContain("rule 'secrets'");
    expect(answer.files![0]!.seedError).toBe("permission_denied");
  });

  it("move and copy check both ends, and every file of a tree", async () => {
    const { backend, inner } = await seeded({ "/.env": "S", "/proj/a.ts": "a", "/proj/.env": "S", "/plain/x.txt": "x" }, SECRETS_PRESET);
    expect((await backend.copy("/.env", "/leak.txt")).error?.message).toContain("read of '/.env'");
    expect((await backend.move("/plain/x.txt", "/plain/.env")).error?.message).toContain("write of '/plain/.env'");
    expect((await backend.move("/proj", "/moved")).error?.message).toContain("'/proj/.env'");
    expect((await backend.copy("/proj", "/copied")).error?.code).toBe("permission_denied");
    expect((await backend.delete("/proj")).error?.message).toContain("delete of '/proj/.env'");
    expect((await inner.glob("**")).entries!.map((e) => e.path)).toEqual(["/.env", "/plain/x.txt", "/proj/.env", "/proj/a.ts"]);
    expect((await backend.move("/plain", "/elsewhere")).error).toBeUndefined();
    expect((await inner.read("/elsewhere/x.txt")).content).toBe("x");
  });

  it("ask approves, rejects with a reason the model sees, or changes the call", async () => {
    const requests: PermissionRequest[] = [];
    const { backend, inner } = await seeded({ "/notes/a.md": "old" }, [{ name: "review notes", action: "ask", operations: ["write", "edit", "delete"], paths: "/notes/**" }], (request: PermissionRequest) => {
      requests.push(request);
      if (request.operation === "delete") return { behavior: "deny", message: "notes are kept" };
      if (request.operation === "edit") return true;
      return { behavior: "allow", updatedInput: { content: request.input.content!.toUpperCase() } };
    });
    expect((await backend.write("/notes/b.md", "shout")).error).toBeUndefined();
    expect((await inner.read("/notes/b.md")).content).toBe("SHOUT");
    expect((await backend.edit("/notes/a.md", "old", "new")).occurrences).toBe(1);
    expect((await backend.delete("/notes/a.md")).error).toEqual({ code: "permission_denied", path: "/notes/a.md", message: "Permission denied: delete of '/notes/a.md' was rejected: notes are kept" });
    expect(requests.map((r) => [r.operation, r.method, r.path, r.rule.name])).toEqual([
      ["write", "write", "/notes/b.md", "review notes"],
      ["edit", "edit", "/notes/a.md", "review notes"],
      ["delete", "delete", "/notes/a.md", "review notes"],
    ]);
    expect(requests[1]!.input).toEqual({ oldString: "old", newString: "new" });
  });

  it("an ask rule without a callback, a callback that throws, and one that changes what it may not, all deny", async () => {
    const rules: PermissionRule[] = [{ action: "ask", operations: "write" }];
    expect((await (await seeded({}, rules)).backend.write("/a", "x")).error?.message).toBe("Permission denied: write of '/a' needs approval (rule 'ask write') and no ask callback is configured");
    const throwing = await seeded({}, rules, () => {
      throw new Error("boom");
    });
    expect((await throwing.backend.write("/a", "x")).error?.message).toContain("the ask callback failed");
    const sneaky = await seeded({}, rules, () => ({ behavior: "allow", updatedInput: { path: "/elsewhere" } }));
    expect((await sneaky.backend.write("/a", "x")).error?.code).toBe("permission_denied");
    expect((await sneaky.inner.glob("**")).entries).toEqual([]);
  });

  it("execute rules match the working directory; ask can change the command", async () => {
    const sandbox = withPermissions(new LocalSandbox({ permissions: false }), {
      rules: [
        { name: "no commands in vendor", action: "deny", operations: "execute", paths: "vendor/**" },
        { action: "ask", operations: "execute" },
      ],
      ask: (request) => ({ behavior: "allow", updatedInput: { command: `${request.input.command} safely` } }),
    });
    try {
      expect(await sandbox.execute("echo run")).toEqual({ output: "run safely\n", exitCode: 0, truncated: false });
      expect((await sandbox.mkdir("vendor")).error).toBeUndefined();
      const denied = await sandbox.execute("echo hi", { cwd: "vendor" });
      expect(denied.error?.message).toMatch(/^Permission denied: execute of '.*\/vendor' is denied by rule 'no commands in vendor'/);
      expect((await sandbox.spawn("echo hi", { cwd: `${sandbox.root}/vendor` })).error?.code).toBe("permission_denied");
    } finally {
      await sandbox.close();
    }
  });

  it("executeStream goes through the same gate, also on a sandbox guarded by its own permissions option", async () => {
    const asked: string[] = [];
    const ask = (request: { input: Readonly<Record<string, string>> }) => (asked.push(request.input.command ?? ""), false);
    const guardedByOption = new LocalSandbox({ permissions: { rules: [{ action: "ask", operations: "execute" }], ask } });
    const wrapped = withPermissions(new LocalSandbox({ permissions: false }), { rules: [{ action: "ask", operations: "execute" }], ask });
    try {
      for (const sandbox of [guardedByOption, wrapped]) {
        const stream = sandbox.executeStream("echo ran");
        const chunks: string[] = [];
        for await (const chunk of stream) chunks.push(String(chunk));
        expect(chunks.join("")).not.toContain("ran");
        expect((await stream.result).error?.code).toBe("permission_denied");
      }
      expect(asked).toEqual(["echo ran", "echo ran"]);
    } finally {
      await guardedByOption.close();
      await wrapped.close();
    }
  });
});

describe("guards stacked on a FilesystemBackend", () => {
  it("ls leaves out the names each guard denies (the outer one's rules and the secrets preset), with and without sizes, read afresh or kept", async () => {
    const workspace = tempDir();
    for (const name of ["a.txt", "b.secret", ".env", "c.draft"]) writeFileSync(join(workspace, name), "x");
    mkdirSync(join(workspace, "keys.secret"));
    const inner = new FilesystemBackend({ workspace }); // guarded by the secrets preset
    const middle = withPermissions(inner, { rules: [{ action: "deny", operations: ["read"], paths: ["*.draft"] }] });
    const outer = withPermissions(middle, { rules: [{ action: "deny", operations: ["read"], paths: ["*.secret"] }] });
    expect((await outer.read("/b.secret")).error?.code).toBe("permission_denied");
    for (const sizes of [true, false, false]) {
      expect((await outer.ls("/", { sizes })).entries!.map((e) => e.path), `sizes ${sizes}`).toEqual(["/a.txt"]);
      expect((await middle.ls("/", { sizes })).entries!.map((e) => e.path), `sizes ${sizes}`).toEqual(["/a.txt", "/b.secret", "/keys.secret/"]);
    }
  });
});

describe("an ask rule on delete", () => {
  it("is asked once for a file and once per entry for a directory, direct or under another wrapper, on disk and in a LocalSandbox", async () => {
    const asked: string[] = [];
    const ask = (request: PermissionRequest) => (asked.push(request.path), true);
    const rules: PermissionRule[] = [{ action: "ask", operations: "delete" }];
    const workspace = tempDir();
    const disk = new FilesystemBackend({ workspace, permissions: { rules, ask } });
    const sandbox = new LocalSandbox({ workspace: tempDir(), permissions: { rules, ask } });
    try {
      for (const inner of [disk, sandbox] as Backend[]) {
        for (const backend of [inner, withPermissions(inner, { rules: [{ action: "deny", operations: "delete", paths: "/keep/**" }] })]) {
          for (const path of ["/a.txt", "/d/x.txt", "/d/y.txt"]) expect((await inner.write(path, "x")).error).toBeUndefined();
          asked.length = 0;
          expect((await backend.delete("/a.txt")).error).toBeUndefined();
          expect(asked).toEqual(["/a.txt"]);
          asked.length = 0;
          expect((await backend.delete("/d")).error).toBeUndefined();
          expect(asked.sort()).toEqual(["/d", "/d/x.txt", "/d/y.txt"]);
        }
      }
    } finally {
      await sandbox.close();
    }
  });
});

describe("an edit of a file the caller may change but not read", () => {
  it("answers no content: the edited text is a read the rules deny", async () => {
    const dir = tempDir();
    writeFileSync(join(dir, "log.txt"), "public line\nhidden line\n");
    const backend = new FilesystemBackend({ workspace: dir, permissions: { rules: [{ action: "deny", operations: "read", paths: "log.txt" }] } });
    expect((await backend.read("/log.txt")).error?.code).toBe("permission_denied");
    const edited = await backend.edit("/log.txt", "public", "PUBLIC");
    expect(edited.error).toBeUndefined();
    expect(edited.content).toBeUndefined();
    expect(readFileSync(join(dir, "log.txt"), "utf8")).toBe("PUBLIC line\nhidden line\n");
    // Where the rules let the caller read it, the content is answered as before.
    const open = new FilesystemBackend({ workspace: dir, permissions: { rules: [{ action: "deny", operations: "read", paths: "other.txt" }] } });
    expect((await open.edit("/log.txt", "PUBLIC", "public")).content).toBe("public line\nhidden line\n");
  });
});

describe("a read-only rule and a link to what it protects", () => {
  it("holds on a sandbox whose file operations run in its shell: no change passes through the link", async () => {
    const sandbox = new BubblewrapSandbox({ workspace: tempDir(), permissions: { rules: [readOnly("/workspace/kept/**")] } });
    try {
      expect((await sandbox.execute("mkdir kept && echo old > kept/f && ln -s kept via")).exitCode).toBe(0);
      expect((await sandbox.write("/workspace/kept/f", "new", { overwrite: true })).error?.code).toBe("permission_denied");
      for (const path of ["/workspace/via/f", "/workspace/via/g"]) expect((await sandbox.write(path, "new", { overwrite: true })).error?.code).toBe("permission_denied");
      expect((await sandbox.edit("/workspace/via/f", "old", "new")).error?.code).toBe("permission_denied");
      expect((await sandbox.delete("/workspace/via/f")).error?.code).toBe("permission_denied");
      expect((await sandbox.read("/workspace/via/f")).content).toBe("old");
      expect((await sandbox.execute("ls kept; cat kept/f")).output).toBe("f\nold\n");
    } finally {
      await sandbox.close();
    }
  });
});

describe("a read-deny rule and a link to what it protects", () => {
  it("holds on a sandbox whose reads run in its shell: a read, grep, ls or glob by way of a link shows nothing the rule denies", async () => {
    const dir = tempDir();
    mkdirSync(join(dir, "private"));
    writeFileSync(join(dir, "private", "data.txt"), "TOPSECRET\n");
    const sandbox = new BubblewrapSandbox({ workspace: dir, permissions: { rules: [{ action: "deny", operations: "read", paths: "private/**" }] } });
    try {
      expect((await sandbox.read("/workspace/private/data.txt")).error?.code).toBe("permission_denied");
      // The command itself cannot read it, by the link or otherwise.
      expect((await sandbox.execute("ln -s private pub && ln -s private/data.txt direct.txt && cat pub/data.txt direct.txt")).output).not.toContain("TOPSECRET");
      for (const path of ["/workspace/pub/data.txt", "/workspace/direct.txt"]) {
        const read = await sandbox.read(path);
        expect(JSON.stringify(read), path).not.toContain("TOPSECRET");
        expect(read.error?.code, path).toBe("permission_denied");
        expect(JSON.stringify(await sandbox.readRaw(path)), path).not.toContain("TOPSECRET");
      }
      // An edit reads first: by the link it would copy the text into a file the caller may read.
      expect((await sandbox.edit("/workspace/direct.txt", "TOP", "top")).error?.code).toBe("permission_denied");
      expect((await sandbox.execute("[ -L direct.txt ] && echo still a link")).output).toBe("still a link\n");
      // grep follows a linked root as before, but shows nothing the rules deny where it leads.
      expect((await sandbox.execute("mkdir -p shared && echo TOPSECRET shared > shared/s.txt && ln -s shared sh")).exitCode).toBe(0);
      for (const root of ["/workspace/pub", "/workspace/direct.txt"]) expect(JSON.stringify(await sandbox.grep("TOPSECRET", { path: root })), root).not.toContain("TOPSECRET");
      expect((await sandbox.grep("TOPSECRET", { path: "/workspace/sh" })).matches?.map((m) => m.path)).toEqual(["/workspace/sh/s.txt"]);
      // ls and glob likewise: no name (or size) of what the rules deny, a linked directory they allow listed as before.
      for (const root of ["/workspace/pub", "/workspace/direct.txt"]) {
        expect(JSON.stringify(await sandbox.ls(root)), root).not.toContain("data.txt");
        expect(JSON.stringify(await sandbox.glob("**", { path: root })), root).not.toContain("data.txt");
      }
      expect((await sandbox.ls("/workspace/sh")).entries?.map((e) => e.path)).toEqual(["/workspace/sh/s.txt"]);
      expect((await sandbox.glob("**/*.txt", { path: "/workspace/sh" })).entries?.map((e) => e.path)).toEqual(["/workspace/sh/s.txt"]);
      // A link to a file the rules let be read is followed as before.
      expect((await sandbox.execute("echo open > open.txt && ln -s open.txt to-open.txt")).exitCode).toBe(0);
      expect((await sandbox.read("/workspace/to-open.txt")).content).toBe("open");
    } finally {
      await sandbox.close();
    }
  });
});

describe("the secrets preset, on by default", () => {
  const SECRETS = [
    ".env",
    ".env.local",
    "app/.env.production",
    "id_rsa",
    "keys/id_ed25519.pub",
    "tls/server.pem",
    "tls/server.key",
    ".ssh/config",
    "home/.ssh/authorized_keys",
    ".aws/credentials",
    "home/.config/gcloud/credentials.db",
    ".azure/accessTokens.json",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".docker/config.json",
    ".kube/config",
    ".git/config",
    "vendor/lib/.git/config",
    ".git-credentials",
  ];
  const PLAIN = ["src/env.ts", ".gitignore", ".git/HEAD", "keys.txt", "README.md", "environment.md"];

  it("FilesystemBackend denies every preset name and allows the rest; the message names no host path", async () => {
    const workspace = tempDir();
    for (const path of [...SECRETS, ...PLAIN]) {
      mkdirSync(join(workspace, path, ".."), { recursive: true });
      writeFileSync(join(workspace, path), "content");
    }
    const backend = new FilesystemBackend({ workspace });
    expect(backend).toBeInstanceOf(FilesystemBackend);
    expect(backend.workspace).toBe(workspace);
    for (const path of SECRETS) {
      const read = await backend.read(path);
      expect(read.error?.code, path).toBe("permission_denied");
      expect(read.error!.message).not.toContain(workspace);
      expect((await backend.write(path, "x", { overwrite: true })).error?.code, path).toBe("permission_denied");
    }
    for (const path of PLAIN) expect((await backend.read(path)).content, path).toBe("content");
    expect(readFileSync(join(workspace, ".env"), "utf8")).toBe("content");
    expect((await backend.glob("**")).entries!.map((e) => e.path).sort()).toEqual(PLAIN.map((p) => `/${p}`).sort());
  });

  it("permissions: false turns it off; { rules } replaces it; a bad option fails the constructor", async () => {
    const workspace = tempDir();
    writeFileSync(join(workspace, ".env"), "S");
    writeFileSync(join(workspace, "a.txt"), "A");
    expect((await new FilesystemBackend({ workspace, permissions: false }).read(".env")).content).toBe("S");
    const replaced = new FilesystemBackend({ workspace, permissions: { rules: [{ action: "deny", paths: "a.txt" }] } });
    expect((await replaced.read(".env")).content).toBe("S");
    expect((await replaced.read("a.txt")).error?.code).toBe("permission_denied");
    expect(() => new FilesystemBackend({ workspace, permissions: { rules: [{ action: "nope" }] } as never })).toThrow(/action must be/);
    expect(() => new FilesystemBackend({ workspace, permissions: "off" as never })).toThrow(/permissions must be/);
  });

  it("is on for LocalSandbox's file operations, which its commands can still bypass (said in the execute tool's description)", async () => {
    const sandbox = new LocalSandbox();
    try {
      expect((await sandbox.write(".env", "S")).error?.code).toBe("permission_denied");
      writeFileSync(join(sandbox.workspace, ".env"), "S");
      expect((await sandbox.read(".env")).error?.code).toBe("permission_denied");
      expect((await sandbox.execute("cat .env")).output).toBe("S");
    } finally {
      await sandbox.close();
    }
  });
});
