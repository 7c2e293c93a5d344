/**
 * OverlaySandbox through the shared suite, commands included: over
 * bubblewrap and over local processes, each on an OverlayBackend over an
 * empty directory (the suite writes names the secrets preset denies, so rules
 * are off here, as in test/overlay.conformance.test.ts).
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { OverlayBackend } from "../backends/overlay.js";
import { runConformance } from "../conformance/index.js";
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { LocalSandbox } from "../sandboxes/local.js";
import { OverlaySandbox } from "../sandboxes/overlay.js";

const missing = await BubblewrapSandbox.unavailableReason();
if (missing) throw new Error(`${missing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

const kinds = [
  { name: "bubblewrap", make: (dir: string) => new BubblewrapSandbox({ workspace: dir, permissions: false }) },
  { name: "local processes", make: (dir: string) => new LocalSandbox({ workspace: dir, permissions: false }) },
];

for (const { name, make } of kinds) {
  runConformance({
    name: `OverlaySandbox (over ${name})`,
    create: async () => {
      const overlay = new OverlayBackend({ workspace: await fs.mkdtemp(path.join(os.tmpdir(), "strata-overlay-sandbox-")), permissions: false });
      return OverlaySandbox.open({ overlay, sandbox: make });
    },
    root: (sandbox) => sandbox.root,
    destroy: async (sandbox) => {
      await sandbox.close();
      await fs.rm(sandbox.overlay.workspace, { recursive: true, force: true });
    },
    close: (sandbox) => sandbox.close(),
    capabilities: { execute: true, realDirectories: true, links: false },
  });
}
