/**
 * core/search.ts: literal or regex search, case folding, context, output
 * modes and paging, over the native API of every kind of backend; and a
 * property test against a naive reference (one RegExp per line of every
 * file), which also proves the native-grep prefilter never loses a match.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { CompositeBackend } from "../backends/composite.js";
import { FilesystemBackend } from "../backends/filesystem.js";
import { StateBackend } from "../backends/state.js";
import { splitLines } from "../core/format.js";
import type { Backend } from "../core/protocol.js";
import { parseRegex, requiredLiteral, search, type SearchAnswer, type SearchLine, type SearchOptions } from "../core/search.js";
import type { GrepOptions } from "../core/types.js";

const encoder = new TextEncoder();
const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "strata-search-"));
  dirs.push(dir);
  return dir;
}

/** Records the patterns the search asks the native grep for. */
function spying<B extends Backend>(backend: B): B & { grepped: string[] } {
  const grepped: string[] = [];
  const grep = backend.grep.bind(backend);
  return Object.assign(backend, {
    grepped,
    grep: (pattern: string, options?: GrepOptions) => {
      grepped.push(pattern);
      return grep(pattern, options);
    },
  });
}

// The tree holds /.git/config, which the default secrets preset denies: these tests compare search semantics, so the filesystem backends opt out.
const KINDS: Array<[string, () => Backend]> = [
  ["StateBackend", () => new StateBackend()],
  ["FilesystemBackend", () => new FilesystemBackend({ workspace: tempDir(), permissions: false })],
  [
    "CompositeBackend (state default, filesystem and state routes)",
    () =>
      new CompositeBackend({
        default: new StateBackend(),
        routes: { "/src/": new FilesystemBackend({ workspace: tempDir(), permissions: false }), "/node_modules/": new StateBackend() },
      }),
  ],
];

const TREE: Record<string, string | Uint8Array> = {
  "/src/a.ts": "const foo = 1;\nlet bar = foo + 2;\n// FOO upper\nnothing here\n",
  "/src/b.txt": "a.b(c)*\nabc\naxb(c)\n",
  "/src/crlf.txt": "one\r\ntwo foo\r\nthree\r\n",
  "/src/bin.dat": new Uint8Array([0x66, 0x6f, 0x6f, 0x0a, 0x00, 0x01, 0x02]),
  "/src/latin1.txt": new Uint8Array([0x66, 0x6f, 0x6f, 0xe9, 0x0a]), // "foo" and invalid UTF-8: binary
  "/src/.git": "gitdir: foo\n",
  "/node_modules/pkg/index.js": "foo from node_modules\n",
  "/.git/config": "foo in git\n",
  "/deep/x/.git/HEAD": "foo ref\n",
  "/ctx.txt": Array.from({ length: 10 }, (_, i) => (i + 1 === 3 || i + 1 === 5 || i + 1 === 9 ? `hit ${i + 1}` : `l${i + 1}`)).join("\n") + "\n",
  "/colours.txt": "color\ncolour\ncolr\nbar only\n",
  "/case.txt": "abc\nABC\naBc\n",
};

async function seeded(make: () => Backend): Promise<Backend> {
  const backend = make();
  const files = Object.entries(TREE).map(([path, content]) => [path, typeof content === "string" ? encoder.encode(content) : content] as const);
  const uploaded = await backend.uploadFiles(files);
  expect(uploaded.error).toBeUndefined();
  expect(uploaded.files!.filter((f) => f.error)).toEqual([]);
  return backend;
}

async function ok(backend: Backend, options: SearchOptions): Promise<SearchAnswer> {
  const answer = await search(backend, options);
  if (answer.error) throw new Error(`search failed: ${answer.error.code}: ${answer.error.message}`);
  return answer;
}

async function content(backend: Backend, options: SearchOptions): Promise<SearchLine[]> {
  const answer = await ok(backend, options);
  if (answer.mode !== "content") throw new Error("not content");
  return answer.lines;
}

