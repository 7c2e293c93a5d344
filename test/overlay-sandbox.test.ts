/**
 * OverlaySandbox over real sandboxes (bubblewrap and local processes): what
 * commands change lands in the overlay's layer, the real directory untouched
 * until commit; file operations and commands see each other's changes.
 */
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { OverlayBackend } from "../backends/overlay.js";
import type { Sandbox } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { OverlaySandbox } from "../sandboxes/overlay.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const undo of cleanup.splice(0).reverse()) await undo();
});

const FILES: Record<string, string> = { "a": "old a\n", "b": "one\ntwo\n", "c": "c\n", "keep/k.txt": "kept\n" };

function tree(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-overlay-sandbox-"));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true });
    writeFileSync(join(dir, name), content);
  }
  return dir;
}

/** Every path under `dir` with its content's hash (directories as "dir"), for byte-for-byte comparison. */
function fingerprint(dir: string, under = ""): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(join(dir, under)).sort()) {
    const rel = under ? `${under}/${name}` : name;
    if (statSync(join(dir, rel)).isDirectory()) {
      out[rel] = "dir";
      Object.assign(out, fingerprint(dir, rel));
    } else out[rel] = createHash("sha256").update(readFileSync(join(dir, rel))).digest("hex");
  }
  return out;
}

const sha = (text: string) => createHash("sha256").update(text).digest("hex");

const kinds = [
  { name: "bubblewrap", make: (dir: string): Sandbox => new BubblewrapSandbox({ workspace: dir, permissions: false }) },
  { name: "local processes", make: (dir: string): Sandbox => new LocalSandbox({ workspace: dir, permissions: false }) },
];

