/**
 * tools/: each tool's happy path and errors over StateBackend and a
 * LocalSandbox, the stale-file guard, multi-edit all-or-none, dry runs and
 * diffs, read_file paging, images, and output budgets with eviction.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { afterEach, describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { withPermissions } from "../backends/permissions.js";
import { StateBackend } from "../backends/state.js";
import type { Backend } from "../core/protocol.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { createTools, MAX_PDF_BYTES, toolDefinitions, ToolSession, type BoundTool, type ToolOutput } from "../tools/index.js";

type Tools = Record<string, BoundTool>;

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const step of cleanup.splice(0)) await step();
});

const kinds = {
  StateBackend: (): Backend => new StateBackend(),
  LocalSandbox: (): Backend => {
    const sandbox = new LocalSandbox();
    cleanup.push(() => sandbox.close());
    return sandbox;
  },
};

function toolsFor(backend: Backend, options?: Parameters<typeof createTools>[1]): Tools {
  return Object.fromEntries(createTools(backend, options).map((tool) => [tool.name, tool]));
}

function expectOk(output: ToolOutput): string {
  expect(output.isError, output.text).toBe(false);
  return output.text;
}

function expectError(output: ToolOutput, pattern: RegExp): void {
  expect(output.isError, output.text).toBe(true);
  expect(output.text).not.toContain("\n");
  expect(output.text).toMatch(pattern);
}

async function text(backend: Backend, path: string): Promise<string> {
  const raw = await backend.readRaw(path);
  if (raw.error) throw new Error(raw.error.message);
  return raw.data.content as string;
}

const PNG = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1]);

describe("tool definitions", () => {
  it("offer execute only over a sandbox", async () => {
    expect(Object.keys(toolsFor(new StateBackend()))).toEqual(["ls", "read_file", "write_file", "edit_file", "glob", "grep"]);
    expect(Object.keys(toolsFor(kinds.LocalSandbox()))).toEqual(["ls", "read_file", "write_file", "edit_file", "glob", "grep", "execute"]);
    // A composite is a Sandbox by type; it runs commands only when its default backend does (also behind a permission wrapper).
    const routes = { "/memories/": new StateBackend() };
    expect(Object.keys(toolsFor(new CompositeBackend({ default: new StateBackend(), routes })))).not.toContain("execute");
    expect(Object.keys(toolsFor(withPermissions(new CompositeBackend({ default: new StateBackend(), routes }), { rules: [] })))).not.toContain("execute");
    expect(Object.keys(toolsFor(new CompositeBackend({ default: kinds.LocalSandbox(), routes })))).toContain("execute");
  });

  it("export JSON Schema with the snake_case names models know", () => {
    const byName = Object.fromEntries(toolDefinitions.map((tool) => [tool.name, tool.jsonSchema()]));
    for (const schema of Object.values(byName)) expect(schema.type).toBe("object");
    const props = (name: string) => Object.keys((byName[name]!.properties ?? {}) as object);
    expect(props("read_file")).toEqual(["file_path", "offset", "limit"]);
    expect(props("edit_file")).toEqual(expect.arrayContaining(["file_path", "old_string", "new_string", "replace_all", "edits", "dry_run"]));
    expect(props("grep")).toEqual(expect.arrayContaining(["pattern", "path", "glob", "output_mode", "head_limit", "case_insensitive", "context", "regex", "offset"]));
    expect(props("execute")).toEqual(["command", "timeout"]);
    expect(byName.read_file!.required).toEqual(["file_path"]);
    for (const tool of toolDefinitions) expect(tool.description.length).toBeGreaterThan(60);
  });

  it("answer invalid arguments with one line, never a throw", async () => {
    const tools = toolsFor(new StateBackend());
    expectError(await tools.read_file!.call({ file_path: 42 }), /Invalid arguments for read_file: file_path/);
    expectError(await tools.read_file!.call({ file_path: "/a", offset: -1 }), /offset/);
    expectError(await tools.edit_file!.call({ file_path: "/a" }), /old_string and new_string/);
  });
});

for (const [kind, create] of Object.entries(kinds)) {
  describe(`tools over ${kind}`, () => {
    it("ls lists one directory, says when it is missing or empty", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/src/a.ts", "export {}\n");
      await backend.write("/README.md", "hi\n");
      const listing = expectOk(await tools.ls!.call({}));
      expect(listing).toContain("/README.md (3 bytes)");
      expect(listing).toContain("/src/");
      expect(expectOk(await tools.ls!.call({ path: "/src" }))).toBe("/src/a.ts (10 bytes)");
      expectError(await tools.ls!.call({ path: "/nope" }), /Directory '\/nope' does not exist/);
      expectError(await tools.ls!.call({ path: "/a/../b" }), /'\.\.' segments/);
    });

    it("read_file numbers lines, states the total and the next offset, and pages", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/f.txt", Array.from({ length: 10 }, (_, i) => `line ${i + 1}`).join("\n") + "\n");
      const first = expectOk(await tools.read_file!.call({ file_path: "/f.txt", limit: 3 }));
      expect(first).toBe("     1\tline 1\n     2\tline 2\n     3\tline 3\n\n[Lines 1-3 of 10. More remains: call read_file with offset=3 to continue.]");
      const next = expectOk(await tools.read_file!.call({ file_path: "/f.txt", offset: 3, limit: 3 }));
      expect(next).toContain("     4\tline 4\n");
      expect(next).toContain("[Lines 4-6 of 10. More remains: call read_file with offset=6 to continue.]");
      const end = expectOk(await tools.read_file!.call({ file_path: "/f.txt", offset: 8 }));
      expect(end).toContain("    10\tline 10\n\n[Lines 9-10 of 10 (end of file).]");
      expectError(await tools.read_file!.call({ file_path: "/f.txt", offset: 10 }), /offset 10 exceeds .*10 lines/);
      expectError(await tools.read_file!.call({ file_path: "/missing.txt" }), /File '\/missing.txt' not found/);
    });

    it("read_file cuts long lines with a marker and says a file is empty", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/long.txt", `${"x".repeat(5000)}\nshort\n`);
      const out = expectOk(await tools.read_file!.call({ file_path: "/long.txt" }));
      expect(out).toContain("[line truncated: 5000 characters]");
      expect(out).toContain("     2\tshort");
      await backend.write("/empty.txt", "");
      expect(expectOk(await tools.read_file!.call({ file_path: "/empty.txt" }))).toMatch(/exists but is empty \(0 lines\)/);
    });

    it("read_file answers an image as a block and other binaries as one line", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.uploadFiles([
        ["/pic.png", PNG],
        ["/blob.bin", Uint8Array.from([0, 1, 2, 255])],
      ]);
      const image = await tools.read_file!.call({ file_path: "/pic.png" });
      expect(image.isError).toBe(false);
      expect(image.blocks).toEqual([{ type: "image", mimeType: "image/png", data: Buffer.from(PNG).toString("base64") }]);
      expect(image.text).toContain("image/png");
      const blob = await tools.read_file!.call({ file_path: "/blob.bin" });
      expect(blob).toEqual({ text: "'/blob.bin' is a binary file (application/octet-stream, 4 bytes); it cannot be shown as text.", isError: false });
    });

    it("read_file answers a PDF as a file block, a large one and a non-UTF-8 text as one line", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      const pdf = new TextEncoder().encode("%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n");
      await backend.uploadFiles([
        ["/docs/report.pdf", pdf],
        // A misnamed PDF is still recognised by its first bytes.
        ["/docs/report.dat", pdf],
        ["/latin1.txt", Uint8Array.from([0x63, 0x61, 0x66, 0xe9, 0x0a])],
        ["/fake.png", Uint8Array.from([0, 1, 2, 255, 254])],
        ["/fake.pdf", Uint8Array.from([0, 1, 2, 255, 254])],
      ]);
      // Named like an image or a PDF but not one: described, never sent as a block a model API would refuse.
      for (const [path, type] of [["/fake.png", "image/png"], ["/fake.pdf", "application/pdf"]] as const) {
        const fake = await tools.read_file!.call({ file_path: path });
        expect(fake).toEqual({ text: `'${path}' is named like ${type} but its bytes are not one (5 bytes); it cannot be shown.`, isError: false });
      }
      for (const path of ["/docs/report.pdf", "/docs/report.dat"]) {
        const read = await tools.read_file!.call({ file_path: path });
        expect(read.text).toBe(`PDF document '${path}' (${pdf.length} bytes), attached as a document.`);
        expect(read.blocks).toEqual([{ type: "file", mimeType: "application/pdf", data: Buffer.from(pdf).toString("base64"), name: path.slice(6) }]);
      }
      const big = new Uint8Array(MAX_PDF_BYTES + 1);
      big.set(pdf);
      await backend.uploadFiles([["/big.pdf", big]]);
      const refused = await tools.read_file!.call({ file_path: "/big.pdf" });
      expect(refused.blocks).toBeUndefined();
      expect(refused.text).toMatch(/^'\/big\.pdf' is a PDF \(\d+ bytes\), too large to show \(over 20971520 bytes\)/);
      expect(expectOk(await tools.read_file!.call({ file_path: "/latin1.txt" }))).toBe(
        "'/latin1.txt' is not valid UTF-8 text (5 bytes; perhaps another encoding such as Latin-1); read_file shows UTF-8 text only, and edit_file cannot change it.",
      );
    });

    it("long lines are cut without splitting a character, in read_file and grep", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      const line = `${"a".repeat(1_999)}😀${"b".repeat(50_000)}`;
      await backend.write("/long.txt", `${line}\nshort\n`);
      const loneHalf = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
      const read = expectOk(await tools.read_file!.call({ file_path: "/long.txt" }));
      expect(read).not.toMatch(loneHalf);
      expect(read).toContain(`${"a".repeat(1_999)}… [line truncated: ${line.length} characters]`);
      const found = expectOk(await tools.grep!.call({ pattern: "bbb", output_mode: "content" }));
      expect(found).toBe(`/long.txt:1:${"a".repeat(1_999)}… [line truncated: ${line.length} characters]`);
    });

    it("grep refuses a regex that nests repetitions before it runs, and allows unambiguous ones", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/redos.txt", `${"a".repeat(5_000)}!\nwww.example.com\n`);
      const started = Date.now();
      expectError(await tools.grep!.call({ pattern: "(a+)+$", regex: true, output_mode: "content" }), /repeats a group that itself repeats \(like \(a\+\)\+\)/);
      expectError(await tools.grep!.call({ pattern: "(\\w*\\s?)*x", regex: true }), /exponential time/);
      expect(Date.now() - started).toBeLessThan(1_000);
      expect(expectOk(await tools.grep!.call({ pattern: "^(\\w+\\.)+com$", regex: true, output_mode: "content" }))).toBe("/redos.txt:2:www.example.com");
    });

    it("hostile paths answer one line naming no host path, and never throw", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      const hostile = ["../../etc/passwd", "/../x", "", "/a\u0000b", "~/x", "C:\\Windows", `/${"a".repeat(5_000)}`, "/dir/../../up"];
      for (const path of hostile) {
        for (const output of [
          await tools.read_file!.call({ file_path: path }),
          await tools.write_file!.call({ file_path: path, content: "x" }),
          await tools.edit_file!.call({ file_path: path, old_string: "a", new_string: "b" }),
          await tools.ls!.call({ path }),
          await tools.glob!.call({ pattern: "*", path }),
          await tools.grep!.call({ pattern: "x", path }),
        ]) {
          expect(output.isError, `${JSON.stringify(path).slice(0, 40)}: ${output.text}`).toBe(true);
          expect(output.text).not.toContain("\n");
          expect(output.text).not.toContain(tmpdir());
          expect(output.text.length).toBeLessThan(600);
        }
      }
    });

    it("parallel writes and edits of one path in one session apply one at a time, each on the last", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      expectOk(await tools.write_file!.call({ file_path: "/p.txt", content: "0\n" }));
      const calls = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          i % 2 === 0
            ? tools.edit_file!.call({ file_path: "/p.txt", old_string: "\n", new_string: `\n${i}\n`, replace_all: false })
            : tools.write_file!.call({ file_path: "/p.txt", content: `w${i}\n` }),
        ),
      );
      // Every call saw the file as the one before it left it (in call order): none was refused as stale.
      for (const [i, call] of calls.entries()) {
        if (i % 2 === 1) expectOk(call);
        else if (call.isError) expect(call.text).toMatch(/appears 2 times/);
        expect(call.text).not.toMatch(/changed since/);
      }
      expect(calls[0]!.isError).toBe(false);
      expect(await text(backend, "/p.txt")).toBe("w9\n");
    });

    it("write_file creates, and replaces only a file read in this session and unchanged since", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      expect(expectOk(await tools.write_file!.call({ file_path: "/new/a.txt", content: "one\ntwo\n" }))).toBe("Created '/new/a.txt' (2 lines, 8 bytes).");
      expect(await text(backend, "/new/a.txt")).toBe("one\ntwo\n");
      // Its own write counts as seen: replacing it needs no read.
      expectOk(await tools.write_file!.call({ file_path: "/new/a.txt", content: "again\n" }));
      await backend.write("/other.txt", "theirs\n");
      expectError(await tools.write_file!.call({ file_path: "/other.txt", content: "mine\n" }), /has not been read in this session\. Read it with read_file before overwriting it/);
      expect(await text(backend, "/other.txt")).toBe("theirs\n");
      expectOk(await tools.read_file!.call({ file_path: "/other.txt" }));
      expect(expectOk(await tools.write_file!.call({ file_path: "/other.txt", content: "mine\n" }))).toMatch(/^Replaced the content of '\/other.txt'/);
      expect(await text(backend, "/other.txt")).toBe("mine\n");
      expectError(await tools.write_file!.call({ file_path: "/new", content: "x" }), /directory/);
    });

    it("edit_file: refused before a read, allowed after, refused after a change behind the session's back", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/a.txt", "alpha\nbeta\ngamma\n");
      expectError(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "beta", new_string: "BETA" }), /'\/a.txt' has not been read in this session\. Read it with read_file/);
      expect(await text(backend, "/a.txt")).toBe("alpha\nbeta\ngamma\n");

      // A window is enough: the hash is of the whole file.
      expectOk(await tools.read_file!.call({ file_path: "/a.txt", limit: 1 }));
      const edited = expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "beta", new_string: "BETA" }));
      expect(edited).toBe("Edited '/a.txt' (1 replacement).\n\n--- /a.txt\n+++ /a.txt\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma");
      expect(await text(backend, "/a.txt")).toBe("alpha\nBETA\ngamma\n");

      // The session's own edit refreshed the hash: a second edit needs no new read.
      expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "gamma", new_string: "GAMMA" }));

      // Someone else changes it: refused until read again.
      await backend.write("/a.txt", "alpha\nBETA\nGAMMA\ndelta\n", { overwrite: true });
      expectError(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "delta", new_string: "DELTA" }), /has changed since you last read it\. Read it again/);
      expectError(await tools.write_file!.call({ file_path: "/a.txt", content: "x" }), /has changed since you last read it/);
      expectOk(await tools.read_file!.call({ file_path: "/a.txt" }));
      expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "delta", new_string: "DELTA" }));
      expect(await text(backend, "/a.txt")).toBe("alpha\nBETA\nGAMMA\nDELTA\n");
    });

    it("edit_file errors are one line a model can act on", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/a.txt", "x = 1\nx = 1\nx = 1\n");
      expectOk(await tools.read_file!.call({ file_path: "/a.txt" }));
      expectError(
        await tools.edit_file!.call({ file_path: "/a.txt", old_string: "x = 1", new_string: "x = 2" }),
        /^old_string appears 3 times in '\/a.txt'\. Add surrounding lines to make it unique, or set replace_all to change every occurrence$/,
      );
      expectError(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "nope", new_string: "x" }), /old_string was not found in '\/a.txt'/);
      expectError(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "x", new_string: "x" }), /identical/);
      expectError(await tools.edit_file!.call({ file_path: "/missing.txt", old_string: "a", new_string: "b" }), /not found/);
      const all = expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "x = 1", new_string: "x = 2", replace_all: true }));
      expect(all).toContain("(3 replacements)");
      expect(await text(backend, "/a.txt")).toBe("x = 2\nx = 2\nx = 2\n");
    });

    it("edit_file applies several edits all or none, and a dry run writes nothing", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/m.py", "def f():\n    return 1\n\ndef g():\n    return 2\n");
      expectOk(await tools.read_file!.call({ file_path: "/m.py" }));
      expectError(
        await tools.edit_file!.call({
          file_path: "/m.py",
          edits: [
            { old_string: "return 1", new_string: "return 10" },
            { old_string: "return 3", new_string: "return 30" },
          ],
        }),
        /^Edit 2 of 2: old_string was not found .*No edit was applied$/,
      );
      expect(await text(backend, "/m.py")).toBe("def f():\n    return 1\n\ndef g():\n    return 2\n");

      const edits = [
        { old_string: "return 1", new_string: "return 10" },
        { old_string: "return 2", new_string: "return 20" },
        // Applied to the result of the previous edits.
        { old_string: "return 10", new_string: "return 11" },
      ];
      const dry = expectOk(await tools.edit_file!.call({ file_path: "/m.py", edits, dry_run: true }));
      expect(dry).toMatch(/^Dry run: 3 edits, 3 replacements in '\/m.py' would make this change; nothing was written\./);
      expect(dry).toContain("-    return 1\n+    return 11");
      expect(await text(backend, "/m.py")).toBe("def f():\n    return 1\n\ndef g():\n    return 2\n");

      const done = expectOk(await tools.edit_file!.call({ file_path: "/m.py", edits }));
      expect(done).toContain("-    return 2\n+    return 20");
      expect(await text(backend, "/m.py")).toBe("def f():\n    return 11\n\ndef g():\n    return 20\n");
      expectError(await tools.edit_file!.call({ file_path: "/m.py", old_string: "a", new_string: "b", edits }), /either old_string\/new_string or edits/);
    });

    it("edit_file keeps CRLF line endings", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/w.txt", "one\r\ntwo\r\nthree\r\n");
      expectOk(await tools.read_file!.call({ file_path: "/w.txt" }));
      const out = expectOk(await tools.edit_file!.call({ file_path: "/w.txt", old_string: "one\ntwo", new_string: "one\nTWO\n2b" }));
      expect(out).toContain("-two\n+TWO\n+2b");
      expect(out).toContain("(CRLF line endings kept)");
      expect(await text(backend, "/w.txt")).toBe("one\r\nTWO\r\n2b\r\nthree\r\n");
    });

    it("edit_file refuses a binary file", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.uploadFiles([["/b.bin", Uint8Array.from([0, 1, 2])]]);
      expectOk(await tools.read_file!.call({ file_path: "/b.bin" }));
      expectError(await tools.edit_file!.call({ file_path: "/b.bin", old_string: "a", new_string: "b" }), /binary file/);
    });

    it("parallel edits of one file in one session all land", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/p.txt", Array.from({ length: 8 }, (_, i) => `v${i}`).join("\n") + "\n");
      expectOk(await tools.read_file!.call({ file_path: "/p.txt" }));
      const results = await Promise.all(Array.from({ length: 8 }, (_, i) => tools.edit_file!.call({ file_path: "/p.txt", old_string: `v${i}\n`, new_string: `w${i}\n` })));
      for (const result of results) expectOk(result);
      expect(await text(backend, "/p.txt")).toBe(Array.from({ length: 8 }, (_, i) => `w${i}`).join("\n") + "\n");
    });

    it("the guard agrees with the backend's line model on every line ending", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      const cases = ["no newline at the end", "lone\rcarriage\nreturn\n", "ends in cr\r", "crlf\r\nlines\r\n", "blank\n\n\nlines\n\n", "\n", "\ufeffbom\n"];
      for (const [i, content] of cases.entries()) {
        const path = `/le-${i}.txt`;
        await backend.write(path, content);
        expectOk(await tools.read_file!.call({ file_path: path, offset: 0, limit: 1 }));
        expect(tools.read_file!.session.hasRead(path), JSON.stringify(content)).toBe(true);
        expectOk(await tools.write_file!.call({ file_path: path, content: "replaced\n" }));
      }
    });

    it("the window shown and the hash recorded come from one read: a change right after it makes the next edit stale", async () => {
      const backend = create();
      let raced = false;
      const racing = new Proxy(backend, {
        get(target, key, receiver) {
          const value = Reflect.get(target, key, receiver);
          if (key === "readRaw") {
            // Someone writes right after the session fetched the file.
            return async (path: string) => {
              const answer = await target.readRaw(path);
              if (!raced) {
                raced = true;
                await target.write(path, "changed\n", { overwrite: true });
              }
              return answer;
            };
          }
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
      const tools = toolsFor(racing);
      await backend.write("/r.txt", "original\n");
      expect(expectOk(await tools.read_file!.call({ file_path: "/r.txt" }))).toContain("original");
      expectError(await tools.edit_file!.call({ file_path: "/r.txt", old_string: "original", new_string: "x" }), /has changed since you last read it/);
      // Reading it again records the new version.
      expectOk(await tools.read_file!.call({ file_path: "/r.txt" }));
      expectOk(await tools.edit_file!.call({ file_path: "/r.txt", old_string: "changed", new_string: "x" }));
    });

    it("overwrites a binary file once it has been read, and reads a directory as an error", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.uploadFiles([["/pic.png", PNG]]);
      expectError(await tools.write_file!.call({ file_path: "/pic.png", content: "text now" }), /has not been read/);
      expectOk(await tools.read_file!.call({ file_path: "/pic.png" }));
      expectOk(await tools.write_file!.call({ file_path: "/pic.png", content: "text now" }));
      expect(await text(backend, "/pic.png")).toBe("text now");
      await backend.write("/dir/x.txt", "x");
      expectError(await tools.read_file!.call({ file_path: "/dir" }), /directory/);
    });

    it("takes null for an omitted optional parameter", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/n.txt", "a\nb\n");
      expect(expectOk(await tools.read_file!.call({ file_path: "/n.txt", offset: null, limit: null }))).toContain("[Lines 1-2 of 2 (end of file).]");
      expectOk(await tools.edit_file!.call({ file_path: "/n.txt", old_string: "a", new_string: "A", replace_all: null, edits: null, dry_run: null }));
      expect(await text(backend, "/n.txt")).toBe("A\nb\n");
      // Nested too: OpenAI's strict mode sends every optional field of an edit as null.
      expectOk(await tools.edit_file!.call({ file_path: "/n.txt", old_string: null, new_string: null, edits: [{ old_string: "b", new_string: "B", replace_all: null }], dry_run: null }));
      expect(await text(backend, "/n.txt")).toBe("A\nB\n");
    });

    it("an edit (one or several) or an overwrite never replaces a change made meanwhile by someone else", async () => {
      const backend = create();
      const meddling = new Proxy(backend, {
        get(target, key, receiver) {
          const value = Reflect.get(target, key, receiver);
          if (key === "edit") {
            // Another writer lands between the guard's check and the edit.
            return async (path: string, oldString: string, newString: string, options: object) => {
              await target.write(path, "first\nsecond\nthird (theirs)\n", { overwrite: true });
              return target.edit(path, oldString, newString, options);
            };
          }
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
      const tools = toolsFor(meddling);
      await backend.write("/c.txt", "first\nsecond\nthird\n");
      expectOk(await tools.read_file!.call({ file_path: "/c.txt" }));
      const out = expectOk(await tools.edit_file!.call({ file_path: "/c.txt", old_string: "first", new_string: "FIRST" }));
      expect(out).toMatch(/^Edited '\/c.txt' \(1 replacement\), but the file was also changed by someone else meanwhile: read it again/);
      expect(await text(backend, "/c.txt")).toBe("FIRST\nsecond\nthird (theirs)\n");
      expectError(await tools.edit_file!.call({ file_path: "/c.txt", old_string: "second", new_string: "SECOND" }), /has changed since you last read it/);

      // Several edits land as one native edit of the text read: a change meanwhile makes them write nothing.
      await backend.write("/m.txt", "first\nsecond\nthird\n");
      expectOk(await tools.read_file!.call({ file_path: "/m.txt" }));
      const edits = [
        { old_string: "first", new_string: "1" },
        { old_string: "second", new_string: "2" },
      ];
      expectError(await tools.edit_file!.call({ file_path: "/m.txt", edits }), /^'\/m\.txt' was changed by someone else while the edits were applied; nothing was written/);
      expect(await text(backend, "/m.txt")).toBe("first\nsecond\nthird (theirs)\n");
      // So does replacing a file with write_file.
      await backend.write("/w.txt", "first\nsecond\nthird\n");
      expectOk(await tools.read_file!.call({ file_path: "/w.txt" }));
      expectError(await tools.write_file!.call({ file_path: "/w.txt", content: "mine\n" }), /^'\/w\.txt' was changed by someone else while it was being replaced; nothing was written/);
      expect(await text(backend, "/w.txt")).toBe("first\nsecond\nthird (theirs)\n");
      // Edits that cancel out write nothing.
      const plain = toolsFor(backend);
      expectOk(await plain.read_file!.call({ file_path: "/m.txt" }));
      expect(expectOk(await plain.edit_file!.call({ file_path: "/m.txt", edits: [{ old_string: "first", new_string: "x" }, { old_string: "x", new_string: "first" }] }))).toBe(
        "The edits leave '/m.txt' unchanged; nothing was written.",
      );
    });

    it("glob finds files by pattern", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/src/a.ts", "a");
      await backend.write("/src/deep/b.ts", "b");
      await backend.write("/src/c.js", "c");
      expect(expectOk(await tools.glob!.call({ pattern: "*.ts" }))).toBe("/src/a.ts\n/src/deep/b.ts");
      expect(expectOk(await tools.glob!.call({ pattern: "deep/*.ts", path: "/src" }))).toBe("/src/deep/b.ts");
      expect(expectOk(await tools.glob!.call({ pattern: "*.rs" }))).toBe("No files match '*.rs' under '/'.");
    });

    it("grep: literal by default, regex, case folding, context, modes and paging", async () => {
      const backend = create();
      const tools = toolsFor(backend);
      await backend.write("/a.ts", "const Foo = 1;\nfoo();\nbar();\n");
      await backend.write("/b.ts", "a.b\naxb\n");
      await backend.write("/node_modules/x/i.ts", "foo\n");
      expect(expectOk(await tools.grep!.call({ pattern: "foo" }))).toBe("/a.ts");
      expect(expectOk(await tools.grep!.call({ pattern: "foo", output_mode: "content" }))).toBe("/a.ts:2:foo();");
      expect(expectOk(await tools.grep!.call({ pattern: "foo", output_mode: "content", case_insensitive: true }))).toBe("/a.ts:1:const Foo = 1;\n/a.ts:2:foo();");
      expect(expectOk(await tools.grep!.call({ pattern: "a.b", output_mode: "content" }))).toBe("/b.ts:1:a.b");
      expect(expectOk(await tools.grep!.call({ pattern: "a.b", regex: true, output_mode: "count" }))).toBe("/b.ts:2");
      expect(expectOk(await tools.grep!.call({ pattern: "bar", output_mode: "content", context: 1 }))).toBe("/a.ts-2-foo();\n/a.ts:3:bar();");
      expect(expectOk(await tools.grep!.call({ pattern: "foo", include_ignored: true }))).toBe("/a.ts\n/node_modules/x/i.ts");
      const page = expectOk(await tools.grep!.call({ pattern: "(", output_mode: "content", head_limit: 1 }));
      expect(page).toBe("/a.ts:2:foo();\n\n[More results: call grep again with offset=1]");
      expect(expectOk(await tools.grep!.call({ pattern: "(", output_mode: "content", head_limit: 1, offset: 1 }))).toBe("/a.ts:3:bar();");
      expect(expectOk(await tools.grep!.call({ pattern: "zzz" }))).toBe("No matches for 'zzz' under '/'.");
      expectError(await tools.grep!.call({ pattern: "(", regex: true }), /regular expression|regex|pattern/i);
      expectError(await tools.grep!.call({ pattern: "x", path: "/a/../b" }), /'\.\.' segments/);
    });

    it("holds every answer to the output budget, evicting the full result to the workspace", async () => {
      const backend = create();
      const session = new ToolSession(backend, { maxOutputChars: 1_000 });
      const tools = toolsFor(backend, { session });
      for (let i = 0; i < 100; i++) await backend.write(`/many/file-${String(i).padStart(3, "0")}.txt`, "x");
      const out = expectOk(await tools.glob!.call({ pattern: "*.txt" }));
      expect(out.length).toBeLessThan(1_000);
      expect(out).toMatch(/^\/many\/file-000\.txt\n/);
      expect(out).toMatch(/\/many\/file-099\.txt$/);
      expect(out).toMatch(/\[… output truncated: \d+ of \d+ characters omitted\. The full output is in '\/\.strata\/evicted\/glob-1\.txt'/);
      const full = await text(backend, "/.strata/evicted/glob-1.txt");
      expect(full.split("\n")).toHaveLength(100);
      // Evicted results stay out of listings and searches.
      expect(expectOk(await tools.glob!.call({ pattern: "glob-*.txt" }))).toMatch(/^No files match/);
      expect(expectOk(await tools.ls!.call({}))).toBe("/many/");
      expect(expectOk(await tools.ls!.call({ path: "/.strata" }))).not.toContain("evicted");
      // Asked for by name, they are listed, beside the .gitignore that keeps them out of commits.
      expect(expectOk(await tools.ls!.call({ path: "/.strata/evicted" }))).toMatch(/^\/\.strata\/evicted\/\.gitignore \(\d+ bytes\)\n\/\.strata\/evicted\/glob-1\.txt \(\d+ bytes\)$/);
      expect(await text(backend, "/.strata/evicted/.gitignore")).toMatch(/^\*$/m);
      expect(expectOk(await tools.glob!.call({ pattern: ".strata/evicted/*.txt" }))).toBe("/.strata/evicted/glob-1.txt");
      expect(expectOk(await tools.grep!.call({ pattern: "file-042", glob: ".strata/evicted/**" }))).toBe("/.strata/evicted/glob-1.txt");
      // read_file keeps to the budget by stopping at a line and naming the offset to continue from.
      await backend.write("/big.txt", Array.from({ length: 500 }, (_, i) => `row ${i}`).join("\n"));
      const read = expectOk(await tools.read_file!.call({ file_path: "/big.txt" }));
      expect(read.length).toBeLessThan(1_000);
      expect(read).toMatch(/\[Lines 1-(\d+) of 500; the output budget ended the answer here\. More remains: call read_file with offset=\1 to continue\.\]$/);
    });

    it("keeps the full result in the session's memory when the workspace refuses the write", async () => {
      const backend = create();
      const readOnly = new Proxy(backend, {
        get(target, key, receiver) {
          if (key === "write") return async (path: string) => ({ error: { code: "permission_denied", message: `Permission denied: '${path}'`, path } });
          const value = Reflect.get(target, key, receiver);
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
      const tools = toolsFor(readOnly, { maxOutputChars: 500 });
      for (let i = 0; i < 60; i++) await backend.write(`/f${String(i).padStart(2, "0")}.txt`, "x");
      const out = expectOk(await tools.glob!.call({ pattern: "*.txt" }));
      expect(out).toMatch(/\[… output truncated: \d+ of \d+ characters omitted\. The workspace could not store it, so this session keeps the full output in memory as '\/\.strata\/evicted\/glob-1\.txt'/);
      expect((await backend.ls("/.strata")).entries ?? []).toEqual([]);
      // read_file pages it by that path, as if it were a file.
      const page = expectOk(await tools.read_file!.call({ file_path: "/.strata/evicted/glob-1.txt", offset: 58, limit: 5 }));
      expect(page).toBe("    59\t/f58.txt\n    60\t/f59.txt\n\n[Lines 59-60 of 60 (end of file). This result is kept in this session's memory, not in the workspace.]");
      expectError(await tools.read_file!.call({ file_path: "/.strata/evicted/glob-1.txt", offset: 60 }), /Line offset 60 exceeds the length/);
      // evict: false only cuts.
      const cutOnly = toolsFor(readOnly, { maxOutputChars: 500, evict: false });
      expect(expectOk(await cutOnly.glob!.call({ pattern: "*.txt" }))).toMatch(/characters omitted \(over the 500-character output budget\); narrow the request/);
    });
  });
}

describe("edit_file over FilesystemBackend", () => {
  const workspace = () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-edit-"));
    cleanup.push(async () => rmSync(dir, { recursive: true, force: true }));
    return dir;
  };

  it("knows what the file holds after its edit from the backend's answer: one read per edit, and the stale-file guard holds", async () => {
    const dir = workspace();
    const backend = new FilesystemBackend({ workspace: dir });
    let reads = 0;
    const counting = new Proxy(backend, {
      get(target, key) {
        const value = Reflect.get(target, key, target) as unknown;
        if (key === "readRaw") reads++;
        return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
    const tools = toolsFor(counting);
    writeFileSync(join(dir, "a.txt"), "one\ntwo\nthree\n");
    expectOk(await tools.read_file!.call({ file_path: "/a.txt" }));
    reads = 0;
    expect(expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "two", new_string: "TWO" }))).toMatch(/^Edited '\/a\.txt' \(1 replacement\)\.\n\n/);
    expect(reads).toBe(1);
    // Its own edit counts as read: the next one needs no read_file.
    expectOk(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "three", new_string: "THREE" }));
    expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("one\nTWO\nTHREE\n");
    // Another program's change after the edit is caught by the next one.
    writeFileSync(join(dir, "a.txt"), "one\nTWO\nTHREE\nfour\n");
    expectError(await tools.edit_file!.call({ file_path: "/a.txt", old_string: "one", new_string: "ONE" }), /has changed since you last read it/);
  });

  it("a change another program made between the guard's read and the edit is reported, and the file must be read again", async () => {
    const dir = workspace();
    const backend = new FilesystemBackend({ workspace: dir });
    const meddling = new Proxy(backend, {
      get(target, key) {
        const value = Reflect.get(target, key, target) as unknown;
        if (key === "edit") {
          return async (path: string, oldString: string, newString: string, options: object) => {
            writeFileSync(join(dir, "c.txt"), "first\nsecond\nthird (theirs)\n");
            return target.edit(path, oldString, newString, options);
          };
        }
        return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
    const tools = toolsFor(meddling);
    writeFileSync(join(dir, "c.txt"), "first\nsecond\nthird\n");
    expectOk(await tools.read_file!.call({ file_path: "/c.txt" }));
    const out = expectOk(await tools.edit_file!.call({ file_path: "/c.txt", old_string: "first", new_string: "FIRST" }));
    expect(out).toMatch(/^Edited '\/c.txt' \(1 replacement\), but the file was also changed by someone else meanwhile: read it again/);
    expect(readFileSync(join(dir, "c.txt"), "utf8")).toBe("FIRST\nsecond\nthird (theirs)\n");
    expectError(await tools.edit_file!.call({ file_path: "/c.txt", old_string: "second", new_string: "SECOND" }), /has changed since you last read it/);
  });
});

describe("ToolSession.budget", () => {
  it("keeps whole characters and lines in its preview", async () => {
    const session = new ToolSession(new StateBackend(), { maxOutputChars: 1_000, evict: false });
    const emoji = "😀".repeat(2_000);
    const cut = await session.budget("x", { text: emoji, isError: false });
    expect(cut.text).not.toMatch(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/);
    const lines = Array.from({ length: 300 }, (_, i) => `line ${i}`).join("\n");
    const out = (await session.budget("x", { text: lines, isError: true })).text;
    expect(out).toMatch(/^line 0\nline 1\n/);
    expect(out).toMatch(/\nline 299$/);
    expect(out.split("\n").every((line) => /^line \d+$/.test(line) || line.startsWith("[… output truncated"))).toBe(true);
    expect(await session.budget("x", { text: "short", isError: false })).toEqual({ text: "short", isError: false });
  });
});

describe("a backend that throws", () => {
  it("answers an error naming no host path; the tools never throw", async () => {
    const backend = new StateBackend();
    await backend.write("/a.txt", "a\n");
    const throwing = new Proxy(backend, {
      get(target, key, receiver) {
        if (key === "readRaw" || key === "write" || key === "ls") {
          return async () => {
            throw new Error("EIO: /home/secret/workspace/a.txt");
          };
        }
        const value = Reflect.get(target, key, receiver);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
    const tools = toolsFor(throwing, { maxOutputChars: 300 });
    for (const output of [
      await tools.read_file!.call({ file_path: "/a.txt" }),
      await tools.write_file!.call({ file_path: "/b.txt", content: "b" }),
      await tools.ls!.call({}),
    ]) {
      expect(output.isError).toBe(true);
      expect(output.text).toMatch(/failed unexpectedly \(Error in the workspace backend\)/);
      expect(output.text).not.toContain("/home/secret");
    }
    // Eviction's write throwing mid-budget is an answer too (kept in memory).
    await backend.write("/big.txt", "x\n".repeat(500));
    const found = await tools.grep!.call({ pattern: "x", output_mode: "content" });
    expect(found.isError).toBe(false);
    expect(found.text).toContain("keeps the full output in memory");
  });
});

describe("eviction names", () => {
  it("stay distinct for concurrent calls across sessions, and continue past an earlier process's results", async () => {
    const backend = new StateBackend();
    // An earlier process left 30 results (its counter is gone with it).
    for (let i = 1; i <= 30; i++) await backend.write(`/.strata/evicted/glob-${i}.txt`, `old ${i}`);
    for (let i = 0; i < 80; i++) await backend.write(`/f${String(i).padStart(2, "0")}.txt`, "x");
    const sessions = [new ToolSession(backend, { maxOutputChars: 300 }), new ToolSession(backend, { maxOutputChars: 300 })];
    const outputs = await Promise.all(Array.from({ length: 10 }, (_, i) => createTools(backend, { session: sessions[i % 2]! })[4]!.call({ pattern: "*.txt" })));
    const paths = outputs.map((output) => /The full output is in '([^']+)'/.exec(output.text)?.[1]);
    expect(new Set(paths).size).toBe(10);
    for (const path of paths) expect(path).toMatch(/^\/\.strata\/evicted\/glob-(3[1-9]|40)\.txt$/);
    // Nothing earlier was replaced.
    expect(await text(backend, "/.strata/evicted/glob-30.txt")).toBe("old 30");
  });
});

describe("execute", () => {
  it("runs a command and reports its exit code", async () => {
    const tools = toolsFor(kinds.LocalSandbox());
    expect(expectOk(await tools.execute!.call({ command: "echo hello" }))).toBe("hello\n[exit code 0]");
    expect(expectOk(await tools.execute!.call({ command: "echo oops >&2; exit 3" }))).toBe("oops\n[exit code 3]");
    expect(expectOk(await tools.execute!.call({ command: "sleep 5", timeout: 0.5 }))).toMatch(/exit code 124; the command timed out/);
    expectError(await tools.execute!.call({ command: "" }), /Invalid arguments for execute: command/);
  });

  it("sees the files the other tools write, and the guard sees its changes", async () => {
    const sandbox = kinds.LocalSandbox();
    const tools = toolsFor(sandbox);
    expectOk(await tools.write_file!.call({ file_path: "/s.txt", content: "one\n" }));
    expect(expectOk(await tools.execute!.call({ command: "cat s.txt; echo two >> s.txt" }))).toBe("one\n[exit code 0]");
    expectError(await tools.edit_file!.call({ file_path: "/s.txt", old_string: "two", new_string: "2" }), /has changed since you last read it/);
  });
});

describe.skipIf(!(await BubblewrapSandbox.isAvailable()))("tools over a sandbox whose path space starts at /workspace", () => {
  it("start at the sandbox's root: relative paths, listings, searches and evicted results", async () => {
    const sandbox = new BubblewrapSandbox();
    cleanup.push(() => sandbox.close());
    const tools = toolsFor(sandbox, { maxOutputChars: 300 });
    expect(expectOk(await tools.write_file!.call({ file_path: "rel.txt", content: "rel\n" }))).toBe("Created '/workspace/rel.txt' (1 line, 4 bytes).");
    expectOk(await tools.write_file!.call({ file_path: "/workspace/src/a.txt", content: "one\ntwo\n" }));
    expect(expectOk(await tools.ls!.call({}))).toBe("/workspace/rel.txt (4 bytes)\n/workspace/src/");
    // Its own writes count as read, under either spelling of the path.
    expectOk(await tools.edit_file!.call({ file_path: "/workspace/rel.txt", old_string: "rel", new_string: "REL" }));
    expectOk(await tools.edit_file!.call({ file_path: "src/a.txt", old_string: "two", new_string: "2" }));
    expect(expectOk(await tools.glob!.call({ pattern: "*.txt" }))).toBe("/workspace/rel.txt\n/workspace/src/a.txt");
    expect(expectOk(await tools.grep!.call({ pattern: "one", output_mode: "content" }))).toBe("/workspace/src/a.txt:1:one");
    const out = expectOk(await tools.execute!.call({ command: "seq 1 200" }));
    expect(out).toContain("The full output is in '/workspace/.strata/evicted/execute-1.txt'");
    expect(out).toMatch(/^1\n2\n[\s\S]*\n200\n\[exit code 0\]$/);
    expect(expectOk(await tools.read_file!.call({ file_path: "/workspace/.strata/evicted/execute-1.txt", offset: 199 }))).toContain("   200\t200");
    expect(expectOk(await tools.ls!.call({}))).toBe("/workspace/rel.txt (4 bytes)\n/workspace/src/");
    expectError(await tools.read_file!.call({ file_path: "/etc/passwd" }), /outside the workspace/);
  });
});
