/**
 * MCP cancellation reaches the native API through the `signal` option every
 * operation takes. The tool definitions do not carry a signal, so each MCP
 * session sees its backend through `withCallSignal`: a view that adds the
 * signal of the call in progress (kept in an AsyncLocalStorage, so parallel
 * calls each carry their own) to the options of every operation.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import type { Backend } from "../core/protocol.js";

/** Where each operation takes its options object (the argument index). */
const OPTIONS_AT: Readonly<Record<string, number>> = {
  ls: 1,
  read: 1,
  readRaw: 1,
  write: 2,
  edit: 3,
  delete: 1,
  grep: 1,
  glob: 1,
  stat: 1,
  mkdir: 1,
  move: 2,
  copy: 2,
  uploadFiles: 1,
  downloadFiles: 1,
  execute: 1,
  spawn: 1,
};

const current = new AsyncLocalStorage<AbortSignal>();

/** Runs `fn` with `signal` as the signal every operation of a `withCallSignal` view receives. */
export function runWithSignal<T>(signal: AbortSignal, fn: () => Promise<T>): Promise<T> {
  return current.run(signal, fn);
}

/** A view of `backend` whose operations also honour the signal of the call in progress. */
export function withCallSignal<B extends Backend>(backend: B): B {
  return new Proxy(backend, {
    get(target, key) {
      const value: unknown = Reflect.get(target, key, target);
      if (typeof value !== "function") return value;
      const at = typeof key === "string" ? OPTIONS_AT[key] : undefined;
      if (at === undefined) return value.bind(target);
      return (...args: unknown[]) => {
        const signal = current.getStore();
        const options = args[at];
        // Anything but an options object (or none) is left for the backend to refuse.
        if (signal === undefined || (options !== undefined && (typeof options !== "object" || options === null || Array.isArray(options)))) {
          return value.apply(target, args);
        }
        const given = (options as { signal?: unknown } | undefined)?.signal;
        const both = given instanceof AbortSignal ? anyOf(given, signal) : signal;
        const call = args.slice();
        while (call.length < at) call.push(undefined);
        call[at] = { ...(options as object | undefined), signal: both };
        return value.apply(target, call);
      };
    },
  });
}

/** AbortSignal.any, which Node 20 has only from 20.3. */
function anyOf(a: AbortSignal, b: AbortSignal): AbortSignal {
  if (typeof AbortSignal.any === "function") return AbortSignal.any([a, b]);
  const controller = new AbortController();
  const abort = (from: AbortSignal) => () => controller.abort(from.reason);
  if (a.aborted || b.aborted) controller.abort((a.aborted ? a : b).reason);
  else {
    a.addEventListener("abort", abort(a), { once: true });
    b.addEventListener("abort", abort(b), { once: true });
  }
  return controller.signal;
}
