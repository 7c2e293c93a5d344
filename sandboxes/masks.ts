/**
 * Finding what a sandbox hides from a command: the paths its permission rules
 * deny for reading. Bubblewrap walks the host directory behind the workspace
 * (DeniedFinder); Docker asks `find` inside the container (denialFindScript),
 * then keeps only what the rules match exactly (the same PermissionPolicy).
 */
import { lstat, readdir } from "node:fs/promises";
import nodePath from "node:path";
import { StrataError } from "../core/errors.js";
import type { PermissionPolicy, PermissionRule } from "../core/permissions.js";
import { shellQuote } from "./shell.js";

/** A path to hide, relative to the workspace, and whether it is a directory (hidden whole). */
export interface Denied {
  path: string;
  dir: boolean;
}

/**
 * Finds what a sandbox's rules deny under `hostDir` (the workspace, whose
 * virtual root is `root`), without following a symlink: a symlink is never
 * hidden itself (what it names is, if the rules deny it). A denied directory
 * is not entered: it is hidden whole. Entries that vanish meanwhile are
 * skipped. Each directory's answer is kept with its inode and modification
 * time, so a later walk of an unchanged tree costs one lstat per directory;
 * a directory changed in the last 2 seconds is always read again, since a
 * change within the filesystem's clock tick can leave its time unchanged.
 */
export class DeniedFinder {
  private readonly known = new Map<string, { key: string; denied: Denied[]; below: string[] }>();

  constructor(
    private readonly hostDir: string,
    private readonly root: string,
    private readonly policy: PermissionPolicy,
  ) {}

  async find(): Promise<Denied[]> {
    const denied: Denied[] = [];
    const seen = new Set<string>();
    const walk = async (relative: string): Promise<void> => {
      seen.add(relative);
      const host = relative === "" ? this.hostDir : nodePath.join(this.hostDir, relative);
      let key: string | undefined;
      try {
        const stat = await lstat(host, { bigint: true });
        if (!stat.isDirectory()) return;
        // ctime, not only mtime: a command can set a directory's mtime back (touch -d), never its ctime.
        key = Date.now() - Number(stat.ctimeMs) > 2000 ? `${stat.ino}:${stat.mtimeNs}:${stat.ctimeNs}` : undefined;
      } catch {
        return;
      }
      let answer = this.known.get(relative);
      if (!answer || key === undefined || answer.key !== key) {
        answer = await this.read(relative, host, key ?? "");
        if (key === undefined) this.known.delete(relative);
        else this.known.set(relative, answer);
      }
      denied.push(...answer.denied);
      await Promise.all(answer.below.map(walk));
    };
    await walk("");
    // Directories gone since: their answers go too.
    for (const relative of this.known.keys()) if (!seen.has(relative)) this.known.delete(relative);
    return denied;
  }

  private async read(relative: string, host: string, key: string): Promise<{ key: string; denied: Denied[]; below: string[] }> {
    const answer = { key, denied: [] as Denied[], below: [] as string[] };
    let entries;
    try {
      entries = await readdir(host, { withFileTypes: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT" || (error as NodeJS.ErrnoException).code === "ENOTDIR") return answer;
      // A directory that cannot be listed (a command took its read bit: chmod 300) may hold a secret a
      // command can still open by name: it is hidden whole, and a workspace that cannot be listed refuses.
      if (relative === "") throw new StrataError("permission_denied", "The workspace cannot be checked for denied files (it cannot be listed); the command was not run");
      answer.denied.push({ path: relative, dir: true });
      return answer;
    }
    for (const entry of entries) {
      if (entry.isSymbolicLink()) continue;
      const path = relative === "" ? entry.name : `${relative}/${entry.name}`;
      // Only the entry's own rules: its ancestors were found allowed on the way down.
      if (this.policy.checkOwn("read", `${this.root === "/" ? "" : this.root}/${path}`).action === "deny") answer.denied.push({ path, dir: entry.isDirectory() });
      else if (entry.isDirectory()) answer.below.push(path);
    }
    return answer;
  }
}

/**
 * A shell script that prints (NUL-separated, relative to $W) every file and
 * directory under $W a deny rule on reading may match and that is not yet
 * locked (owned by root with no access for others). find's patterns are
 * looser than the rules' globs (`*` crosses `/`), so the caller filters the
 * answer through the policy. A rule without paths matches everything: then
 * every path is a candidate.
 */
export function denialFindScript(rules: readonly PermissionRule[]): string | undefined {
  const tests: string[] = [];
  for (const rule of rules) {
    if (rule.action !== "deny") continue;
    const ops = rule.operations === undefined ? ["read"] : typeof rule.operations === "string" ? [rule.operations] : rule.operations;
    if (!ops.includes("read")) continue;
    if (rule.paths === undefined) return 'cd "$W" && find . -mindepth 1 \\( -type f -o -type d \\) \\( ! -user 0 -o -perm /077 \\) -print0';
    for (const pattern of typeof rule.paths === "string" ? [rule.paths] : rule.paths) tests.push(...findTests(pattern));
  }
  if (tests.length === 0) return undefined;
  return `cd "$W" && find . -mindepth 1 \\( ${tests.join(" -o ")} \\) \\( -type f -o -type d \\) \\( ! -user 0 -o -perm /077 \\) -print0`;
}

/** find tests for one glob: -name for a basename pattern, -path (with `**` as `*`, and without it) otherwise. */
function findTests(pattern: string): string[] {
  const out: string[] = [];
  for (const variant of expandBraces(pattern)) {
    const body = variant.replace(/^\/+/, "");
    if (!variant.includes("/")) {
      out.push(`-name ${shellQuote(variant)}`);
      continue;
    }
    // Anchored at any depth (`*` also crosses `/`): looser than the glob, which the caller applies to what is found.
    const parts = body.split("/").filter((p) => p !== "");
    let variants = [""];
    for (const part of parts) {
      variants = variants.flatMap((v) => (part === "**" ? [v, `${v}/*`] : [`${v}/${part.replace(/\*\*/g, "*")}`]));
    }
    for (const v of variants) out.push(`-path ${shellQuote(`*${v}`)}`);
  }
  return out;
}

/** `{a,b}` alternatives, expanded (nested ones too); find's patterns have none. */
function expandBraces(pattern: string): string[] {
  const open = pattern.search(/(?<!\\)\{/);
  if (open === -1) return [pattern];
  let depth = 0;
  let close = -1;
  const commas: number[] = [];
  for (let i = open; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === "\\") {
      i++;
      continue;
    }
    if (c === "{") depth++;
    else if (c === "}" && --depth === 0) {
      close = i;
      break;
    } else if (c === "," && depth === 1) commas.push(i);
  }
  if (close === -1) return [pattern];
  const bounds = [open, ...commas, close];
  const head = pattern.slice(0, open);
  const tail = pattern.slice(close + 1);
  const out: string[] = [];
  for (let i = 0; i < bounds.length - 1; i++) out.push(...expandBraces(head + pattern.slice(bounds[i]! + 1, bounds[i + 1]) + tail));
  return out;
}
