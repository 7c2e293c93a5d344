/**
 * The shell side of BaseSandbox: quoting, POSIX sh fragments (GNU coreutils
 * and BusyBox alike) that the derived file operations run, and the parsers
 * of what they print. Kept apart from the class so each reads in one sitting.
 */
import { StrataError, errors, printable } from "../core/errors.js";
import { decodeBase64, decodeText } from "../core/filedata.js";
import { checkQuota } from "../core/limits.js";
import type { FileInfo, GrepMatch } from "../core/types.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

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
    case "link":
      return new StrataError("permission_denied", `'${printable(path)}' lies under a symbolic link, and no change passes through one`, { path });
    case "special":
      return new StrataError("permission_denied", `'${path}' is not a regular file`);
    case "toolarge":
      return errors.tooLarge(path, Number(fields[0]), Number(fields[1]));
    case "conflict":
      return errors.conflict(path, "another writer changed it between read and write");
    case "busy":
      return new StrataError("busy", `'${printable(path)}' stayed locked by another operation for a minute; try again`);
    case "quota":
      return quotaError(path, fields.map(Number));
    case "failed":
      return errors.io(path);
    default:
      return undefined;
  }
}

/** The shell's `quota UB UF DB DF QB QF` line as core's quota error, so the wording is the one every backend uses. */
function quotaError(path: string, [bytes = 0, files = 0, addBytes = 0, addFiles = 0, maxBytes = -1, maxFiles = -1]: number[]): StrataError {
  try {
    checkQuota(
      { maxBytes: maxBytes < 0 ? undefined : maxBytes, maxFiles: maxFiles < 0 ? undefined : maxFiles },
      { bytes, files },
      { bytes: addBytes, files: addFiles },
      path,
    );
  } catch (error) {
    if (error instanceof StrataError) return error;
  }
  return errors.quotaExceeded(path, "the workspace is full");
}

/** Quotes any string for POSIX sh: spaces, quotes, newlines and `$` survive as they are. */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** A number as a shell script may see it: a plain integer, never exponent form (`1e+21`). */
export function int(value: number): string {
  if (!Number.isSafeInteger(value)) throw errors.invalidArgument(`${String(value)} is not an integer a shell can take`);
  return String(value);
}

// ---- shell fragments (POSIX sh; GNU coreutils and BusyBox alike) ----

/** Stops with a status word unless "$P" is a readable regular file (symlinks inside the sandbox are followed). */
export const CHECK_REGULAR_FILE = `[ -d "$P" ] && { echo isdir; exit 0; }
[ -e "$P" ] || { echo missing; exit 0; }
[ -f "$P" ] || { echo special; exit 0; }
[ -r "$P" ] || { echo denied; exit 0; }`;

/**
 * `linked PATH` succeeds when a directory between "$W" and PATH is a symbolic
 * link. No change (write, edit, delete, mkdir, move, copy) passes through
 * one: the permission rules are checked on the path as given, and a link
 * could lead a change under a path they protect (docs/security.md). A link
 * at PATH itself is the change's own object (replaced, deleted or moved).
 */
export const LINKED_FN = `linked() {
  a=\${1%/*}
  while [ "\${#a}" -gt "\${#W}" ]; do [ -L "$a" ] && return 0; a=\${a%/*}; done
  return 1
}`;

/**
 * Where the rules deny some reads: a read whose "$P" is reached through a
 * symbolic link (a parent directory below "$W" or the path itself) stops at
 * `via TARGET`, the path with every link resolved, so the caller checks the
 * rules on the file it would read before it reads it (BaseSandbox.readThrough).
 * The rules are checked on the path as given, and the derived operations' own
 * scripts see every file, also what commands are not shown. Needs LINKED_FN.
 */
export const READ_THROUGH_LINK = `if { [ "$P" != "$W" ] && [ -L "$P" ]; } || linked "$P"; then echo "via $(readlink -f -- "$P")"; exit 0; fi`;

