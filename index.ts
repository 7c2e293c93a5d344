/**
 * strata-workspace — everything for Node in one import. Browsers and edge
 * runtimes import `strata-workspace/core` and `strata-workspace/backends/state`
 * (no Node built-ins); the sandbox runtime is `strata-workspace/runtime`, the
 * test suite `strata-workspace/conformance`. Importing this loads no engine
 * package: pg, ioredis, dockerode, ssh2 and better-sqlite3 load when the class
 * that needs them is first used (stores/optional-package.ts).
 */
export * from "./core/index.js";
export * from "./backends/state.js";
export * from "./backends/composite.js";
export * from "./backends/filesystem.js";
export * from "./backends/store.js";
export * from "./stores/store.js";
export * from "./stores/memory.js";
export * from "./stores/sqlite.js";
export * from "./stores/postgres.js";
export * from "./stores/redis.js";
export * from "./stores/langgraph.js";
export * from "./sandboxes/base.js";
export * from "./sandboxes/local.js";
export * from "./sandboxes/bubblewrap.js";
export * from "./sandboxes/docker.js";
export * from "./sandboxes/ssh.js";