const where = (lines: SearchLine[]) => lines.map((l) => `${l.path}:${l.line}${l.match ? ":" : "-"}${l.text}`);

describe.each(KINDS)("search over %s", (_name, make) => {
  it("literal, regex and ignoreCase agree on a literal; the literal prefilters through the native grep", async () => {
    const backend = spying(await seeded(make));
    const literal = await content(backend, { pattern: "foo" });
    expect(where(literal)).toEqual(["/src/.git:1:gitdir: foo", "/src/a.ts:1:const foo = 1;", "/src/a.ts:2:let bar = foo + 2;", "/src/crlf.txt:2:two foo"]);
    expect(backend.grepped).toEqual(["foo"]);
    expect(await content(backend, { pattern: "foo", regex: true })).toEqual(literal);
    expect(backend.grepped).toEqual(["foo", "foo"]);
    const folded = await content(backend, { pattern: "foo", ignoreCase: true });
    expect(where(folded)).toEqual([...where(literal).slice(0, 3), "/src/a.ts:3:// FOO upper", where(literal)[3]].sort());
    expect(await content(backend, { pattern: "FOO", regex: true, ignoreCase: true })).toEqual(folded);
    expect(backend.grepped).toHaveLength(2); // case folding never asks the case-sensitive native grep
  });

  it("reads regex special characters literally unless regex is set", async () => {
    const backend = await seeded(make);
    expect(where(await content(backend, { pattern: "a.b(c)*" }))).toEqual(["/src/b.txt:1:a.b(c)*"]);
    expect(where(await content(backend, { pattern: "a.b\\(c\\)", regex: true }))).toEqual(["/src/b.txt:1:a.b(c)*", "/src/b.txt:3:axb(c)"]);
    expect(where(await content(backend, { pattern: "^a[bx]", regex: true, path: "/src" }))).toEqual(["/src/b.txt:2:abc", "/src/b.txt:3:axb(c)"]);
  });

  it("merges overlapping context windows and shows each line once", async () => {
    const backend = await seeded(make);
    expect(where(await content(backend, { pattern: "hit", context: 1 }))).toEqual([
      "/ctx.txt:2-l2",
      "/ctx.txt:3:hit 3",
      "/ctx.txt:4-l4",
      "/ctx.txt:5:hit 5",
      "/ctx.txt:6-l6",
      "/ctx.txt:8-l8",
      "/ctx.txt:9:hit 9",
      "/ctx.txt:10-l10",
    ]);
    expect(where(await content(backend, { pattern: "hit", before: 0, after: 2 }))).toEqual([
      "/ctx.txt:3:hit 3",
      "/ctx.txt:4-l4",
      "/ctx.txt:5:hit 5",
      "/ctx.txt:6-l6",
      "/ctx.txt:7-l7",
      "/ctx.txt:9:hit 9",
      "/ctx.txt:10-l10",
    ]);
    // `before` overrides `context` on its side only; windows are clipped to the file.
    expect(where(await content(backend, { pattern: "hit 3", context: 5, before: 0 }))).toEqual([
      "/ctx.txt:3:hit 3",
      ...[4, 5, 6, 7, 8].map((n) => (n === 5 ? "/ctx.txt:5-hit 5" : `/ctx.txt:${n}-l${n}`)),
    ]);
    expect(where(await content(backend, { pattern: "hit 9", context: 3 })).at(-1)).toBe("/ctx.txt:10-l10");
  });

  it("answers in the three output modes", async () => {
    const backend = await seeded(make);
    const files = await ok(backend, { pattern: "foo", outputMode: "files_with_matches" });
    expect(files).toEqual({ mode: "files_with_matches", files: ["/src/.git", "/src/a.ts", "/src/crlf.txt"], truncated: false });
    const counts = await ok(backend, { pattern: "o", outputMode: "count", path: "/src" });
    expect(counts).toEqual({
      mode: "count",
      counts: [
        { path: "/src/.git", count: 1 },
        { path: "/src/a.ts", count: 3 },
        { path: "/src/crlf.txt", count: 2 },
      ],
      truncated: false,
    });
    const lines = await ok(backend, { pattern: "hit" });
    expect(lines).toMatchObject({ mode: "content", totalMatches: 3, truncated: false });
    expect(lines).not.toHaveProperty("nextOffset");
  });

  it("pages with headLimit and offset over lines, files and count rows", async () => {
    const backend = await seeded(make);
    for (const [outputMode, headLimit] of [
      ["content", 2],
      ["content", 3],
      ["files_with_matches", 1],
      ["files_with_matches", 3],
      ["count", 2],
      ["count", 3],
    ] as const) {
      const whole = await ok(backend, { pattern: "o", outputMode, context: 1 });
      const unitsOf = (a: SearchAnswer): unknown[] => (a.mode === "content" ? a.lines : a.mode === "count" ? a.counts : a.files);
      const all = unitsOf(whole);
      expect(all.length).toBeGreaterThanOrEqual(4);
      const collected: unknown[] = [];
      let offset: number | undefined = 0;
      let pages = 0;
      while (offset !== undefined) {
        const page = await ok(backend, { pattern: "o", outputMode, context: 1, headLimit, offset });
        expect(unitsOf(page).length).toBeLessThanOrEqual(headLimit);
        expect(page.truncated).toBe(page.nextOffset !== undefined);
        if (page.nextOffset !== undefined) expect(page.nextOffset).toBe(offset + headLimit);
        if (page.mode === "content" && whole.mode === "content") expect(page.totalMatches).toBe(whole.totalMatches);
        collected.push(...unitsOf(page));
        offset = page.nextOffset;
        pages++;
      }
      expect(collected).toEqual(all);
      expect(pages).toBe(Math.ceil(all.length / headLimit));
      const past = await ok(backend, { pattern: "o", outputMode, offset: all.length + 5 });
      expect(unitsOf(past)).toEqual([]);
      expect(past.truncated).toBe(false);
    }
  });

  it("skips node_modules/ and .git/ directories (at any depth) unless asked; a file named .git is searched", async () => {
    const backend = await seeded(make);
    const paths = async (options: Partial<SearchOptions>) => {
      const answer = await ok(backend, { pattern: "foo", outputMode: "files_with_matches", ...options });
      return answer.mode === "files_with_matches" ? answer.files : [];
    };
    expect(await paths({})).toEqual(["/src/.git", "/src/a.ts", "/src/crlf.txt"]);
    expect(await paths({ regex: true, pattern: "f.o" })).toEqual(["/src/.git", "/src/a.ts", "/src/crlf.txt"]);
    expect(await paths({ includeIgnored: true })).toEqual(["/.git/config", "/deep/x/.git/HEAD", "/node_modules/pkg/index.js", "/src/.git", "/src/a.ts", "/src/crlf.txt"]);
    // Searching inside one explicitly searches it.
    expect(await paths({ path: "/node_modules" })).toEqual(["/node_modules/pkg/index.js"]);
    expect(await paths({ path: "/deep/x/.git/HEAD" })).toEqual(["/deep/x/.git/HEAD"]);
    expect(await paths({ path: "/deep" })).toEqual([]);
  });

  it("reads CRLF files under the shared line model", async () => {
    const backend = await seeded(make);
    expect(where(await content(backend, { pattern: "foo$", regex: true }))).toEqual(["/src/.git:1:gitdir: foo", "/src/crlf.txt:2:two foo"]);
    expect(where(await content(backend, { pattern: "^two foo$", regex: true }))).toEqual(["/src/crlf.txt:2:two foo"]);
    expect(await ok(backend, { pattern: "\\r", regex: true, outputMode: "count" })).toEqual({ mode: "count", counts: [], truncated: false });
    expect(where(await content(backend, { pattern: "two", path: "/src/crlf.txt", context: 5 }))).toEqual([
      "/src/crlf.txt:1-one",
      "/src/crlf.txt:2:two foo",
      "/src/crlf.txt:3-three",
    ]);
  });

  it("skips binary files", async () => {
    const backend = await seeded(make);
    expect(await ok(backend, { pattern: "foo", path: "/src/bin.dat" })).toEqual({ mode: "content", lines: [], totalMatches: 0, truncated: false });
    expect(await ok(backend, { pattern: "f.o", regex: true, path: "/src/bin.dat", outputMode: "count" })).toEqual({ mode: "count", counts: [], truncated: false });
    expect(await ok(backend, { pattern: "f.o", regex: true, path: "/src/latin1.txt", outputMode: "count" })).toEqual({ mode: "count", counts: [], truncated: false });
    expect(await ok(backend, { pattern: "foo", path: "/src/latin1.txt", ignoreCase: true })).toMatchObject({ lines: [], totalMatches: 0 });
  });

  it("never uses a prefilter that would miss matches", async () => {
    const backend = spying(await seeded(make));
    expect(where(await content(backend, { pattern: "colou?r", regex: true }))).toEqual(["/colours.txt:1:color", "/colours.txt:2:colour"]);
    expect(backend.grepped).toEqual(["colo"]);
    expect(where(await content(backend, { pattern: "colou*r", regex: true }))).toEqual(["/colours.txt:1:color", "/colours.txt:2:colour"]);
    expect(where(await content(backend, { pattern: "foo|bar", regex: true, path: "/src/a.ts" }))).toEqual(["/src/a.ts:1:const foo = 1;", "/src/a.ts:2:let bar = foo + 2;"]);
    expect(where(await content(backend, { pattern: "colr|bar", regex: true }))).toEqual(["/colours.txt:3:colr", "/colours.txt:4:bar only", "/src/a.ts:2:let bar = foo + 2;"]);
    expect(where(await content(backend, { pattern: "ABC", ignoreCase: true, path: "/case.txt" }))).toEqual(["/case.txt:1:abc", "/case.txt:2:ABC", "/case.txt:3:aBc"]);
    expect(where(await content(backend, { pattern: "A(?:B)C", regex: true, ignoreCase: true, path: "/case.txt" }))).toHaveLength(3);
    expect(backend.grepped).toEqual(["colo", "colo"]);
  });

  it("refuses regexes that can match the empty string, regexes that do not compile, and bad options", async () => {
    const backend = await seeded(make);
    for (const pattern of ["a*", "^", "$", "^$", "\\b", "(?:)", "x?|y", "(a|)", "a{0}", "(?=foo)", "[]*", "(a)\\1|b?"]) {
      const answer = await search(backend, { pattern, regex: true });
      expect(answer.error?.code, pattern).toBe("invalid_argument");
      expect(answer.error?.message, pattern).toMatch(/empty string/);
    }
    for (const pattern of ["(", "a)", "[a", "a**", "?", "\\"]) {
      const answer = await search(backend, { pattern, regex: true });
      expect(answer.error?.code, pattern).toBe("invalid_argument");
      expect(answer.error?.message, pattern).toMatch(/Invalid regex/);
    }
    // As literals these are text.
    expect(await ok(backend, { pattern: "a*", outputMode: "count" })).toEqual({ mode: "count", counts: [], truncated: false });
    expect(await ok(backend, { pattern: "(", outputMode: "count" })).toEqual({ mode: "count", counts: [{ path: "/src/b.txt", count: 2 }], truncated: false });
    const bad: unknown[] = [
      undefined,
      null,
      "foo",
      {},
      { pattern: "" },
      { pattern: 5 },
      { pattern: "a\nb" },
      { pattern: "a\0" },
      { pattern: "x".repeat(16 * 1024 + 1) },
      { pattern: "a", regex: "yes" },
      { pattern: "a", ignoreCase: 1 },
      { pattern: "a", context: -1 },
      { pattern: "a", before: 1.5 },
      { pattern: "a", after: Number.NaN },
      { pattern: "a", headLimit: 0 },
      { pattern: "a", headLimit: -2 },
      { pattern: "a", offset: -1 },
      { pattern: "a", outputMode: "lines" },
      { pattern: "a", path: 7 },
      { pattern: "a", glob: ["*"] },
      { pattern: "a", includeIgnored: "no" },
      { pattern: "a", signal: {} },
    ];
    for (const options of bad) {
      const answer = await search(backend, options as SearchOptions);
      expect(answer.error?.code, JSON.stringify(options)?.slice(0, 80)).toBe("invalid_argument");
    }
  });

  it("passes the backend's errors through and honours the glob and the signal", async () => {
    const backend = await seeded(make);
    expect((await search(backend, { pattern: "foo", path: "/src/../etc" })).error?.code).toBe("invalid_path");
    expect((await search(backend, { pattern: "f.o", regex: true, path: "/src/../etc" })).error?.code).toBe("invalid_path");
    expect((await search(backend, { pattern: "foo", glob: "[a" })).error?.code).toBe("invalid_argument");
    expect(await ok(backend, { pattern: "o", glob: "*.ts", outputMode: "files_with_matches" })).toEqual({ mode: "files_with_matches", files: ["/src/a.ts"], truncated: false });
    expect(await ok(backend, { pattern: "o+", regex: true, glob: "*.txt", path: "/src", outputMode: "files_with_matches" })).toEqual({
      mode: "files_with_matches",
      files: ["/src/crlf.txt"],
      truncated: false,
    });
    expect(await ok(backend, { pattern: "foo", path: "/missing" })).toEqual({ mode: "content", lines: [], totalMatches: 0, truncated: false });
    const controller = new AbortController();
    controller.abort();
    expect((await search(backend, { pattern: "foo", signal: controller.signal })).error?.code).toBe("aborted");
    expect((await search(backend, { pattern: "f.o", regex: true, signal: controller.signal })).error?.code).toBe("aborted");
  });
});

