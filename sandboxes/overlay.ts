/**
 * OverlaySandbox: a shell over an OverlayBackend's view, whose commands'
 * changes land in the layer like the file tools' do, so `diff()` shows what
 * `execute` did and `commit()` / `discard()` apply or drop it.
 *
 * bubblewrap (0.8, Debian) has no overlay mount, and an overlay mount would
 * show host paths in the sandbox's mountinfo, so commands run on a scratch
 * copy instead: at `open()` the overlay's view is copied (not hard-linked: a
 * command could write through a link into the real directory) into a
 * private temporary directory, and a sandbox made by the caller's factory
 * (BubblewrapSandbox, LocalSandbox, … over that directory) runs every
 * command there. After each command the scratch is listed again (size,
 * modification and change times, inode; a file whose listing moved is read
 * and hashed), and what the command added, modified and deleted is imported
 * into the layer through the OverlayBackend's own upload, mkdir and delete:
 * diff, commit, discard and conflict detection are the overlay's, unchanged.
 *
 * File operations go to the overlay; the paths they change are copied into
 * the scratch again before the next command (a move or copy is repeated in
 * the scratch by the inner sandbox instead, so commands keep modes and
 * links). A change the layer refuses (a permission rule, a size limit) is
 * put back in the scratch as the view has it, and the command's output ends
 * with a line naming it; so is a change to a file the disk changed behind
 * the copy (`conflict`: capturing it would base it on the disk's new
 * version, and commit would overwrite that change unseen). What the layer
 * cannot hold is not captured: symbolic links, special files, file modes.
 *
 * Costs: opening copies the whole view (every file read once, written once,
 * hashed once); each command costs a stat of every path in the scratch,
 * plus, for each file whose listing changed, a read of it and of the view's
 * version. Disk changes made behind the overlay after `open()` are not seen
 * by commands (the scratch is a copy).
 *
 * Concurrency: commands, and the file operations that change something,
 * run one at a time per sandbox (a change landing in the middle of a
 * command's capture would be lost or captured twice); a spawned process
 * holds that turn until it exits, its changes captured before `wait()`
 * answers. Reads do not wait.
 */
import { lstatSync, mkdirSync, mkdtempSync, writeFileSync, openSync, readdirSync, readFileSync, closeSync, constants, rmSync, type BigIntStats } from "node:fs";
import { tmpdir } from "node:os";
import nodePath from "node:path";
import type { OverlayBackend, OverlayCommit, OverlayConflict } from "../backends/overlay.js";
import { BaseBackend, unwrap, type DownloadAnswer, type TextWindow, type UploadAnswer } from "../core/base.js";
import { errors, printable, StrataError, toErrorInfo } from "../core/errors.js";
import { toFileDataV2 } from "../core/filedata.js";
import { KeyedMutex } from "../core/lock.js";
import { isWithin, joinPath, normalizePath } from "../core/paths.js";
import type { Sandbox } from "../core/protocol.js";
import { toSeedProtocol as seed } from "../core/seed.js";
import type { FileChange } from "../core/snapshots.js";
import type {
  DeleteResult,
  EditResult,
  ExecuteOptions,
  ExecuteResponse,
  FileDataV2,
  FileInfo,
  FilesUpdate,
  GrepResult,
  Result,
  SpawnedProcess,
  SpawnOptions,
  WriteResult,
} from "../core/types.js";
import { nodeCrypto } from "../stores/lazy-builtins.js";

export interface OverlaySandboxOptions {
  /** The layer commands' changes land in, and file operations go to. */
  overlay: OverlayBackend;
  /** Makes the sandbox commands run in, over a host directory (the scratch copy), e.g. `(dir) => new BubblewrapSandbox({ workspace: dir })`. */
  sandbox: (workspace: string) => Sandbox | Promise<Sandbox>;
}

/** What the scratch held at a path after the last command (or copy). */
type Seen = { kind: "dir" } | { kind: "other" } | { kind: "file"; stamp: string; hash: string };

/** Files copied or imported per batch. */
const BATCH = 64;

