import { randomBytes, randomUUID } from "node:crypto";
import { constants } from "node:fs";
import { link, lstat, lutimes, mkdir, open, readdir, rename, rm, stat, unlink } from "node:fs/promises";
import { join, resolve } from "node:path";
import { z } from "zod";
import { SandboxRegistryError } from "./errors.js";
import type { SandboxHandle } from "./handle.js";
import { SandboxSpecSchema, type SandboxSpec } from "./provider.js";
import { providers as defaultProviders, type ProviderRegistry } from "./registry.js";

/**
 * Sandbox identities that outlive a process (OpenRath's
 * PersistentSandboxRegistry). It holds no live handles, only what a later
 * process needs to find a sandbox again:
 *
 *   <root>/local/<id>/          a local sandbox's working directory
 *   <root>/remote/<id>.json     a record naming a provider and its remoteId
 *                               (a Docker container id, an ssh:// URL)
 *
 * The root is `STRATA_SANDBOX_DIR`, else `.strata/sandboxes` under the
 * current directory, unless the constructor names one. Several processes may
 * use it at once: records are written whole (temporary file + rename) and
 * removed by renaming them away first, so a reader sees a complete record or
 * none, never half of one. Directories are created 0700 and records 0600,
 * since a record tells where a sandbox is. Ids are checked against a strict
 * pattern, so no id can reach outside the root.
 *
 * The registry never follows a link: a `local/` or `remote/` that is a
 * symbolic link, or that (like the root) belongs to another user, is refused
 * with `permission_denied` before anything is written, chmodded or removed,
 * and entries are read, touched and removed without following links. A local
 * directory carries a marker (`local/.<id>.created`) written when the
 * registry made it; `pruneLocal` and `listLocal` only see marked ones, so a
 * directory put there by anything else is never pruned.
 */

export interface LocalSandboxEntry {
  id: string;
  /** The working directory on this host. */
  path: string;
  modifiedAt: Date;
}

/** What a record file holds. When it was last used is the file's mtime, so touching never rewrites it. */
const RecordSchema = z.object({
  version: z.literal(1),
  id: z.string(),
  provider: z.string(),
  remoteId: z.string(),
  spec: SandboxSpecSchema.nullable(),
  /** The provider created the sandbox (handle.created), so a reattached handle's close destroys it. Absent in older records: false. */
  created: z.boolean().default(false),
  createdAt: z.string(),
});

export type RemoteSandboxRecord = z.output<typeof RecordSchema> & {
  /** Last recorded or touched (the record file's mtime), ISO 8601. */
  touchedAt: string;
};

export interface PersistentSandboxRegistryOptions {
  /** Where identities live; default `STRATA_SANDBOX_DIR` or `.strata/sandboxes`. */
  root?: string;
  /** Providers `reattach` looks names up in; default the process-wide registry. */
  providers?: ProviderRegistry;
}

export interface PruneOptions {
  /** Age in milliseconds: entries not modified (or touched) for longer are removed. */
  olderThanMs: number;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/** An id names one file or directory under the root: letters, digits, `_`, `.`, `-`; not starting with `.`. */
export function validateSandboxId(id: string): string {
  if (typeof id !== "string" || !ID.test(id)) {
    throw new SandboxRegistryError("invalid_argument", `Invalid sandbox id '${String(id).slice(0, 80)}': use up to 128 letters, digits, '_', '.' or '-', starting with a letter or digit`);
  }
  return id;
}

export class PersistentSandboxRegistry {
  readonly root: string;
  readonly #providers: ProviderRegistry;

  constructor(options: PersistentSandboxRegistryOptions = {}) {
    this.root = resolve(options.root ?? process.env.STRATA_SANDBOX_DIR ?? join(".strata", "sandboxes"));
    this.#providers = options.providers ?? defaultProviders;
  }

  // ---------------------------------------------------------------- local

  /** Where a local sandbox's directory is (whether or not it exists). */
  localPath(id: string): string {
    return join(this.root, "local", validateSandboxId(id));
  }