describe("search over many files", () => {
  /** 120 files, every one matching; reads counted. */
  async function many() {
    const backend = new StateBackend();
    const names = Array.from({ length: 120 }, (_, i) => `/f/${String(i).padStart(3, "0")}.txt`);
    await backend.uploadFiles(names.map((name) => [name, encoder.encode(`x1\ny\nx2\n`)] as const));
    let downloads = 0;
    const download = backend.downloadFiles.bind(backend);
    backend.downloadFiles = (paths, options) => {
      downloads++;
      return download(paths, options);
    };
    return { backend, names, downloads: () => downloads };
  }

  it("reads in batches of 50 and stops once a page of files or counts is known to have more", async () => {
    const { backend, names, downloads } = await many();
    const first = await ok(backend, { pattern: "x", regex: true, outputMode: "files_with_matches", headLimit: 5 });
    expect(first).toEqual({ mode: "files_with_matches", files: names.slice(0, 5), truncated: true, nextOffset: 5 });
    expect(downloads()).toBe(1);
    const counts = await ok(backend, { pattern: "x", outputMode: "count", headLimit: 10, offset: 45 });
    expect(counts).toEqual({ mode: "count", counts: names.slice(45, 55).map((path) => ({ path, count: 2 })), truncated: true, nextOffset: 55 });
    expect(downloads()).toBe(3);
    const last = await ok(backend, { pattern: "x", outputMode: "files_with_matches", headLimit: 50, offset: 100 });
    expect(last).toEqual({ mode: "files_with_matches", files: names.slice(100), truncated: false });
    // Content mode reports the total, so it reads everything.
    const lines = await ok(backend, { pattern: "x", headLimit: 3 });
    expect(lines).toMatchObject({ mode: "content", totalMatches: 240, truncated: true, nextOffset: 3 });
    expect(lines.mode === "content" && where(lines.lines)).toEqual(["/f/000.txt:1:x1", "/f/000.txt:3:x2", "/f/001.txt:1:x1"]);
  });
});

