/**
 * The `strata` command as a real process (through tsx, from source): every
 * file command in text and --json, the error line and exit statuses, hostile
 * paths, a byte-exact binary round trip, sync into SQLite and back (with
 * --delete and --dry-run), exec in bubblewrap, --help everywhere, and demo;
 * route URLs confined to a namespace or a directory, --permissions (a file or
 * a preset, ask denied unless --yes), and exec and mcp over --sandbox ssh://
 * against the test sshd.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { openRoute } from "../mcp/routes.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { providerMissing, requireService } from "./support/runtime-services.js";
import { SshWorkspaces } from "./support/sandbox-services.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const CLI = join(ROOT, "cli", "strata.ts");
const TSX = pathToFileURL(join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;

// Every command is a fresh Node process through tsx: seconds apiece on a loaded 2-core machine.
const SLOW = 240_000;

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(files: Record<string, string | Uint8Array> = {}): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-cli-"));
  dirs.push(dir);
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true });
    writeFileSync(join(dir, name), content);
  }
  return dir;
}

interface Run {
  status: number | null;
  stdout: Buffer;
  out: string;
  err: string;
}

function strata(cwd: string, args: string[], input?: string | Uint8Array, env: NodeJS.ProcessEnv = process.env): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", TSX, CLI, ...args], { cwd, env, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => err.push(chunk));
    child.on("error", reject);
    child.on("close", (status) => {
      const stdout = Buffer.concat(out);
      resolve({ status, stdout, out: stdout.toString("utf8"), err: Buffer.concat(err).toString("utf8") });
    });
    child.stdin.end(input ?? "");
  });
}

/** A failure: the status, exactly one stderr line naming the code, and no host path in it. */
function expectFailure(run: Run, status: number, code: string, cwd: string): void {
  expect(run.status, run.err).toBe(status);
  const lines = run.err.split("\n").filter(Boolean);
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(new RegExp(`^strata: ${code}: `));
  expect(run.err).not.toContain(cwd);
  expect(run.err).not.toContain(tmpdir());
}

/** Every file under a host directory, relative, sorted. */
function tree(dir: string): string[] {
  const files: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const full = join(d, name);
      if (statSync(full).isDirectory()) walk(full);
      else files.push(relative(dir, full));
    }
  };
  walk(dir);
  return files.sort();
}

