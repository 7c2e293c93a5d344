/**
 * Bounded concurrency inside one process, shared by the backends and the
 * sandboxes: `mapLimit` runs a list of tasks a few at a time, `Slots` lets
 * at most a few holders in at once. Pure TypeScript (no `node:` imports),
 * like the rest of core; not part of the public index.
 */

/** `fn` over `items` with at most `limit` running, results in input order; items start in input order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

/**
 * At most `limit()` holders at once; the others wait in arrival order. A
 * slot given up goes straight to the next waiter, so a newcomer cannot
 * overtake the queue. The limit is read at each `acquire`, so an owner may
 * set it after creating the slots.
 */
export class Slots {
  private used = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(private readonly limit: () => number) {}

  /** Resolves once the caller holds a slot; every acquire is paired with one `release`. */
  async acquire(): Promise<void> {
    if (this.used < this.limit()) {
      this.used++;
      return;
    }
    await new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.used--;
  }

  /** Lets every waiter go on without a slot (its owner is closing: each sees that, fails, and still releases). */
  wakeAll(): void {
    for (const wake of this.waiting.splice(0)) wake();
  }
}
