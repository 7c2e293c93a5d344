/**
 * strata/core — the contract. Pure TypeScript with no `node:` imports, so it
 * runs in browsers, edge runtimes, Deno and Bun.
 */
export * from "./errors.js";
export * from "./types.js";
export * from "./protocol.js";
export * from "./paths.js";
export * from "./format.js";
export * from "./edit.js";
export * from "./glob.js";
export * from "./grep.js";
export * from "./filedata.js";
export * from "./tree.js";
export * from "./base.js";
export * from "./seed.js";
export * from "./mime.js";
export * from "./limits.js";
export * from "./lock.js";
