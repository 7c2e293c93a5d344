/**
 * A child process for the crash tests: writes files 0..count-1 until it is
 * killed. `files` writes them one by one through StoreBackend and prints the
 * number written after each; `batch` prints "start" and stores them all in
 * one putMany.
 *
 *   node --import tsx test/support/crash-writer.ts <postgres|redis> <url> <namespace-json> <files|batch> <count>
 */
import { StoreBackend } from "../../backends/store.js";
import { fileDataFromText } from "../../core/filedata.js";
import { PostgresStore } from "../../stores/postgres.js";
import { RedisStore } from "../../stores/redis.js";
import type { Namespace, Store } from "../../stores/store.js";
import { crashContent } from "./servers.js";

const [engine, url, namespaceJson, mode, countText] = process.argv.slice(2);
const namespace = JSON.parse(namespaceJson!) as Namespace;
const count = Number(countText);
const store: Store = engine === "postgres" ? new PostgresStore({ connectionString: url! }) : new RedisStore({ url: url! });
const path = (i: number) => `/crash/f${String(i).padStart(4, "0")}.txt`;

if (mode === "batch") {
  const entries = Array.from({ length: count }, (_, i) => [path(i), fileDataFromText(crashContent(i))] as const);
  process.stdout.write("start\n");
  await store.putMany(namespace, entries);
  process.stdout.write("done\n");
} else {
  const backend = new StoreBackend({ store, namespace });
  for (let i = 0; i < count; i++) {
    const result = await backend.write(path(i), crashContent(i));
    if (result.error) throw new Error(result.error.message);
    process.stdout.write(`${i + 1}\n`);
  }
}
await store.close();
