import { StateBackend } from "../backends/state.js";
import { runConformance } from "../conformance/index.js";

runConformance({ name: "StateBackend", create: () => new StateBackend(), capabilities: { filesUpdate: true } });
