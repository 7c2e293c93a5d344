import { FILE_HEADERS_ONLY, createTwoFilesPatch } from "diff";
import { z } from "zod";
import { applyEdit } from "../core/edit.js";
import { isStrataError, printable } from "../core/errors.js";
import { fileDataText } from "../core/filedata.js";
import { ToolFailure, defineTool, ok, orFail } from "./define.js";
import { canonicalPath } from "./paths.js";

const oneEdit = z.object({
  old_string: z.string().describe("The exact text to replace, copied from the file without read_file's line numbers"),
  new_string: z.string().describe("The text to put in its place (must differ from old_string)"),
  replace_all: z.boolean().optional().describe("Replace every occurrence instead of requiring exactly one. Default false"),
});

export const editFileSchema = z.object({
  file_path: z.string().describe("Absolute path of the file to edit"),
  old_string: z.string().optional().describe("The exact text to replace (one edit). Include enough surrounding lines to make it unique"),
  new_string: z.string().optional().describe("The replacement text (one edit)"),
  replace_all: z.boolean().optional().describe("Replace every occurrence of old_string instead of requiring exactly one. Default false"),
  edits: z
    .array(oneEdit)
    .min(1)
    .optional()
    .describe("Several edits of the same file, applied in order to the result of the previous one: all of them land or none does. Use instead of old_string/new_string"),
  dry_run: z.boolean().optional().describe("Show the diff the edit would make without writing it. Default false"),
});

export const editFile = defineTool({
  name: "edit_file",
  description: [
    "Replaces exact text in a file. old_string must match the file exactly (whitespace and indentation included,",
    "without read_file's line-number prefix) and appear exactly once, unless replace_all is set.",
    "For several changes to one file, pass edits: [{old_string, new_string, replace_all?}, ...]; they apply in order",
    "and either all land or none does. dry_run shows the change without writing it.",
    "The answer includes a unified diff of the change. The file's line endings (LF or CRLF) are kept.",
    "You must read the file with read_file in this session first, and again if it changed since.",
  ].join(" "),
  inputSchema: editFileSchema,
  async execute(session, input) {
    const single = input.old_string !== undefined || input.new_string !== undefined;
    if (input.edits && single) throw new ToolFailure("Pass either old_string/new_string or edits, not both");
    if (!input.edits && (input.old_string === undefined || input.new_string === undefined)) {
      throw new ToolFailure("Pass old_string and new_string (or edits: [{old_string, new_string}])");
    }
    const edits = input.edits ?? [{ old_string: input.old_string!, new_string: input.new_string!, replace_all: input.replace_all }];

    return session.exclusive(canonicalPath(session, input.file_path), async () => {
      const raw = orFail(await session.backend.readRaw(input.file_path));
      const path = raw.path;
      const before = fileDataText(raw.data);
      if (before === null) throw new ToolFailure(`'${printable(path)}' is a binary file; edit_file changes text files only`);
      const stale = await session.staleReason(path, raw.data, "edit");
      if (stale) throw new ToolFailure(stale);

      let after = before;
      let occurrences = 0;
      for (const [i, edit] of edits.entries()) {
        try {
          const outcome = applyEdit(after, edit.old_string, edit.new_string, edit.replace_all ?? false, path);
          after = outcome.text;
          occurrences += outcome.occurrences;
        } catch (error) {
          if (!isStrataError(error)) throw error;
          throw new ToolFailure(edits.length > 1 ? `Edit ${i + 1} of ${edits.length}: ${error.message}. No edit was applied` : error.message);
        }
      }
      const what = `${edits.length > 1 ? `${edits.length} edits, ` : ""}${occurrences} replacement${occurrences === 1 ? "" : "s"}`;
      if (input.dry_run) return ok(`Dry run: ${what} in '${printable(path)}' would make this change; nothing was written.\n\n${unifiedDiff(path, before, after)}`);

      // Through the native edit, which is atomic against writers outside this session: one edit as
      // given; several as one replacement of the whole text read by the text computed, which lands only
      // while the file still holds what was read (an append made meanwhile is kept, any other change
      // makes it fail and nothing is written).
      if (before === after) return ok(`The edits leave '${printable(path)}' unchanged; nothing was written.`);
      const [edit] = edits;
      const landing =
        edits.length === 1
          ? session.backend.edit(path, edit!.old_string, edit!.new_string, { replaceAll: edit!.replace_all ?? false })
          : session.backend.edit(path, before, after, { replaceAll: false });
      // The answer's diff is made while the edit waits on the disk (its fsync), not before the edit starts.
      // (A backend that throws rather than answer is a bug; its rejection is still this call's, awaited below.)
      landing.catch(() => undefined);
      await nextTurn();
      const diff = unifiedDiff(path, before, after);
      const landed = await landing;
      if (landed.error) {
        if (edits.length > 1 && (landed.error.code === "no_match" || landed.error.code === "ambiguous_match")) {
          session.invalidate(path);
          throw new ToolFailure(`'${printable(path)}' was changed by someone else while the edits were applied; nothing was written. Read it again with read_file`);
        }
        throw new ToolFailure(landed.error.message);
      }
      // What the file holds now: the backend's answer says when it knows (it edited the text it read under its
      // lock), else it is read again. Anything but the text computed here means someone else changed it meanwhile.
      const now = landed.content !== undefined ? landed.content : await session.backend.readRaw(path).then((read) => (read.error ? null : fileDataText(read.data)));
      if (now === after) {
        await session.remember(path, after);
        return ok(`Edited '${printable(path)}' (${what}).\n\n${diff}`);
      }
      session.invalidate(path);
      return ok(`Edited '${printable(path)}' (${what}), but the file was also changed by someone else meanwhile: read it again before changing it further.\n\n${diff}`);
    });
  },
});

/** One turn of the event loop: I/O a call started gets under way (setImmediate: Node's setTimeout(0) waits 1 ms). */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => (globalThis.setImmediate ? globalThis.setImmediate(resolve) : setTimeout(resolve, 0)));
}

/**
 * A unified diff (jsdiff) of a change, three lines of context. A CRLF file
 * is diffed on its lines without the `\r` (a model reads the diff, not the
 * bytes) and the answer says its endings were kept.
 */
export function unifiedDiff(path: string, before: string, after: string): string {
  const crlf = before.includes("\r\n");
  const a = crlf ? before.replace(/\r\n/g, "\n") : before;
  const b = crlf ? after.replace(/\r\n/g, "\n") : after;
  const body = createTwoFilesPatch(path, path, a, b, undefined, undefined, { context: 3, headerOptions: FILE_HEADERS_ONLY }).trimEnd();
  return crlf ? `${body}\n(CRLF line endings kept)` : body;
}
