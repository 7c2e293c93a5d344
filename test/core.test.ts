import fc from "fast-check";
import picomatch from "picomatch";
import { describe, expect, it } from "vitest";
import {
  applyEdit,
  compileGlob,
  fileDataFromBytes,
  fileDataSize,
  fileDataText,
  formatRead,
  grepText,
  normalizePath,
  renderLines,
  splitLines,
  toFileDataV2,
  type GrepMatch,
} from "../core/index.js";
import { decodeBase64, encodeBase64 } from "../core/filedata.js";
import { literalPrefix } from "../core/glob.js";
import { browserBundleInputs } from "./support/browser-bundle.js";

describe("normalizePath", () => {
  it("is idempotent and always absolute", () => {
    const segment = fc.stringMatching(/^[a-z.é ]{1,6}$/).filter((s) => s !== ".." && s.trim() !== "" && !s.startsWith("~"));
    fc.assert(
      fc.property(fc.array(fc.oneof(segment, fc.constant("."), fc.constant("")), { maxLength: 8 }), (segments) => {
        const once = normalizePath(`/${segments.join("/")}`);
        expect(normalizePath(once)).toBe(once);
        expect(once.startsWith("/")).toBe(true);
        expect(once === "/" || !once.endsWith("/")).toBe(true);
        expect(once.split("/")).not.toContain(".");
      }),
    );
  });
  it("answers an already normal path (its one-scan route) as the full route does", () => {
    // A leading "//" always takes the full route, and folds to the same path.
    const outcome = (path: string) => {
      try {
        return normalizePath(path);
      } catch {
        return "refused";
      }
    };
    const piece = fc.oneof(fc.constantFrom("/", ".", "..", "\\", "~", "\0", "é", " ", ".strata-tmp-", ".strata-lock-", ".strata-", "C:"), fc.stringMatching(/^[a-z.]{1,4}$/));
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 10 }), (pieces) => {
        const path = `/${pieces.join("")}`;
        expect(outcome(path)).toBe(outcome(`/${path}`));
      }),
      { numRuns: 2000 },
    );
    expect(normalizePath(`/${"x".repeat(255)}`)).toBe(`/${"x".repeat(255)}`);
    expect(outcome(`/${"x".repeat(256)}`)).toBe("refused");
    expect(outcome(`/a/${"x".repeat(4094)}`)).toBe("refused");
  });
});

describe("read formatting", () => {
  it("equals rendering the split lines, for any text and window", () => {
    const text = fc.array(fc.constantFrom("a", "b", "\n", "\r\n", "\r", "ü", " "), { maxLength: 40 }).map((p) => p.join(""));
    fc.assert(
      fc.property(text, fc.nat(12), fc.integer({ min: 1, max: 12 }), (content, offset, limit) => {
        const lines = splitLines(content);
        let expected: string;
        if (lines.length === 0 && offset === 0) expected = "System reminder: File exists but has empty contents";
        else if (offset >= lines.length) expected = "error";
        else expected = renderLines(lines.slice(offset, offset + limit), offset + 1);
        let actual: string;
        try {
          actual = formatRead(content, "/f", offset, limit);
        } catch {
          actual = "error";
        }
        expect(actual).toBe(expected);
      }),
    );
  });
});

describe("grepText", () => {
  it("finds exactly the lines that contain the pattern", () => {
    const text = fc.array(fc.constantFrom("ab", "a", "b", "\n", "\r\n", "x"), { maxLength: 30 }).map((p) => p.join(""));
    fc.assert(
      fc.property(text, fc.constantFrom("a", "ab", "b", "x", "bx"), (content, pattern) => {
        const found: GrepMatch[] = [];
        grepText("/f", content, pattern, found);
        const expected = splitLines(content)
          .map((line, i) => ({ path: "/f", line: i + 1, text: line }))
          .filter((m) => m.text.includes(pattern));
        expect(found).toEqual(expected);
      }),
    );
  });
});

