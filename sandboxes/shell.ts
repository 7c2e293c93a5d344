/**
 * The shell side of BaseSandbox: POSIX sh fragments (GNU coreutils and
 * BusyBox alike) that the derived file operations run, and the parsers of
 * what they print. Kept apart from the class so each reads in one sitting.
 */
import { StrataError, errors } from "../core/errors.js";
import { decodeBase64, decodeText } from "../core/filedata.js";
import type { FileInfo, GrepMatch } from "../core/types.js";

/** Largest file `readRaw`, `edit` and a sandbox's download move through `execute`. */
export const MAX_TRANSFER_BYTES = 64 * 1024 * 1024;
/** Files up to this size are read (and grepped) whole, so core decides binary-ness and formats exactly. */
export const WHOLE_FILE_BYTES = 1024 * 1024;

/** Maps a script's status word to the error it stands for; undefined for success words. */
export function statusError(status: string, path: string, fields: string[]): StrataError | undefined {
  switch (status) {
    case "missing":
      return errors.notFound(path);
    case "isdir":
      return errors.isDirectory(path);
    case "notdir":
      return errors.notADirectory(path);
    case "exists":
      return errors.alreadyExists(path);
    case "denied":
      return errors.permissionDenied(path);
    case "special":
      return new StrataError("permission_denied", `'${path}' is not a regular file`);
    case "toolarge":
      return errors.tooLarge(path, Number(fields[0]), Number(fields[1]));
    case "conflict":
      return new StrataError("conflict", `'${path}' changed while it was being edited; read it again and retry`);
    case "failed":
      return errors.io(path);
    default:
      return undefined;
  }
}

// ---- shell fragments (POSIX sh; GNU coreutils and BusyBox alike) ----

/** Stops with a status word unless "$P" is a readable regular file (symlinks inside the sandbox are followed). */
export const CHECK_REGULAR_FILE = `[ -d "$P" ] && { echo isdir; exit 0; }
[ -e "$P" ] || { echo missing; exit 0; }
[ -f "$P" ] || { echo special; exit 0; }
[ -r "$P" ] || { echo denied; exit 0; }`;

/** Stops unless "$P" may become a file: not a directory, and no ancestor up to "$W" is a file. */
export const CHECK_PLACE_FOR_FILE = `[ -d "$P" ] && { echo isdir; exit 0; }
a=\${P%/*}
while [ "\${#a}" -gt "\${#W}" ]; do
  if [ -e "$a" ] || [ -L "$a" ]; then [ -d "$a" ] || { echo notdir; exit 0; }; fi
  a=\${a%/*}
done`;

/**
 * Writes stdin to a temporary file beside "$P" and renames it over "$P", so
 * a failed write never leaves a half-written file; keeps an existing file's mode.
 */
export const REPLACE_FROM_STDIN = (temp: string) => `d=\${P%/*}
d=\${d:-/}
mkdir -p -- "$d" || { echo denied; exit 0; }
t="$d/${temp}"
if cat > "$t"; then
  [ -f "$P" ] && chmod "$(stat -L -c %a -- "$P")" "$t"
  mv -f -- "$t" "$P" && { echo ok; exit 0; }
fi
rm -f -- "$t"
if [ -w "$d" ]; then echo failed; else echo denied; fi`;

/** `place PATH`: prints whether PATH may become a file: ok, isdir, or notdir (an ancestor up to "$W" is a file). */
export const PLACE_FN = `place() {
  [ -d "$1" ] && { echo isdir; return; }
  a=\${1%/*}
  while [ "\${#a}" -gt "\${#W}" ]; do
    if [ -e "$a" ] || [ -L "$a" ]; then [ -d "$a" ] || { echo notdir; return; }; fi
    a=\${a%/*}
  done
  echo ok
}`;

/**
 * `put PATH SIZE TEMP`: takes exactly SIZE bytes from stdin (dd with
 * fullblock: exact on pipes, GNU and BusyBox alike) into PATH via a temp
 * file and rename; prints a status. A file that cannot be written still has
 * its bytes consumed so the next file starts at the right place; if the
 * stream position is lost (a failed write), the rest of the batch fails.
 */
export const PUT_FN = `take() {
  q=$(($1 / 65536)); r=$(($1 % 65536))
  if [ "$q" -gt 0 ]; then dd bs=65536 count="$q" iflag=fullblock || return 1; fi
  if [ "$r" -gt 0 ]; then dd bs="$r" count=1 iflag=fullblock || return 1; fi
  return 0
}
put() {
  [ -z "$broken" ] || { echo failed; return; }
  st=$(place "$1")
  if [ "$st" = ok ]; then
    d=\${1%/*}; d=\${d:-/}; t="$d/$3"
    if mkdir -p -- "$d" && : > "$t"; then
      if take "$2" > "$t"; then
        [ -f "$1" ] && chmod "$(stat -L -c %a -- "$1")" "$t"
        if mv -f -- "$t" "$1"; then echo ok; else rm -f -- "$t"; st=$(place "$1"); [ "$st" = ok ] && st=denied; echo "$st"; fi
        return
      fi
      rm -f -- "$t"; broken=1; echo failed; return
    fi
    st=denied
  fi
  take "$2" > /dev/null || broken=1
  echo "$st"
}`;

/** `get PATH`: prints a status line, then (for ok) the file as base64, then NUL; "later" once the batch holds ~64 MiB. */
export const GET_FN = `sent=0
get() {
  if [ -d "$1" ]; then echo isdir
  elif [ ! -e "$1" ]; then echo missing
  elif [ ! -f "$1" ]; then echo special
  elif [ ! -r "$1" ]; then echo denied
  else
    s=$(($(wc -c < "$1")))
    if [ "$s" -gt ${MAX_TRANSFER_BYTES} ]; then echo "toolarge $s ${MAX_TRANSFER_BYTES}"
    elif [ "$sent" -gt 0 ] && [ $((sent + s)) -gt ${MAX_TRANSFER_BYTES} ]; then echo later
    else sent=$((sent + s)); echo ok; base64 < "$1"; fi
  fi
  printf '\\000'
}`;