/**
 * sh: whether "$a" is still something other than a directory, from one stat
 * (a dangling link too). Asked only once `[ -e ]` and `[ -d ]` said so: a
 * directory a concurrent delete removed between those two tests would pass
 * for a file, and the write would answer not_a_directory.
 */
const STILL_NOT_DIRECTORY = `{ strata_t=$(stat -L -c %F -- "$a" 2>/dev/null); if [ -n "$strata_t" ]; then [ "$strata_t" != directory ]; else [ -L "$a" ]; fi; }`;

/** Stops unless "$P" may become a file: not a directory, and no ancestor up to "$W" is a file. */
export const CHECK_PLACE_FOR_FILE = `[ -d "$P" ] && { echo isdir; exit 0; }
a=\${P%/*}
while [ "\${#a}" -gt "\${#W}" ]; do
  if [ -e "$a" ] || [ -L "$a" ]; then [ -d "$a" ] || ! ${STILL_NOT_DIRECTORY} || { echo notdir; exit 0; }; fi
  a=\${a%/*}
done`;

/** Reserved names: temporary files and lock directories of in-flight operations; listings leave them out. */
export const RESERVED_NAME = /^\.strata-(tmp|lock)-/;

/**
 * Workspace usage for the quota. `measure` sets UB (bytes, from `du -sk`) and
 * UF (regular files); `room DB DF` prints a `quota` status and fails when
 * adding DB bytes and DF files would pass QB/QF (-1: no limit). The script
 * sets QB QF, and UB UF to the cached usage or -1 to measure here.
 */
export const QUOTA_FN = `measure() {
  set -- $(du -sk -- "$W")
  UB=$((\${1:-0} * 1024)); UF=0
  for k in $(find "$W" -type f -exec sh -c 'echo $#' sh {} +); do UF=$((UF + k)); done
}
room() {
  [ "$QB" -ge 0 ] || [ "$QF" -ge 0 ] || return 0
  [ "$UB" -ge 0 ] || measure
  if { [ "$QB" -ge 0 ] && [ "$1" -gt 0 ] && [ $((UB + $1)) -gt "$QB" ]; } || { [ "$QF" -ge 0 ] && [ "$2" -gt 0 ] && [ $((UF + $2)) -gt "$QF" ]; }; then
    echo "quota $UB $UF $1 $2 $QB $QF"; return 1
  fi
  return 0
}`;

/**
 * The name of a virtual path's lock directory (LOCK_FN), kept in the
 * workspace's top directory. Every Strata writer of the path takes it: the
 * shell's overwrite, edit's compare-and-swap and delete, and every
 * sandbox's upload (Docker's UPLOAD script, SSH's rename round trip,
 * Bubblewrap's host side), so an edit's compare and its rename are one step
 * for all of them.
 */
export function lockName(path: string): string {
  return `.strata-lock-${nodeCrypto().createHash("sha256").update(path).digest("hex").slice(0, 32)}`;
}

/**
 * Fails (status 1) unless the file "$1" holds exactly "$2" bytes. Run on
 * every temporary file filled from stdin before it is linked or renamed
 * into place: a stdin cut short (the sandbox closed, the connection lost, the
 * sender killed) looks like a plain end of file to cat and dd, and the torn
 * temporary must never replace the target. A cut stream can only be
 * shorter, so the count catches every cut. `wc -c` answers from the inode
 * for a regular file on GNU (BusyBox reads it through).
 */
export const SIZE_FN = `size_is() { [ "$(($(wc -c < "$1")))" -eq "$2" ]; }`;

/**
 * A lock directory "$L" (mkdir is atomic on every file system and in every
 * userland, unlike flock, which BusyBox may lack). A holder killed before it
 * released leaves the directory; one older than 30 s is broken. Waits up to
 * a minute, then fails (the caller answers busy). A waiter forks little
 * (the clock and the lock's age are read every 16th try; the wait's start
 * at the first of those, so an uncontended lock forks only its mkdir): many
 * writers waiting at once must not exhaust the sandbox's process limit. A
 * lock released between a failed mkdir and the look at it is just tried again;
 * only mkdir failing 5 times in a row with no lock there (no workspace, no
 * permission) gives up.
 */