describe("the required literal of a regex", () => {
  const literal = (source: string) => requiredLiteral(parseRegex(source).alternatives);
  it("is derived only where every match must contain it", () => {
    expect(literal("colou?r")).toBe("colo");
    expect(literal("foo|bar")).toBe("");
    expect(literal("xa+b")).toBe("xa");
    expect(literal("a+bcd")).toBe("abcd");
    expect(literal("ab{2,}cd")).toBe("bcd");
    expect(literal("a\\.b[cd]ef")).toBe("a.b");
    expect(literal("\\bword\\b")).toBe("word");
    expect(literal("\\d+\\s*items")).toBe("items");
    expect(literal("(foo|bar)baz")).toBe("baz");
    expect(literal("x{0,3}yz")).toBe("yz");
    expect(literal("ab{x")).toBe("ab{x");
    expect(literal("a.*b")).toBe("a");
    expect(literal("\\x41BC")).toBe("BC");
    // Annex B: `\c` with no control letter is a backslash, then `c`; so `\c?` needs the backslash and never matches empty.
    expect(literal("\\cJx")).toBe("x");
    expect(literal("\\c?")).toBe("\\");
    expect(literal("a\\c1")).toBe("a\\c1");
    expect(parseRegex("(?i:abc)").unsure).toBe(true);
  });
});

