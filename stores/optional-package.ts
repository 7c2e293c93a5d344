/**
 * Loading an engine package when the class that needs it is first used, so the
 * root import loads none of them. pg, ioredis, dockerode and ssh2 are optional
 * peer dependencies (installed by whoever uses PostgresStore, RedisStore,
 * DockerSandbox or SshSandbox); better-sqlite3 is a dependency, loaded the same
 * way because its native addon is costly to load for a program that never
 * opens a SQLite store.
 *
 * Synchronous (`createRequire`) because the constructors that need the
 * packages are; all five are CommonJS packages.
 */
import { createRequire } from "node:module";
import { StrataError } from "../core/errors.js";

/** Made on the first package load: creating it costs a root import that loads no engine a millisecond or two. */
let require: NodeJS.Require | undefined;

/** Node's require, made on first use (the engine packages, lazily loaded built-ins). */
export function nodeRequire(): NodeJS.Require {
  return (require ??= createRequire(import.meta.url));
}


/**
 * A function that returns package `name`, loading it on its first call. A
 * package that is not installed fails with `unavailable` (like a missing
 * program such as BusyBox or prlimit: the host lacks something the caller can
 * install, and the message says how), naming `user`, the class that needs it.
 */
export function optionalPackage<T>(name: string, user: string): () => T {
  let loaded: T | undefined;
  return () => {
    if (loaded === undefined) {
      try {
        loaded = nodeRequire()(name) as T;
      } catch (error) {
        throw loadError(name, user, error);
      }
    }
    return loaded;
  };
}

function loadError(name: string, user: string, error: unknown): StrataError {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown };
  const text = typeof message === "string" ? message : String(error);
  // Only the package itself missing means "install it"; a missing file or dependency inside it is a broken install.
  if (code === "MODULE_NOT_FOUND" && text.startsWith(`Cannot find module '${name}'`)) {
    return new StrataError("unavailable", `${user} needs the package '${name}', which is not installed: npm install ${name}`, { cause: error });
  }
  return new StrataError("unavailable", `${user} cannot load the package '${name}' (${text.split("\n")[0]}); reinstall it: npm install ${name}`, {
    cause: error,
  });
}
