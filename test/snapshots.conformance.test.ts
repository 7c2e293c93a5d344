/**
 * The shared suite over a StateBackend whose snapshot journal is live: after
 * every operation the wrapper restores the snapshot taken before it, then the
 * one after it, and checks every record is back (the same objects), so
 * following changes for snapshots provably alters no answer, concurrency
 * sections included, and restore is exact for every change the suite makes.
 * The same over a StoreBackend on a MemoryStore, whose restore is also
 * synchronous (the SQL stores' restores are transactions: another operation
 * would land between the two restores, so they are tested by property instead).
 */
import { StateBackend } from "../backends/state.js";
import { StoreBackend } from "../backends/store.js";
import { runConformance } from "../conformance/index.js";
import { MemoryStore } from "../stores/memory.js";

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

/** The same wrapper for a StoreBackend over a MemoryStore: its synchronous snapshot and restore, back and forth after every operation. */
function snapshottingStore(backend: StoreBackend): StoreBackend {
  const store = backend.store as MemoryStore;
  return new Proxy(backend, {
    get(target, key, receiver) {
      const value: unknown = Reflect.get(target, key, receiver);
      if (typeof value !== "function" || typeof key !== "string" || key === "constructor") return value;
      return async (...args: unknown[]) => {
        const namespace = target.namespace;
        let before: string;
        try {
          before = store.snapshotSync(namespace);
        } catch {
          // A closed store: the operation answers for itself.
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        }
        const answer: unknown = await (value as (...a: unknown[]) => unknown).apply(target, args);
        let after: string;
        try {
          after = store.snapshotSync(namespace);
        } catch {
          return answer; // closed by the operation
        }
        store.restoreSync(namespace, before);
        const restored = store.restoreSync(namespace, after);
        if (restored.snapshot !== after) throw new Error("restore did not land on the snapshot");
        return answer;
      };
    },
  });
}

runConformance({
  name: "StoreBackend over MemoryStore with live snapshots",
  create: () => snapshottingStore(new StoreBackend({ store: new MemoryStore() })),
  destroy: (backend) => backend.store.close(),
  close: (backend) => backend.store.close(),
  capabilities: { closedCode: "unavailable" },
});