// ---------------------------------------------------------------- property: search() equals a naive reference

const FILE_PATHS = ["/a.txt", "/b.md", "/d/c.txt", "/d/e/f.txt", "/node_modules/m.js", "/d/.git/g", "/bin.dat"];
const LINE_ALPHABET = ["a", "b", "A", "B", "c", " ", ".", "(", ")", "|", "*", "-"];
const REGEX_ALPHABET = ["a", "b", "A", "c", ".", "*", "+", "?", "|", "(", ")", "[", "]", "^", "$", "\\", "{", "}", "1", ",", "-", "b"];

const line = fc.array(fc.constantFrom(...LINE_ALPHABET), { maxLength: 8 }).map((chars) => chars.join(""));
const fileText = fc
  .tuple(fc.array(line, { maxLength: 6 }), fc.constantFrom("\n", "\r\n"), fc.boolean())
  .map(([lines, eol, finalEol]) => lines.join(eol) + (finalEol && lines.length > 0 ? eol : ""));
const tree = fc.dictionary(fc.constantFrom(...FILE_PATHS), fileText, { maxKeys: FILE_PATHS.length });
const regexPiece = fc
  .array(fc.constantFrom("a", "b", "c", "A", "ab", "ba", ".", "[ab]", "\\b", "b?", "a*", "c+", "a{2}", "^", "$"), { minLength: 1, maxLength: 3 })
  .map((tokens) => tokens.join(""));