export class OverlaySandbox extends BaseBackend implements Sandbox {
  readonly id: string;
  /** Paths the file operations changed since the scratch last matched the view ("/" for all of it). */
  private readonly stale = new Set<string>();
  private seen = new Map<string, Seen>();
  private readonly turn = new KeyedMutex();
  private closed = false;

  private constructor(
    readonly overlay: OverlayBackend,
    private readonly inner: Sandbox,
    private readonly scratch: string,
  ) {
    super();
    this.id = `overlay-${inner.id}`;
  }

  /** Copies the overlay's view into a fresh scratch directory and makes the sandbox over it. */
  static async open(options: OverlaySandboxOptions): Promise<OverlaySandbox> {
    if (typeof options?.sandbox !== "function" || typeof options.overlay?.diff !== "function") {
      throw errors.invalidArgument("OverlaySandbox.open needs { overlay, sandbox }: an OverlayBackend and a function making a sandbox over a directory");
    }
    const scratch = mkdtempSync(nodePath.join(tmpdir(), "strata-overlay-"));
    let inner: Sandbox | undefined;
    try {
      // The first copy is written straight into the fresh directory, before any command: a
      // sandbox hands its workspace to its user at its first command (BubblewrapSandbox as root).
      await copyView(options.overlay, "/", (dirs) => {
        for (const dir of dirs) if (dir !== "/") mkdirSync(nodePath.join(scratch, dir.slice(1)), { recursive: true });
      }, (files) => {
        for (const [path, bytes] of files) writeFileSync(nodePath.join(scratch, path.slice(1)), bytes, { flag: "wx" });
      });
      inner = await options.sandbox(scratch);
      const opened = new OverlaySandbox(options.overlay, inner, scratch);
      opened.seen = opened.scan(new Map());
      return opened;
    } catch (error) {
      await inner?.close().catch(() => undefined);
      rmSync(scratch, { recursive: true, force: true });
      // A file system error names the scratch directory, a host path: only its code goes on.
      if (error instanceof StrataError) throw error;
      throw new StrataError("io_error", `Copying the overlay's view into a scratch directory failed (${(error as NodeJS.ErrnoException)?.code ?? "error"})`);
    }
  }

  /** Where commands and file paths start: the inner sandbox's workspace (e.g. "/workspace"). */
  protected override get pathRoot(): string {
    return this.inner.root;
  }

  // ---- the layer ----

  /** The overlay's diff: what the file operations and the commands changed (paths as the overlay names them, "/" being the workspace). */
  diff(): Promise<Result<{ changes: FileChange[] }>> {
    return this.overlay.diff();
  }

  conflicts(): Promise<Result<{ conflicts: OverlayConflict[] }>> {
    return this.overlay.conflicts();
  }

  /** The overlay's commit; the view, and so the scratch, stays as it is. */
  commit(): Promise<Result<OverlayCommit>> {
    return this.turn.run("", () => this.overlay.commit());
  }

  /** The overlay's discard; the scratch is copied again from the disk before the next command. */
  discard(): Promise<Result<{ discarded: number }>> {
    return this.turn.run("", async () => {
      const dropped = await this.overlay.discard();
      this.stale.add("/");
      return dropped;
    });
  }

  // ---- commands ----

  async execute(command: string, options?: ExecuteOptions): Promise<Result<ExecuteResponse>> {
    if (this.closed) return { error: { code: "sandbox_closed", message: "The sandbox is closed" } };
    return this.turn.run("", async () => {
      try {
        await this.refresh();
      } catch (error) {
        return { error: toErrorInfo(error) };
      }
      const ran = await this.inner.execute(command, options);
      const missed = await this.capture();
      if (ran.error || missed.length === 0) return ran;
      const named = missed.map((m) => ({ ...m, path: this.toCallerPath(m.path) }));
      return { ...ran, output: `${ran.output}${ran.output === "" || ran.output.endsWith("\n") ? "" : "\n"}${missedNote(named)}\n` };
    });
  }

