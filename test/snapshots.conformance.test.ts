/**
 * The shared suite over a StateBackend whose snapshot journal is live: after
 * every operation the wrapper restores the snapshot taken before it, then the
 * one after it, and checks every record is back (the same objects), so
 * following changes for snapshots provably alters no answer, concurrency
 * sections included, and restore is exact for every change the suite makes.
 */
import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";

function snapshotting(backend: StateBackend): StateBackend {
  return new Proxy(backend, {
    get(target, key, receiver) {
      const value: unknown = Reflect.get(target, key, receiver);
      if (typeof value !== "function" || typeof key !== "string" || key === "constructor") return value;
      return async (...args: unknown[]) => {
        const before = target.snapshot();
        const answer: unknown = await (value as (...a: unknown[]) => unknown).apply(target, args);
        // Back to before the operation and forward again, in one synchronous step: nothing may differ.
        const files = { ...target.files };
        const after = target.snapshot();
        target.restore(before);
        const restored = target.restore(after);
        if (restored.error) throw new Error(restored.error.message);
        const now = target.files;
        const keys = Object.keys(files);
        if (keys.length !== Object.keys(now).length || keys.some((key) => now[key] !== files[key])) throw new Error("restore was not exact");
        return answer;
      };
    },
  });
}

runConformance({
  name: "StateBackend with live snapshots",
  create: () => snapshotting(new StateBackend()),
  capabilities: { filesUpdate: true },
});
