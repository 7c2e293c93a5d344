/**
 * The permission wrapper keeps the native API's semantics: the shared suite
 * over withPermissions(StateBackend) and withPermissions(FilesystemBackend),
 * with rules that deny a place the suite never uses and ask (and approve)
 * every write, so every operation goes through the checks.
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { FilesystemBackend } from "../backends/filesystem.js";
import { withPermissions } from "../backends/permissions.js";
import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";
import { LocalSandbox } from "../sandboxes/local.js";
import type { PermissionOptions } from "../core/permissions.js";

const options: PermissionOptions = {
  rules: [
    { name: "never used", action: "deny", paths: ["/zz-denied/**", "*.denied-by-test"] },
    { name: "approve writes", action: "ask", operations: ["write", "edit", "delete"] },
  ],
  ask: () => true,
};

runConformance({
  name: "withPermissions(StateBackend)",
  create: () => withPermissions(new StateBackend(), options),
  capabilities: { filesUpdate: true },
});

const workspaces = new Map<object, string>();
runConformance({
  name: "withPermissions(FilesystemBackend)",
  create: async () => {
    const workspace = await fs.mkdtemp(path.join(os.tmpdir(), "strata-perm-"));
    // The inner backend's own preset is off: the wrapper's rules are the ones under test.
    const backend = withPermissions(new FilesystemBackend({ workspace, permissions: false }), options);
    workspaces.set(backend, workspace);
    return backend;
  },
  destroy: (backend) => fs.rm(workspaces.get(backend)!, { recursive: true, force: true }),
  capabilities: { realDirectories: true, propertyRuns: 10 },
});

runConformance({
  name: "withPermissions(LocalSandbox)",
  create: () => withPermissions(new LocalSandbox({ permissions: false }), options),
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  root: (sandbox) => sandbox.root,
  capabilities: { execute: true },
});