/**
 * Run by `find -exec sh -c … {} +` once per batch of paths: prints the batch
 * size, each path with its type (d/f) NUL-terminated, then `stat` lines
 * ("size mtime path") for the paths stat could read, in the same order.
 */
export const STAT_BATCH = `printf 'B%d\\n' "$#"
for n do if [ -d "$n" ]; then printf 'd%s\\000' "$n"; else printf 'f%s\\000' "$n"; fi; done
stat -L -c '%s %Y %n' -- "$@"
:`;

/**
 * Run by `find -exec sh -c … {} +` on files up to 1 MiB: keeps those holding
 * the pattern (one grep -l), then reports them as one record:
 * B<wc -c output>\0<base64 of the files concatenated>\0. Names reaching here
 * hold no newline, so splitting grep's list on newlines is exact.
 */
export const GREP_SMALL_BATCH = `L=$(grep -l -F -e "$STRATA_PATTERN" -- "$@")
[ -n "$L" ] || exit 0
set -f
IFS='
'
set -- $L
printf 'B'; printf '%s\\n' "$@"; printf '\\000'
wc -c -- "$@"; printf '\\000'
cat -- "$@" | base64; printf '\\000'`;

/** grep's per-file report: W<path>\0<base64 of the file>\0, or L<path>\0<base64 of grep -n lines>\0 for big files without NUL. */
export const GREP_EMIT = `emit() {
  s=$(($(wc -c < "$1")))
  if [ "$s" -le ${WHOLE_FILE_BYTES} ]; then printf 'W%s\\000' "$1"; base64 < "$1"; printf '\\000'; return 0; fi
  [ "$(($(tr -d '\\000' < "$1" | wc -c)))" -eq "$s" ] || return 0
  printf 'L%s\\000' "$1"; grep -n -F -e "$STRATA_PATTERN" -- "$1" | base64; printf '\\000'
}`;

export interface StatEntry {
  name: string;
  isDir: boolean;
  size?: number;
  mtime?: number;
}

/** Parses STAT_BATCH output. A path stat could not read (a dangling symlink, a race) keeps no size. */
export function parseStatBatches(payload: string): StatEntry[] {
  const entries: StatEntry[] = [];
  let at = 0;
  while (payload.startsWith("B", at)) {
    const headerEnd = payload.indexOf("\n", at);
    const count = Number(payload.slice(at + 1, headerEnd));
    at = headerEnd + 1;
    const batch: StatEntry[] = [];
    for (let i = 0; i < count; i++) {
      const end = payload.indexOf("\0", at);
      if (end === -1) return entries;
      batch.push({ isDir: payload[at] === "d", name: payload.slice(at + 1, end) });
      at = end + 1;
    }
    const statLine = /(\d+) (\d+) /y;
    for (const entry of batch) {
      statLine.lastIndex = at;
      const match = statLine.exec(payload);
      if (!match) continue;
      const after = statLine.lastIndex;
      if (!payload.startsWith(`${entry.name}\n`, after)) continue;
      entry.size = Number(match[1]);
      entry.mtime = Number(match[2]);
      at = after + entry.name.length + 1;
    }
    entries.push(...batch);
  }
  return entries;
}

export function fileInfo(path: string, entry: StatEntry): FileInfo {
  const info: FileInfo = { path, is_dir: false };
  if (entry.size !== undefined) info.size = entry.size;
  if (entry.mtime !== undefined) info.modified_at = new Date(entry.mtime * 1000).toISOString();
  return info;
}

/** `grep -n` output of a big file as matches; a line that is not UTF-8 makes the file binary (skipped). */
export function parseGrepLines(path: string, output: Uint8Array): GrepMatch[] {
  const matches: GrepMatch[] = [];
  let start = 0;
  while (start < output.length) {
    let end = output.indexOf(10, start);
    if (end === -1) end = output.length;
    const colon = output.indexOf(58, start);
    const stop = end > start && output[end - 1] === 13 ? end - 1 : end;
    const text = colon === -1 || colon > end ? null : decodeText(output.subarray(colon + 1, stop));
    if (text === null) return [];
    matches.push({ path, line: Number(new TextDecoder().decode(output.subarray(start, colon))), text });
    start = end + 1;
  }
  return matches;
}

export function fromBase64(text: string): Uint8Array {
  return decodeBase64(text.replace(/\s+/g, ""));
}

/** A temporary file name beside the target: unique per call, since PIDs repeat across PID namespaces. */
export function tempName(): string {
  return `.strata-tmp-${globalThis.crypto.randomUUID()}`;
}

/**
 * Splits work into round trips: each under MAX_TRANSFER_BYTES of content
 * and under ~96 KiB of script (Linux caps one argv string at 128 KiB).
 */
export function batches<T>(items: readonly T[], size: (item: T) => number, pathLength: (item: T) => number): T[][] {
  const result: T[][] = [];
  let current: T[] = [];
  let bytes = 0;
  let script = 0;
  for (const item of items) {
    const itemScript = pathLength(item) * 4 + 96;
    if (current.length > 0 && (bytes + size(item) > MAX_TRANSFER_BYTES || script + itemScript > 96 * 1024)) {
      result.push(current);
      current = [];
      bytes = 0;
      script = 0;
    }
    current.push(item);
    bytes += size(item);
    script += itemScript;
  }
  if (current.length > 0) result.push(current);
  return result;
}
