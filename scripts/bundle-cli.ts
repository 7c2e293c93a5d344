/**
 * The `strata` command as the package ships it: cli/strata.ts bundled by
 * esbuild into `<out>/cli/strata.js` (the bin), each command's part and the
 * packages it uses a chunk of its own beside it (`strata-<hash>.js`), loaded
 * when the command is named. An MCP client starts `strata mcp` for every
 * session, so its start-up is the server's: one file per chunk to resolve,
 * read and compile instead of hundreds of modules (measured: about 50 ms of
 * a 250 ms start-up).
 *
 * What loads only at run time stays outside: better-sqlite3 (native), and
 * the engine packages the stores and sandboxes load when first used
 * (optional-package.ts). The library's own modules (`dist/index.js` and the
 * rest, as tsc emits them) are untouched.
 *
 *   tsx scripts/bundle-cli.ts dist        (npm run build runs it)
 */
import { copyFileSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Loaded at run time, never bundled. */
const EXTERNAL = ["better-sqlite3", "pg", "ioredis", "dockerode", "ssh2", "cpu-features"];

/** Bundles the command into `<out>/cli/`, replacing what was there under the bin's and the chunks' names. */
export async function bundleCli(out: string): Promise<void> {
  const cliDir = join(out, "cli");
  mkdirSync(cliDir, { recursive: true });
  for (const name of readdirSync(cliDir)) if (/^strata(-[A-Z0-9]+)?\.js(\.map)?$/.test(name)) rmSync(join(cliDir, name));
  await build({
    entryPoints: [join(ROOT, "cli", "strata.ts")],
    outdir: cliDir,
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20",
    chunkNames: "strata-[hash]",
    external: EXTERNAL,
    // Bundled CommonJS packages call require (Node built-ins): ESM output has none unless given one.
    banner: { js: "import { createRequire as __strataCreateRequire } from 'node:module'; const require = __strataCreateRequire(import.meta.url);" },
    logLevel: "error",
  });
  // Read next to the module that reads it (runtime/provider.ts, now in a chunk here).
  copyFileSync(join(ROOT, "runtime", "cold-start.json"), join(cliDir, "cold-start.json"));
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const out = process.argv[2];
  if (!out) throw new Error("usage: tsx scripts/bundle-cli.ts <out dir>");
  await bundleCli(out);
}