  async spawn(command: string, options?: SpawnOptions): Promise<Result<SpawnedProcess>> {
    if (this.closed) return { error: { code: "sandbox_closed", message: "The sandbox is closed" } };
    let started!: (answer: Result<SpawnedProcess>) => void;
    const answer = new Promise<Result<SpawnedProcess>>((resolve) => (started = resolve));
    // The turn is held until the process ends and its changes are in the layer.
    const captured = this.turn.run("", async () => {
      try {
        await this.refresh();
      } catch (error) {
        started({ error: toErrorInfo(error) });
        return;
      }
      const spawned = await this.inner.spawn(command, options);
      started(spawned);
      if (spawned.error) return;
      await spawned.wait();
      await this.capture();
    });
    const spawned = await answer;
    if (spawned.error) return spawned;
    const process: SpawnedProcess = {
      stdin: spawned.stdin,
      stdout: spawned.stdout,
      stderr: spawned.stderr,
      kill: () => spawned.kill(),
      wait: async () => {
        const ended = await spawned.wait();
        await captured.catch(() => undefined);
        return ended;
      },
    };
    return process;
  }

  /** Closes the inner sandbox and removes the scratch; the layer stays (commit or discard it through the overlay). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.inner.close();
    rmSync(this.scratch, { recursive: true, force: true });
  }

  // ---- file operations: the overlay's ----

  protected async doLs(path: string): Promise<FileInfo[]> {
    this.assertOpen();
    return unwrap(await this.overlay.ls(path)).entries;
  }

  protected async doReadRaw(path: string): Promise<FileDataV2> {
    this.assertOpen();
    return toFileDataV2(unwrap(await this.overlay.readRaw(path)).data);
  }

  protected override async doRead(path: string, offset: number, limit: number): Promise<TextWindow> {
    this.assertOpen();
    const read = unwrap(await this.overlay.read(path, { offset, limit }));
    if (read.encoding === "binary") throw errors.binary(read.path, read.size);
    return { lines: read.lineCount === 0 ? [] : read.content.split("\n"), totalLines: read.totalLines };
  }

  protected override async doStat(path: string): Promise<FileInfo> {
    this.assertOpen();
    return unwrap(await this.overlay.stat(path));
  }

  protected async doGrep(pattern: string, path: string | null, glob: string | null, maxCount: number | undefined): Promise<GrepResult> {
    this.assertOpen();
    return unwrap(await this.overlay.grep(pattern, { path, glob, maxCount }));
  }

  protected async doGlob(pattern: string, path: string | null, includeDirectories = false, sizes = true): Promise<FileInfo[]> {
    this.assertOpen();
    return unwrap(await this.overlay.glob(pattern, { path, includeDirectories, sizes })).entries;
  }

  protected override async doDownload(paths: readonly string[]): Promise<DownloadAnswer[]> {
    // Batches answer per item, a closed sandbox too.
    if (this.closed) return paths.map((path) => ({ path, content: null, error: "sandbox_closed" }));
    return unwrap(await this.overlay.downloadFiles(paths)).files.map((f) => ({ path: f.path, content: f.content, error: f.error?.code ?? null }));
  }

  protected async doWrite(path: string, content: string, overwrite: boolean): Promise<WriteResult> {
    return this.changing([path], () => seed(this.overlay).write(path, content, { overwrite }));
  }

  protected async doEdit(path: string, oldString: string, newString: string, replaceAll: boolean): Promise<EditResult> {
    return this.changing([path], () => seed(this.overlay).edit(path, oldString, newString, replaceAll));
  }

  protected async doDelete(path: string): Promise<DeleteResult> {
    return this.changing([path], () => seed(this.overlay).delete(path));
  }

  protected override async doMkdir(path: string, recursive: boolean): Promise<FilesUpdate> {
    return this.changing([path], async () => unwrap(await this.overlay.mkdir(path, { recursive })).filesUpdate);
  }

  protected override async doMove(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.mirroredTransfer(from, to, overwrite, "move");
  }

  protected override async doCopy(from: string, to: string, overwrite: boolean): Promise<FilesUpdate> {
    return this.mirroredTransfer(from, to, overwrite, "copy");
  }

  /**
   * A move or copy in the overlay, then the same in the scratch by the inner
   * sandbox, so what commands see keeps what the layer cannot hold (modes,
   * links); when the two disagree, the scratch is copied from the view instead.
   */
  private mirroredTransfer(from: string, to: string, overwrite: boolean, how: "move" | "copy"): Promise<FilesUpdate> {
    this.assertOpen();
    return this.turn.run("", async () => {
      const done = await this.overlay[how](from, to, { overwrite });
      const touched = how === "move" ? [from, to] : [to];
      if (done.error) {
        this.markStale(touched);
        throw toStrata(done.error);
      }
      try {
        await this.refresh();
        const mirrored = await this.inner[how](this.innerPath(normalizePath(from)), this.innerPath(normalizePath(to)), { overwrite });
        if (mirrored.error) this.markStale(touched);
        else this.seen = this.scan(this.seen);
      } catch {
        this.markStale(touched);
      }
      return done.filesUpdate;
    });
  }