export const LOCK_FN = `lock() {
  s=; i=0; k=0
  until mkdir -- "$L"; do
    if [ ! -d "$L" ]; then i=$((i + 1)); [ "$i" -lt 5 ] && continue; return 1; fi
    i=0; k=$((k + 1))
    if [ $((k % 16)) -eq 0 ]; then
      n=$(date +%s); s=\${s:-$n}
      m=$(stat -c %Y -- "$L") && [ $((n - m)) -gt 30 ] && rmdir -- "$L" && continue
      [ $((n - s)) -lt 60 ] || return 1
    fi
    sleep 0.01 || sleep 1
  done
  locked=1
}`;

/**
 * Puts stdin at "$P" (N bytes), one of three ways:
 * - create: a hard link from a temporary file, which fails if "$P" exists,
 *   so of concurrent creators exactly one wins;
 * - replace: rename over "$P" under the path's lock;
 * - swap: under the lock, only if "$P" still has the md5 "$H" (edit's
 *   compare-and-swap: the compare and the rename are one step for every
 *   Strata writer, since overwrite takes the same lock).
 * Content goes to a temporary file in the workspace's top directory first
 * (same file system, so the final step is a rename or a link), so a failed
 * write never leaves a half-written file, and the temporary must hold
 * exactly N bytes before it goes anywhere (a stdin cut by close() or a lost
 * connection is only an early end of file to cat); an existing file's mode
 * is kept.
 * The final step is `ln -T` / `mv -T` (GNU and BusyBox alike): a directory
 * that appeared at "$P" meanwhile makes it fail (is_directory) instead of
 * receiving the file inside it. A parent a concurrent delete removed is made
 * again and the step retried, as a later write would (not by swap: an edit
 * whose file went with a delete answers missing, the delete came first;
 * delete takes the path's lock, so it cannot remove the file mid-swap). A failure is
 * classified from what is there now (`why`): a file on the way is notdir, a
 * directory at "$P" isdir, an existing parent we may not write denied.
 * A failed write removes the directories it created (only those: rmdir
 * stops at a non-empty one). The first line printed is the status,
 * `ok UB UF DB DF` on success.
 */
