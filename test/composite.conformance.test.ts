import { CompositeBackend } from "../backends/composite.js";
import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";

// Routes cut through the paths the suite uses, so most tests cross a route boundary.
runConformance({
  name: "CompositeBackend over StateBackends",
  create: () =>
    new CompositeBackend({
      default: new StateBackend(),
      routes: { "/src": new StateBackend(), "/dots/": new StateBackend(), "/a/b": new StateBackend() },
    }),
  capabilities: { mountPoints: ["/src", "/dots", "/a/b"] },
});
