/**
 * Snapshots, restore, diff and fork on StateBackend: restore is exact after
 * any mix of changes (property test), later snapshots survive a restore,
 * a fork is independent, changes made through a foreign state object are
 * undone too, concurrent readers see old or restored, never a mix, and 1000
 * snapshots with small edits stay within 2x the memory of the largest state.
 */
import fc from "fast-check";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { StateBackend } from "../backends/state.js";
import { BackendRuntime } from "../core/protocol.js";
import { fileDataText, fileDataFromText } from "../core/filedata.js";

/** The files as plain text (binary as base64), for exact comparison. */
function contents(backend: StateBackend): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [path, data] of Object.entries(backend.files).sort(([a], [b]) => (a < b ? -1 : 1))) {
    out[path] = `${"encoding" in data ? data.encoding : "v1"}:${fileDataText(data) ?? (data.content as string)}`;
  }
  return out;
}

const paths = fc.constantFrom("/a", "/b", "/d/x", "/d/y", "/d/e/z", "/e", "/d");
const text = fc.constantFrom("", "one\n", "two\ntwo\n", "three", "x\ny\nz\n");
const operation = fc.oneof(
  fc.record({ op: fc.constant("write" as const), path: paths, text, overwrite: fc.boolean() }),
  fc.record({ op: fc.constant("edit" as const), path: paths, from: fc.constantFrom("one", "two", "x"), to: text, all: fc.boolean() }),
  fc.record({ op: fc.constant("delete" as const), path: paths }),
  fc.record({ op: fc.constant("move" as const), path: paths, to: paths, overwrite: fc.boolean() }),
  fc.record({ op: fc.constant("copy" as const), path: paths, to: paths, overwrite: fc.boolean() }),
  fc.record({ op: fc.constant("upload" as const), path: paths }),
  fc.record({ op: fc.constant("snapshot" as const) }),
  fc.record({ op: fc.constant("restore" as const), pick: fc.nat() }),
);

type Op = typeof operation extends fc.Arbitrary<infer T> ? T : never;

async function apply(backend: StateBackend, step: Op, taken: Array<[string, Record<string, string>]>): Promise<void> {
  switch (step.op) {
    case "write": await backend.write(step.path, step.text, { overwrite: step.overwrite }); break;
    case "edit": await backend.edit(step.path, step.from, step.to, { replaceAll: step.all }); break;
    case "delete": await backend.delete(step.path); break;
    case "move": await backend.move(step.path, step.to, { overwrite: step.overwrite }); break;
    case "copy": await backend.copy(step.path, step.to, { overwrite: step.overwrite }); break;
    case "upload": await backend.uploadFiles([[step.path, Uint8Array.of(0, 255, 1)]]); break;
    case "snapshot": taken.push([backend.snapshot(), contents(backend)]); break;
    case "restore":
      if (taken.length > 0) {
        const [id, expected] = taken[step.pick % taken.length]!;
        expect(backend.restore(id)).toMatchObject({ snapshot: id });
        expect(contents(backend)).toEqual(expected);
      }
      break;
  }
}

