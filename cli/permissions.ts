/**
 * `--permissions <file|preset>`, one option for `strata mcp` and every file
 * command: permission rules (docs/permissions.md) from a JSON file, or a
 * preset by name. The rules go over the whole target, above the secrets
 * preset its files and sandbox keep.
 */
import { existsSync } from "node:fs";
import nodePath from "node:path";
import { z } from "zod";
import { readJsonFile } from "./json-file.js";
import { PERMISSION_OPERATIONS, SECRETS_PRESET, type AskCallback, type PermissionOperation, type PermissionRule } from "../core/permissions.js";

const operation = z.custom<PermissionOperation>((value) => PERMISSION_OPERATIONS.includes(value as PermissionOperation), { message: `one of ${PERMISSION_OPERATIONS.join(", ")}` });
const ruleSchema = z.strictObject({
  action: z.enum(["allow", "deny", "ask"]),
  operations: z.union([operation, z.array(operation)]).optional(),
  paths: z.union([z.string(), z.array(z.string())]).optional(),
  name: z.string().optional(),
});

/** Permission rules: a list, or `{ "rules": [...] }` (the shape of withPermissions' options). */
export const rulesSchema = z.union([z.array(ruleSchema), z.strictObject({ rules: z.array(ruleSchema) }).transform((value) => value.rules)]);

const CHANGES: PermissionOperation[] = ["write", "edit", "delete"];

/** Rules by name, for `--permissions NAME`. A file of that name is written `./NAME`. */
export const PERMISSION_PRESETS: Readonly<Record<string, readonly PermissionRule[]>> = {
  /** What FilesystemBackend and the sandboxes deny anyway: secret files. */
  secrets: SECRETS_PRESET,
  /** No file is written, edited or deleted (commands are governed by `execute` rules, not this). */
  "read-only": [...SECRETS_PRESET, { name: "read-only", action: "deny", operations: CHANGES }],
  /** Every write, edit and delete asks first. */
  "ask-changes": [...SECRETS_PRESET, { name: "ask-changes", action: "ask", operations: CHANGES }],
};

/** The rules `--permissions` names: a preset, else a JSON file. Errors name the file, never its directory. */
export function loadPermissions(spec: string): PermissionRule[] {
  if (Object.hasOwn(PERMISSION_PRESETS, spec)) return [...PERMISSION_PRESETS[spec]!];
  const name = nodePath.basename(spec);
  if (!existsSync(spec)) {
    throw new Error(`--permissions '${name}': no such file, and not a preset (${Object.keys(PERMISSION_PRESETS).join(", ")})`);
  }
  return readJsonFile(spec, "permissions file", rulesSchema);
}

/**
 * The command line's answer to an `ask` rule: a script has no one to ask, so
 * it is denied, saying that `--yes` approves; with `--yes` it is approved.
 */
export function commandLineAsk(yes: boolean): AskCallback {
  return (request) => {
    if (yes) return true;
    const rule = request.rule.name ? `the rule '${request.rule.name}'` : "a permission rule";
    return { behavior: "deny", message: `${rule} asks for approval and the command line does not ask (--yes approves)` };
  };
}
