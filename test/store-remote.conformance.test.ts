import { randomUUID } from "node:crypto";
import { afterAll } from "vitest";
import { StoreBackend } from "../backends/store.js";
import { runConformance } from "../conformance/index.js";
import { runStoreConformance } from "../conformance/stores.js";
import { PostgresStore } from "../stores/postgres.js";
import { RedisStore } from "../stores/redis.js";
import type { Store } from "../stores/store.js";
import { serviceUrl } from "./support/servers.js";

// One connection pool per engine for the whole file; every test gets a namespace of its own.
const postgres = new PostgresStore({ connectionString: serviceUrl("STRATA_POSTGRES_URL") });
const redis = new RedisStore({ url: serviceUrl("STRATA_REDIS_URL") });
afterAll(() => Promise.all([postgres.close(), redis.close()]));

for (const [name, store] of [
  ["PostgresStore", postgres],
  ["RedisStore", redis],
] as const satisfies ReadonlyArray<readonly [string, Store]>) {
  runConformance({
    name: `StoreBackend over ${name}`,
    create: () => new StoreBackend({ store, namespace: ["conformance", randomUUID()] }),
    destroy: async (backend) => {
      await store.deleteTree(backend.namespace, "/");
    },
  });
}

runStoreConformance({
  name: "PostgresStore",
  create: (options) => new PostgresStore({ connectionString: serviceUrl("STRATA_POSTGRES_URL"), maxConnections: 4, ...options }),
  destroy: (store) => store.close(),
});
runStoreConformance({
  name: "RedisStore",
  create: (options) => new RedisStore({ url: serviceUrl("STRATA_REDIS_URL"), ...options }),
  destroy: (store) => store.close(),
});