describe("strata file commands", () => {
  it("write, read, ls, edit, glob and grep, as text and as --json", { timeout: SLOW }, async () => {
    const dir = tempDir({ "src/main.ts": "const a = 1;\nconst b = 2;\n" });
    expect((await strata(dir, ["write", "notes/todo.md", "--", "- ship\n- test\n"])).out).toBe("wrote /notes/todo.md\n");
    expect((await strata(dir, ["write", "/notes/stdin.md"], "from stdin")).status).toBe(0);
    expect(readFileSync(join(dir, "notes/stdin.md"), "utf8")).toBe("from stdin");

    expect((await strata(dir, ["read", "notes/todo.md"])).out).toBe("- ship\n- test\n");
    const window = JSON.parse((await strata(dir, ["read", "notes/todo.md", "--offset", "1", "--limit", "1", "--json"])).out);
    expect(window).toMatchObject({ path: "/notes/todo.md", encoding: "utf-8", content: "- test", totalLines: 2, offset: 1, lineCount: 1 });

    // /memories lives in .strata/ (created by the writes above); --no-memories leaves the route out.
    const listed = await strata(dir, ["ls", "--no-memories"]);
    expect(listed.out.split("\n").filter(Boolean)).toEqual(["/.strata/", "/notes/", "/src/"]);
    const json = JSON.parse((await strata(dir, ["ls", "src", "--json"])).out);
    expect(json.entries).toEqual([expect.objectContaining({ path: "/src/main.ts", size: 26 })]);

    expect((await strata(dir, ["edit", "src/main.ts", "const", "let", "--all"])).out).toBe("edited /src/main.ts (2 occurrences)\n");
    expect(readFileSync(join(dir, "src/main.ts"), "utf8")).toBe("let a = 1;\nlet b = 2;\n");

    expect((await strata(dir, ["glob", "**/*.md"])).out).toBe("/notes/stdin.md\n/notes/todo.md\n");
    expect((await strata(dir, ["grep", "let b"])).out).toBe("/src/main.ts:2:let b = 2;\n");
    const grep = JSON.parse((await strata(dir, ["grep", "let", "--max-count", "1", "--json"])).out);
    expect(grep).toEqual({ matches: [{ path: "/src/main.ts", line: 1, text: "let a = 1;" }], truncated: true });
  });

  it("/memories is the SQLite route `strata mcp` serves, and --backend opens one route URL", { timeout: SLOW }, async () => {
    const dir = tempDir();
    expect((await strata(dir, ["write", "/memories/facts.md", "the sky is blue"])).status).toBe(0);
    expect(existsSync(join(dir, ".strata", "memories.db"))).toBe(true);
    expect((await strata(dir, ["read", "/memories/facts.md"])).out).toBe("the sky is blue\n");

    expect((await strata(dir, ["write", "a.txt", "in sqlite", "-b", "sqlite:data/x.db"])).status).toBe(0);
    expect(existsSync(join(dir, "a.txt"))).toBe(false);
    expect((await strata(dir, ["read", "a.txt", "--backend", "sqlite:data/x.db"])).out).toBe("in sqlite\n");
  });

  it("an error is one line on stderr, a status by its code, and {error:{code,message}} with --json", { timeout: SLOW }, async () => {
    const dir = tempDir({ "a.txt": "x x\n", ".env": "API_KEY=sk-live" });
    expectFailure(await strata(dir, ["read", "missing.txt"]), 3, "file_not_found", dir);
    // The secrets preset of the workspace's files: a denied secret is status 4, its content never printed.
    const secret = await strata(dir, ["read", ".env"]);
    expectFailure(secret, 4, "permission_denied", dir);
    expect(secret.out).not.toContain("sk-live");
    const json = await strata(dir, ["read", "missing.txt", "--json"]);
    expectFailure(json, 3, "file_not_found", dir);
    expect(JSON.parse(json.out)).toEqual({ error: { code: "file_not_found", message: expect.any(String), path: "/missing.txt" } });
    expectFailure(await strata(dir, ["write", "a.txt", "again"]), 5, "already_exists", dir);
    expectFailure(await strata(dir, ["edit", "a.txt", "x", "y"]), 5, "ambiguous_match", dir);
    expectFailure(await strata(dir, ["upload", join(dir, "nope.bin"), "x.bin"]), 3, "file_not_found", dir);
    expectFailure(await strata(dir, ["ls", "-b", "ftp://example.com"]), 2, "invalid_argument", dir);
    // Usage errors: one line too, status 2.
    expectFailure(await strata(dir, ["read"]), 2, "usage", dir);
    expectFailure(await strata(dir, ["frobnicate"]), 2, "usage", dir);
    expectFailure(await strata(dir, ["read", "a.txt", "--limit", "many"]), 2, "usage", dir);
  });

  it("a hostile path is refused and nothing outside the workspace is read or written", { timeout: SLOW }, async () => {
    const outside = tempDir({ "secret.txt": "TOP SECRET" });
    const dir = tempDir();
    symlinkSync(join(outside, "secret.txt"), join(dir, "link.txt"));
    symlinkSync(outside, join(dir, "linkdir"));
    expectFailure(await strata(dir, ["read", "../../etc/passwd"]), 2, "invalid_path", dir);
    expectFailure(await strata(dir, ["write", "/../../../../etc/planted.txt", "x"]), 2, "invalid_path", dir);
    for (const path of ["link.txt", "linkdir/secret.txt"]) {
      const run = await strata(dir, ["read", path]);
      expect(run.status).not.toBe(0);
      expect(run.out + run.err).not.toContain("TOP SECRET");
      expect(run.err).not.toContain(outside);
    }
    expect((await strata(dir, ["write", "linkdir/planted.txt", "x"])).status).not.toBe(0);
    expect(readdirSync(outside)).toEqual(["secret.txt"]);
  });

  it("upload and download are byte-exact for a binary file, in the workspace and in SQLite", { timeout: SLOW }, async () => {
    const bytes = new Uint8Array(70_000);
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7919 + (i >> 8)) & 0xff;
    const dir = tempDir({ "blob.bin": bytes });
    for (const target of [[], ["-b", "sqlite:.strata/bytes.db"]]) {
      expect((await strata(dir, ["upload", "blob.bin", "/in/blob.bin", ...target])).out).toBe(`uploaded /in/blob.bin (${bytes.length} bytes)\n`);
      expect((await strata(dir, ["download", "/in/blob.bin", "back.bin", ...target])).status).toBe(0);
      expect(new Uint8Array(readFileSync(join(dir, "back.bin")))).toEqual(bytes);
      const piped = await strata(dir, ["download", "/in/blob.bin", ...target]);
      expect(new Uint8Array(piped.stdout)).toEqual(bytes);
      const json = JSON.parse((await strata(dir, ["download", "/in/blob.bin", "--json", ...target])).out);
      expect(new Uint8Array(Buffer.from(json.content, "base64"))).toEqual(bytes);
      rmSync(join(dir, "back.bin"));
    }
    // Standard input in, the same bytes out through `read`.
    expect((await strata(dir, ["upload", "-", "/stdin.bin"], bytes)).status).toBe(0);
    expect(new Uint8Array((await strata(dir, ["read", "/stdin.bin"])).stdout)).toEqual(bytes);
  });

  it("a store URL's ?namespace= and a file: URL's directory confine a route: nothing outside is reached", { timeout: SLOW }, async () => {
    const outside = tempDir({ "secret.txt": "TOP SECRET" });
    const dir = tempDir({ "data/top.txt": "above the route", "data/sub/in.txt": "inside" });
    symlinkSync(outside, join(dir, "data", "sub", "out"));
    const db = "sqlite:.strata/shared.db";
    const writes = await Promise.all([
      strata(dir, ["write", "/a.txt", "team a", "-b", `${db}?namespace=team/a`]),
      strata(dir, ["write", "/b.txt", "team b", "-b", `${db}?namespace=team/b`]),
    ]);
    for (const run of writes) expect(run.status, run.err).toBe(0);
    const [ownA, ownB, parent, missing, escape, empty] = await Promise.all([
      strata(dir, ["ls", "-b", `${db}?namespace=team/a`]),
      strata(dir, ["read", "/a.txt", "-b", `${db}?namespace=team%2Fb`]),
      strata(dir, ["ls", "-b", `${db}?namespace=team`]),
      strata(dir, ["ls", "-b", db]),
      strata(dir, ["read", "/../b.txt", "-b", `${db}?namespace=team/a`]),
      strata(dir, ["ls", "-b", `${db}?namespace=`]),
    ]);
    expect(ownA.out).toBe("/a.txt\n");
    // team%2Fb is team/b: it holds b.txt, not a.txt.
    expectFailure(ownB, 3, "file_not_found", dir);
    // A namespace sees nothing of a longer one's, nor the default one anything of either.
    expect(parent.out).toBe("");
    expect(missing.out).toBe("");
    expectFailure(escape, 2, "invalid_path", dir);
    expectFailure(empty, 2, "invalid_argument", dir);

    const [inside, up, absolute, link, grep] = await Promise.all([
      strata(dir, ["read", "in.txt", "-b", "file:data/sub"]),
      strata(dir, ["read", "../top.txt", "-b", "file:data/sub"]),
      strata(dir, ["read", "/../../data/top.txt", "-b", "file:data/sub"]),
      strata(dir, ["read", "out/secret.txt", "-b", "file:data/sub"]),
      strata(dir, ["grep", "e", "-b", "file:data/sub"]),
    ]);
    expect(inside.out).toBe("inside\n");
    expectFailure(up, 2, "invalid_path", dir);
    expectFailure(absolute, 2, "invalid_path", dir);
    expect(link.status).not.toBe(0);
    expect(link.out + link.err).not.toContain("TOP SECRET");
    expect(grep.out).toBe("/in.txt:1:inside\n");
  });

  it("postgres:// and redis:// route URLs take ?namespace= too (taken out before the driver sees the URL)", { timeout: SLOW }, async () => {
    const id = randomUUID();
    const urls = [requireService("STRATA_POSTGRES_URL", "10-postgres.sh"), `${requireService("STRATA_REDIS_URL", "11-redis.sh").replace(/\/+$/, "")}/2`];
    for (const base of urls) {
      const join = base.includes("?") ? "&" : "?";
      const mine = await openRoute("/", `${base}${join}namespace=cli-${id}/mine`, ROOT);
      const theirs = await openRoute("/", `${base}${join}namespace=cli-${id}/theirs`, ROOT);
      const parent = await openRoute("/", `${base}${join}namespace=cli-${id}`, ROOT);
      try {
        expect((await mine.backend.write("/only-mine.txt", "mine")).error).toBeUndefined();
        expect((await mine.backend.read("/only-mine.txt")).content).toBe("mine");
        expect((await theirs.backend.read("/only-mine.txt")).error?.code).toBe("file_not_found");
        expect((await parent.backend.ls("/")).entries).toEqual([]);
        expect((await theirs.backend.glob("**")).entries).toEqual([]);
        expect((await mine.backend.read("/../only-mine.txt")).error?.code).toBe("invalid_path");
        expect((await mine.backend.delete("/only-mine.txt")).error).toBeUndefined();
      } finally {
        await Promise.all([mine.close(), theirs.close(), parent.close()]);
      }
    }
  });

  it("--permissions takes rules or a preset, as strata mcp does: a denied or unapproved file is status 4 and one line", { timeout: SLOW }, async () => {
    const dir = tempDir({
      "notes/a.md": "needle one\n",
      "private/p.md": "needle two\n",
      "private/q.md": "needle three\n",
      "blob.bin": "bytes",
    });
    const rules = [
      { name: "private", action: "ask", operations: ["read"], paths: ["private/**"] },
      { name: "no-notes-edits", action: "deny", operations: ["write", "edit", "delete"], paths: ["notes/**"] },
    ];
    writeFileSync(join(dir, "rules.json"), JSON.stringify(rules));
    const p = ["--permissions", "rules.json", "--no-memories"];
    const [asked, approved, denied, grep, grepYes, download, upload, preset, badFile, sync] = await Promise.all([
      strata(dir, ["read", "private/p.md", ...p]),
      strata(dir, ["read", "private/p.md", ...p, "--yes"]),
      strata(dir, ["edit", "notes/a.md", "one", "1", ...p, "--yes"]),
      strata(dir, ["grep", "needle", ...p]),
      strata(dir, ["grep", "needle", ...p, "-y"]),
      strata(dir, ["download", "private/q.md", ...p]),
      strata(dir, ["upload", "blob.bin", "/notes/blob.bin", ...p]),
      strata(dir, ["write", "new.txt", "x", "--permissions", "read-only"]),
      strata(dir, ["ls", "--permissions", "nope.json"]),
      strata(dir, ["sync", ".", `sqlite:${join(tempDir(), "copy.db")}`, "--permissions", "rules.json"]),
    ]);
    // ask without --yes: denied, saying why and how to approve.
    expectFailure(asked, 4, "permission_denied", dir);
    expect(asked.err).toContain("'private'");
    expect(asked.err).toContain("--yes");
    expect(asked.out).toBe("");
    expect(approved.out).toBe("needle two\n");
    // deny is not approved by --yes.
    expectFailure(denied, 4, "permission_denied", dir);
    expect(denied.err).toContain("no-notes-edits");
    expect(readFileSync(join(dir, "notes/a.md"), "utf8")).toBe("needle one\n");
    // A search leaves out what is not approved, and shows it with --yes.
    expect(grep.out).toBe("/notes/a.md:1:needle one\n");
    expect(grepYes.out.split("\n").filter(Boolean).sort()).toEqual(["/notes/a.md:1:needle one", "/private/p.md:1:needle two", "/private/q.md:1:needle three"]);
    expectFailure(download, 4, "permission_denied", dir);
    expectFailure(upload, 4, "permission_denied", dir);
    expect(existsSync(join(dir, "notes/blob.bin"))).toBe(false);
    expectFailure(preset, 4, "permission_denied", dir);
    expect(preset.err).toContain("read-only");
    expect(existsSync(join(dir, "new.txt"))).toBe(false);
    expectFailure(badFile, 2, "invalid_argument", dir);
    // The source of a sync is read under the rules too: the private files are not copied.
    expectFailure(sync, 4, "permission_denied", dir);
    expect(sync.err).toContain("'private'");
  });

  it("--help works on every command", { timeout: SLOW }, async () => {
    const dir = tempDir();
    const commands = ["ls", "read", "write", "edit", "glob", "grep", "exec", "upload", "download", "sync", "mcp", "demo"];
    const runs = await Promise.all(commands.map((command) => strata(dir, [command, "--help"])));
    commands.forEach((command, i) => {
      expect(runs[i]?.status, command).toBe(0);
      expect(runs[i]?.out).toContain(`Usage: strata ${command}`);
    });
    expect((await strata(dir, ["--help"])).status).toBe(0);
  });
});