  /** Creates a directory under a fresh id. */
  async allocLocal(): Promise<LocalSandboxEntry> {
    await this.#ownDir("local", true);
    for (;;) {
      const id = randomUUID();
      const path = this.localPath(id);
      if (!(await this.#makeLocal(id))) continue;
      return { id, path, modifiedAt: (await lstat(path)).mtime };
    }
  }

  /** The directory of `id`, created if missing and marked as used now (so pruning spares it). */
  async ensureLocal(id: string): Promise<string> {
    const path = this.localPath(id);
    await this.#ownDir("local", true);
    if (!(await this.#makeLocal(id))) {
      // Already there: use it only if it is a real directory of ours, never through a link.
      const info = await lstat(path).catch((error: unknown) => {
        throw ioError(`use local sandbox '${id}'`, error);
      });
      if (!info.isDirectory() || !ownedByUs(info)) {
        throw new SandboxRegistryError("permission_denied", `Local sandbox '${id}' is not a directory the registry can use (a link, a file, or another user's)`);
      }
    }
    await this.touchLocal(id);
    return path;
  }

  /** Marks a local sandbox as used now. False when it does not exist. */
  async touchLocal(id: string): Promise<boolean> {
    const path = this.localPath(id);
    if (!(await this.#ownDir("local", false))) return false;
    const now = new Date();
    try {
      await lutimes(path, now, now);
      return true;
    } catch (error) {
      if (errorCode(error) === "ENOENT") return false;
      throw ioError(`touch local sandbox '${id}'`, error);
    }
  }

  /** The local sandboxes the registry made: real directories with its marker; links and strangers are left out. */
  async listLocal(): Promise<LocalSandboxEntry[]> {
    const dir = await this.#ownDir("local", false);
    if (!dir) return [];
    const entries: LocalSandboxEntry[] = [];
    for (const id of await this.#names(dir)) {
      if (!ID.test(id)) continue;
      const path = this.localPath(id);
      const info = await lstat(path).catch(() => undefined);
      if (info?.isDirectory() && ownedByUs(info) && (await this.#marked(id))) entries.push({ id, path, modifiedAt: info.mtime });
    }
    return entries;
  }

  /** Removes a local sandbox directory and everything in it. False when it was not there. */
  async deleteLocal(id: string): Promise<boolean> {
    const path = this.localPath(id);
    if (!(await this.#ownDir("local", false))) return false;
    // rm removes a link itself, never what it points to.
    const gone = await this.#remove(path, async (trash) => rm(trash, { recursive: true, force: true }));
    if (gone) await this.#unmark(id);
    return gone;
  }

  /** Removes local sandboxes not modified or touched for `olderThanMs`; returns their ids. */
  async pruneLocal({ olderThanMs }: PruneOptions): Promise<string[]> {
    const cutoff = pruneCutoff(olderThanMs);
    const removed: string[] = [];
    for (const entry of await this.listLocal()) {
      if (entry.modifiedAt.getTime() >= cutoff) continue;
      const gone = await this.#remove(entry.path, async (trash) => {
        const info = await lstat(trash);
        // Touched in the moment between listing and removal: put it back (rename fails if a new one took its place).
        if (info.mtime.getTime() >= cutoff && (await rename(trash, entry.path).then(() => true, () => false))) return false;
        // Swapped for something else since it was listed: not ours to remove; leave it under its hidden name.
        if (!info.isDirectory() || !ownedByUs(info)) return false;
        await rm(trash, { recursive: true, force: true });
      });
      if (gone) {
        await this.#unmark(entry.id);
        removed.push(entry.id);
      }
    }
    return removed;
  }

  // ---------------------------------------------------------------- remote

  /**
   * Records a sandbox a provider can reattach to. Creates a new id unless one
   * is given (then it is replaced). `created: true` says the provider created
   * the sandbox, so closing a reattached handle destroys it; leave it unset for
   * a sandbox named by hand (recordHandle takes it from the handle).
   */
  async recordRemote(
    provider: string,
    remoteId: string,
    spec?: SandboxSpec | null,
    options: { id?: string; created?: boolean } = {},
  ): Promise<RemoteSandboxRecord> {
    if (typeof remoteId !== "string" || remoteId === "") throw new SandboxRegistryError("invalid_argument", "A remote sandbox record needs a remoteId");
    if (options.created !== undefined && typeof options.created !== "boolean") throw new SandboxRegistryError("invalid_argument", "created must be a boolean");
    const parsed = RecordSchema.safeParse({
      version: 1,
      id: validateSandboxId(options.id ?? randomUUID()),
      provider,
      remoteId,
      spec: spec ?? null,
      created: options.created === true,
      createdAt: new Date().toISOString(),
    });
    if (!parsed.success) throw new SandboxRegistryError("invalid_argument", `Invalid remote sandbox record: ${z.prettifyError(parsed.error)}`);
    const stored = parsed.data;
    await this.#writeRecord(stored);
    return { ...stored, touchedAt: stored.createdAt };
  }

  /** Records the sandbox behind a handle (its provider must give it a remoteId: docker and ssh do). */
  async recordHandle(handle: SandboxHandle, options: { id?: string } = {}): Promise<RemoteSandboxRecord> {
    if (!handle.remoteId) {
      throw new SandboxRegistryError("unsupported", `Sandboxes of provider '${handle.provider.name}' do not outlive their process, so they cannot be recorded`);
    }
    return this.recordRemote(handle.provider.name, handle.remoteId, handle.spec, { ...options, created: handle.created });
  }

  /** The record of `id`, or undefined when there is none. */
  async loadRemote(id: string): Promise<RemoteSandboxRecord | undefined> {
    const path = this.#recordPath(id);
    if (!(await this.#ownDir("remote", false))) return undefined;
    let text: string;
    let touched: Date;
    try {
      // Read through one descriptor, so content and mtime belong to the same file even if it is replaced meanwhile.
      const file = await open(path, constants.O_RDONLY | NOFOLLOW);
      try {
        text = await file.readFile("utf8");
        touched = (await file.stat()).mtime;
      } finally {
        await file.close();
      }
    } catch (error) {
      if (errorCode(error) === "ENOENT") return undefined;
      if (errorCode(error) === "ELOOP") throw new SandboxRegistryError("permission_denied", `Remote sandbox record '${id}' is a symbolic link; refusing to follow it`);
      throw ioError(`read remote sandbox record '${id}'`, error);
    }
    return { ...parseRecord(id, text), touchedAt: touched.toISOString() };
  }

  /** Every readable record, oldest first. A damaged file is skipped, not fatal. */
  async listRemote(): Promise<RemoteSandboxRecord[]> {
    const dir = await this.#ownDir("remote", false);
    if (!dir) return [];
    const records: RemoteSandboxRecord[] = [];
    for (const name of await this.#names(dir)) {
      if (!name.endsWith(".json")) continue;
      const id = name.slice(0, -".json".length);
      if (!ID.test(id)) continue;
      const record = await this.loadRemote(id).catch(() => undefined);
      if (record) records.push(record);
    }
    return records.sort((a, b) => (a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : 0));
  }

  /** Marks a record as used now. False when it does not exist. Never recreates a record another process deleted. */
  async touchRemote(id: string): Promise<boolean> {
    const path = this.#recordPath(id);
    if (!(await this.#ownDir("remote", false))) return false;
    const now = new Date();
    try {
      await lutimes(path, now, now);
      return true;
    } catch (error) {
      if (errorCode(error) === "ENOENT") return false;
      throw ioError(`touch remote sandbox record '${id}'`, error);
    }
  }

  /** Forgets a record (the sandbox itself is left alone). False when it was not there. */
  async deleteRemote(id: string): Promise<boolean> {
    const path = this.#recordPath(id);
    if (!(await this.#ownDir("remote", false))) return false;
    return this.#remove(path, (trash) => unlink(trash));
  }

  /** Removes records not written or touched for `olderThanMs`; returns their ids. The sandboxes are left alone. */
  async pruneRemote({ olderThanMs }: PruneOptions): Promise<string[]> {
    const cutoff = pruneCutoff(olderThanMs);
    const removed: string[] = [];
    const dir = await this.#ownDir("remote", false);
    if (!dir) return removed;
    for (const name of await this.#names(dir)) {
      const id = name.endsWith(".json") ? name.slice(0, -".json".length) : "";
      if (!ID.test(id)) continue;
      const path = this.#recordPath(id);
      const info = await lstat(path).catch(() => undefined);
      if (!info?.isFile() || info.mtime.getTime() >= cutoff) continue;
      const gone = await this.#remove(path, async (trash) => {
        // Touched in between: link it back unless a newer record took its place, which then wins.
        if ((await lstat(trash)).mtime.getTime() >= cutoff) {
          await link(trash, path).catch(() => {});
          await unlink(trash);
          return false;
        }
        await unlink(trash);
      });
      if (gone) removed.push(id);
    }
    return removed;
  }

  /** Reattaches to a recorded sandbox through its provider, and marks the record as used. */
  async reattach(id: string): Promise<SandboxHandle> {
    const record = await this.loadRemote(id);
    if (!record) throw new SandboxRegistryError("file_not_found", `No remote sandbox is recorded under id '${id}'`);
    const provider = this.#providers.get(record.provider);
    if (!provider.reattach) throw new SandboxRegistryError("unsupported", `Sandbox provider '${record.provider}' cannot reattach to sandboxes`);
    const handle = await provider.reattach(record.remoteId, record.spec ?? undefined, { created: record.created });
    await this.touchRemote(id);
    return handle;
  }

  // ---------------------------------------------------------------- files

  #recordPath(id: string): string {
    return join(this.root, "remote", `${validateSandboxId(id)}.json`);
  }

  async #writeRecord(record: z.output<typeof RecordSchema>): Promise<void> {
    const dir = (await this.#ownDir("remote", true))!;
    const temp = join(dir, `.${record.id}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    try {
      const file = await open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
      try {
        await file.writeFile(`${JSON.stringify(record, null, 2)}\n`);
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temp, this.#recordPath(record.id));
    } catch (error) {
      await unlink(temp).catch(() => {});
      throw ioError(`write remote sandbox record '${record.id}'`, error);
    }
  }

  /**
   * Removes `path` by renaming it to a unique name first, so a concurrent
   * reader sees it whole or not at all and two removers cannot both act.
   * `finish` disposes of the renamed entry; returning false means it was restored.
   */
  async #remove(path: string, finish: (trash: string) => Promise<unknown>): Promise<boolean> {
    const trash = join(path, "..", `.removing.${process.pid}.${randomBytes(6).toString("hex")}`);
    try {
      await rename(path, trash);
    } catch (error) {
      if (errorCode(error) === "ENOENT") return false;
      throw ioError("remove a sandbox entry", error);
    }
    return (await finish(trash)) !== false;
  }

  /**
   * The path of `local/` or `remote/` once it is known to be the registry's
   * own: the root and it belong to this user, and it is a real directory (opened
   * with O_NOFOLLOW, so a link is never followed, not even to chmod it). With
   * `create` it is made if missing and made private; without, undefined when
   * it does not exist.
   */
  async #ownDir(name: "local" | "remote", create: boolean): Promise<string | undefined> {
    const dir = join(this.root, name);
    try {
      if (create) await mkdir(this.root, { recursive: true, mode: 0o700 });
      const root = await stat(this.root);
      if (!root.isDirectory() || !ownedByUs(root)) {
        throw new SandboxRegistryError("permission_denied", "The sandbox registry's root is not a directory of this user; refusing to use it");
      }
      if (create) await mkdir(dir, { mode: 0o700 }).catch((error: unknown) => {
        if (errorCode(error) !== "EEXIST") throw error;
      });
      const handle = await open(dir, constants.O_RDONLY | DIRECTORY | NOFOLLOW);
      try {
        const info = await handle.stat();
        if (!ownedByUs(info)) throw new SandboxRegistryError("permission_denied", `The sandbox registry's ${name} directory belongs to another user; refusing to use it`);
        // mkdir's mode is filtered by the umask and ignored for an existing directory; fchmod cannot be redirected.
        if (create && (info.mode & 0o777) !== 0o700) await handle.chmod(0o700);
      } finally {
        await handle.close();
      }
      return dir;
    } catch (error) {
      if (!create && errorCode(error) === "ENOENT") return undefined;
      if (errorCode(error) === "ELOOP" || errorCode(error) === "ENOTDIR") {
        throw new SandboxRegistryError("permission_denied", `The sandbox registry's ${name} directory is a symbolic link or not a directory; refusing to follow it`, { cause: error });
      }
      throw ioError("open the sandbox registry directory", error);
    }
  }

  /** Makes local/<id> with the registry's marker; false when something is already there. */
  async #makeLocal(id: string): Promise<boolean> {
    try {
      await mkdir(this.localPath(id), { mode: 0o700 });
    } catch (error) {
      if (errorCode(error) === "EEXIST") return false;
      throw ioError("create a local sandbox directory", error);
    }
    try {
      const marker = await open(this.#markerPath(id), constants.O_WRONLY | constants.O_CREAT | NOFOLLOW, 0o600);
      await marker.close();
    } catch (error) {
      throw ioError("mark a local sandbox directory", error);
    }
    return true;
  }

  #markerPath(id: string): string {
    return join(this.root, "local", `.${validateSandboxId(id)}.created`);
  }

  async #marked(id: string): Promise<boolean> {
    const info = await lstat(this.#markerPath(id)).catch(() => undefined);
    return info?.isFile() === true;
  }

  /** Drops the marker of a removed directory, unless a new one took its place meanwhile. */
  async #unmark(id: string): Promise<void> {
    if (await lstat(this.localPath(id)).then(() => true, () => false)) return;
    await unlink(this.#markerPath(id)).catch(() => {});
  }

  /** Entry names of a directory, without hidden (temporary) ones; [] when it does not exist. */
  async #names(dir: string): Promise<string[]> {
    try {
      return (await readdir(dir)).filter((name) => !name.startsWith(".")).sort();
    } catch (error) {
      if (errorCode(error) === "ENOENT") return [];
      throw ioError("list the sandbox registry", error);
    }
  }
}

function parseRecord(id: string, text: string): z.output<typeof RecordSchema> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new SandboxRegistryError("io_error", `Remote sandbox record '${id}' is not valid JSON`);
  }
  const parsed = RecordSchema.safeParse(value);
  if (!parsed.success || parsed.data.id !== id) throw new SandboxRegistryError("io_error", `Remote sandbox record '${id}' is malformed`);
  return parsed.data;
}

function pruneCutoff(olderThanMs: number): number {
  if (typeof olderThanMs !== "number" || !Number.isFinite(olderThanMs) || olderThanMs < 0) {
    throw new SandboxRegistryError("invalid_argument", "olderThanMs must be a non-negative number of milliseconds");
  }
  return Date.now() - olderThanMs;
}

const NOFOLLOW = constants.O_NOFOLLOW ?? 0;
const DIRECTORY = constants.O_DIRECTORY ?? 0;

/** True for what this process's user owns (always, where there are no uids). */
function ownedByUs(info: { uid: number }): boolean {
  return process.getuid === undefined || info.uid === process.getuid();
}

function errorCode(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** Host paths stay out of the message; the errno code says what went wrong. */
function ioError(what: string, error: unknown): SandboxRegistryError {
  if (error instanceof SandboxRegistryError) return error;
  return new SandboxRegistryError(errorCode(error) === "EACCES" ? "permission_denied" : "io_error", `Could not ${what} (${errorCode(error) ?? "unknown error"})`, { cause: error });
}
