/**
 * The file commands: ls, read, write, edit, glob, grep, upload, download.
 * Each calls one native operation; `--json` prints its result as it is
 * (bytes as base64), otherwise a line per entry for people and pipes.
 */
import { readFileSync, writeFileSync } from "node:fs";
import nodePath from "node:path";
import { Command, InvalidArgumentError } from "commander";
import { fail, printJson, targetOptions, unwrap, virtualPath, withTarget, type TargetFlags } from "./common.js";

function count(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError("a whole number");
  return n;
}

async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** A host file's bytes; the error names the file, never its directory. */
function readLocal(file: string): Uint8Array {
  if (file === "-") return new Uint8Array(0);
  try {
    return readFileSync(file);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return fail(code === "ENOENT" ? "file_not_found" : code === "EACCES" ? "permission_denied" : code === "EISDIR" ? "is_directory" : "io_error", `Cannot read the local file '${nodePath.basename(file)}'`);
  }
}

function writeLocal(file: string, bytes: Uint8Array): void {
  try {
    writeFileSync(file, bytes);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    fail(code === "ENOENT" ? "file_not_found" : code === "EACCES" ? "permission_denied" : code === "EISDIR" ? "is_directory" : "io_error", `Cannot write the local file '${nodePath.basename(file)}'`);
  }
}

export function fileCommands(): Command[] {
  const ls = targetOptions(new Command("ls"))
    .description("list a directory (directories end in /)")
    .argument("[path]", "the directory", "/")
    .option("-l, --long", "sizes and modification times too")
    .action((path: string, flags: TargetFlags & { long?: boolean }) =>
      withTarget(flags, async (backend) => {
        const listing = unwrap(await backend.ls(virtualPath(path)));
        if (flags.json) return printJson(listing);
        for (const e of listing.entries) process.stdout.write(flags.long ? `${String(e.is_dir ? "-" : (e.size ?? "?")).padStart(10)}  ${e.modified_at ?? ""}  ${e.path}\n` : `${e.path}\n`);
      }),
    );

  const read = targetOptions(new Command("read"))
    .description("print a file: a window of a text file's lines, or a binary file's bytes as they are")
    .argument("<path>", "the file")
    .option("--offset <n>", "first line, 0-based", count)
    .option("--limit <n>", "lines to print (default 2000)", count)
    .action((path: string, flags: TargetFlags & { offset?: number; limit?: number }) =>
      withTarget(flags, async (backend) => {
        const content = unwrap(await backend.read(virtualPath(path), { offset: flags.offset, limit: flags.limit }));
        if (flags.json) return printJson(content);
        if (content.encoding === "binary") process.stdout.write(content.content);
        else process.stdout.write(content.content === "" ? "" : `${content.content}\n`);
      }),
    );

  const write = targetOptions(new Command("write"))
    .description("create a file from the argument or, without one, from standard input")
    .argument("<path>", "the file")
    .argument("[content]", "the text (default: standard input)")
    .option("--overwrite", "replace the file when it exists")
    .action((path: string, content: string | undefined, flags: TargetFlags & { overwrite?: boolean }) =>
      withTarget(flags, async (backend) => {
        const text = content ?? (await readStdin()).toString("utf8");
        const changed = unwrap(await backend.write(virtualPath(path), text, { overwrite: flags.overwrite === true }));
        if (flags.json) printJson({ path: changed.path });
        else process.stdout.write(`wrote ${changed.path}\n`);
      }),
    );

  const edit = targetOptions(new Command("edit"))
    .description("replace an exact string in a file (more than one occurrence needs --all)")
    .argument("<path>", "the file")
    .argument("<old>", "the text to find")
    .argument("<new>", "its replacement")
    .option("--all", "replace every occurrence")
    .action((path: string, oldString: string, newString: string, flags: TargetFlags & { all?: boolean }) =>
      withTarget(flags, async (backend) => {
        const edited = unwrap(await backend.edit(virtualPath(path), oldString, newString, { replaceAll: flags.all === true }));
        if (flags.json) printJson({ path: edited.path, occurrences: edited.occurrences });
        else process.stdout.write(`edited ${edited.path} (${edited.occurrences} ${edited.occurrences === 1 ? "occurrence" : "occurrences"})\n`);
      }),
    );

  const glob = targetOptions(new Command("glob"))
    .description("files matching a glob pattern, sorted by path")
    .argument("<pattern>", "e.g. '**/*.ts'")
    .option("-p, --path <dir>", "search under this directory (default /)")
    .option("-d, --dirs", "match directories too")
    .action((pattern: string, flags: TargetFlags & { path?: string; dirs?: boolean }) =>
      withTarget(flags, async (backend) => {
        const listing = unwrap(await backend.glob(pattern, { path: virtualPath(flags.path), includeDirectories: flags.dirs === true, sizes: flags.json === true }));
        if (flags.json) return printJson(listing);
        for (const e of listing.entries) process.stdout.write(`${e.path}\n`);
      }),
    );

  const grep = targetOptions(new Command("grep"))
    .description("literal search in file contents: path:line:text")
    .argument("<text>", "the literal text to find")
    .option("-p, --path <dir>", "search under this directory or file (default /)")
    .option("-g, --glob <pattern>", "only files matching this glob")
    .option("-m, --max-count <n>", "stop after this many matches", count)
    .action((text: string, flags: TargetFlags & { path?: string; glob?: string; maxCount?: number }) =>
      withTarget(flags, async (backend) => {
        const result = unwrap(await backend.grep(text, { path: virtualPath(flags.path), glob: flags.glob ?? null, maxCount: flags.maxCount }));
        if (flags.json) return printJson(result);
        for (const m of result.matches) process.stdout.write(`${m.path}:${m.line}:${m.text}\n`);
        if (result.truncated) process.stderr.write("strata: more matches than --max-count; the list is cut\n");
      }),
    );

  const upload = targetOptions(new Command("upload"))
    .description("copy a local file's bytes into the backend (overwriting); '-' reads standard input")
    .argument("<local>", "the local file, or -")
    .argument("<path>", "where it goes")
    .action((local: string, path: string, flags: TargetFlags) =>
      withTarget(flags, async (backend) => {
        const bytes = local === "-" ? new Uint8Array(await readStdin()) : readLocal(local);
        const item = unwrap(await backend.uploadFiles([[virtualPath(path), bytes]])).files[0];
        if (item?.error) fail(item.error.code, item.error.message, item.error.path);
        if (flags.json) printJson({ path: item?.path, size: bytes.length });
        else process.stdout.write(`uploaded ${item?.path} (${bytes.length} bytes)\n`);
      }),
    );

  const download = targetOptions(new Command("download"))
    .description("copy a file's bytes out of the backend; '-' (the default) writes standard output")
    .argument("<path>", "the file")
    .argument("[local]", "the local file, or -", "-")
    .action((path: string, local: string, flags: TargetFlags) =>
      withTarget(flags, async (backend) => {
        const item = unwrap(await backend.downloadFiles([virtualPath(path)])).files[0];
        if (!item || item.error || !item.content) return fail(item?.error?.code ?? "io_error", item?.error?.message ?? "Nothing was downloaded", item?.error?.path);
        if (local === "-") {
          if (flags.json) printJson({ path: item.path, content: item.content });
          else process.stdout.write(item.content);
          return;
        }
        writeLocal(local, item.content);
        if (flags.json) printJson({ path: item.path, size: item.content.length });
        else process.stdout.write(`downloaded ${item.path} (${item.content.length} bytes)\n`);
      }),
    );

  return [ls, read, write, edit, glob, grep, upload, download];
}
