/**
 * The Node built-ins that cost an import of the package milliseconds to load
 * (node:crypto, node:child_process, node:worker_threads), loaded on first use
 * instead: a program that imports the package need not hash, spawn or ask
 * about threads before its first operation (issue 14). Each getter returns
 * the module itself, so a call site reads `nodeCrypto().createHash(…)`.
 */
import type * as ChildProcess from "node:child_process";
import type * as Crypto from "node:crypto";
import type * as WorkerThreads from "node:worker_threads";
import { nodeRequire } from "./optional-package.js";

function builtin<T>(id: string): () => T {
  let loaded: T | undefined;
  return () => (loaded ??= nodeRequire()(id) as T);
}

export const nodeCrypto = builtin<typeof Crypto>("node:crypto");
export const childProcess = builtin<typeof ChildProcess>("node:child_process");
export const workerThreads = builtin<typeof WorkerThreads>("node:worker_threads");