describe("StateBackend snapshots", () => {
  it("restore is exact after any mix of writes, edits, deletes, moves, copies, uploads and restores (property)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(operation, { maxLength: 40 }), fc.array(fc.nat(), { maxLength: 8 }), async (steps, picks) => {
        const backend = new StateBackend();
        const taken: Array<[string, Record<string, string>]> = [[backend.snapshot(), {}]];
        for (const step of steps) await apply(backend, step, taken);
        const now = contents(backend);
        const latest = backend.snapshot();
        // Every snapshot, in random order, then back to the latest.
        for (const pick of picks) {
          const [id, expected] = taken[pick % taken.length]!;
          backend.restore(id);
          expect(contents(backend)).toEqual(expected);
          // The index follows: listings and searches agree with the records.
          const globbed = (await backend.glob("**")).entries!.map((e) => e.path);
          expect(globbed).toEqual(Object.keys(expected));
        }
        backend.restore(latest);
        expect(contents(backend)).toEqual(now);
      }),
      { numRuns: 300 },
    );
  });

  it("diff between any two snapshots names exactly the files that differ, with a unified diff", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(operation, { maxLength: 30 }), fc.nat(), fc.nat(), async (steps, i, j) => {
        const backend = new StateBackend();
        const taken: Array<[string, Record<string, string>]> = [[backend.snapshot(), {}]];
        for (const step of steps) await apply(backend, step, taken);
        taken.push(["now", contents(backend)]);
        const [a, before] = taken[i % taken.length]!;
        const [b, after] = taken[j % taken.length]!;
        if (a === "now") return;
        const answer = backend.diff(a, b);
        if (answer.error) throw new Error(answer.error.message);
        const expected = [...new Set([...Object.keys(before), ...Object.keys(after)])]
          .filter((p) => before[p] !== after[p])
          .sort()
          .map((path) => ({ path, kind: before[path] === undefined ? "added" : after[path] === undefined ? "deleted" : "modified" }));
        expect(answer.changes.map(({ path, kind }) => ({ path, kind }))).toEqual(expected);
      }),
      { numRuns: 200 },
    );
  });

  it("diff gives a unified text diff per file, against now by default", async () => {
    const backend = new StateBackend();
    await backend.write("/keep.txt", "same\n");
    await backend.write("/a.txt", "one\ntwo\n");
    await backend.write("/gone.txt", "bye\n");
    const s1 = backend.snapshot();
    await backend.edit("/a.txt", "two", "TWO");
    await backend.delete("/gone.txt");
    await backend.write("/new.txt", "hi\n");
    await backend.write("/keep.txt", "same\n", { overwrite: true });
    await backend.uploadFiles([["/bin", Uint8Array.of(0, 1)]]);
    const answer = backend.diff(s1);
    expect(answer.changes?.map((c) => [c.path, c.kind])).toEqual([
      ["/a.txt", "modified"],
      ["/bin", "added"],
      ["/gone.txt", "deleted"],
      ["/new.txt", "added"],
    ]);
    const a = answer.changes![0]!;
    expect(a.patch).toContain("--- a/a.txt");
    expect(a.patch).toContain("+++ b/a.txt");
    expect(a.patch).toContain("-two\n+TWO");
    expect(answer.changes![1]!.patch).toBeUndefined();
    expect(answer.changes![2]).toMatchObject({ sizeBefore: 4 });
    expect(answer.changes![2]!.patch).toContain("+++ /dev/null");
    expect(backend.diff("nope").error?.code).toBe("invalid_argument");
    expect(backend.restore("nope").error?.code).toBe("invalid_argument");
    expect(backend.restore(42 as unknown as string).error?.code).toBe("invalid_argument");
  });

  it("a snapshot with nothing changed since the last is the same id; ids of another backend are refused", async () => {
    const one = new StateBackend();
    const two = new StateBackend();
    await one.write("/a", "x");
    const s = one.snapshot();
    expect(one.snapshot()).toBe(s);
    expect(two.restore(s).error?.code).toBe("invalid_argument");
  });

  it("fork: an independent backend sharing the records", async () => {
    const parent = new StateBackend({ quota: { maxFiles: 10 } });
    await parent.write("/a", "a");
    await parent.write("/d/b", "b");
    const child = parent.fork();
    expect(child.files["/a"]).toBe(parent.files["/a"]);
    await child.write("/a", "child", { overwrite: true });
    await child.delete("/d");
    await parent.write("/p", "p");
    expect(contents(parent)).toEqual({ "/a": "utf-8:a", "/d/b": "utf-8:b", "/p": "utf-8:p" });
    expect(contents(child)).toEqual({ "/a": "utf-8:child" });
    for (let i = 0; i < 9; i++) await child.write(`/f${i}`, "x");
    expect((await child.write("/over", "x")).error?.code).toBe("quota_exceeded");
  });

  it("undoes changes made through a foreign state object, in place or by replacing the map", async () => {
    const runtime = { state: { files: {} as Record<string, unknown> } };
    const backend = new StateBackend(runtime);
    await backend.write("/a", "a");
    const s1 = backend.snapshot();
    // In place, through the state (the proxy the backend installed).
    (runtime.state.files as Record<string, unknown>)["/b"] = fileDataFromText("b");
    delete (runtime.state.files as Record<string, unknown>)["/a"];
    const s2 = backend.snapshot();
    expect(contents(backend)).toEqual({ "/b": "utf-8:b" });
    // Replaced wholesale, as a reducer would: compared key by key at the next snapshot.
    runtime.state.files = { "/c": fileDataFromText("c"), "/b": (runtime.state.files as Record<string, unknown>)["/b"] };
    const s3 = backend.snapshot();
    expect(backend.diff(s2, s3).changes?.map((c) => [c.path, c.kind])).toEqual([["/c", "added"]]);
    backend.restore(s1);
    expect(contents(backend)).toEqual({ "/a": "utf-8:a" });
    expect((runtime.state.files as Record<string, { content: string }>)["/a"]!.content).toBe("a");
    backend.restore(s3);
    expect(contents(backend)).toEqual({ "/b": "utf-8:b", "/c": "utf-8:c" });
    backend.restore(s2);
    expect(contents(backend)).toEqual({ "/b": "utf-8:b" });
  });

  it("two backends on one map: each one's snapshots see the other's changes", async () => {
    const runtime = new BackendRuntime({ files: {} });
    const one = new StateBackend({ runtime });
    const two = new StateBackend({ runtime });
    const s0 = one.snapshot();
    await two.write("/x", "x");
    await two.write("/y", "y");
    expect(one.diff(s0).changes?.map((c) => c.path)).toEqual(["/x", "/y"]);
    one.restore(s0);
    expect(await two.ls("/")).toEqual({ entries: [] });
  });

  it("readers and writers racing restore see the old files or the restored ones, never a mix", async () => {
    const backend = new StateBackend();
    for (let i = 0; i < 200; i++) await backend.write(`/f${i}`, "old-e\n");
    const before = backend.snapshot();
    for (let i = 0; i < 200; i++) await backend.write(`/f${i}`, "new-e\n", { overwrite: true });
    const calls: Array<Promise<unknown>> = [];
    for (let round = 0; round < 50; round++) {
      calls.push(backend.grep("-e", { glob: "/f*", maxCount: 10_000 }).then((r) => new Set(r.matches!.map((m) => m.text.slice(0, 3)))));
      // An edit either lands before the restore (and is undone) or after it (and finds the old text).
      calls.push(backend.edit(`/f${round}`, "-e", "-edited").then((r) => (r.error ? "refused" : "edited")));
      if (round === 25) calls.push(Promise.resolve().then(() => backend.restore(before)));
    }
    const answers = await Promise.all(calls);
    for (const seen of answers) if (seen instanceof Set) expect(seen.size).toBe(1);
    const texts = new Set(Object.values(contents(backend)));
    // Edits after the restore found "old-e" and changed it; none of "new" survives.
    expect([...texts].every((t) => t.startsWith("utf-8:old"))).toBe(true);
  });
});

