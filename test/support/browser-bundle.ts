/** A browser bundle of some modules (test/core.test.ts from the sources, test/cold-import.test.ts from the built files). */
import { build, type Metafile } from "esbuild";
import { expect } from "vitest";

/** Bundles `entries` (paths relative to `dir`) for a browser, checks it built with no Node built-in imported, and gives its inputs. */
export async function browserBundleInputs(dir: string, entries: readonly string[], loader: "ts" | "js"): Promise<string[]> {
  const result = await build({
    stdin: { contents: entries.map((entry) => `export * from "./${entry}";`).join("\n"), resolveDir: dir, loader },
    bundle: true,
    platform: "browser",
    format: "esm",
    write: false,
    logLevel: "silent",
    metafile: true,
  });
  expect(result.errors).toEqual([]);
  expect(result.outputFiles[0]!.text).not.toMatch(/from\s+["'](node:|fs|path|os|child_process)["']/);
  return Object.keys((result.metafile as Metafile).inputs);
}
