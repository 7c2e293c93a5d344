// The one module needed, not the package index (which loads every diff flavour: a fifth of the root import's modules).
import { createTwoFilesPatch } from "diff/lib/patch/create.js";
import { fileDataSize, fileDataText } from "./filedata.js";
import type { FileData, Result } from "./types.js";

/**
 * Snapshots of a key → record map as a tree of change sets, the way a version
 * control system keeps commits: each snapshot holds only what changed since
 * its parent, the record objects themselves are shared (never copied), and a
 * snapshot costs O(1) however many files there are. Moving the map to another
 * snapshot applies the changes along the tree path between them, so restore
 * and diff cost O(changes between the two states), not O(files).
 *
 * Records are treated as immutable: a change replaces a record, never edits
 * one in place (every backend here already works that way).
 */

/** A key's value before and after a stretch of changes; `undefined` is "absent". */
export interface KeyChange<V> {
  before: V | undefined;
  after: V | undefined;
}

interface SnapshotNode<V> {
  id: string;
  parent: SnapshotNode<V> | undefined;
  depth: number;
  /** What changed from the parent's state to this snapshot's. */
  delta: Map<string, KeyChange<V>>;
}

/** Where a transition starts or ends: a snapshot, or the live map (`"now"`). */
export type SnapshotPoint = string | "now";

export class SnapshotTree<V> {
  private readonly nodes = new Map<string, SnapshotNode<V>>();
  /** The snapshot the live map last matched. */
  private base: SnapshotNode<V>;
  /** Changes since `base`. */
  private working = new Map<string, KeyChange<V>>();
  private nextId = 0;

  constructor(private readonly prefix = "s") {
    this.base = { id: this.newId(), parent: undefined, depth: 0, delta: new Map() };
    this.nodes.set(this.base.id, this.base);
  }

  private newId(): string {
    return `${this.prefix}${this.nextId++}`;
  }

  /** Records one change to the live map (call it for every change, with the value replaced). */
  note(key: string, before: V | undefined, after: V | undefined): void {
    const seen = this.working.get(key);
    if (seen) seen.after = after;
    else this.working.set(key, { before, after });
  }

  /** The live map's state as a new snapshot (or the current one when nothing changed since it). */
  snapshot(): string {
    if (this.working.size === 0) return this.base.id;
    const node: SnapshotNode<V> = { id: this.newId(), parent: this.base, depth: this.base.depth + 1, delta: this.working };
    this.nodes.set(node.id, node);
    this.base = node;
    this.working = new Map();
    return node.id;
  }

  has(id: string): boolean {
    return this.nodes.has(id);
  }

  /** Snapshots held. */
  get size(): number {
    return this.nodes.size;
  }

  /**
   * What differs between two points: for each key that changed along the way,
   * its value at `from` and at `to` (keys that ended where they started are
   * left out). Unknown ids are the caller's to check with `has`.
   */
  changes(from: SnapshotPoint, to: SnapshotPoint): Map<string, KeyChange<V>> {
    const out = new Map<string, KeyChange<V>>();
    const step = (key: string, before: V | undefined, after: V | undefined) => {
      const seen = out.get(key);
      if (seen) seen.after = after;
      else out.set(key, { before, after });
    };
    const start = from === "now" ? this.base : this.nodes.get(from)!;
    const end = to === "now" ? this.base : this.nodes.get(to)!;
    if (from === "now") for (const [key, change] of this.working) step(key, change.after, change.before);
    // Up from the start to the common ancestor, undoing; then down to the end, redoing.
    let up = start;
    let down = end;
    const descend: Array<SnapshotNode<V>> = [];
    while (up.depth > down.depth) {
      for (const [key, change] of up.delta) step(key, change.after, change.before);
      up = up.parent!;
    }
    while (down.depth > up.depth) {
      descend.push(down);
      down = down.parent!;
    }
    while (up !== down) {
      for (const [key, change] of up.delta) step(key, change.after, change.before);
      up = up.parent!;
      descend.push(down);
      down = down.parent!;
    }
    for (const node of descend.reverse()) for (const [key, change] of node.delta) step(key, change.before, change.after);
    if (to === "now") for (const [key, change] of this.working) step(key, change.before, change.after);
    for (const [key, change] of out) if (change.before === change.after) out.delete(key);
    return out;
  }

  /** Marks the live map as now matching snapshot `id` (after the caller applied `changes("now", id)`). */
  moveTo(id: string): void {
    this.base = this.nodes.get(id)!;
    this.working = new Map();
  }
}

/** One file that differs between two snapshots. */
export interface FileChange {
  path: string;
  kind: "added" | "modified" | "deleted";
  /** Bytes before and after (absent where the file is absent). */
  sizeBefore?: number;
  sizeAfter?: number;
  /** A unified diff of the text (`a/path` → `b/path`); absent when either side is binary. */
  patch?: string;
}

/** File changes, sorted by path, each with a unified text diff; records with the same bytes and encoding, and keys absent on both sides, are left out. */
export function describeFileChanges(changes: Map<string, KeyChange<FileData>>): FileChange[] {
  const out: FileChange[] = [];
  for (const [path, { before, after }] of [...changes].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    if (before === undefined && after === undefined) continue;
    const oldText = before === undefined ? "" : fileDataText(before);
    const newText = after === undefined ? "" : fileDataText(after);
    if (before !== undefined && after !== undefined && oldText !== null && oldText === newText) continue;
    if (before !== undefined && after !== undefined && oldText === null && newText === null && before.content === after.content) continue;
    const change: FileChange = { path, kind: before === undefined ? "added" : after === undefined ? "deleted" : "modified" };
    if (before !== undefined) change.sizeBefore = fileDataSize(before);
    if (after !== undefined) change.sizeAfter = fileDataSize(after);
    if (oldText !== null && newText !== null) {
      change.patch = createTwoFilesPatch(before === undefined ? "/dev/null" : `a${path}`, after === undefined ? "/dev/null" : `b${path}`, oldText, newText);
    }
    out.push(change);
  }
  return out;
}

/** What `restore` answers: the snapshot now in place, and how many files it put back or removed. */
export interface Restored {
  snapshot: string;
  changed: number;
}

/**
 * Snapshots as a backend offers them, under one set of names: StateBackend
 * answers at once, StoreBackend (over a store that keeps snapshots) through
 * promises, so `await` serves both. Ids are opaque strings, valid only on
 * the backend (or store namespace) that gave them.
 */
export interface Snapshots {
  /** The files as they are now, kept under the id returned. */
  snapshot(): string | Promise<string>;
  /** Puts the files back as they were at snapshot `id`; later snapshots stay valid. */
  restore(id: string): Result<Restored> | Promise<Result<Restored>>;
  /** Files that differ between snapshot `from` and `to` (default: now), each text file with a unified diff. */
  diff(from: string, to?: SnapshotPoint): Result<{ changes: FileChange[] }> | Promise<Result<{ changes: FileChange[] }>>;
  /** An independent copy that shares unchanged records with this one. */
  fork(): Snapshots;
}
