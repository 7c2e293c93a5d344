/**
 * A JSON file the command line reads (the MCP config, permission rules):
 * parsed and checked against its schema, every failure one line that names
 * the file by its base name only (no host path).
 */
import { readFileSync } from "node:fs";
import nodePath from "node:path";
import type { z } from "zod";

export function readJsonFile<T extends z.ZodType>(file: string, what: string, schema: T): z.output<T> {
  const name = nodePath.basename(file);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, "utf8"));
  } catch (error) {
    throw new Error(`The ${what} '${name}' could not be read: ${error instanceof Error ? error.message : String(error)}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`The ${what} '${name}': ${issue?.path.join(".") || "(top)"}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}