describe("StateBackend snapshots: memory", () => {
  it("1000 snapshots with small edits stay within 2x the memory of the largest state", async () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const heap = () => {
      for (let i = 0; i < 3; i++) gc();
      return process.memoryUsage().heapUsed;
    };
    const empty = heap();
    const backend = new StateBackend();
    const files = 4000;
    for (let i = 0; i < files; i++) await backend.write(`/src/m${i % 40}/f${i}.ts`, `// file ${i}\n${`const v${i} = ${i};\n`.repeat(60)}`);
    const state = heap() - empty;
    const ids: string[] = [];
    for (let n = 0; n < 1000; n++) {
      const i = (n * 7919) % files;
      await backend.edit(`/src/m${i % 40}/f${i}.ts`, `// file ${i}`, `// file ${i} edited ${n}`);
      ids.push(backend.snapshot());
    }
    const total = heap() - empty;
    // The largest state is the last one (edits only grow it); everything held must be within twice it.
    console.log(`state ${(state / 2 ** 20).toFixed(1)} MiB, with 1000 snapshots ${(total / 2 ** 20).toFixed(1)} MiB (${(total / state).toFixed(2)}x)`);
    expect(total).toBeLessThan(2 * state);
    // And they are all still good.
    expect(backend.restore(ids[0]!)).toMatchObject({ snapshot: ids[0] });
    expect(backend.diff(ids[0]!, ids[999]!).changes!.length).toBeGreaterThan(500);
  }, 120_000);
});
