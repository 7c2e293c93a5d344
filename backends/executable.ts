/**
 * Finding a program on PATH, for the host tools Strata starts: rg
 * (FilesystemBackend's grep), bwrap, setpriv, prlimit and busybox
 * (BubblewrapSandbox), bwrap for the runtime's provider check. Here, below
 * the sandboxes and the runtime, so there is one lookup for all of them.
 */
import { accessSync, constants, statSync } from "node:fs";
import nodePath from "node:path";

export interface PathSearch {
  /** The directories to search, PATH-style (default: this process's PATH, or none). Empty entries are skipped. */
  path?: string;
  /** Directories searched after `path`. */
  then?: readonly string[];
  /** Whether a candidate is the program (default `isFile`). */
  accept?: (candidate: string) => boolean;
}

/** The first `dir/name` the search accepts, or undefined. */
export function findOnPath(name: string, search: PathSearch = {}): string | undefined {
  const accept = search.accept ?? isFile;
  for (const dir of (search.path ?? process.env.PATH ?? "").split(nodePath.delimiter).concat(search.then ?? [])) {
    if (dir === "") continue;
    const candidate = nodePath.join(dir, name);
    if (accept(candidate)) return candidate;
  }
  return undefined;
}

/** A regular file (symlinks followed); a candidate that cannot be examined is not one. */
export function isFile(candidate: string): boolean {
  try {
    return statSync(candidate).isFile();
  } catch {
    return false;
  }
}

/** Executable by this process (access X_OK); a candidate that cannot be examined is not one. */
export function isExecutable(candidate: string): boolean {
  try {
    accessSync(candidate, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}
