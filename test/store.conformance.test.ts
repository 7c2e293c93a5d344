import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "vitest";
import { StoreBackend } from "../backends/store.js";
import { runConformance } from "../conformance/index.js";
import { runStoreConformance } from "../conformance/stores.js";
import { InMemoryStore } from "@langchain/langgraph-checkpoint";
import { LangGraphStore } from "../stores/langgraph.js";
import { MemoryStore } from "../stores/memory.js";
import { SqliteStore } from "../stores/sqlite.js";

const dir = mkdtempSync(join(tmpdir(), "strata-store-conformance-"));
let databases = 0;
afterAll(() => rmSync(dir, { recursive: true, force: true }));

runConformance({
  name: "StoreBackend over MemoryStore",
  create: () => new StoreBackend({ store: new MemoryStore() }),
  destroy: (backend) => backend.store.close(),
  close: (backend) => backend.store.close(),
  capabilities: { closedCode: "unavailable" },
});

runConformance({
  name: "StoreBackend over SqliteStore",
  create: () => new StoreBackend({ store: new SqliteStore({ path: join(dir, `${++databases}.db`) }) }),
  destroy: (backend) => backend.store.close(),
  close: (backend) => backend.store.close(),
  capabilities: { closedCode: "unavailable" },
});

runConformance({
  name: "StoreBackend over LangGraph InMemoryStore",
  create: () => new StoreBackend({ store: new LangGraphStore({ store: new InMemoryStore() }), namespace: ["assistant-1", "filesystem"] }),
  destroy: (backend) => backend.store.close(),
  close: (backend) => backend.store.close(),
  capabilities: { closedCode: "unavailable" },
});

runStoreConformance({ name: "MemoryStore", create: (options) => new MemoryStore(options), destroy: (store) => store.close() });
runStoreConformance({
  name: "SqliteStore",
  create: (options) => new SqliteStore({ path: join(dir, `${++databases}.db`), ...options }),
  destroy: (store) => store.close(),
});
runStoreConformance({
  name: "LangGraphStore over InMemoryStore",
  create: (options) => new LangGraphStore({ store: new InMemoryStore(), ...options }),
  destroy: (store) => store.close(),
});