describe.each(kinds)("OverlaySandbox over $name", ({ make }) => {
  async function open(dir: string): Promise<{ sandbox: OverlaySandbox; overlay: OverlayBackend; p: (path: string) => string }> {
    const overlay = new OverlayBackend({ workspace: dir, permissions: false });
    const sandbox = await OverlaySandbox.open({ overlay, sandbox: make });
    cleanup.push(() => sandbox.close());
    const p = (path: string) => (sandbox.root === "/" ? `/${path}` : `${sandbox.root}/${path}`);
    return { sandbox, overlay, p };
  }

  const COMMAND = "echo x > a; sed -i 's/two/TWO/' b; rm c; mkdir -p d/e && echo y > d/e/f";

  it("a command's creates, edits and deletes land in the layer; the directory is untouched; commit applies them", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const before = fingerprint(dir);
    const { sandbox } = await open(dir);
    const ran = await sandbox.execute(COMMAND);
    expect(ran.error).toBeUndefined();
    expect(ran.exitCode, ran.output).toBe(0);
    expect(ran.output).toBe("");
    const diff = await sandbox.diff();
    expect(diff.changes!.map((c) => [c.kind, c.path])).toEqual([
      ["modified", "/a"],
      ["modified", "/b"],
      ["deleted", "/c"],
      ["added", "/d/e/f"],
    ]);
    expect(fingerprint(dir)).toEqual(before);
    expect((await sandbox.read("b")).content).toBe("one\nTWO");

    const committed = await sandbox.commit();
    expect(committed.error).toBeUndefined();
    expect(readFileSync(join(dir, "a"), "utf8")).toBe("x\n");
    expect(readFileSync(join(dir, "b"), "utf8")).toBe("one\nTWO\n");
    expect(existsSync(join(dir, "c"))).toBe(false);
    expect(readFileSync(join(dir, "d/e/f"), "utf8")).toBe("y\n");
    expect(readFileSync(join(dir, "keep/k.txt"), "utf8")).toBe("kept\n");
    expect((await sandbox.diff()).changes).toEqual([]);
    // The view is still what the commands see.
    expect((await sandbox.execute("cat a b d/e/f; ls")).output).toBe("x\none\nTWO\ny\na\nb\nd\nkeep\n");
  });

  it("discard: the directory unchanged byte for byte, and the next command sees the original state", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const before = fingerprint(dir);
    const { sandbox } = await open(dir);
    expect((await sandbox.execute(COMMAND)).exitCode).toBe(0);
    expect((await sandbox.discard()).discarded).toBeGreaterThan(0);
    expect(fingerprint(dir)).toEqual(before);
    expect((await sandbox.diff()).changes).toEqual([]);
    const seen = await sandbox.execute("cat a b c; ls; test -e d || echo no-d");
    expect(seen.output).toBe("old a\none\ntwo\nc\na\nb\nc\nkeep\nno-d\n");
    expect((await sandbox.diff()).changes).toEqual([]);
  });

  it("a file tool's write is visible to the next command; a command's change to the next read", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, p } = await open(dir);
    expect((await sandbox.write(p("notes/n.txt"), "from the tool\n")).error).toBeUndefined();
    expect((await sandbox.edit(p("a"), "old", "new")).error).toBeUndefined();
    expect((await sandbox.delete(p("keep"))).error).toBeUndefined();
    expect((await sandbox.execute("cat notes/n.txt a; test -e keep || echo no-keep")).output).toBe("from the tool\nnew a\nno-keep\n");
    expect((await sandbox.execute("echo from the shell >> notes/n.txt; mv a moved")).exitCode).toBe(0);
    expect((await sandbox.read(p("notes/n.txt"))).content).toBe("from the tool\nfrom the shell");
    expect((await sandbox.read(p("moved"))).content).toBe("new a");
    expect((await sandbox.stat(p("a"))).error?.code).toBe("file_not_found");
    const diff = await sandbox.diff();
    expect(diff.changes!.map((c) => [c.kind, c.path])).toEqual([
      ["deleted", "/a"],
      ["deleted", "/keep/k.txt"],
      ["added", "/moved"],
      ["added", "/notes/n.txt"],
    ]);
    expect(readFileSync(join(dir, "a"), "utf8")).toBe("old a\n");
  });

  it("replacements: a file becomes a directory, a tree goes, a failing command's changes count too; commit makes the disk the view", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, p } = await open(dir);
    expect((await sandbox.move(p("keep"), p("kept"))).error).toBeUndefined();
    const ran = await sandbox.execute("rm a && mkdir a && echo z > a/z; rm -rf kept; mkdir empty; printf '\\000\\001' > bin; exit 3");
    expect(ran.exitCode).toBe(3);
    expect((await sandbox.diff()).changes!.map((c) => [c.kind, c.path])).toEqual([
      ["deleted", "/a"],
      ["added", "/a/z"],
      ["added", "/bin"],
      ["deleted", "/keep/k.txt"],
    ]);
    expect((await sandbox.stat(p("empty"))).is_dir).toBe(true);
    const view = (await sandbox.execute("find . | sort")).output;
    expect((await sandbox.commit()).error).toBeUndefined();
    expect(fingerprint(dir)).toEqual({ a: "dir", "a/z": sha("z\n"), b: sha("one\ntwo\n"), bin: sha("\u0000\u0001"), c: sha("c\n"), empty: "dir" });
    expect((await sandbox.execute("find . | sort")).output).toBe(view);
  });

  it("commit refuses a file the disk changed behind the layer, nothing applied", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox } = await open(dir);
    expect((await sandbox.execute("echo mine > a; echo new > n")).exitCode).toBe(0);
    writeFileSync(join(dir, "a"), "someone else\n");
    const refused = await sandbox.commit();
    expect(refused.error?.code).toBe("conflict");
    expect(refused.error?.message).toContain("/a (modified)");
    expect(refused.error?.message).not.toContain(dir);
    expect((await sandbox.conflicts()).conflicts).toEqual([{ path: "/a", reason: "modified" }]);
    expect(readFileSync(join(dir, "a"), "utf8")).toBe("someone else\n");
    expect(existsSync(join(dir, "n"))).toBe(false);
  });

  it("a command's change to a file the disk changed behind the scratch copy is refused as a conflict, not based on the new version", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, p } = await open(dir);
    writeFileSync(join(dir, "a"), "someone else\n");
    writeFileSync(join(dir, "c"), "someone else's c\n");
    const ran = await sandbox.execute("echo mine > a; rm c; echo fine > b");
    expect(ran.output).toBe(`[overlay] not captured, put back as the overlay has it: ${p("c")} (conflict), ${p("a")} (conflict)\n`);
    expect((await sandbox.diff()).changes!.map((c) => [c.kind, c.path])).toEqual([["modified", "/b"]]);
    expect((await sandbox.execute("cat a c")).output).toBe("someone else\nsomeone else's c\n");
  });

  it("a file the disk created behind the copy, at a path the command writes or under a directory it removes, is a conflict; commit keeps the disk's", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, p } = await open(dir);
    writeFileSync(join(dir, "new.txt"), "someone else's new file\n");
    writeFileSync(join(dir, "keep", "theirs"), "someone else's file in keep\n");
    const ran = await sandbox.execute("echo mine > new.txt; rm -r keep; echo fine > b");
    expect(ran.output).toBe(`[overlay] not captured, put back as the overlay has it: ${p("keep")} (conflict), ${p("new.txt")} (conflict)\n`);
    expect((await sandbox.diff()).changes!.map((c) => [c.kind, c.path])).toEqual([["modified", "/b"]]);
    expect((await sandbox.commit()).error).toBeUndefined();
    expect(readFileSync(join(dir, "new.txt"), "utf8")).toBe("someone else's new file\n");
    expect(readFileSync(join(dir, "keep", "theirs"), "utf8")).toBe("someone else's file in keep\n");
    expect(readFileSync(join(dir, "keep", "k.txt"), "utf8")).toBe("kept\n");
  });

  it("a change the layer refuses is put back and named in the output, no host path shown", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const overlay = new OverlayBackend({ workspace: dir, maxFileSize: 100 });
    const sandbox = await OverlaySandbox.open({ overlay, sandbox: make });
    cleanup.push(() => sandbox.close());
    const big = sandbox.root === "/" ? "/big" : `${sandbox.root}/big`;
    const ran = await sandbox.execute("head -c 500 /dev/zero > big; echo ok > small");
    expect(ran.output).toBe(`[overlay] not captured, put back as the overlay has it: ${big} (too large)\n`);
    expect(ran.output).not.toContain(tmpdir());
    expect((await sandbox.diff()).changes!.map((c) => [c.kind, c.path])).toEqual([["added", "/small"]]);
    expect((await sandbox.execute("test -e big || echo gone")).output).toBe("gone\n");
  });

  it("a change asked for while a command runs waits for its capture; a read does not wait", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, p } = await open(dir);
    let commandDone = false;
    const running = sandbox.execute("sleep 0.6; echo from the command > x").then((r) => ((commandDone = true), r));
    await new Promise((resolve) => setTimeout(resolve, 100));
    const reading = sandbox.read(p("a")).then((r) => ({ r, before: !commandDone }));
    const writing = sandbox.write(p("x"), "from the tool\n", { overwrite: true }).then((r) => ({ r, after: commandDone }));
    const [ran, read, written] = await Promise.all([running, reading, writing]);
    expect(ran.exitCode).toBe(0);
    expect(read).toMatchObject({ before: true, r: { content: "old a" } });
    expect(written.after).toBe(true);
    expect(written.r.error).toBeUndefined();
    expect((await sandbox.execute("cat x")).output).toBe("from the tool\n");
    expect((await sandbox.read(p("x"))).content).toBe("from the tool");
  });

  it("closing under a running command captures nothing: the scratch going away is no deletion", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox, overlay } = await open(dir);
    const running = sandbox.execute("sleep 2");
    await new Promise((resolve) => setTimeout(resolve, 200));
    await sandbox.close();
    await running;
    expect((await overlay.diff()).changes).toEqual([]);
    expect((await sandbox.read("a")).error?.code).toBe("sandbox_closed");
  });

  it("spawn: the process's changes are in the layer when wait answers", { timeout: 60_000 }, async () => {
    const dir = tree(FILES);
    const { sandbox } = await open(dir);
    const started = await sandbox.spawn("echo spawned > s");
    if (started.error) throw new Error(started.error.message);
    const ended = await started.wait();
    expect(ended.exitCode).toBe(0);
    expect((await sandbox.diff()).changes!.map((c) => [c.kind, c.path])).toEqual([["added", "/s"]]);
    await sandbox.close();
    expect((await sandbox.execute("true")).error?.code).toBe("sandbox_closed");
  });
});
