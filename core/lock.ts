/**
 * Per-key serialization inside one process: callers with the same key run one
 * after another, in arrival order; different keys never wait for each other.
 * Hand-written because it is a dozen lines and must stay free of `node:`
 * imports (core runs in browsers); the entry of a key is dropped when its
 * queue drains, so memory stays bounded by the keys in use.
 */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<void>>();

  /** Runs `task` once every earlier task with the same key has settled. */
  async run<T>(key: string, task: () => Promise<T> | T): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const done = new Promise<void>((resolve) => (release = resolve));
    const tail = previous.then(() => done);
    this.tails.set(key, tail);
    try {
      await previous;
      return await task();
    } finally {
      release();
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }

  /** Runs `task` holding every key (sorted, so two multi-key callers cannot deadlock). */
  async runAll<T>(keys: readonly string[], task: () => Promise<T> | T): Promise<T> {
    const sorted = [...new Set(keys)].sort();
    const step = (i: number): Promise<T> => (i === sorted.length ? Promise.resolve(task()) : this.run(sorted[i]!, () => step(i + 1)));
    return step(0);
  }
}
