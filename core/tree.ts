import { ancestorsOf, baseName, joinPath, parentOf } from "./paths.js";

/**
 * Directory index over a flat set of file paths, so listing a directory costs
 * O(entries in it) rather than O(all files). Directories exist implicitly
 * while they hold a file, as in every key-value backend.
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
    const parent = this.children.get(parentOf(path));
    if (parent) {
      parent.add(baseName(path));
      return;
    }
    let child = path;
    for (const dir of ancestorsOf(path).reverse()) {
      const names = this.children.get(dir);
      if (names) {
        names.add(baseName(child));
        return;
      }
      this.children.set(dir, new Set([baseName(child)]));
      child = dir;
    }
  }

  removeFile(path: string): void {
    let child = path;
    let dir = parentOf(path);
    for (;;) {
      const names = this.children.get(dir);
      if (!names) return;
      names.delete(baseName(child));
      if (names.size > 0 || dir === "/") return;
      this.children.delete(dir);
      child = dir;
      dir = parentOf(dir);
    }
  }

  /** Drops a directory and everything under it from the index. */
  removeTree(dir: string): void {
    for (const name of this.children.get(dir) ?? []) this.removeTree(joinPath(dir, name));
    if (dir !== "/") {
      this.children.delete(dir);
      this.removeFile(dir);
    }
  }

  isDirectory(path: string): boolean {
    return this.children.has(path);
  }

  /** Names directly inside `dir` (files and directories), unsorted; empty when absent. */
  list(dir: string): Iterable<string> {
    return this.children.get(dir) ?? [];
  }
}