  protected async doUpload(files: ReadonlyArray<readonly [string, Uint8Array]>): Promise<UploadAnswer[]> {
    if (this.closed) return files.map((item) => ({ path: Array.isArray(item) && typeof item[0] === "string" ? item[0] : "", error: "sandbox_closed" }));
    const paths = files.map((item) => (Array.isArray(item) && typeof item[0] === "string" ? item[0] : "/"));
    return this.changing(paths, async () => unwrap(await this.overlay.uploadFiles(files)).files.map((f) => ({ path: f.path, error: f.error?.code ?? null })));
  }

  /** Runs a change to the overlay in the sandbox's turn, and marks its paths for copying into the scratch, whatever the answer (a part may have landed). */
  private changing<T>(paths: readonly string[], body: () => Promise<T>): Promise<T> {
    this.assertOpen();
    return this.turn.run("", async () => {
      try {
        return await body();
      } finally {
        this.markStale(paths);
      }
    });
  }

  private markStale(paths: readonly string[]): void {
    for (const path of paths) {
      try {
        this.stale.add(normalizePath(path));
      } catch {
        // A path the overlay refused as malformed changed nothing.
      }
    }
  }

  /** After `close()` every operation answers `sandbox_closed`, as every sandbox's does. */
  private assertOpen(): void {
    if (this.closed) throw new StrataError("sandbox_closed", "The sandbox is closed");
  }

  /** An overlay path as the inner sandbox names it. */
  private innerPath(path: string): string {
    const root = this.inner.root;
    return path === "/" ? root : root === "/" ? path : `${root}${path}`;
  }

  // ---- keeping the scratch and the layer together ----

  /** Before a command: copies what the file operations changed into the scratch, and lists it again. */
  private async refresh(): Promise<void> {
    if (this.stale.size === 0) return;
    const paths = this.stale.has("/") ? ["/"] : [...this.stale].sort().filter((p, i, all) => !all.slice(0, i).some((q) => isWithin(q, p)));
    this.stale.clear();
    for (const path of paths) await this.copyIn(path);
    this.seen = this.scan(this.seen);
  }

  /** Makes the scratch at `path` what the overlay's view holds there. */
  private async copyIn(path: string): Promise<void> {
    const inner = (p: string) => this.innerPath(p);
    if (path === "/") {
      for (const entry of unwrap(await this.inner.ls(this.inner.root)).entries) unwrap(await this.inner.delete(entry.path));
    } else {
      const removed = await this.inner.delete(inner(path));
      if (removed.error && removed.error.code !== "file_not_found") throw toStrata(removed.error);
    }
    await copyView(
      this.overlay,
      path,
      async (dirs) => {
        for (const dir of dirs) if (dir !== "/") unwrap(await this.inner.mkdir(inner(dir), { recursive: true }));
      },
      async (files) => {
        for (const put of unwrap(await this.inner.uploadFiles(files.map(([p, bytes]) => [inner(p), bytes] as const))).files) if (put.error) throw toStrata(put.error);
      },
    );
  }

  /**
   * After a command: imports into the layer what it changed in the scratch.
   * Answers what the layer refused; those paths are put back as the view has
   * them before the next command.
   */
  private async capture(): Promise<Array<{ path: string; code: string }>> {
    try {
      return await this.importChanges();
    } catch (error) {
      // Whatever went wrong part-way, the scratch is made the view again before the next command.
      this.stale.add("/");
      return [{ path: "/", code: toErrorInfo(error).code }];
    }
  }