describe("strata sync", () => {
  it("copies a folder into sqlite: and back; --dry-run changes nothing, --delete mirrors", { timeout: SLOW }, async () => {
    const binary = Uint8Array.from({ length: 4096 }, (_, i) => (i * 31) & 0xff);
    const dir = tempDir({ "src/a.txt": "alpha\n", "src/sub/b.txt": "beta\n", "src/sub/deep/c.bin": binary });
    const db = "sqlite:.strata/sync.db";

    // Piped: quiet.
    const first = await strata(dir, ["sync", "src", db]);
    expect(first).toMatchObject({ status: 0, out: "", err: "" });
    expect((await strata(dir, ["glob", "**", "-b", db])).out).toBe("/a.txt\n/sub/b.txt\n/sub/deep/c.bin\n");

    // Nothing changed: nothing to do.
    expect((await strata(dir, ["sync", "src", db, "--dry-run"])).out).toBe("");
    writeFileSync(join(dir, "src/a.txt"), "ALPHA\n");
    writeFileSync(join(dir, "src/new.txt"), "new\n");
    const plan = await strata(dir, ["sync", "src", db, "--dry-run"]);
    expect(plan.out).toBe("+ /new.txt\n~ /a.txt\n");
    expect((await strata(dir, ["read", "a.txt", "-b", db])).out).toBe("alpha\n");
    const json = JSON.parse((await strata(dir, ["sync", "src", db, "--json"])).out);
    expect(json).toEqual({ dryRun: false, added: ["/new.txt"], updated: ["/a.txt"], deleted: [], unchanged: 2 });
    expect((await strata(dir, ["read", "a.txt", "-b", db])).out).toBe("ALPHA\n");

    // Back out into a folder that has extra files: kept without --delete, removed with it.
    mkdirSync(join(dir, "out/old/deep"), { recursive: true });
    writeFileSync(join(dir, "out/old/deep/x.txt"), "stale");
    writeFileSync(join(dir, "out/junk.txt"), "junk");
    writeFileSync(join(dir, "out/a.txt"), "stale a");
    expect((await strata(dir, ["sync", db, "out"])).status).toBe(0);
    expect(tree(join(dir, "out"))).toEqual(["a.txt", "junk.txt", "new.txt", "old/deep/x.txt", "sub/b.txt", "sub/deep/c.bin"]);

    const dry = await strata(dir, ["sync", db, "out", "--delete", "--dry-run"]);
    expect(dry.out).toBe("- /junk.txt\n- /old/\n");
    expect(tree(join(dir, "out"))).toContain("junk.txt");
    expect((await strata(dir, ["sync", db, "out", "--delete"])).status).toBe(0);
    expect(tree(join(dir, "out"))).toEqual(tree(join(dir, "src")));
    for (const file of tree(join(dir, "src"))) expect(readFileSync(join(dir, "out", file))).toEqual(readFileSync(join(dir, "src", file)));
    expect(existsSync(join(dir, "out/old"))).toBe(false);

    // A dry run into a folder that does not exist creates nothing.
    expect((await strata(dir, ["sync", "src", "fresh", "--dry-run"])).out).toBe("+ /a.txt\n+ /new.txt\n+ /sub/b.txt\n+ /sub/deep/c.bin\n");
    expect(existsSync(join(dir, "fresh"))).toBe(false);

    // A source that is not there: one line, status 3.
    expectFailure(await strata(dir, ["sync", "nowhere", db]), 3, "file_not_found", dir);
    // Folders where one holds the other are refused, and nothing changes (--delete would remove the source).
    const before = tree(join(dir, "src"));
    expectFailure(await strata(dir, ["sync", "src/sub", "src", "--delete"]), 2, "invalid_argument", dir);
    expectFailure(await strata(dir, ["sync", ".", "file:src/backup"]), 2, "invalid_argument", dir);
    expect(tree(join(dir, "src"))).toEqual(before);
  });
});

