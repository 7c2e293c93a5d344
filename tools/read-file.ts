import { z } from "zod";
import { printable } from "../core/errors.js";
import { textWindow } from "../core/base.js";
import { encodeBase64, fileDataBytes, fileDataText } from "../core/filedata.js";
import { DEFAULT_READ_LIMIT, forEachLine, renderLines } from "../core/format.js";
import { baseName } from "../core/paths.js";
import { mimeTypeOf } from "../core/mime.js";
import { defineTool, ok, orFail, type FileBlock, type ImageBlock, type ToolOutput } from "./define.js";
import { canonicalPath } from "./paths.js";
import type { ToolSession } from "./session.js";

/** Image types shown to the model as image blocks. */
const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
/**
 * Larger images are described, not sent: model APIs refuse an image over
 * about 5 MB once base64-encoded, which is 3.75 MB of image.
 */
export const MAX_IMAGE_BYTES = (5 * 1024 * 1024 * 3) / 4;
/** Larger PDFs are described, not sent (a request carrying one would be refused by most model APIs). */
export const MAX_PDF_BYTES = 20 * 1024 * 1024;

export const readFileSchema = z.object({
  file_path: z.string().describe("Absolute path of the file to read, e.g. /src/app.ts"),
  offset: z
    .number()
    .int()
    .min(0)
    .optional()
    .describe("0-based line to start at (line number N is offset N-1). Default 0. Use the offset a previous answer gave to continue"),
  limit: z.number().int().min(1).optional().describe(`How many lines to read. Default ${DEFAULT_READ_LIMIT}`),
});

export const readFile = defineTool({
  name: "read_file",
  description: [
    "Reads a file from the workspace. Text comes back with line numbers (cat -n style: the number, a tab, the line);",
    "the line numbers are not part of the file, so never copy them into edit_file's old_string.",
    `Reads up to ${DEFAULT_READ_LIMIT} lines from the start by default; use offset and limit to page through long files.`,
    "Every answer states the file's total line count and, when more remains, the offset to continue from.",
    "Lines over 2000 characters are cut with a marker. PNG, JPEG, GIF and WebP images come back as images and",
    "PDFs as documents (where the client supports them); other binary files as a one-line description.",
    "It also reads the over-budget results other tools saved under .strata/evicted/, by the path their answer named.",
    "Read a file before editing or overwriting it: edit_file and write_file refuse a file you have not read,",
    "or that changed since you read it.",
  ].join(" "),
  inputSchema: readFileSchema,
  selfBudgeted: true,
  async execute(session, input) {
    return readLines(session, input.file_path, { offset: input.offset ?? 0, limit: input.limit ?? DEFAULT_READ_LIMIT });
  },
});

/** Which lines of a file to answer: a window from an offset, or the last `tail` lines. */
export type LineWindow = { offset: number; limit: number } | { tail: number };

/**
 * read_file's answer for a window of a file (read_file_tail's too). The file
 * is read once, whole: its text gives the window and its bytes the hash the
 * stale-file guard records, so what the model sees is exactly the version
 * recorded. A file the backend cannot hand over whole (too large to load at
 * once) is answered from the native windowed read, and nothing is recorded:
 * an edit of it asks for a read that can be checked.
 */
export async function readLines(session: ToolSession, filePath: string, window: LineWindow): Promise<ToolOutput> {
  const held = session.heldResult(canonicalPath(session, filePath));
  if (held !== undefined) return ok(readHeld(session, held, canonicalPath(session, filePath), window));
  const whole = await session.backend.readRaw(filePath);
  if (whole.error) return readWindowed(session, filePath, window);
  const path = whole.path;
  const text = fileDataText(whole.data);
  if (text === null) return binaryAnswer(session, path, fileDataBytes(whole.data), mimeTypeOf(path, false));
  const offset = "tail" in window ? Math.max(0, forEachLine(text, () => undefined) - window.tail) : window.offset;
  const limit = "tail" in window ? window.tail : window.limit;
  // A PDF can be all ASCII, so it decodes as text: it is still a document.
  if (offset === 0 && text.startsWith("%PDF-")) {
    const bytes = fileDataBytes(whole.data);
    if (sniffType(bytes) === "application/pdf") return binaryAnswer(session, path, bytes, "application/pdf");
  }
  const { lines, totalLines } = textWindow(text, path, offset, limit);
  await session.remember(path, whole.data);
  return ok(renderText(session, lines, path, offset, totalLines));
}

/** The native windowed read, for a file `readRaw` cannot hand over whole; nothing is recorded for the guard. */
async function readWindowed(session: ToolSession, filePath: string, window: LineWindow): Promise<ToolOutput> {
  let offset = 0;
  let limit = DEFAULT_READ_LIMIT;
  if ("tail" in window) {
    // One line first for the total.
    const probe = orFail(await session.backend.read(filePath, { offset: 0, limit: 1 }));
    if (probe.encoding === "utf-8") [offset, limit] = [Math.max(0, probe.totalLines - window.tail), window.tail];
  } else {
    [offset, limit] = [window.offset, window.limit];
  }
  const read = orFail(await session.backend.read(filePath, { offset, limit }));
  if (read.encoding === "binary") return binaryAnswer(session, read.path, read.content, read.mimeType);
  session.forget(read.path);
  return ok(renderText(session, read.lineCount === 0 ? [] : read.content.split("\n"), read.path, read.offset, read.totalLines));
}

