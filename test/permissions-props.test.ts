import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { PermissionPolicy, type PermissionAction, type PermissionRule } from "../core/permissions.js";
import { baseName, parentOf } from "../core/paths.js";

/** find's -name: `*` any bytes (a dot and a newline too), everything else literal. */
function findName(glob: string, name: string): boolean {
  const re = new RegExp(`^${glob.split("*").map((s) => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")).join(".*")}$`, "s");
  return re.test(name);
}

const seg = fc.constantFrom("a", "b", "ab", "*", "?", "**", "a*", "*b", "a**b", "a?", ".", ".a", "{a,b}", "[ab]", "a.b", "x");
const pattern = fc
  .tuple(fc.constantFrom("", "/", "**/", "./", "/a/"), fc.array(seg, { minLength: 1, maxLength: 4 }), fc.constantFrom("", "/"))
  .map(([head, segs, tail]) => head + segs.join("/") + tail);
const rule = fc.record({
  action: fc.constantFrom<PermissionAction>("deny", "ask", "allow"),
  paths: fc.array(pattern, { minLength: 1, maxLength: 2 }),
});
const name = fc.constantFrom("a", "b", "ab", "aab", "x", ".a", "a.b", "axb", "c", "A", "a\nb", "a/");
const path = fc.array(name, { minLength: 1, maxLength: 5 }).map((names) => `/${names.join("/")}`.replace(/\/+/g, "/").replace(/(.)\/$/, "$1"));

function policyOf(rules: PermissionRule[], root = "/a"): PermissionPolicy | undefined {
  try {
    return new PermissionPolicy(rules.map((r) => ({ ...r, operations: ["delete", "read"] })), root);
  } catch {
    return undefined;
  }
}

describe("PermissionPolicy shortcuts agree with check", () => {
  it("refusalNames: a path below a root that a deny or ask rule refuses bears a name below the root", () => {
    fc.assert(
      fc.property(fc.array(rule, { minLength: 1, maxLength: 3 }), path, fc.nat(5), (rules, target, cut) => {
        const policy = policyOf(rules);
        if (!policy) return;
        const names = policy.refusalNames("delete");
        if (names === undefined) return;
        const parts = target.split("/").slice(1);
        const depth = Math.min(cut, parts.length - 1);
        const root = `/${parts.slice(0, depth).join("/")}`;
        // The root and its ancestors are checked on their own; only a refusal coming from below the root matters.
        if (depth > 0 && policy.check("delete", root).action !== "allow") return;
        if (policy.check("delete", target).action === "allow") return;
        const below = parts.slice(depth);
        expect(below.some((n) => names.some((g) => findName(g, n))), `${JSON.stringify(rules)} ${target} root ${root} names ${JSON.stringify(names)}`).toBe(true);
      }),
      { numRuns: 20000 },
    );
  });

  it("listingDenial, and nameDenial for a child, equal check(...).action === 'deny'", () => {
    fc.assert(
      fc.property(fc.array(rule, { minLength: 1, maxLength: 3 }), path, fc.boolean(), fc.boolean(), (rules, child, slash, deeper) => {
        const policy = policyOf(rules);
        if (!policy) return;
        const parts = child.split("/");
        const dir = parts.length > 2 ? parts.slice(0, deeper ? -2 : -1).join("/") || "/" : "/";
        const entry = slash ? `${child}/` : child;
        expect(policy.listingDenial("read", dir)(entry), `${JSON.stringify(rules)} dir ${dir} entry ${entry}`).toBe(policy.check("read", entry).action === "deny");
        // nameDenial: the same answer from the entry's name alone, for a child of dir.
        if (dir === parentOf(child) && child !== "/") {
          expect(policy.nameDenial("read", dir)(baseName(child)), `${JSON.stringify(rules)} dir ${dir} name of ${child}`).toBe(policy.check("read", entry).action === "deny");
        }
      }),
      { numRuns: 20000 },
    );
  });
});