export const WRITE_FROM_STDIN = (temp: string, mode: "create" | "replace" | "swap") => `d=\${P%/*}; d=\${d:-/}; t="$W/${temp}"
c=; a=$d; made=; locked=; done=
while [ "\${#a}" -gt "\${#W}" ] && [ ! -e "$a" ] && [ ! -L "$a" ]; do c=$a; a=\${a%/*}; done
undo() {
  [ -n "$made" ] && [ -n "$c" ] || return 0
  x=$d
  while [ "\${#x}" -gt "\${#W}" ]; do
    rmdir -- "$x" || [ ! -e "$x" ] || return 0
    [ "$x" = "$c" ] && return 0
    x=\${x%/*}
  done
}
why() {
  a=$d
  while [ "\${#a}" -gt "\${#W}" ]; do
    if [ -e "$a" ] || [ -L "$a" ]; then [ -d "$a" ] || ! ${STILL_NOT_DIRECTORY} || { echo notdir; return; }; fi
    a=\${a%/*}
  done
  if [ -d "$P" ]; then echo isdir
  elif [ ! -d "$d" ]; then echo again
  elif [ ! -w "$d" ] || [ ! -x "$d" ]; then echo denied
  else echo failed; fi
}
taken() { if [ -d "$P" ]; then echo isdir; else echo exists; fi; }
cleanup() { rm -f -- "$t"; [ -z "$locked" ] || rmdir -- "$L"; [ -n "$done" ] || undo; }
old() { o=0; e=0; if [ -f "$P" ]; then o=$(stat -L -c %s -- "$P") || o=0; e=1; fi; }
trap cleanup EXIT
${LINKED_FN}
linked "$P" && { echo link; exit 0; }
${mode === "swap" ? CHECK_REGULAR_FILE : CHECK_PLACE_FOR_FILE}
${mode === "create" ? `if [ -e "$P" ] || [ -L "$P" ]; then taken; exit 0; fi
` : ""}old
room $((N - o)) $((1 - e)) || exit 0
cat > "$t" || { if [ -w "$W" ]; then echo failed; else echo denied; fi; exit 0; }
# stdin cut short (the call stopped, the sandbox closed): never put a torn file in place.
[ "$(($(wc -c < "$t")))" -eq "$N" ] || { echo failed; exit 0; }
${mode === "create" ? "" : `lock || { echo busy; exit 0; }
${mode === "swap" ? `${CHECK_REGULAR_FILE}
h=$(md5sum < "$P")
[ "\${h%% *}" = "$H" ] || { echo conflict; exit 0; }` : `[ -d "$P" ] && { echo isdir; exit 0; }`}
old
[ "$e" = 1 ] && chmod "$(stat -L -c %a -- "$P")" "$t"
room $((N - o)) $((1 - e)) || exit 0
`}made=1; n=0
while :; do
  if ${mode === "swap" ? "" : `mkdir -p -- "$d" && `}${mode === "create" ? `ln -T -- "$t" "$P"` : `mv -f -T -- "$t" "$P"`}; then
    done=1; echo "ok $UB $UF $((N - o)) $((1 - e))"; exit 0
  fi
  ${mode === "create" ? `if [ -e "$P" ] || [ -L "$P" ]; then taken; exit 0; fi` : `[ -d "$P" ] && { echo isdir; exit 0; }`}
  w=$(why)
  ${mode === "swap"
    ? `# The file's directory went with a concurrent delete of an ancestor: the delete came first.
  [ "$w" = again ] && w=missing`
    : `# A concurrent delete removed the directory: make it again, as a later write would. (It may be back already,
  # made by another writer after this step failed: then nothing here explains the failure, so that is tried again too.)
  if [ "$w" = again ] || [ "$w" = failed ]; then n=$((n + 1)); [ "$n" -lt 8 ] && continue; w=failed; fi`}
  echo "$w"; exit 0
done`;

/**
 * `place PATH`: prints whether PATH may become a file: ok, isdir, notdir (an
 * ancestor up to "$W" is a file), or link (one is a symlink: see LINKED_FN).
 */
export const PLACE_FN = `place() {
  [ -d "$1" ] && { echo isdir; return; }
  a=\${1%/*}
  while [ "\${#a}" -gt "\${#W}" ]; do
    [ -L "$a" ] && { echo link; return; }
    if [ -e "$a" ]; then [ -d "$a" ] || ! ${STILL_NOT_DIRECTORY} || { echo notdir; return; }; fi
    a=\${a%/*}
  done
  echo ok
}`;

/**
 * `put PATH SIZE TEMP LOCK`: takes exactly SIZE bytes from stdin (dd with
 * fullblock: exact on pipes, GNU and BusyBox alike) into a temp file beside
 * PATH, checks it holds SIZE bytes (a stdin cut short is only an early end
 * of file to dd), then renames it over PATH holding the path's lock
 * directory LOCK (LOCK_FN: the lock edit's compare-and-swap, overwrite and
 * delete take); prints a status. A file that cannot be written still has
 * its bytes consumed so the next file starts at the right place; if the
 * stream position is lost (a failed or short write), the rest of the batch
 * fails. Needs PLACE_FN, LOCK_FN and SIZE_FN.
 */
