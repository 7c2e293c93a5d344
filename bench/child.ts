/** Entry point of a benchmark child process; see runInChild in harness.ts. */
import { childMain } from "./harness.js";

await childMain(process.argv.slice(2));