/** The numbered window with its footer, held to the budget by stopping at a line (never evicted: the file is already there). */
function renderText(session: ToolSession, lines: readonly string[], path: string, offset: number, totalLines: number): string {
  if (totalLines === 0) return `'${printable(path)}' exists but is empty (0 lines).`;
  // Leave room for the footer; a single line is always shown (renderLines cuts it to 2000 characters).
  const room = session.maxOutputChars - 200;
  let used = 0;
  let shown = 0;
  for (const line of lines) {
    const cost = Math.min(line.length, 2_100) + 8;
    if (shown > 0 && used + cost > room) break;
    used += cost;
    shown++;
  }
  const body = renderLines(lines.slice(0, shown), offset + 1);
  const last = offset + shown;
  let footer = `[Lines ${offset + 1}-${last} of ${totalLines}`;
  if (last < totalLines) {
    footer += shown < lines.length ? "; the output budget ended the answer here" : "";
    footer += `. More remains: call read_file with offset=${last} to continue.]`;
  } else {
    footer += " (end of file).]";
  }
  return `${body}\n\n${footer}`;
}

async function binaryAnswer(session: ToolSession, path: string, bytes: Uint8Array, mimeType: string): Promise<ToolOutput> {
  await session.remember(path, bytes);
  // Blocks go by the bytes, never by the name alone: a model API refuses a whole request over one image that does not decode.
  const sniffed = sniffType(bytes);
  const type = sniffed ?? mimeType;
  const size = `${bytes.length} bytes`;
  if (sniffed === null && (IMAGE_TYPES.has(mimeType) || mimeType === "application/pdf")) {
    return ok(`'${printable(path)}' is named like ${mimeType} but its bytes are not one (${size}); it cannot be shown.`);
  }
  if (IMAGE_TYPES.has(type)) {
    if (bytes.length > MAX_IMAGE_BYTES) {
      return ok(`'${printable(path)}' is an image (${type}, ${size}), too large to show (over ${MAX_IMAGE_BYTES} bytes).`);
    }
    const block: ImageBlock = { type: "image", mimeType: type, data: encodeBase64(bytes) };
    return ok(`Image '${printable(path)}' (${type}, ${size}).`, [block]);
  }
  if (type === "application/pdf") {
    if (bytes.length > MAX_PDF_BYTES) {
      return ok(`'${printable(path)}' is a PDF (${size}), too large to show (over ${MAX_PDF_BYTES} bytes); extract its text with a command if the workspace can run one.`);
    }
    const block: FileBlock = { type: "file", mimeType: type, data: encodeBase64(bytes), name: baseName(path) };
    return ok(`PDF document '${printable(path)}' (${size}), attached as a document.`, [block]);
  }
  if (looksLikeText(bytes)) {
    return ok(
      `'${printable(path)}' is not valid UTF-8 text (${size}; perhaps another encoding such as Latin-1); read_file shows UTF-8 text only, and edit_file cannot change it.`,
    );
  }
  return ok(`'${printable(path)}' is a binary file (${type}, ${size}); it cannot be shown as text.`);
}

/** No NUL and few control bytes in the first 8 KB: text in an encoding other than UTF-8, not binary data. */
function looksLikeText(bytes: Uint8Array): boolean {
  const head = bytes.subarray(0, 8192);
  if (head.length === 0) return false;
  let control = 0;
  for (const byte of head) {
    if (byte === 0) return false;
    if (byte < 0x20 && byte !== 0x09 && byte !== 0x0a && byte !== 0x0d && byte !== 0x0c) control++;
  }
  return control / head.length < 0.05;
}

/** An evicted result this session keeps in memory, paged like a file (it never changes, so nothing is recorded for the guard). */
function readHeld(session: ToolSession, text: string, path: string, window: LineWindow): string {
  const offset = "tail" in window ? Math.max(0, forEachLine(text, () => undefined) - window.tail) : window.offset;
  const { lines, totalLines } = textWindow(text, path, offset, "tail" in window ? window.tail : window.limit);
  return renderText(session, lines, path, offset, totalLines).replace(/\.\]$/, ". This result is kept in this session's memory, not in the workspace.]");
}

/** The image or PDF type from the file's first bytes, so a misnamed file is still shown. */
function sniffType(bytes: Uint8Array): string | null {
  const at = (i: number) => bytes[i] ?? -1;
  if (at(0) === 0x25 && at(1) === 0x50 && at(2) === 0x44 && at(3) === 0x46 && at(4) === 0x2d) return "application/pdf";
  if (at(0) === 0x89 && at(1) === 0x50 && at(2) === 0x4e && at(3) === 0x47) return "image/png";
  if (at(0) === 0xff && at(1) === 0xd8 && at(2) === 0xff) return "image/jpeg";
  if (at(0) === 0x47 && at(1) === 0x49 && at(2) === 0x46 && at(3) === 0x38) return "image/gif";
  if (at(0) === 0x52 && at(1) === 0x49 && at(2) === 0x46 && at(3) === 0x46 && at(8) === 0x57 && at(9) === 0x45 && at(10) === 0x42 && at(11) === 0x50) {
    return "image/webp";
  }
  return null;
}
