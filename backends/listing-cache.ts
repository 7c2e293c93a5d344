/**
 * Listings by name and kind (ls with `sizes: false`) of directories that
 * have not changed since they were read. Reading a directory of thousands
 * of entries is most of such a listing's cost (the kernel's walk of its
 * hashed index, libuv's sort of the names), and agents list the same
 * directories again and again.
 *
 * A listing is kept with its directory's stamps as fstat answers them on the
 * open directory: device, inode, size, link count, mtime and ctime. Every
 * entry created, removed or renamed in a directory moves its mtime and ctime
 * (and nothing else can change a name or a kind), so a listing is answered
 * again only while fstat answers the very same stamps. A stamp is only as
 * fine as the kernel's clock tick (a few milliseconds) and the filesystem's
 * timestamps (two seconds on FAT), so two changes within one tick can leave
 * it unchanged: a listing is kept only when the directory's last change
 * lies SETTLED_MS or more before the listing was asked for (as git trusts a
 * file's stamp only when it is older than the index), so any later change
 * carries a later stamp. A directory changed more recently (or stamped in
 * the future, a clock ahead) is read every time. So is a directory on a
 * filesystem not known to keep such stamps (network and FUSE filesystems
 * may answer made-up or cached ones): only the local kernel filesystems of
 * LOCAL_FILESYSTEMS are trusted.
 */
import type { Stats } from "node:fs";
import type { FileInfo } from "../core/types.js";

/**
 * statfs f_type of the filesystems whose directory stamps are kept by the
 * kernel itself: ext2/3/4, XFS, Btrfs, tmpfs, overlayfs, ZFS, F2FS, bcachefs.
 */
const LOCAL_FILESYSTEMS: ReadonlySet<number> = new Set([0xef53, 0x58465342, 0x9123683e, 0x01021994, 0x794c7630, 0x2fc12fc1, 0xf2f52010, 0xca451a4e]);

/** Whether listings may be kept for a directory on a filesystem of this statfs type. */
export function trustsStamps(filesystemType: number): boolean {
  return LOCAL_FILESYSTEMS.has(filesystemType);
}

/** How old a directory's last change must be for its listing to be kept. */
export const SETTLED_MS = 3_000;
/** Entries kept at most, over every directory: the least recently listed go first. */
const MAX_ENTRIES = 200_000;

interface Kept {
  stamp: string;
  entries: readonly FileInfo[];
}

export class ListingCache {
  private readonly kept = new Map<string, Kept>();
  private size = 0;
  /** Whether each device seen keeps trustworthy stamps: a device's filesystem type never changes, so statfs is asked once. */
  private readonly trustedDevices = new Map<number, boolean>();

  /** trustsStamps for the filesystem of device `dev`, whose statfs type `typeOf` answers (called once per device). */
  trusts(dev: number, typeOf: () => number): boolean {
    let trusted = this.trustedDevices.get(dev);
    if (trusted === undefined) this.trustedDevices.set(dev, (trusted = trustsStamps(typeOf())));
    return trusted;
  }

  /**
   * A copy of the listing kept for `dir` when the directory still carries
   * the stamps it had then; undefined otherwise.
   */
  get(dir: string, stat: Stats): FileInfo[] | undefined {
    const kept = this.kept.get(dir);
    if (!kept) return undefined;
    if (kept.stamp !== stampOf(stat)) {
      this.drop(dir, kept);
      return undefined;
    }
    // Most recently used last.
    this.kept.delete(dir);
    this.kept.set(dir, kept);
    // Fresh objects: a caller may change what it was given.
    return kept.entries.map((entry) => (entry.is_dir ? { path: entry.path, is_dir: true } : { path: entry.path, is_dir: false }));
  }

  /**
   * Keeps the listing read for `dir`, whose stamps are `stat` (taken before
   * it was read), when the directory had settled by `askedAt` (Date.now()
   * before the fstat).
   */
  set(dir: string, stat: Stats, askedAt: number, entries: readonly FileInfo[]): void {
    const old = this.kept.get(dir);
    if (old) this.drop(dir, old);
    if (!this.keeps(stat, askedAt, entries.length)) return;
    this.kept.set(dir, { stamp: stampOf(stat), entries: entries.map((entry) => ({ path: entry.path, is_dir: entry.is_dir })) });
    this.size += entries.length;
    for (const [oldest, kept] of this.kept) {
      if (this.size <= MAX_ENTRIES) break;
      this.drop(oldest, kept);
    }
  }

  /** Whether `set` keeps a listing of `count` entries of a directory with these stamps. */
  keeps(stat: Stats, askedAt: number, count: number): boolean {
    return askedAt - Math.max(stat.mtimeMs, stat.ctimeMs) >= SETTLED_MS && count <= MAX_ENTRIES / 4;
  }

  private drop(dir: string, kept: Kept): void {
    this.kept.delete(dir);
    this.size -= kept.entries.length;
  }
}

/** A directory's identity and change stamps, to the nanosecond where the filesystem keeps them. */
function stampOf(stat: Stats): string {
  return `${stat.dev}:${stat.ino}:${stat.size}:${stat.nlink}:${stat.mtimeMs}:${stat.ctimeMs}`;
}
