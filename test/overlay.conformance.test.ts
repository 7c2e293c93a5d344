import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { OverlayBackend } from "../backends/overlay.js";
import { runConformance } from "../conformance/index.js";
import { SqliteStore } from "../stores/sqlite.js";

// As test/filesystem.conformance.test.ts: the suite writes names the secrets preset denies, so rules are off here.
const stores = new WeakMap<OverlayBackend, SqliteStore>();

runConformance({
  name: "OverlayBackend (layer in memory)",
  create: async () => new OverlayBackend({ workspace: await fs.mkdtemp(path.join(os.tmpdir(), "strata-overlay-")), permissions: false }),
  destroy: (backend) => fs.rm(backend.workspace, { recursive: true, force: true }),
  capabilities: { realDirectories: true },
});

runConformance({
  name: "OverlayBackend (layer in SQLite)",
  create: async () => {
    const workspace = await fs.mkdtemp(path.join(os.tmpdir(), "strata-overlay-"));
    const store = new SqliteStore({ path: path.join(workspace, "..", `${path.basename(workspace)}.db`) });
    const backend = new OverlayBackend({ workspace, store, namespace: ["overlay", "conformance"], permissions: false });
    stores.set(backend, store);
    return backend;
  },
  destroy: async (backend) => {
    await stores.get(backend)?.close();
    await fs.rm(`${backend.workspace}.db`, { force: true });
    await fs.rm(backend.workspace, { recursive: true, force: true });
  },
  capabilities: { realDirectories: true, propertyRuns: 10 },
});
