/**
 * The shared suite through the audit wrapper: over StateBackend and over a
 * local sandbox, so recording provably changes no answer. The sink is
 * deliberately hostile (it throws on every other record) to show a failing
 * log changes nothing either.
 */
import { audited, MemoryAuditLog, type AuditRecord } from "../backends/audit.js";
import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";
import { LocalSandbox } from "../sandboxes/local.js";

let n = 0;
const flaky = {
  append(record: AuditRecord) {
    if (n++ % 2 === 0) throw new Error("sink down");
    return new Promise<void>((resolve) => setTimeout(resolve, 1)).then(() => void record);
  },
};

runConformance({
  name: "AuditedBackend over StateBackend",
  create: () => audited(new StateBackend(), { log: new MemoryAuditLog(), context: { toolCallId: "t1" } }),
  capabilities: { filesUpdate: true },
});

runConformance({
  name: "AuditedBackend over StateBackend (failing sink)",
  create: () => audited(new StateBackend(), { log: flaky }),
  capabilities: { filesUpdate: true, propertyRuns: 10 },
});

// The sandbox half of the wrapper (execute, spawn, close) over LocalSandbox: the wrapper's code is
// the same over every sandbox, and each sandbox's own suite covers the sandbox. The suite writes
// names the secrets preset denies, so the rules are off (test/permissions.test.ts covers them).
runConformance({
  name: "AuditedSandbox over LocalSandbox",
  create: () => audited(new LocalSandbox({ permissions: false }), { log: new MemoryAuditLog() }),
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  capabilities: { execute: true },
});
