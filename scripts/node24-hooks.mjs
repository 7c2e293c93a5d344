// Preloaded (`--import`) by scripts/node24.sh into every Node process of the
// Node 24 test pass: resolves better-sqlite3, by require or import, to the copy
// built for Node 24 in .node24/node_modules instead of node_modules' Node 20
// build. Synchronous module hooks (Node >= 22.15) cover require, which is how
// stores/optional-package.ts loads the package; a Node without them (20) keeps
// node_modules' copy, the one built for it.
import { realpathSync } from "node:fs";
import module from "node:module";
import process from "node:process";
import { URL, fileURLToPath, pathToFileURL } from "node:url";

const root = new URL("../", import.meta.url);
// Resolution answers real paths, so compare against the real one (node_modules may be a link).
const from = `${pathToFileURL(realpathSync(fileURLToPath(new URL("node_modules/better-sqlite3", root)))).href}/`;
const to = new URL(".node24/node_modules/better-sqlite3/", root).href;

if (typeof module.registerHooks === "function" && Number(process.versions.node.split(".")[0]) >= 24) {
  module.registerHooks({
    resolve(specifier, context, nextResolve) {
      const resolved = nextResolve(specifier, context);
      return resolved.url?.startsWith(from) ? { ...resolved, url: to + resolved.url.slice(from.length) } : resolved;
    },
  });
}
