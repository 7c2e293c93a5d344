import { StrataError, errors, printable } from "./errors.js";

export interface EditOutcome {
  text: string;
  occurrences: number;
}

/**
 * Exact-string replacement, the single implementation every backend uses.
 * CRLF-aware: in a file with `\r\n` endings, an `oldString` written with bare
 * `\n` (as models write it) matches, and the replacement keeps `\r\n`.
 */
export function applyEdit(text: string, oldString: string, newString: string, replaceAll: boolean, path: string): EditOutcome {
  if (typeof oldString !== "string" || typeof newString !== "string") {
    throw errors.invalidArgument("old_string and new_string must be strings");
  }
  if (oldString === "") throw errors.invalidArgument("old_string must not be empty; use write to create content");
  if (oldString === newString) throw errors.invalidArgument("old_string and new_string are identical; nothing to change");

  let find = oldString;
  let replacement = newString;
  if (text.includes("\r\n") && find.includes("\n") && !find.includes("\r\n")) {
    find = find.replace(/\n/g, "\r\n");
    replacement = replacement.replace(/\r?\n/g, "\r\n");
  }

  const positions: number[] = [];
  for (let i = text.indexOf(find); i !== -1; i = text.indexOf(find, i + find.length)) {
    positions.push(i);
    if (!replaceAll && positions.length > 1) {
      // Count them all so the message can say how many.
      let count = positions.length;
      for (let j = text.indexOf(find, i + find.length); j !== -1; j = text.indexOf(find, j + find.length)) count++;
      throw new StrataError(
        "ambiguous_match",
        `old_string appears ${count} times in '${printable(path)}'. Add surrounding lines to make it unique, or set replace_all to change every occurrence`,
      );
    }
  }
  if (positions.length === 0) {
    throw new StrataError("no_match", `old_string was not found in '${printable(path)}'. Read the file and copy the text exactly, including whitespace`);
  }

  // Slicing rather than String.replace: `$&`-style patterns in newString stay literal.
  let out = "";
  let last = 0;
  for (const position of positions) {
    out += text.slice(last, position) + replacement;
    last = position + find.length;
  }
  return { text: out + text.slice(last), occurrences: positions.length };
}
