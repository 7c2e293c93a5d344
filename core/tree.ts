import { parentOf } from "./paths.js";

/**
 * Directory index over a flat set of file paths, so listing a directory costs
 * O(entries in it) rather than O(all files). Directories exist implicitly
 * while they hold a file, as in every key-value backend.
 *
 * Each directory holds its children's full paths, the very strings the caller
 * keys its records by, not their names: a name would be a new string per file
 * (about 30 bytes each, a tenth of a small file's footprint at 100k files).
 */
export class DirectoryIndex {
  private readonly children = new Map<string, Set<string>>([["/", new Set()]]);

  static of(paths: Iterable<string>): DirectoryIndex {
    const index = new DirectoryIndex();
    for (const path of paths) index.addFile(path);
    return index;
  }

  addFile(path: string): void {
    // Most files land in a directory that already exists: one lookup, no list of ancestors.
    let child = path;
    for (;;) {
      const dir = parentOf(child);
      const names = this.children.get(dir);
      if (names) {
        names.add(child);
        return;
      }
      this.children.set(dir, new Set([child]));
      child = dir;
    }
  }

  removeFile(path: string): void {
    let child = path;
    let dir = parentOf(path);
    for (;;) {
      const entries = this.children.get(dir);
      if (!entries) return;
      entries.delete(child);
      if (entries.size > 0 || dir === "/") return;
      this.children.delete(dir);
      child = dir;
      dir = parentOf(dir);
    }
  }

  /** Drops a directory and everything under it from the index. */
  removeTree(dir: string): void {
    for (const path of this.children.get(dir) ?? []) this.removeTree(path);
    if (dir !== "/") {
      this.children.delete(dir);
      this.removeFile(dir);
    }
  }

  isDirectory(path: string): boolean {
    return this.children.has(path);
  }

  /** Full paths of the files and directories directly inside `dir`, unsorted; empty when absent. */
  list(dir: string): Iterable<string> {
    return this.children.get(dir) ?? [];
  }
}
