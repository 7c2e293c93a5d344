import { z } from "zod";
import { printable } from "../core/errors.js";
import { isWithin, parentOf } from "../core/paths.js";
import { ToolFailure, defineTool, ok, orFail } from "./define.js";
import { canonicalPath } from "./paths.js";

export const lsSchema = z.object({
  path: z.string().optional().describe("Absolute path of the directory to list. Default: the workspace root"),
  sizes: z.boolean().optional().describe("false: names only (directories still end in '/'), no sizes; faster on large directories. Default true"),
});

export const ls = defineTool({
  name: "ls",
  description:
    "Lists a directory (not recursive): one entry a line, directories ending in '/', files with their size in bytes (sizes: false leaves sizes out). Use glob to find files by name across directories.",
  inputSchema: lsSchema,
  async execute(session, input) {
    const path = input.path ?? session.root;
    const sizes = input.sizes ?? true;
    const listing = orFail(await session.backend.ls(path, sizes ? undefined : { sizes }));
    // Evicted results are tool artefacts: hidden unless their directory is what is listed. Only a
    // directory holding the eviction directory (or inside it) can list one.
    const canonical = canonicalPath(session, path);
    const listsEvicted = session.isEvicted(canonical);
    const mayHide = !listsEvicted && isWithin(canonical, session.evictionDir);
    const strataDir = parentOf(session.evictionDir);
    let hideStrataDir = false;
    if (mayHide && listing.entries.some((entry) => entry.path === `${strataDir}/`)) {
      // `.strata/` holding nothing but evicted results is noise too.
      const inside = await session.backend.ls(strataDir, { sizes: false });
      hideStrataDir = !inside.error && inside.entries.every((entry) => session.isEvicted(entry.path.replace(/(.)\/$/, "$1")));
    }
    const shown = (entry: { path: string }) => {
      const bare = entry.path.replace(/(.)\/$/, "$1");
      return !session.isEvicted(bare) && !(hideStrataDir && bare === strataDir);
    };
    const entries = mayHide ? listing.entries.filter(shown) : listing.entries;
    if (entries.length === 0) {
      // A missing directory lists as empty in the native API; the model should hear which it is.
      const stat = await session.backend.stat(path);
      if (stat.error) throw new ToolFailure(stat.error.code === "file_not_found" ? `Directory '${printable(path)}' does not exist` : stat.error.message);
      if (!stat.is_dir) return ok(`${stat.path} (${stat.size ?? 0} bytes) is a file, not a directory`);
      return ok(`'${printable(stat.path.replace(/(.)\/$/, "$1"))}' is empty.`);
    }
    if (!sizes) return ok(entries.map((entry) => entry.path).join("\n"));
    return ok(entries.map((entry) => (entry.is_dir ? entry.path : `${entry.path} (${entry.size ?? 0} bytes)`)).join("\n"));
  },
});