describe("applyEdit", () => {
  it("replaceAll removes every occurrence and counts them", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 30 }), fc.constantFrom("a", "ab", "\n"), (text, old) => {
        const count = text.split(old).length - 1;
        if (count === 0) return;
        const { text: out, occurrences } = applyEdit(text, old, "\u0001", true, "/f");
        expect(occurrences).toBe(count);
        expect(out.split("\u0001").length - 1).toBe(count);
      }),
    );
  });
});

describe("glob", () => {
  it("computes the literal root of a pattern", () => {
    expect(literalPrefix("src/lib/**/*.ts")).toBe("src/lib");
    expect(literalPrefix("**/*.ts")).toBe("");
    expect(literalPrefix("a/{b,c}/d")).toBe("a");
    expect(compileGlob("src/lib/*.ts", "/repo").root).toBe("/repo/src/lib");
    expect(compileGlob("*.ts", "/repo").root).toBe("/repo");
  });

  it("never matches outside the search path, even with an absolute pattern", () => {
    const m = compileGlob("/etc/*", "/home");
    expect(m("/etc/passwd")).toBe(false);
  });

  it("answers `**/X` by the name alone (byName too) exactly as picomatch answers the path relative to the search path", () => {
    const options = { dot: true, noextglob: true, nonegate: true, strictSlashes: true, flags: "s" } as const;
    const name = fc.constantFrom("a.ts", ".a.ts", "b", "ab.js", ".", "x.ts.bak", "é.ts", "a b.ts", "[a].ts", "**", ".ts", "x.d.ts", ".d.ts", "a..ts", "a.TS");
    const tail = fc.constantFrom("*.ts", "*", "?", ".*", "a*", "[ab]*", "{a,b}*", "*.{ts,js}", "**", "a\\*", "*.ts*", "*.d.ts", "*..ts", "*.d-x_1");
    fc.assert(
      fc.property(fc.array(name, { minLength: 0, maxLength: 4 }), fc.integer({ min: 1, max: 3 }), tail, fc.constantFrom("/", "/src"), (segments, stars, x, searchPath) => {
        const body = `${"**/".repeat(stars)}${x}`;
        const path = segments.length === 0 ? searchPath : `${searchPath === "/" ? "" : searchPath}/${segments.join("/")}`;
        if (segments.includes(".")) return; // not a normalised path
        const relative = path === searchPath ? "" : path.slice(searchPath === "/" ? 1 : searchPath.length + 1);
        const expected = relative !== "" && picomatch(body, options)(relative);
        const matcher = compileGlob(body, searchPath);
        expect(matcher(path), `${body} ${path}`).toBe(expected);
        if (path !== matcher.root) expect(matcher.byName!(path.slice(path.lastIndexOf("/") + 1)), `byName ${body} ${path}`).toBe(expected);
      }),
      { numRuns: 2000 },
    );
  });
});

describe("file data", () => {
  it("round-trips any bytes through base64 and sizes them", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => {
        expect(Array.from(decodeBase64(encodeBase64(bytes)))).toEqual(Array.from(bytes));
        expect(fileDataSize(fileDataFromBytes(bytes))).toBe(bytes.length);
      }),
    );
  });

  it("reads v1 records as joined lines", () => {
    const v1 = { content: ["a", "b", ""], created_at: "t0", modified_at: "t1" };
    expect(toFileDataV2(v1)).toEqual({ content: "a\nb\n", encoding: "utf-8", created_at: "t0", modified_at: "t1" });
    expect(fileDataText(v1)).toBe("a\nb\n");
  });
});

describe("browser build", () => {
  it("bundles core and the in-memory backends for a browser with no Node built-ins", async () => {
    const inputs = await browserBundleInputs(process.cwd(), ["core/index.ts", "backends/state.ts", "backends/composite.ts", "stores/memory.ts"], "ts");
    // glob and diff work in the bundle: their packages are in it, not loaded at run time.
    expect(inputs.some((input) => input.includes("node_modules/picomatch/"))).toBe(true);
    expect(inputs.some((input) => input.includes("node_modules/diff/"))).toBe(true);
  });
});
