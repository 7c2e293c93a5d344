/**
 * Containment, for every isolating sandbox: one entry per sandbox in the
 * list below (the Docker sandbox adds itself here). A sandbox whose engine
 * is missing fails the file, with what to install; it is never skipped.
 */
import { BubblewrapSandbox } from "../sandboxes/bubblewrap.js";
import { containmentCases, type ContainmentTarget } from "./containment-cases.js";

const bwrapMissing = await BubblewrapSandbox.unavailableReason();
if (bwrapMissing) throw new Error(`${bwrapMissing}; run \`bash scripts/services/20-bubblewrap.sh\` (npm test does this for you)`);

const targets: ContainmentTarget[] = [
  {
    name: "bubblewrap",
    create: async (limits) => new BubblewrapSandbox(limits),
    hostWorkspace: (sandbox) => (sandbox as BubblewrapSandbox).hostWorkspace,
  },
  {
    name: "bubblewrap (BusyBox userland)",
    create: async (limits) => new BubblewrapSandbox({ ...limits, toolset: "busybox" }),
    hostWorkspace: (sandbox) => (sandbox as BubblewrapSandbox).hostWorkspace,
  },
];

for (const target of targets) containmentCases(target);