const REGEX_TOKENS = ["a", "b", "c", "A", "ab", "ba", "|", "?", "*", "+", "(", ")", "(?:", ".", "[ab]", "[^a]", "\\b", "^", "$", "{2}", "{0,1}", "\\.", "\\(", "c+", "\\1", "(a)"];
const regexSource = fc.oneof(
  fc.array(fc.constantFrom(...REGEX_ALPHABET), { minLength: 1, maxLength: 7 }).map((chars) => chars.join("")),
  fc.array(fc.constantFrom(...REGEX_TOKENS), { minLength: 1, maxLength: 6 }).map((tokens) => tokens.join("")),
  // Well-formed pieces, alternated and grouped: where a careless prefilter would lose matches.
  fc
    .tuple(regexPiece, regexPiece, fc.constantFrom("", "?", "+", "*"), fc.constantFrom("%|%", "(%|%)", "(?:%|%)$1", "%$1|%"))
    .map(([x, y, q, shape]) => shape.replace("%", x).replace("%", y).replace("$1", q)),
);
const literalSource = fc.array(fc.constantFrom(...LINE_ALPHABET), { minLength: 1, maxLength: 3 }).map((chars) => chars.join(""));

const escape = (text: string) => text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");

/** The lines search() must answer, computed the obvious way. */
function reference(files: Record<string, string>, re: RegExp, before: number, after: number, includeIgnored: boolean): SearchLine[] {
  const out: SearchLine[] = [];
  for (const path of Object.keys(files).sort()) {
    if (path === "/bin.dat") continue;
    if (!includeIgnored && path.split("/").slice(0, -1).some((s) => s === "node_modules" || s === ".git")) continue;
    const lines = splitLines(files[path]!);
    const matches = new Set(lines.flatMap((text, i) => (re.test(text) ? [i] : [])));
    lines.forEach((text, i) => {
      let shown = false;
      for (const m of matches) if (i >= m - before && i <= m + after) shown = true;
      if (shown) out.push({ path, line: i + 1, text, match: matches.has(i) });
    });
  }
  return out;
}