describe("strata exec", () => {
  it("runs in bubblewrap: streams the output, exits with the command's status, --json answers the result", { timeout: SLOW }, async () => {
    const why = await BubblewrapSandbox.unavailableReason();
    if (why) providerMissing("bubblewrap", why, "40-bubblewrap.sh");
    const dir = tempDir({ "hello.txt": "hi from the workspace\n" });
    const run = await strata(dir, ["exec", "--sandbox", "bwrap", "cat hello.txt; pwd; exit 7"]);
    expect(run.status).toBe(7);
    expect(run.out).toBe("hi from the workspace\n/workspace\n");
    const json = JSON.parse((await strata(dir, ["exec", "--json", "echo", "made", ">", "made.txt"])).out);
    expect(json).toEqual({ output: "", exitCode: 0, truncated: false });
    expect(readFileSync(join(dir, "made.txt"), "utf8")).toBe("made\n");
    const timedOut = await strata(dir, ["exec", "--timeout", "1", "sleep 20"]);
    expect(timedOut.status).toBe(124);
  });
});

describe("strata exec and strata mcp over SSH", () => {
  /** The test sshd (scripts/services/40-sshd.sh), a remote directory under one per run, and what an ssh user's ~/.ssh holds. */
  function sshSetup(): { url: (name: string) => string; workspaces: SshWorkspaces; knownHosts: string; key: string; home: string; env: NodeJS.ProcessEnv } {
    const workspaces = new SshWorkspaces("cli-test");
    const { host, port, username } = workspaces.service.options;
    const key = requireService("STRATA_SSH_KEY", "40-sshd.sh");
    const home = tempDir();
    const knownHosts = join(home, "known_hosts");
    writeFileSync(knownHosts, `[${host}]:${port} ${String(workspaces.service.options.hostKey).trim()}\n`);
    // HOME without ~/.ssh and no agent: nothing found unless the test says so.
    const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, SSH_AUTH_SOCK: "" };
    return { url: (name) => `ssh://${username}@${host}:${port}${workspaces.root}/${name}`, workspaces, knownHosts, key, home, env };
  }

  it("exec runs in the remote directory with --identity and --known-hosts, or with ~/.ssh's key and known_hosts, or through the agent", { timeout: SLOW }, async () => {
    const ssh = sshSetup();
    try {
      const dir = tempDir();
      const flags = ["-i", ssh.key, "--known-hosts", ssh.knownHosts];
      const run = await strata(dir, ["exec", "--sandbox", ssh.url("a"), ...flags, "echo hi; pwd; whoami; exit 3"], undefined, ssh.env);
      expect(run.status, run.err).toBe(3);
      expect(run.out).toBe(`hi\n${ssh.workspaces.root}/a\n${ssh.workspaces.service.options.username}\n`);
      expect((await strata(dir, ["exec", "--sandbox", ssh.url("a"), ...flags, "mkdir sub"], undefined, ssh.env)).status).toBe(0);
      const json = JSON.parse((await strata(dir, ["exec", "--sandbox", ssh.url("a"), ...flags, "--json", "--cwd", "sub", "pwd"], undefined, ssh.env)).out);
      expect(json).toEqual({ output: `${ssh.workspaces.root}/a/sub\n`, exitCode: 0, truncated: false });

      // Nothing given, nothing in ~/.ssh, no agent: no key to log in with, said in one line.
      const [noKey, noKnownHosts] = await Promise.all([
        strata(dir, ["exec", "--sandbox", ssh.url("a"), "--known-hosts", ssh.knownHosts, "true"], undefined, ssh.env),
        strata(dir, ["exec", "--sandbox", ssh.url("a"), "-i", ssh.key, "true"], undefined, ssh.env),
      ]);
      expectFailure(noKey, 2, "invalid_argument", dir);
      expect(noKey.err).toContain("--identity");
      expectFailure(noKnownHosts, 2, "invalid_argument", dir);
      expect(noKnownHosts.err).toContain("ssh-keyscan");
      // A known_hosts file that does not list this server: refused before any credential is sent.
      const stranger = join(ssh.home, "other_known_hosts");
      writeFileSync(stranger, `[${ssh.workspaces.service.options.host}]:1 ${String(ssh.workspaces.service.options.hostKey).trim()}\n`);
      expectFailure(await strata(dir, ["exec", "--sandbox", ssh.url("a"), "-i", ssh.key, "--known-hosts", stranger, "true"], undefined, ssh.env), 4, "permission_denied", dir);

      // The ssh user's own setup: ~/.ssh/id_ed25519 and ~/.ssh/known_hosts, no flags.
      mkdirSync(join(ssh.home, ".ssh"), { mode: 0o700 });
      writeFileSync(join(ssh.home, ".ssh", "id_ed25519"), readFileSync(ssh.key), { mode: 0o600 });
      writeFileSync(join(ssh.home, ".ssh", "known_hosts"), readFileSync(ssh.knownHosts));
      const plain = await strata(dir, ["exec", "--sandbox", ssh.url("b"), "pwd"], undefined, ssh.env);
      expect(plain.status, plain.err).toBe(0);
      expect(plain.out).toBe(`${ssh.workspaces.root}/b\n`);

      // An agent holding the key, and no key file: SSH_AUTH_SOCK is used.
      rmSync(join(ssh.home, ".ssh", "id_ed25519"));
      const socket = join(ssh.home, "agent.sock");
      const agent = spawn("ssh-agent", ["-D", "-a", socket], { stdio: "ignore" });
      try {
        for (let i = 0; i < 50 && !existsSync(socket); i++) await new Promise((resolve) => setTimeout(resolve, 100));
        const added = await new Promise<number | null>((resolve) => spawn("ssh-add", [ssh.key], { env: { ...ssh.env, SSH_AUTH_SOCK: socket }, stdio: "ignore" }).on("close", resolve));
        expect(added).toBe(0);
        const viaAgent = await strata(dir, ["exec", "--sandbox", ssh.url("b"), "echo agent"], undefined, { ...ssh.env, SSH_AUTH_SOCK: socket });
        expect(viaAgent.status, viaAgent.err).toBe(0);
        expect(viaAgent.out).toBe("agent\n");
      } finally {
        agent.kill();
      }
    } finally {
      await ssh.workspaces.cleanUp();
    }
  });

  it("strata mcp --sandbox ssh://… serves the remote directory: files and commands are the remote machine's", { timeout: SLOW }, async () => {
    const ssh = sshSetup();
    const client = new Client({ name: "strata-cli-ssh-test", version: "1" });
    try {
      const dir = tempDir();
      const args = ["--import", TSX, CLI, "mcp", "--root", dir, "--sandbox", ssh.url("m"), "--identity", ssh.key, "--known-hosts", ssh.knownHosts];
      await client.connect(new StdioClientTransport({ command: process.execPath, args, cwd: dir, stderr: "pipe", env: ssh.env as Record<string, string> }));
      const call = async (name: string, input: Record<string, unknown>) => {
        const result = (await client.callTool({ name, arguments: input })) as CallToolResult;
        const first = result.content[0];
        return { isError: result.isError === true, text: first?.type === "text" ? first.text : "" };
      };
      // The remote directory is the workspace's root, named as the remote machine names it.
      const remote = `${ssh.workspaces.root}/m`;
      const roots = await call("list_allowed_roots", {});
      expect(roots.text).toContain("over SSH");
      expect(roots.text).toContain(remote);
      const written = await call("write_file", { file_path: `${remote}/remote.txt`, content: "over ssh" });
      expect(written.isError, written.text).toBe(false);
      const ran = await call("execute", { command: "cat remote.txt; echo; pwd" });
      expect(ran.text).toContain("over ssh");
      expect(ran.text).toContain(remote);
      // Nothing landed in the local directory.
      expect(existsSync(join(dir, "remote.txt"))).toBe(false);
    } finally {
      await client.close().catch(() => undefined);
      await ssh.workspaces.cleanUp();
    }
  });
});

