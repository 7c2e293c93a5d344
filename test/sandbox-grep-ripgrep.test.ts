/**
 * A sandbox's grep takes the ripgrep path when `rg` is on the sandbox's PATH
 * and the POSIX path otherwise; both must give the same answers, on a tree
 * built to tell them apart (hidden and ignored files, binary, big, CRLF,
 * newline and control characters in names, internal names, symlinks).
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { unwrap } from "../core/base.js";
import { LocalSandbox } from "../sandboxes/local.js";

const NEEDLE = "TODO(rg)";
let dir: string;
let shim: string;
let withRg: LocalSandbox;
let withoutRg: LocalSandbox;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "strata-rg-"));
  const ws = join(dir, "ws");
  const file = (path: string, content: string | Buffer) => {
    mkdirSync(join(ws, path, ".."), { recursive: true });
    writeFileSync(join(ws, path), content);
  };
  file("a.txt", `one\n${NEEDLE} here\nthree ${NEEDLE}\n`);
  file("src/deep/b.ts", `const x = 1; // ${NEEDLE}\n`);
  file("src/none.ts", "nothing\n");
  file(".hidden/c.md", `${NEEDLE}\n`);
  file(".gitignore", "*\n");
  file(".ignore", "src\n");
  file(".rgignore", "*.md\n");
  file("crlf.txt", `first\r\n${NEEDLE}\r\nlast\r\n`);
  file("binary.bin", Buffer.concat([Buffer.from(`${NEEDLE}\n`), Buffer.from([0, 1, 2])]));
  file("late-nul.txt", Buffer.concat([Buffer.from(`x\n`.repeat(50_000)), Buffer.from([0]), Buffer.from(NEEDLE)]));
  file("big.log", `${"filler line\n".repeat(120_000)}${NEEDLE} in a big file\n${"tail\n".repeat(10)}`);
  file("name\nwith newline.txt", `${NEEDLE}\n`);
  file("ctl\u0001name.txt", `${NEEDLE}\n`);
  file("dir\nnl/inner.txt", `${NEEDLE}\n`);
  file(".strata-tmp-abc/d.txt", `${NEEDLE}\n`);
  file(".strata-lock-x", `${NEEDLE}\n`);
  file("space name .txt", `${NEEDLE} spaced\n`);
  file("no-newline.txt", `${NEEDLE}`);
  symlinkSync(join(ws, "a.txt"), join(ws, "link.txt"));
  symlinkSync(join(ws, "src"), join(ws, "linkdir"));
  // A PATH holding every program of /usr/bin but rg.
  shim = join(dir, "bin");
  mkdirSync(shim);
  for (const name of readdirSync("/usr/bin")) if (name !== "rg") symlinkSync(join("/usr/bin", name), join(shim, name));
  withRg = new LocalSandbox({ workspace: ws });
  withoutRg = new LocalSandbox({ workspace: ws, env: { PATH: shim, HOME: ws, LANG: "C.UTF-8" } });
});

afterAll(async () => {
  await withRg?.close();
  await withoutRg?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("sandbox grep: the ripgrep path answers as the POSIX path does", () => {
  it("runs rg in one sandbox and not in the other", async () => {
    expect(unwrap(await withRg.execute("command -v rg")).exitCode).toBe(0);
    expect(unwrap(await withoutRg.execute("command -v rg")).exitCode).not.toBe(0);
  });

  it.each([
    ["the whole tree", NEEDLE, undefined, undefined],
    ["a subdirectory", NEEDLE, "/src", undefined],
    ["with a glob", NEEDLE, "/", "**/*.txt"],
    ["a single file", NEEDLE, "/a.txt", undefined],
    ["a pattern of shell and regex characters", "$(x) `y` .* [a] \\n", "/", undefined],
    ["a pattern found nowhere", "absent-needle", "/", undefined],
  ])("%s", async (_, pattern, path, glob) => {
    const fast = unwrap(await withRg.grep(pattern, { path, glob }));
    const posix = unwrap(await withoutRg.grep(pattern, { path, glob }));
    expect(fast).toEqual(posix);
  });

  it("finds what the contract says it finds", async () => {
    const { matches } = unwrap(await withRg.grep(NEEDLE));
    expect(matches.map((m) => [m.path, m.line, m.text])).toEqual([
      ["/.hidden/c.md", 1, NEEDLE],
      ["/a.txt", 2, `${NEEDLE} here`],
      ["/a.txt", 3, `three ${NEEDLE}`],
      ["/big.log", 120_001, `${NEEDLE} in a big file`],
      ["/crlf.txt", 2, NEEDLE],
      ["/ctl\u0001name.txt", 1, NEEDLE],
      ["/dir\nnl/inner.txt", 1, NEEDLE],
      ["/name\nwith newline.txt", 1, NEEDLE],
      ["/no-newline.txt", 1, NEEDLE],
      ["/space name .txt", 1, `${NEEDLE} spaced`],
      ["/src/deep/b.ts", 1, `const x = 1; // ${NEEDLE}`],
    ]);
  });
});