  private async importChanges(): Promise<Array<{ path: string; code: string }>> {
    const missed: Array<{ path: string; code: string }> = [];
    // Closed under a running command: the scratch is going, and its absence is no deletion.
    if (this.closed) return missed;
    let now: Map<string, Seen>;
    try {
      now = this.scan(this.seen);
    } catch (error) {
      this.stale.add("/");
      return [{ path: "/", code: toErrorInfo(error).code }];
    }
    const before = this.seen;
    const gone: string[] = [];
    for (const [path, was] of before) {
      const is = now.get(path);
      if (was.kind === "other") continue;
      if (!is || is.kind !== was.kind) gone.push(path);
    }
    const madeDirs: string[] = [];
    const written: string[] = [];
    for (const [path, is] of now) {
      const was = before.get(path);
      if (is.kind === "dir" && was?.kind !== "dir") madeDirs.push(path);
      if (is.kind === "file" && (was?.kind !== "file" || was.hash !== is.hash)) written.push(path);
    }
    const refuse = (path: string, code: string) => {
      missed.push({ path, code });
      this.stale.add(path);
    };
    /**
     * Whether the view's file at `path` is no longer what the scratch held
     * before the command: the disk changed behind the overlay since the copy.
     * Capturing the command's change would record the disk's new version as
     * its base, and commit would overwrite that change without a conflict.
     */
    const movedBehind = async (path: string, goneToo: boolean): Promise<boolean> => {
      const was = before.get(path);
      if (was !== undefined && was.kind !== "file") return false;
      const got = await this.overlay.downloadFiles([path]);
      const content = got.files?.[0]?.content;
      // Nothing was there at the copy: a file there now is the disk's, created behind the copy.
      if (was === undefined) return content !== undefined && content !== null;
      if (!content) return !goneToo;
      return hashOf(content) !== was.hash;
    };
    /** Whether the view holds, under a directory the command removed, a file the copy never had (the disk added it behind). */
    const addedUnder = async (dir: string): Promise<boolean> => {
      const listed = await this.overlay.glob("**", { path: dir, sizes: false });
      if ("error" in listed && listed.error) return listed.error.code !== "file_not_found";
      return (listed as { entries: Array<{ path: string }> }).entries.some((entry) => !before.has(entry.path));
    };
    // Outermost first: deleting a directory takes what is under it.
    gone.sort();
    const handled: string[] = [];
    for (const path of gone) {
      if (handled.some((dir) => isWithin(dir, path))) continue;
      handled.push(path);
      let behind = false;
      for (const file of gone) if (isWithin(path, file) && (await movedBehind(file, true))) behind = true;
      if (!behind && before.get(path)?.kind === "dir") behind = await addedUnder(path);
      if (behind) {
        refuse(path, "conflict");
        continue;
      }
      const answer = await this.overlay.delete(path);
      if (answer.error && answer.error.code !== "file_not_found") refuse(path, answer.error.code);
    }
    for (const path of madeDirs.sort()) {
      const answer = await this.overlay.mkdir(path, { recursive: true });
      if (answer.error) refuse(path, answer.error.code);
    }
    written.sort();
    for (let i = 0; i < written.length; i += BATCH) {
      const batch: Array<readonly [string, Uint8Array]> = [];
      for (const path of written.slice(i, i + BATCH)) {
        if (await movedBehind(path, false)) {
          refuse(path, "conflict");
          continue;
        }
        try {
          batch.push([path, readNoFollow(this.hostPath(path))]);
        } catch {
          refuse(path, "io_error");
        }
      }
      if (batch.length === 0) continue;
      const answer = await this.overlay.uploadFiles(batch);
      if (answer.error) for (const [path] of batch) refuse(path, answer.error.code);
      else for (const item of answer.files) if (item.error) refuse(item.path, item.error.code);
    }
    this.seen = now;
    if (missed.length > 0) await this.refresh().catch(() => this.stale.add("/"));
    return missed;
  }

