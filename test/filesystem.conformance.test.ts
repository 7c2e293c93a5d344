import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { runConformance } from "../conformance/index.js";

// The suite writes names the default secrets preset denies (.env, …): this file tests the backend's semantics, so it opts out; test/permissions.test.ts covers the preset.
const tempRoot = (backend: FilesystemBackend) => backend.workspace;

runConformance({
  name: "FilesystemBackend (ripgrep)",
  create: async () => new FilesystemBackend({ workspace: await fs.mkdtemp(path.join(os.tmpdir(), "strata-fs-")), permissions: false }),
  destroy: (backend) => fs.rm(tempRoot(backend), { recursive: true, force: true }),
  capabilities: { realDirectories: true },
});

runConformance({
  name: "FilesystemBackend (JS grep)",
  create: async () => new FilesystemBackend({ workspace: await fs.mkdtemp(path.join(os.tmpdir(), "strata-fs-")), useRipgrep: false, permissions: false }),
  destroy: (backend) => fs.rm(tempRoot(backend), { recursive: true, force: true }),
  capabilities: { propertyRuns: 10, realDirectories: true },
});
