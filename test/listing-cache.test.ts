import type { Stats } from "node:fs";
import { describe, expect, it } from "vitest";
import { ListingCache, SETTLED_MS, trustsStamps } from "../backends/listing-cache.js";

const stat = (changedAt: number, more: Partial<Stats> = {}) => ({ dev: 1, ino: 2, size: 4096, nlink: 2, mtimeMs: changedAt, ctimeMs: changedAt, ...more }) as Stats;
const entries = [
  { path: "/d/a", is_dir: false },
  { path: "/d/b/", is_dir: true },
];

describe("ListingCache", () => {
  it("keeps a listing only when its directory had settled, and answers it only for the same stamps", () => {
    const cache = new ListingCache();
    const now = 1_000_000;
    cache.set("/d", stat(now - SETTLED_MS + 1), now, entries);
    expect(cache.get("/d", stat(now - SETTLED_MS + 1))).toBeUndefined(); // changed too recently to trust its stamps
    cache.set("/d", stat(now + 5_000), now, entries);
    expect(cache.get("/d", stat(now + 5_000))).toBeUndefined(); // stamped in the future
    cache.set("/d", stat(now - SETTLED_MS), now, entries);
    expect(cache.get("/d", stat(now - SETTLED_MS))).toEqual(entries);
    for (const changed of [{ mtimeMs: now }, { ctimeMs: now }, { ino: 3 }, { dev: 2 }, { size: 8192 }, { nlink: 3 }]) {
      cache.set("/d", stat(now - SETTLED_MS), now, entries);
      expect(cache.get("/d", stat(now - SETTLED_MS, changed)), JSON.stringify(changed)).toBeUndefined();
      expect(cache.get("/d", stat(now - SETTLED_MS))).toBeUndefined(); // dropped once it no longer matched
    }
  });

  it("answers copies: neither the listing given nor one answered changes what is kept", () => {
    const cache = new ListingCache();
    const given = entries.map((e) => ({ ...e }));
    cache.set("/d", stat(0), SETTLED_MS, given);
    given[0]!.path = "/x";
    const first = cache.get("/d", stat(0))!;
    first[1]!.is_dir = false;
    first.pop();
    expect(cache.get("/d", stat(0))).toEqual(entries);
  });

  it("holds a bounded number of entries, the least recently listed going first", () => {
    const cache = new ListingCache();
    const big = Array.from({ length: 45_000 }, (_, i) => ({ path: `/d/f${i}`, is_dir: false }));
    for (let i = 0; i < 4; i++) cache.set(`/d${i}`, stat(0), SETTLED_MS, big);
    expect(cache.get("/d0", stat(0))).toBeDefined(); // 180,000 entries: all kept; /d0 is now the most recently listed
    cache.set("/d4", stat(0), SETTLED_MS, big); // 225,000: /d1 goes
    expect(cache.get("/d1", stat(0))).toBeUndefined();
    cache.set("/d5", stat(0), SETTLED_MS, big); // then /d2
    expect(cache.get("/d2", stat(0))).toBeUndefined();
    for (const kept of ["/d0", "/d3", "/d4", "/d5"]) expect(cache.get(kept, stat(0)), kept).toBeDefined();
  });

  it("trusts the stamps of local kernel filesystems only (network and FUSE ones may make them up or cache them)", () => {
    expect(trustsStamps(0xef53)).toBe(true); // ext4
    expect(trustsStamps(0x01021994)).toBe(true); // tmpfs
    expect(trustsStamps(0x6969)).toBe(false); // NFS
    expect(trustsStamps(0xff534d42)).toBe(false); // CIFS
    expect(trustsStamps(0x65735546)).toBe(false); // FUSE
  });
});
