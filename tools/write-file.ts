import { z } from "zod";
import { printable } from "../core/errors.js";
import { fileDataText } from "../core/filedata.js";
import { ToolFailure, defineTool, ok, orFail } from "./define.js";
import { canonicalPath } from "./paths.js";

export const writeFileSchema = z.object({
  file_path: z.string().describe("Absolute path of the file to write; missing parent directories are created"),
  content: z.string().describe("The whole content of the file"),
});

export const writeFile = defineTool({
  name: "write_file",
  description: [
    "Writes a file with the given content. Creates a new file (and its parent directories).",
    "Replacing an existing file is allowed only after you have read it with read_file in this session and it has not",
    "changed since; prefer edit_file for changing part of a file.",
  ].join(" "),
  inputSchema: writeFileSchema,
  async execute(session, input) {
    return session.exclusive(canonicalPath(session, input.file_path), async () => {
      const raw = await session.backend.readRaw(input.file_path);
      if (raw.error && raw.error.code !== "file_not_found") throw new ToolFailure(raw.error.message);
      if (raw.error) {
        const created = await session.backend.write(input.file_path, input.content);
        if (created.error?.code === "already_exists") {
          throw new ToolFailure(`File '${printable(created.error.path ?? input.file_path)}' was created by someone else meanwhile. Read it with read_file before overwriting it`);
        }
        const path = orFail(created).path;
        await session.remember(path, input.content);
        return ok(`Created '${printable(path)}' (${describe(input.content)}).`);
      }
      const stale = await session.staleReason(raw.path, raw.data, "overwrite");
      if (stale) throw new ToolFailure(stale);
      const current = fileDataText(raw.data);
      if (current === input.content) return ok(`'${printable(raw.path)}' already has this content (${describe(input.content)}); nothing was written.`);
      if (current === null || current === "") {
        // Binary or empty: no text to swap against, so a plain overwrite.
        const path = orFail(await session.backend.write(raw.path, input.content, { overwrite: true })).path;
        await session.remember(path, input.content);
        return ok(`Replaced the content of '${printable(path)}' (${describe(input.content)}).`);
      }
      // Text: replaced through the native edit of the whole text read, atomic against writers outside
      // this session, so a change made since the check is never overwritten.
      const swapped = await session.backend.edit(raw.path, current, input.content, { replaceAll: false });
      if (swapped.error) {
        if (swapped.error.code === "no_match" || swapped.error.code === "ambiguous_match") {
          session.invalidate(raw.path);
          throw new ToolFailure(`'${printable(raw.path)}' was changed by someone else while it was being replaced; nothing was written. Read it again with read_file`);
        }
        throw new ToolFailure(swapped.error.message);
      }
      const now = await session.backend.readRaw(swapped.path);
      if (!now.error && fileDataText(now.data) === input.content) {
        await session.remember(swapped.path, now.data);
        return ok(`Replaced the content of '${printable(swapped.path)}' (${describe(input.content)}).`);
      }
      session.invalidate(swapped.path);
      return ok(`Replaced the content of '${printable(swapped.path)}' (${describe(input.content)}), but the file was also changed by someone else meanwhile: read it again before changing it further.`);
    });
  },
});

function describe(content: string): string {
  const lines = content === "" ? 0 : content.split("\n").length - (content.endsWith("\n") ? 1 : 0);
  return `${lines} line${lines === 1 ? "" : "s"}, ${new TextEncoder().encode(content).length} bytes`;
}
