/**
 * The shared suite through the audit wrapper: over StateBackend and over a
 * bubblewrap sandbox, so recording provably changes no answer. The sink is
 * deliberately hostile (it throws on every other record) to show a failing
 * log changes nothing either.
 */
import { audited, MemoryAuditLog, type AuditRecord } from "../backends/audit.js";
import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";

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

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\``);

runConformance({
  name: "AuditedSandbox over BubblewrapSandbox",
  create: () => audited(new BubblewrapSandbox(), { log: new MemoryAuditLog() }),
  root: (sandbox) => sandbox.backend.workspace,
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  // Fewer generated trees than the sandbox's own run (which covers the sandbox): under load, 25 outrun the 60 s limit.
  capabilities: { execute: true, propertyRuns: 10 },
});