  /** Lists the scratch: every directory, file (hashed when its stamp moved) and other entry, by overlay path. */
  private scan(previous: Map<string, Seen>): Map<string, Seen> {
    const found = new Map<string, Seen>();
    const walk = (dir: string) => {
      let names: string[];
      try {
        names = readdirSync(this.hostPath(dir));
      } catch {
        // The scratch itself unreadable is a failure, not an empty workspace (that would delete everything).
        if (dir === "/") throw new StrataError("io_error", "The sandbox's scratch directory cannot be listed");
        // Not readable (a command's chmod): what was under it counts as unchanged, not deleted.
        for (const [path, was] of previous) if (path !== dir && isWithin(dir, path)) found.set(path, was);
        return;
      }
      for (const name of names) {
        const path = joinPath(dir, name);
        let info: BigIntStats;
        try {
          info = lstatSync(this.hostPath(path), { bigint: true });
        } catch {
          continue;
        }
        if (info.isDirectory()) {
          found.set(path, { kind: "dir" });
          walk(path);
        } else if (info.isFile()) {
          const stamp = `${info.size}:${info.mtimeNs}:${info.ctimeNs}:${info.ino}`;
          const was = previous.get(path);
          if (was?.kind === "file" && was.stamp === stamp) found.set(path, was);
          else {
            try {
              found.set(path, { kind: "file", stamp, hash: hashOf(readNoFollow(this.hostPath(path))) });
            } catch {
              // Not readable (a command's chmod): unchanged as far as the layer can tell.
              found.set(path, was?.kind === "file" ? was : { kind: "other" });
            }
          }
        } else found.set(path, { kind: "other" });
      }
    };
    walk("/");
    return found;
  }

  /** The scratch's host path for an overlay path (never shown to anyone). */
  private hostPath(path: string): string {
    return path === "/" ? this.scratch : nodePath.join(this.scratch, path.slice(1));
  }
}

/**
 * Hands the overlay's view at `path` (a file, or a directory and everything
 * under it) to `makeDirs` (parents first) and then `writeFiles`, in batches.
 * What the overlay's rules keep from reading stays out: commands cannot see it either.
 */
async function copyView(
  overlay: OverlayBackend,
  path: string,
  makeDirs: (dirs: string[]) => void | Promise<void>,
  writeFiles: (files: Array<readonly [string, Uint8Array]>) => void | Promise<void>,
): Promise<void> {
  const there = await overlay.stat(path);
  if (there.error) {
    if (there.error.code === "file_not_found" || there.error.code === "not_a_directory" || there.error.code === "permission_denied") return;
    throw toStrata(there.error);
  }
  const files: string[] = [];
  const dirs: string[] = [];
  if (there.is_dir) {
    const pending = [path];
    while (pending.length > 0) {
      const dir = pending.pop()!;
      dirs.push(dir);
      const listed = await overlay.ls(dir);
      if (listed.error) continue;
      for (const entry of listed.entries) {
        if (entry.is_dir) pending.push(entry.path.slice(0, -1));
        else files.push(entry.path);
      }
    }
  } else files.push(path);
  await makeDirs(dirs.sort());
  for (let i = 0; i < files.length; i += BATCH) {
    const got = unwrap(await overlay.downloadFiles(files.slice(i, i + BATCH)));
    const readable = got.files.filter((f) => f.content !== null).map((f) => [f.path, f.content!] as const);
    if (readable.length > 0) await writeFiles(readable);
  }
}

/** A regular file's bytes, refusing a symbolic link in the last place. */
function readNoFollow(file: string): Uint8Array {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    return readFileSync(fd);
  } finally {
    closeSync(fd);
  }
}

function hashOf(bytes: Uint8Array): string {
  return nodeCrypto().createHash("sha256").update(bytes).digest("hex");
}

function missedNote(missed: ReadonlyArray<{ path: string; code: string }>): string {
  const list = missed.map((m) => `${printable(m.path)} (${m.code.replace(/_/g, " ")})`).join(", ");
  return `[overlay] not captured, put back as the overlay has it: ${list}`;
}

function toStrata(info: { code: StrataError["code"]; message: string; path?: string }): StrataError {
  return new StrataError(info.code, info.message, info.path === undefined ? undefined : { path: info.path });
}