/** Whether the regex finds a zero-length match somewhere in these probes. */
function matchesEmpty(source: string, flags: string, probes: string[]): boolean {
  const re = new RegExp(source, `${flags}g`);
  for (const probe of probes) {
    re.lastIndex = 0;
    for (let m = re.exec(probe); m !== null; m = re.exec(probe)) {
      if (m[0] === "") return true;
    }
  }
  return false;
}

describe.each([
  ["StateBackend", () => new StateBackend()],
  ["CompositeBackend", () => new CompositeBackend({ default: new StateBackend(), routes: { "/d/": new StateBackend() } })],
] as Array<[string, () => Backend]>)("search() against a naive reference over %s", (_name, make) => {
  it("finds exactly the reference's lines, for random trees, patterns and options", async () => {
    await fc.assert(
      fc.asyncProperty(
        tree,
        fc.oneof(regexSource.map((p) => ({ pattern: p, regex: true })), literalSource.map((p) => ({ pattern: p, regex: false }))),
        fc.record({ ignoreCase: fc.boolean(), before: fc.nat(2), after: fc.nat(2), includeIgnored: fc.boolean() }),
        async (files, { pattern, regex }, { ignoreCase, before, after, includeIgnored }) => {
          const backend = make();
          const uploads = Object.entries(files).map(([path, text]) => [path, path === "/bin.dat" ? encoder.encode(`${text}\0`) : encoder.encode(text)] as const);
          await backend.uploadFiles(uploads);
          const answer = await search(backend, { pattern, regex, ignoreCase, before, after, includeIgnored });
          const flags = ignoreCase ? "i" : "";
          let re: RegExp;
          try {
            re = new RegExp(regex ? pattern : escape(pattern), flags);
          } catch {
            expect(answer.error?.code).toBe("invalid_argument");
            return;
          }
          const probes = ["", "a", "b", "ab", "ba", "A", "c a", ...Object.values(files).flatMap(splitLines)];
          if (answer.error) {
            expect(answer.error.code).toBe("invalid_argument");
            // Refused: it matches the empty string somewhere, or it holds an assertion or a backreference, which
            // the refusal counts as possibly empty (`^\b$|a` never matches empty, yet is refused: conservative).
            const conservative = /[$^]|\\[bB1-9]|\(\?[=!<]/.test(pattern);
            expect(regex && (matchesEmpty(pattern, flags, probes) || conservative), `refused ${pattern}`).toBe(true);
            return;
          }
          if (regex) expect(matchesEmpty(pattern, flags, probes), `accepted ${pattern}, which matches empty`).toBe(false);
          const expected = reference(files, re, before, after, includeIgnored);
          expect(answer.mode).toBe("content");
          if (answer.mode !== "content") return;
          expect(answer.lines).toEqual(expected);
          expect(answer.totalMatches).toBe(expected.filter((l) => l.match).length);
        },
      ),
      { numRuns: 1000 },
    );
  });
});
