import { runConformance } from "../conformance/index.js";
import { LocalSandbox } from "../sandboxes/local.js";

// The suite writes names the default secrets preset denies (.env, …): this file tests the backend's semantics, so it opts out; test/permissions.test.ts covers the preset.
runConformance({
  name: "LocalSandbox",
  create: () => new LocalSandbox({ permissions: false }),
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  capabilities: { execute: true },
});