export const PUT_FN = `take() {
  q=$(($1 / 65536)); r=$(($1 % 65536))
  if [ "$q" -gt 0 ]; then dd bs=65536 count="$q" iflag=fullblock || return 1; fi
  if [ "$r" -gt 0 ]; then dd bs="$r" count=1 iflag=fullblock || return 1; fi
  return 0
}
locked=
trap '[ -z "$locked" ] || rmdir -- "$L"; [ -z "$t" ] || rm -f -- "$t"' EXIT
put() {
  [ -z "$broken" ] || { echo failed; return; }
  st=$(place "$1")
  if [ "$st" = ok ]; then
    d=\${1%/*}; d=\${d:-/}; t="$d/$3"
    if mkdir -p -- "$d" && : > "$t"; then
      if take "$2" > "$t" && size_is "$t" "$2"; then
        L=$4
        if lock; then
          [ -f "$1" ] && chmod "$(stat -L -c %a -- "$1")" "$t"
          if mv -f -T -- "$t" "$1"; then st=ok; else rm -f -- "$t"; st=$(place "$1"); [ "$st" = ok ] && st=denied; fi
          rmdir -- "$L"; locked=
        else
          rm -f -- "$t"; st=busy
        fi
        t=; echo "$st"; return
      fi
      rm -f -- "$t"; t=; broken=1; echo failed; return
    fi
    t=; st=denied
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
 * grep reads its pattern from a here-document (`-f -`) the shell expands from
 * $STRATA_PATTERN, here and wherever grep runs: in argv, a pattern would show
 * in `ps` to every user of a shared (SSH) host.
 */
export const GREP_SMALL_BATCH = `L=$(grep -l -F -f - -- "$@" <<STRATA_P
$STRATA_PATTERN
STRATA_P
)
[ -n "$L" ] || exit 0
set -f
IFS='
'
set -- $L
printf 'B'; printf '%s\\n' "$@"; printf '\\000'
wc -c -- "$@"; printf '\\000'
cat -- "$@" | base64; printf '\\000'`;

/**
 * grep's per-file report: W<path>\0<base64 of the file>\0, or, for big files
 * without NUL, L<path>\0<u>\0<base64 of grep -n lines>\0, where u is the
 * number of the file's last line when no newline ends it (else 0): grep
 * prints a newline after every line, so only u tells whether a `\r` ending
 * that line is a line ending (stripped) or content (kept, as core keeps it).
 */
export const GREP_EMIT = `emit() {
  s=$(($(wc -c < "$1")))
  if [ "$s" -le ${WHOLE_FILE_BYTES} ]; then printf 'W%s\\000' "$1"; base64 < "$1"; printf '\\000'; return 0; fi
  [ "$(($(tr -d '\\000' < "$1" | wc -c)))" -eq "$s" ] || return 0
  u=0; [ "$(tail -c 1 < "$1" | wc -l)" -eq 0 ] && u=$(($(wc -l < "$1") + 1))
  printf 'L%s\\000%s\\000' "$1" "$u"; grep -n -F -f - -- "$1" <<STRATA_P | base64; printf '\\000'
$STRATA_PATTERN
STRATA_P
}`;

/**
 * `grep_batch NAME...` (names one per argument, none holding a newline;
 * needs IFS=$NL, set -f and emit()): reports files up to 1 MiB whole as one
 * B record (names, the sizes `wc -c` counted, then the files concatenated as
 * base64), bigger ones through emit. The sizes are counted before cat reads
 * the files, so a file changed in between shows as a torn batch.
 */
export const GREP_BATCH = `grep_batch() {
  S=$(wc -c -- "$@" 2>/dev/null)
  g_small=
  g_sizes=
  # Split by IFS (a newline), not read from a here-document: sh's read takes a byte per system call.
  for line in $S; do
    [ $# -gt 0 ] || break
    line=\${line#"\${line%%[! ]*}"}
    s=\${line%% *}
    case $s in ''|*[!0-9]*) s=0;; esac
    if [ "$s" -le ${WHOLE_FILE_BYTES} ]; then g_small="$g_small$1$NL"; g_sizes="$g_sizes$s$NL"; else emit "$1"; fi
    shift
  done
  [ -n "$g_small" ] || return 0
  set -- $g_small
  printf 'B'; printf '%s\\n' "$@"; printf '\\000%s\\000' "$g_sizes"
  cat -- "$@" | base64; printf '\\000'
}`;

/** find's walk over the names grep -r or rg left out (`odd`: -path tests), each grepped and sent by emit. */
const grepOddNames = (odd: string) =>
  `find -H "$R" \\( -name '.strata-tmp-*' -o -name '.strata-lock-*' \\) -prune -o -type f ${odd} -exec sh -c ${shellQuote(`${GREP_EMIT}\nfor f do\n  grep -q -F -f - -- "$f" <<STRATA_P && emit "$f"\n$STRATA_PATTERN\nSTRATA_P\ndone`)} sh {} +`;

/** grep's POSIX path (F=posix, or rg failed): find batches; small files whole, big ones through emit, odd names alone. */
export const GREP_POSIX = `find -H "$R" \\( -name '.strata-tmp-*' -o -name '.strata-lock-*' \\) -prune -o -type f -size -${WHOLE_FILE_BYTES / 1024 + 1}k ! -path "*$NL*" -exec sh -c ${shellQuote(GREP_SMALL_BATCH)} sh {} +
find -H "$R" \\( -name '.strata-tmp-*' -o -name '.strata-lock-*' \\) -prune -o -type f ! -size -${WHOLE_FILE_BYTES / 1024 + 1}k ! -path "*$NL*" -exec sh -c ${shellQuote(`grep -l -F -f - -- "$@" <<STRATA_P\n$STRATA_PATTERN\nSTRATA_P`)} sh {} + | while IFS= read -r f; do emit "$f"; done
find -H "$R" \\( -name '.strata-tmp-*' -o -name '.strata-lock-*' \\) -prune -o -type f -path "*$NL*" -exec sh -c ${shellQuote(`${GREP_EMIT}\nfor f do\n  grep -q -F -f - -- "$f" <<STRATA_P && emit "$f"\n$STRATA_PATTERN\nSTRATA_P\ndone`)} sh {} +`;

/**
 * Sets F to how the sandbox proposes grep's candidate files: rg (ripgrep),
 * gnu (GNU grep: -r, -I, --exclude), or posix (find batches). `known` is
 * what an earlier script of the sandbox reported; undefined probes, once.
 */
export function grepFlavor(known: string | undefined): string {
  if (known === "rg" || known === "gnu" || known === "posix") return `F=${known}`;
  return `if command -v rg >/dev/null 2>&1; then F=rg
else case $(grep -V </dev/null 2>&1) in *GNU*) F=gnu;; *) F=posix;; esac; fi`;
}

/**
 * grep's candidates from one GNU \`grep -rlIF\` (F=gnu): -r follows a link
 * only at the root and skips devices, as find -H -type f; -I drops files
 * whose first block holds NUL (core calls those binary anyway; any other
 * candidate is still read whole and decided by core). Names with a newline
 * are left to a find over such names only, run first. Expects R, NL, emit
 * and grep_batch. The fallback of GREP_GNU_WHOLE.
 */
export const GREP_GNU = `${grepOddNames(`-path "*$NL*"`)}
L=$(grep -rlIF --exclude-dir='.strata-tmp-*' --exclude-dir='.strata-lock-*' --exclude='.strata-tmp-*' --exclude='.strata-lock-*' --exclude="*$NL*" --exclude-dir="*$NL*" -f - -- "$R" <<STRATA_P
$STRATA_PATTERN
STRATA_P
)
set -f
IFS=$NL
set --
for f in $L; do
  if [ $# -ge 500 ]; then grep_batch "$@"; set --; fi
  set -- "$@" "$f"
done
[ $# -eq 0 ] || grep_batch "$@"`;

/**
 * grep in one process where grep is GNU's (F=gnu), the script's last step:
 * with -z a record ends at NUL, not at a newline, so a file without NUL is
 * one record, and a file holding the pattern is printed whole, raw, as
 * `NAME\0OFFSET:RECORD\0` (-Z: names may hold newlines; -b: the record's
 * byte offset). A file holding NUL shows as a record past offset 0 or as
 * more than one record (-A1 prints the record after a match, `OFFSET-`), so
 * only a single record at offset 0 is a text file, which core's grepText
 * then searches as every other path does. What -z cannot show is a file
 * whose only NUL is its last byte (a terminator, as a last newline is
 * without -z): such a file reads as text here. Exit status 1 is no match, 2 an unreadable file
 * passed over. The output is taken as UTF-8 text, so an answer holding
 * U+FFFD (bytes that were not UTF-8, or the character itself) is asked
 * again through GREP_GNU, in base64.
 */
export const GREP_GNU_WHOLE = `exec grep -rzHZbF -A1 --no-group-separator --exclude-dir='.strata-tmp-*' --exclude-dir='.strata-lock-*' --exclude='.strata-tmp-*' --exclude='.strata-lock-*' -f - -- "$R" <<STRATA_P
$STRATA_PATTERN
STRATA_P`;

/** Parses GREP_GNU_WHOLE's output: each file that is one NUL-free record, with that record; undefined for a malformed answer. */
export function parseWholeRecords(payload: string): Map<string, string> | undefined {
  const files = new Map<string, string>();
  const binary = new Set<string>();
  let at = 0;
  while (at < payload.length) {
    const nameEnd = payload.indexOf("\0", at);
    const end = nameEnd === -1 ? -1 : payload.indexOf("\0", nameEnd + 1);
    if (end === -1) return undefined;
    const name = payload.slice(at, nameEnd);
    let digits = nameEnd + 1;
    while (digits < end && payload.charCodeAt(digits) >= 48 && payload.charCodeAt(digits) <= 57) digits++;
    if (digits === nameEnd + 1 || digits === end) return undefined;
    const first = payload[digits] === ":" && digits === nameEnd + 2 && payload[nameEnd + 1] === "0";
    if (!first || files.has(name) || binary.has(name)) {
      files.delete(name);
      binary.add(name);
    } else {
      files.set(name, payload.slice(digits + 1, end));
    }
    at = end + 1;
  }
  return files;
}

/**
 * grep's fast path where the sandbox has ripgrep: one rg -l -F (parallel,
 * one walk) proposes the files, which are then reported exactly as the POSIX
 * path reports them (small files whole in B records, big ones through emit),
 * so core's grepText still decides every line and binary-ness. rg is only
 * asked for a literal, reads its pattern from a here-document, sees hidden
 * and ignored files (--hidden, --no-ignore, no config) and raw bytes
 * (-E none), and skips the internal names as find prunes them. rg lists
 * names NUL-terminated and tr swaps NUL and newline, so a name holding a
 * newline (or byte 1) shows as byte 1 and is left to a find over such names
 * only. Expects R, NL, SOH, emit() and grep_batch(); sets rg_done when rg
 * answered (status 0 or 1); otherwise (rg failed) the caller runs the POSIX path.
 */
export const GREP_RIPGREP = `rg_done=
SOH=$(printf '\\001')
L=$( (rg --files-with-matches --null --fixed-strings --hidden --no-ignore --no-config --no-messages -E none -g '!.strata-tmp-*' -g '!.strata-lock-*' -f - -- "$R" <<STRATA_P
$STRATA_PATTERN
STRATA_P
printf '\\000%s' "$?") | tr '\\n\\000' '\\001\\n')
rc=\${L##*"$NL"}
if [ "$rc" = 0 ] || [ "$rc" = 1 ]; then
  rg_done=1
  case $L in *"$NL"*) L=\${L%"$NL"*};; *) L=;; esac
  rg_odd=
  set -f
  IFS=$NL
  set --
  for f in $L; do
    case $f in *"$SOH"*) rg_odd=1; continue;; esac
    set -- "$@" "$f"
    if [ $# -ge 500 ]; then grep_batch "$@"; set --; fi
  done
  [ $# -eq 0 ] || grep_batch "$@"
  [ -z "$rg_odd" ] || ${grepOddNames(`\\( -path "*$NL*" -o -path "*$SOH*" \\)`)}
fi`;

/**
 * Sets G=1 where find has GNU's -printf (one find prints names, types, sizes
 * and times: no shell and no stat per batch), else G=0. `known` is what an
 * earlier script of the same sandbox reported; undefined probes, once.
 */
export function findFlavor(known: boolean | undefined): string {
  if (known !== undefined) return `G=${known ? 1 : 0}`;
  return `if find /dev/null -maxdepth 0 -printf '' </dev/null >/dev/null; then G=1; else G=0; fi`;
}

/**
 * GNU find's `-printf` in place of STAT_BATCH: `%Y %s %T@ %p\0` per entry.
 * %Y follows links (d for a directory, N/L/? for a link to nothing, a loop,
 * an error); %s and %T@ are the entry's own, so ls hands links to STAT_BATCH.
 */
export const FIND_PRINTF = `-printf '%Y %s %T@ %p\\000'`;

export interface StatEntry {
  name: string;
  isDir: boolean;
  size?: number;
  mtime?: number;
}

/**
 * Parses what a listing printed: FIND_PRINTF records and STAT_BATCH batches,
 * in any order (ls prints its links through STAT_BATCH among -printf's
 * records; a batch starts with `B`, a record with a %Y letter, never `B`).
 * A link to nothing or a path stat could not read (a loop, a race) keeps no size.
 */
export function parseListing(payload: string): StatEntry[] {
  const entries: StatEntry[] = [];
  let at = 0;
  while (at < payload.length) {
    if (payload[at] === "B") {
      at = parseStatBatch(payload, at, entries);
      if (at === -1) break;
      continue;
    }
    const end = payload.indexOf("\0", at);
    if (end === -1) break;
    const record = payload.slice(at, end);
    at = end + 1;
    const sizeEnd = record.indexOf(" ", 2);
    const timeEnd = record.indexOf(" ", sizeEnd + 1);
    if (record[1] !== " " || sizeEnd === -1 || timeEnd === -1) continue;
    const type = record[0];
    const entry: StatEntry = { name: record.slice(timeEnd + 1), isDir: type === "d" };
    if (type !== "N" && type !== "L" && type !== "?") {
      entry.size = Number(record.slice(2, sizeEnd));
      entry.mtime = Math.floor(Number(record.slice(sizeEnd + 1, timeEnd)));
    }
    entries.push(entry);
  }
  return entries;
}

/** One STAT_BATCH batch from `at` into `entries`; returns where the next output starts, -1 for a cut batch. */
function parseStatBatch(payload: string, start: number, entries: StatEntry[]): number {
  const headerEnd = payload.indexOf("\n", start);
  if (headerEnd === -1) return -1;
  const count = Number(payload.slice(start + 1, headerEnd));
  let at = headerEnd + 1;
  const batch: StatEntry[] = [];
  for (let i = 0; i < count; i++) {
    const end = payload.indexOf("\0", at);
    if (end === -1) return -1;
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
  return at;
}

export function fileInfo(path: string, entry: StatEntry): FileInfo {
  const info: FileInfo = { path, is_dir: false };
  if (entry.size !== undefined) info.size = entry.size;
  if (entry.mtime !== undefined) info.modified_at = new Date(entry.mtime * 1000).toISOString();
  return info;
}

/**
 * `grep -n` output of a big file as matches; a line that is not UTF-8 makes
 * the file binary (skipped). `unterminated` is the number of a last line no
 * newline ends (0 for none): its trailing `\r` is content.
 */
export function parseGrepLines(path: string, output: Uint8Array, unterminated = 0): GrepMatch[] {
  const matches: GrepMatch[] = [];
  let start = 0;
  while (start < output.length) {
    let end = output.indexOf(10, start);
    if (end === -1) end = output.length;
    const colon = output.indexOf(58, start);
    const line = colon === -1 || colon > end ? NaN : Number(new TextDecoder().decode(output.subarray(start, colon)));
    const stop = end > colon + 1 && output[end - 1] === 13 && line !== unterminated ? end - 1 : end;
    const text = Number.isNaN(line) ? null : decodeText(output.subarray(colon + 1, stop));
    if (text === null) return [];
    matches.push({ path, line, text });
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