describe("strata demo", () => {
  it("runs on embedded defaults from any directory", { timeout: SLOW }, async () => {
    const dir = tempDir();
    const run = await strata(dir, ["demo"]);
    expect(run.status, run.err).toBe(0);
    expect(run.out).toContain("hello from");
    expect(run.out).toContain("invalid_path");
    expect(existsSync(join(dir, ".strata", "demo.db"))).toBe(true);
  });
});

describe("the bundled bin (npm run build: scripts/bundle-cli.ts)", () => {
  it("runs the file commands and serves MCP as the source does, its engines loaded from node_modules", { timeout: SLOW }, async () => {
    // The MCP client passes the server only a safe few variables unless given env: the Node 24 pass's NODE_OPTIONS (its better-sqlite3 build) must reach it.
    const { bundleCli } = await import("../scripts/bundle-cli.js");
    const out = tempDir({ "package.json": JSON.stringify({ type: "module", private: true }) });
    symlinkSync(join(ROOT, "node_modules"), join(out, "node_modules"));
    await bundleCli(out);
    const bin = join(out, "cli", "strata.js");
    expect(readFileSync(bin, "utf8").startsWith("#!/usr/bin/env node\n")).toBe(true);
    const run = (cwd: string, args: string[]) =>
      new Promise<{ status: number | null; out: string; err: string }>((resolve, reject) => {
        const child = spawn(process.execPath, [bin, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] });
        let stdout = "";
        let stderr = "";
        child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
        child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
        child.once("error", reject);
        child.once("close", (status) => resolve({ status, out: stdout, err: stderr }));
      });
    const dir = tempDir({ "a.txt": "hello\n" });
    expect((await run(dir, ["--version"])).out.trim()).toBe("0.1.0");
    expect((await run(dir, ["read", "/a.txt"])).out).toContain("hello");
    // /memories on SQLite: better-sqlite3, outside the bundle, loads from node_modules.
    const listed = await run(dir, ["ls", "/"]);
    expect(listed.status, listed.err).toBe(0);
    expect(listed.out.split("\n")).toEqual(expect.arrayContaining(["/a.txt", "/memories/"]));
    expect((await run(dir, ["nope"])).status).toBe(2);

    const client = new Client({ name: "strata-test", version: "1" });
    await client.connect(new StdioClientTransport({ command: process.execPath, args: [bin, "mcp", "--root", dir, "--no-execute"], stderr: "pipe", env: process.env as Record<string, string> }));
    try {
      const { tools } = await client.listTools();
      expect(tools.map((tool) => tool.name)).toContain("edit_file");
      const result = (await client.callTool({ name: "ls", arguments: { sizes: false } })) as CallToolResult;
      expect(result.content[0]).toMatchObject({ type: "text", text: "/.strata/\n/a.txt\n/memories/" }); // .strata/ holds memories.db
    } finally {
      await client.close();
    }
  });
});
