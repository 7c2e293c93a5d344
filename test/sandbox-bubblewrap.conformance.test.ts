/**
 * BubblewrapSandbox through the shared suite, twice: over the host's GNU
 * userland and over BusyBox (Debian's busybox-static as /bin and /usr/bin),
 * so every file operation BaseSandbox derives from the shell is proven on both.
 */
import { runConformance } from "../conformance/index.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

// The suite writes names the default secrets preset denies (.env, …): this file tests the backend's semantics, so it opts out; test/permissions.test.ts covers the preset.
for (const toolset of ["host", "busybox"] as const) {
  runConformance({
    name: `BubblewrapSandbox (${toolset === "host" ? "GNU coreutils" : "BusyBox"})`,
    create: () => new BubblewrapSandbox({ toolset, permissions: false }),
    root: (sandbox) => sandbox.workspace,
    destroy: (sandbox) => sandbox.close(),
    close: (sandbox) => sandbox.close(),
    capabilities: { execute: true },
  });
}
