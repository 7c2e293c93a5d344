import { runConformance } from "../conformance/index.js";
import { LocalSandbox } from "../sandboxes/local.js";

runConformance({
  name: "LocalSandbox",
  create: () => new LocalSandbox(),
  destroy: (sandbox) => sandbox.close(),
  close: (sandbox) => sandbox.close(),
  capabilities: { execute: true },
});
