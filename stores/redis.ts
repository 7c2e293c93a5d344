import type * as IoRedis from "ioredis";
import type { Redis } from "ioredis";
import { errors, StrataError } from "../core/errors.js";
import { validateQuota, type Quota } from "../core/limits.js";
import type { FileData } from "../core/types.js";
import {
  checkEngineKey,
  DEFAULT_MAX_VALUE_SIZE,
  fromEngineRecord,
  pageSize,
  searchableNeedle,
  toEngineRecord,
  treePrefix,
  type EngineRecord,
} from "./records.js";
import {
  checkBatchConsistent,
  namespaceKey,
  newerLayout,
  prefixEnd,
  storeClosed,
  versionConflict,
  type DirectoryListing,
  type ListOptions,
  type ListPage,
  type Namespace,
  type PutOptions,
  type Store,
  type StoredItem,
  type StoredKey,
  type StoreQuotaOptions,
} from "./store.js";
import { optionalPackage } from "./optional-package.js";
import { nodeCrypto } from "./lazy-builtins.js";

/** The ioredis package, loaded by the first RedisStore given a url (an optional peer dependency; a store given a client needs none). */
const ioredis = optionalPackage<typeof IoRedis>("ioredis", "RedisStore");

export interface RedisStoreOptions extends StoreQuotaOptions {
  /** `redis://host:port/db`; the store opens (and closes) a client of its own. */
  url?: string;
  /** A client owned by the caller; `close()` leaves it open. */
  client?: Redis;
  /** Prepended to every Redis key (default `strata:`). */
  keyPrefix?: string;
  /** Largest value in bytes (default 64 MiB); larger puts fail with `too_large`. */
  maxValueSize?: number;
  /** Longest to wait for a reply before reporting the server unavailable (default 30 s). */
  commandTimeoutMs?: number;
  /** Longest to wait for a connection (default 5 s). */
  connectTimeoutMs?: number;
}

/** Keys examined per script call while searching: bounds how long one call blocks the server. */
const SEARCH_BATCH = 256;
/**
 * Bytes of content one search call reads at most (after its first key): Redis
 * runs one script at a time, so this bounds how long another client waits.
 */
const SEARCH_BYTES = 4 * 1024 * 1024;
/** Keys removed per script call by deleteTree. */
const DELETE_BATCH = 2000;

/**
 * Text records larger than this (bytes) are not split into trigrams: Lua
 * splits 5 to 15 MB a second, so a bigger text would hold the server for
 * longer than a write should. They are listed apart (tb) and verified by
 * every indexed search instead.
 */
const INDEX_MAX = 64 * 1024;
/** Records a trigram's id set holds before it becomes a bitmap: Redis keeps sets this small as compact intsets. */
const SPARSE_MAX = 512;
/** Trigrams of a needle sent to the index at most (any subset of them still finds every match). */
const MAX_TRIGRAMS = 64;
/** Keys indexed per BUILD call, and content bytes read per call at most. */
const BUILD_BATCH = 1000;
const BUILD_BYTES = 256 * 1024;

/**
 * Shared by every script. ARGV[1] is the namespace's key base. Each file key
 * is indexed three ways: in the namespace's sorted set of keys (`k`, for
 * ranges); in its directory's hash of files (`d:<dir>`: name -> "version size
 * modified_at", so a listing is one HGETALL); and, for every ancestor, as a
 * count of files under each child directory (`c:<dir>`: name -> count), so a
 * directory lists its subdirectories without reading their files.
 */
const PRELUDE = `
local B = ARGV[1]
local function each_ancestor(key, visit)
  local pos = 1
  while true do
    local slash = string.find(key, "/", pos + 1, true)
    if not slash then return end
    visit(string.sub(key, 1, pos), string.sub(key, pos + 1, slash - 1))
    pos = slash
  end
end
local function split(key)
  return string.match(key, "^(.*/)([^/]*)$")
end
-- The trigram index (see TRIGRAMS below). x: "1" once every text record is
-- indexed, "b" while the index is being built; absent, writes leave it alone.
local function indexing() return redis.call("EXISTS", B .. "x") == 1 end
local function trigrams(text)
  local set, byte = {}, string.byte
  if #text < 3 then return set end
  local b1, b2 = byte(text, 1, 2)
  for i = 3, #text do
    local b3 = byte(text, i)
    set[(b1 * 256 + b2) * 256 + b3] = true
    b1 = b2; b2 = b3
  end
  return set
end
-- A trigram's ids are a set (an intset: 2 to 4 bytes an id) while at most
-- ${SPARSE_MAX} records hold it, else a bitmap (one bit per id up to the highest):
-- rare trigrams stay small, common ones cost a bit per record.
local function bitmap_ids(bits)
  local ids, byte, band = {}, string.byte, bit.band
  local masks = { 128, 64, 32, 16, 8, 4, 2, 1 }
  for i = 1, #bits do
    local b = byte(bits, i)
    if b ~= 0 then
      for j = 1, 8 do
        if band(b, masks[j]) ~= 0 then ids[#ids + 1] = (i - 1) * 8 + j - 1 end
      end
    end
  end
  return ids
end
-- Calls through unpack in slices: Lua's C stack takes a few thousand values at most.
local function sliced(command, key, values)
  for first = 1, #values, 1000 do redis.call(command, key, unpack(values, first, math.min(first + 999, #values))) end
end
-- Adds id to the trigrams in added and removes it from those in removed.
-- The counts are read and written in one call each, so a write costs one
-- call per trigram it changes (the redis.call, not the Lua, is the cost).
local function update_trigrams(id, added, removed)
  local codes = {}
  for _, code in ipairs(added) do codes[#codes + 1] = code end
  for _, code in ipairs(removed) do codes[#codes + 1] = code end
  if #codes == 0 then return end
  local counts = {}
  for first = 1, #codes, 1000 do
    for _, n in ipairs(redis.call("HMGET", B .. "tc", unpack(codes, first, math.min(first + 999, #codes)))) do counts[#counts + 1] = n end
  end
  local kept, gone = {}, {}
  for i, code in ipairs(codes) do
    local key = B .. "t:" .. code
    local n = tonumber(counts[i] or "0")
    if i <= #added then
      n = n + 1
      if n <= ${SPARSE_MAX} then redis.call("SADD", key, id) else
        if n == ${SPARSE_MAX} + 1 then
          local ids = redis.call("SMEMBERS", key)
          redis.call("DEL", key)
          for _, other in ipairs(ids) do redis.call("SETBIT", key, other, 1) end
        end
        redis.call("SETBIT", key, id, 1)
      end
    else
      n = n - 1
      if n <= 0 then redis.call("DEL", key)
      elseif n < ${SPARSE_MAX} then redis.call("SREM", key, id)
      else
        redis.call("SETBIT", key, id, 0)
        if n == ${SPARSE_MAX} then
          local ids = bitmap_ids(redis.call("GET", key) or "")
          redis.call("DEL", key)
          sliced("SADD", key, ids)
        end
      end
    end
    if n > 0 then kept[#kept + 1] = code; kept[#kept + 1] = n else gone[#gone + 1] = code end
  end
  sliced("HSET", B .. "tc", kept)
  sliced("HDEL", B .. "tc", gone)
end
-- Takes a key out of the index; old is the text its bits were set from.
local function unindex_text(key, old)
  local id = redis.call("HGET", B .. "ti", key)
  if id then
    local removed = {}
    for code in pairs(trigrams(old or "")) do removed[#removed + 1] = code end
    update_trigrams(id, {}, removed)
    redis.call("HDEL", B .. "ti", key)
    redis.call("HDEL", B .. "tk", id)
    redis.call("RPUSH", B .. "tf", id)
  end
  redis.call("SREM", B .. "tb", key)
end
-- Indexes a key's new record (old: the text its bits were set from, if any):
-- binary records are never searched; text over ${INDEX_MAX} bytes is listed
-- in tb, a candidate for every search, so no write scans megabytes in Lua.
local function index_text(key, old, encoding, text)
  local id = redis.call("HGET", B .. "ti", key)
  if encoding == "base64" or #text > ${INDEX_MAX} then
    unindex_text(key, old)
    if encoding ~= "base64" then redis.call("SADD", B .. "tb", key) end
    return
  end
  redis.call("SREM", B .. "tb", key)
  local before = {}
  if id then before = trigrams(old or "") else
    id = redis.call("RPOP", B .. "tf") or redis.call("INCR", B .. "tn")
    redis.call("HSET", B .. "ti", key, id)
    redis.call("HSET", B .. "tk", id, key)
  end
  local after, added, removed = trigrams(text), {}, {}
  for code in pairs(before) do if not after[code] then removed[#removed + 1] = code end end
  for code in pairs(after) do if not before[code] then added[#added + 1] = code end end
  update_trigrams(id, added, removed)
end
-- The record of a key for its next write: the text its index bits came from.
local function indexed_text(key)
  if redis.call("HEXISTS", B .. "ti", key) == 0 then return nil end
  return redis.call("HGET", B .. "f:" .. key, "c")
end
local function index_new_key(key)
  redis.call("ZADD", B .. "k", 0, key)
  each_ancestor(key, function(dir, name) redis.call("HINCRBY", B .. "c:" .. dir, name, 1) end)
end
local function unindex_key(key)
  redis.call("ZREM", B .. "k", key)
  local dir, name = split(key)
  redis.call("HDEL", B .. "d:" .. dir, name)
  each_ancestor(key, function(dir, name)
    if redis.call("HINCRBY", B .. "c:" .. dir, name, -1) <= 0 then redis.call("HDEL", B .. "c:" .. dir, name) end
  end)
end
-- Usage counters (u: b = bytes, n = files), kept only once a quota check has
-- created them, so stores without a quota pay nothing.
local function count_usage(bytes, files)
  if redis.call("EXISTS", B .. "u") == 0 then return end
  redis.call("HINCRBY", B .. "u", "b", bytes)
  if redis.call("HINCRBY", B .. "u", "n", files) <= 0 then redis.call("DEL", B .. "u") end
end
local function remove_file(key)
  local size = tonumber(redis.call("HGET", B .. "f:" .. key, "s") or "0")
  if indexing() then unindex_text(key, indexed_text(key)) end
  if redis.call("DEL", B .. "f:" .. key) == 0 then return false end
  unindex_key(key)
  count_usage(-size, -1)
  -- An emptied namespace keeps no index state: the next write starts a fresh, complete index.
  if redis.call("EXISTS", B .. "k") == 0 then redis.call("DEL", B .. "x", B .. "xc", B .. "tn", B .. "tf") end
  return true
end
-- Examines keys[1..] in order, stopping once budget bytes of content are read
-- (after at least one key). Returns the records holding needle ("": every
-- text), 7 fields each, after a slot for the caller, and the count examined.
local function examine(keys, needle, budget)
  local out, read, count = { "" }, 0, 0
  for _, key in ipairs(keys) do
    if read > 0 and read + redis.call("HSTRLEN", B .. "f:" .. key, "c") > budget then break end
    count = count + 1
    local m = redis.call("HMGET", B .. "f:" .. key, "v", "c", "e", "ca", "ma", "j")
    if m[2] then read = read + #m[2] end
    if m[1] and m[3] ~= "base64" and (needle == "" or string.find(m[2], needle, 1, true)) then
      out[#out + 1] = key; out[#out + 1] = m[1]; out[#out + 1] = m[2]; out[#out + 1] = m[3]
      out[#out + 1] = m[4]; out[#out + 1] = m[5]; out[#out + 1] = m[6] or ""
    end
  end
  return out, count
end
local function usage()
  if redis.call("EXISTS", B .. "u") == 0 then
    local bytes, files = 0, 0
    for _, key in ipairs(redis.call("ZRANGE", B .. "k", 0, -1)) do
      bytes = bytes + tonumber(redis.call("HGET", B .. "f:" .. key, "s") or "0")
      files = files + 1
    end
    if files == 0 then return 0, 0 end
    redis.call("HSET", B .. "u", "b", bytes, "n", files)
  end
  local u = redis.call("HMGET", B .. "u", "b", "n")
  return tonumber(u[1]), tonumber(u[2])
end
-- The tree check of putFile: a file may not be a directory nor lie under a file.
local function check_tree(key)
  local dir, name = split(key)
  if key == "/" or redis.call("HEXISTS", B .. "c:" .. dir, name) == 1 then return redis.error_reply("STRATA_ISDIR " .. key) end
  local failed = nil
  each_ancestor(key, function(dir, name)
    if not failed and dir ~= "" and redis.call("EXISTS", B .. "f:" .. dir .. name) == 1 then failed = redis.error_reply("STRATA_NOTDIR " .. key) end
  end)
  return failed
end
local function check(key, mode, expected)
  if mode == "any" then return nil end
  local current = redis.call("HGET", B .. "f:" .. key, "v")
  if (mode == "absent" and current) or (mode == "version" and current ~= expected) then
    return redis.error_reply("STRATA_CONFLICT " .. (current or ""))
  end
  return nil
end
`;

/**
 * ARGV: base, mode, expected, tree ("1": check each entry as putFile does),
 * maxBytes and maxFiles ("" for no limit), then 7 fields per entry: key,
 * content, encoding, created, modified, size, original. Every check runs
 * before the first write, so a refused call stores nothing.
 */
const PUT = `${PRELUDE}
local FIRST = 7
local failed = check(ARGV[FIRST], ARGV[2], ARGV[3])
if failed then return failed end
if ARGV[4] == "1" then
  for i = FIRST, #ARGV, 7 do
    failed = check_tree(ARGV[i])
    if failed then return failed end
  end
end
if ARGV[5] ~= "" or ARGV[6] ~= "" then
  local bytes, files = usage()
  local seen, add_bytes, add_files = {}, 0, 0
  for i = FIRST, #ARGV, 7 do
    local key, size = ARGV[i], tonumber(ARGV[i + 5])
    local before = seen[key]
    if before == nil then before = tonumber(redis.call("HGET", B .. "f:" .. key, "s") or "-1") end
    if before < 0 then add_files = add_files + 1; before = 0 end
    add_bytes = add_bytes + size - before
    seen[key] = size
  end
  if ARGV[5] ~= "" and add_bytes > 0 and bytes + add_bytes > tonumber(ARGV[5]) then
    return redis.error_reply("STRATA_QUOTA " .. (bytes + add_bytes) .. " bytes would exceed the " .. ARGV[5] .. "-byte quota")
  end
  if ARGV[6] ~= "" and add_files > 0 and files + add_files > tonumber(ARGV[6]) then
    return redis.error_reply("STRATA_QUOTA " .. (files + add_files) .. " files would exceed the " .. ARGV[6] .. "-file quota")
  end
end
-- A namespace's first write starts its index, complete from the outset.
if redis.call("EXISTS", B .. "k") == 0 and redis.call("EXISTS", B .. "x") == 0 then redis.call("SET", B .. "x", "1") end
local indexed = indexing()
local versions = {}
for i = FIRST, #ARGV, 7 do
  local key = ARGV[i]
  local f = B .. "f:" .. key
  local before = redis.call("HGET", f, "s")
  if indexed then index_text(key, indexed_text(key), ARGV[i + 2], ARGV[i + 1]) end
  local v = redis.call("INCR", B .. "seq")
  redis.call("HSET", f, "v", v, "c", ARGV[i + 1], "e", ARGV[i + 2], "ca", ARGV[i + 3], "ma", ARGV[i + 4], "s", ARGV[i + 5])
  if ARGV[i + 6] == "" then redis.call("HDEL", f, "j") else redis.call("HSET", f, "j", ARGV[i + 6]) end
  local dir, name = split(key)
  redis.call("HSET", B .. "d:" .. dir, name, v .. " " .. ARGV[i + 5] .. " " .. ARGV[i + 4])
  if not before then index_new_key(key) end
  count_usage(tonumber(ARGV[i + 5]) - tonumber(before or "0"), before and 0 or 1)
  versions[#versions + 1] = v
end
return versions`;

/** ARGV: base, key, mode, expected. */
const DELETE = `${PRELUDE}
local failed = check(ARGV[2], ARGV[3], ARGV[4])
if failed then return failed end
if not remove_file(ARGV[2]) then return 0 end
return 1`;

/** ARGV: base, min, max (ZRANGEBYLEX bounds), limit. */
const DELETE_TREE = `${PRELUDE}
local keys = redis.call("ZRANGEBYLEX", B .. "k", ARGV[2], ARGV[3], "LIMIT", 0, tonumber(ARGV[4]))
for _, key in ipairs(keys) do remove_file(key) end
return keys`;

/** ARGV: base, min, max, limit. Returns key, version, size, modified per key. */
const LIST = `${PRELUDE}
local out = {}
for _, key in ipairs(redis.call("ZRANGEBYLEX", B .. "k", ARGV[2], ARGV[3], "LIMIT", 0, tonumber(ARGV[4]))) do
  local m = redis.call("HMGET", B .. "f:" .. key, "v", "s", "ma")
  out[#out + 1] = key; out[#out + 1] = m[1] or "0"; out[#out + 1] = m[2] or "0"; out[#out + 1] = m[3] or ""
end
return out`;

/** ARGV: base, directory prefix. Returns the files (name, "version size modified" pairs) and the subdirectory names. */
const LIST_DIRECTORY = `
return { redis.call("HGETALL", ARGV[1] .. "d:" .. ARGV[2]), redis.call("HKEYS", ARGV[1] .. "c:" .. ARGV[2]) }`;

/**
 * ARGV: base, min, max, batch, needle ("" = every text), byte budget. Returns
 * the last key examined, then 7 fields per text record containing the needle
 * (a plain find, no patterns): key, version, content, encoding, created,
 * modified, original. A call stops once it has read the budget's worth of
 * content (after at least one key), so one search over huge files holds the
 * server for milliseconds at a time, never seconds; the caller resumes after
 * the last key examined.
 */
const SEARCH = `${PRELUDE}
local keys = redis.call("ZRANGEBYLEX", B .. "k", ARGV[2], ARGV[3], "LIMIT", 0, tonumber(ARGV[4]))
local out, count = examine(keys, ARGV[5], tonumber(ARGV[6]))
out[1] = keys[count] or ""
return out`;

/**
 * ARGV: base, needle, byte budget, then the keys to examine. As SEARCH over
 * the keys given (the index's candidates); the first field returned is how
 * many keys were examined.
 */
const VERIFY = `${PRELUDE}
local keys = {}
for i = 4, #ARGV do keys[#keys + 1] = ARGV[i] end
local out, count = examine(keys, ARGV[2], tonumber(ARGV[3]))
out[1] = count
return out`;

/**
 * ARGV: base, prefix, then the needle's trigram codes. Returns nil while the
 * namespace's index is incomplete; else the keys under prefix that hold every
 * trigram of the needle (of the rarest four: each is a candidate either way),
 * plus every text too large to index. The caller verifies each candidate.
 */
const CANDIDATES = `${PRELUDE}
if redis.call("GET", B .. "x") ~= "1" then return false end
local prefix = ARGV[2]
local codes = {}
for i = 3, #ARGV do codes[#codes + 1] = ARGV[i] end
local counts = redis.call("HMGET", B .. "tc", unpack(codes))
local ranked = {}
local absent = false
for i, code in ipairs(codes) do
  local n = tonumber(counts[i] or "0")
  if n == 0 then absent = true end
  ranked[#ranked + 1] = { n, code }
end
local out = {}
local function take(key)
  if string.sub(key, 1, #prefix) == prefix then out[#out + 1] = key end
end
if not absent then
  -- The rarest first: a set is walked and each id tested against the others; bitmaps alone are ANDed.
  table.sort(ranked, function(a, b) return a[1] < b[1] end)
  local chosen = {}
  for i = 1, math.min(4, #ranked) do chosen[i] = { ranked[i][1], B .. "t:" .. ranked[i][2] } end
  local ids
  if chosen[1][1] <= ${SPARSE_MAX} then
    ids = {}
    for _, id in ipairs(redis.call("SMEMBERS", chosen[1][2])) do
      local all = true
      for i = 2, #chosen do
        local has = chosen[i][1] <= ${SPARSE_MAX} and redis.call("SISMEMBER", chosen[i][2], id) or redis.call("GETBIT", chosen[i][2], id)
        if has == 0 then all = false; break end
      end
      if all then ids[#ids + 1] = id end
    end
  elseif #chosen == 1 then
    ids = bitmap_ids(redis.call("GET", chosen[1][2]) or "")
  else
    local sources = {}
    for i, c in ipairs(chosen) do sources[i] = c[2] end
    redis.call("BITOP", "AND", B .. "tq", unpack(sources))
    ids = bitmap_ids(redis.call("GET", B .. "tq") or "")
    redis.call("DEL", B .. "tq")
  end
  for first = 1, #ids, 1000 do
    local keys = redis.call("HMGET", B .. "tk", unpack(ids, first, math.min(first + 999, #ids)))
    for _, key in ipairs(keys) do if key then take(key) end end
  end
end
for _, key in ipairs(redis.call("SMEMBERS", B .. "tb")) do take(key) end
return out`;

/**
 * ARGV: base, batch, byte budget. Indexes the next keys of a namespace whose
 * records predate its index, from the cursor kept in `xc`; writes keep the
 * keys already indexed current meanwhile. Returns "" once the index is
 * complete, else "more".
 */
const BUILD = `${PRELUDE}
local state = redis.call("GET", B .. "x")
if state == "1" then return "" end
-- The cursor lives here, shared by every builder, so concurrent builders leave no gap; a build that starts
-- (none yet, or the index was dropped meanwhile) starts from the first key.
if not state then redis.call("SET", B .. "x", "b"); redis.call("DEL", B .. "xc") end
local keys = redis.call("ZRANGEBYLEX", B .. "k", redis.call("GET", B .. "xc") or "-", "+", "LIMIT", 0, tonumber(ARGV[2]))
local budget, read = tonumber(ARGV[3]), 0
for i, key in ipairs(keys) do
  if read >= budget then
    redis.call("SET", B .. "xc", "(" .. keys[i - 1])
    return "more"
  end
  if redis.call("HEXISTS", B .. "ti", key) == 0 and redis.call("SISMEMBER", B .. "tb", key) == 0 then
    local m = redis.call("HMGET", B .. "f:" .. key, "c", "e")
    if m[1] then
      read = read + #m[1]
      index_text(key, nil, m[2], m[1])
    end
  end
end
if #keys == tonumber(ARGV[2]) then
  redis.call("SET", B .. "xc", "(" .. keys[#keys])
  return "more"
end
redis.call("SET", B .. "x", "1")
redis.call("DEL", B .. "xc")
return ""`;

/**
 * The layout steps, as Lua run inside OPEN with `P` the store's key prefix:
 * MIGRATIONS[n] takes the keys under the prefix from layout n to n + 1, so
 * the current layout is version MIGRATIONS.length, recorded in the key
 * `<prefix>schema`. Version 0 is the layout from before versions were
 * recorded (no such key); a prefix with no keys at all is also taken as
 * version 0, so every step must leave an empty prefix as it is. A change of
 * layout edits the scripts above and appends one step here; OPEN runs the
 * steps and records the version in one atomic script, and a step must keep
 * every record.
 */
const MIGRATIONS: readonly string[] = [
  // 0 -> 1: the version key itself; no record changes.
  "",
  // 1 -> 2: writes keep the trigram index; a namespace written before it has
  // no x key and is indexed by its first search (BUILD). The step only
  // bumps the version, so code that does not keep the index refuses the keys.
  "",
];

/** The layout this code writes and reads. */
const SCHEMA_VERSION = MIGRATIONS.length;

/**
 * ARGV: the version key, the key prefix. Migrates an older layout and
 * records the current version; a current one is only read (nothing written);
 * a newer or unreadable version is refused (`STRATA_NEWER <found>`). Returns
 * the version found.
 */
const OPEN = `
local P = ARGV[2]
local found = redis.call("GET", ARGV[1])
local version = tonumber(found or "0")
if version == nil or version ~= math.floor(version) or version < 0 or version > ${SCHEMA_VERSION} then
  return redis.error_reply("STRATA_NEWER " .. found)
end
if version == ${SCHEMA_VERSION} then return version end
${MIGRATIONS.map((step, n) => `if version <= ${n} then\n${step}\nend`).join("\n")}
redis.call("SET", ARGV[1], ${SCHEMA_VERSION})
return version`;

interface Script {
  lua: string;
  sha: string;
}

/** A script whose digest is computed on first use: hashing at import would cost every program that never opens a RedisStore. */
function script(lua: string): Script {
  let sha: string | undefined;
  return {
    lua,
    get sha() {
      return (sha ??= nodeCrypto().createHash("sha1").update(lua).digest("hex"));
    },
  };
}

const SCRIPTS = {
  put: script(PUT),
  delete: script(DELETE),
  deleteTree: script(DELETE_TREE),
  list: script(LIST),
  listDirectory: script(LIST_DIRECTORY),
  search: script(SEARCH),
  verify: script(VERIFY),
  candidates: script(CANDIDATES),
  build: script(BUILD),
  open: script(OPEN),
};

/**
 * Files in Redis. A namespace's keys share one base, `prefix{namespace}:`
 * (the hash tag keeps a namespace in one cluster slot); under it each file
 * is a hash (`f:<key>`: version, content, encoding, timestamps, size), and
 * the indexes described in PRELUDE are kept in step by Lua scripts, so every
 * write, compare-and-set included, is atomic and one round trip. Versions come
 * from a per-namespace counter and are never reused. Key order is byte order,
 * which is code-point order.
 *
 * `search` runs the substring test inside Redis (a plain `string.find`),
 * returning only matching records. A needle of 3 bytes or more examines only
 * the candidates of a trigram index, kept by the same scripts as every write:
 * per namespace, each text record gets a small integer id (`ti`/`tk`), and each
 * byte trigram the ids holding it (`t:<code>`: a set while few, a bitmap once
 * common) with a count of them (`tc`); a search intersects the id sets of the
 * needle's rarest trigrams. Texts over
 * INDEX_MAX are listed apart (`tb`) and always examined. A namespace written
 * before the index existed (no `x` key) is indexed by its first search, in
 * short calls. Memory: 2 to 4 bytes per (rare trigram, record) pair, and for
 * each common trigram one bit per id up to the highest id.
 */
export class RedisStore implements Store {
  /** The ioredis client underneath (the store's own, or the one given as `client`): the escape hatch to the engine. */
  readonly client: Redis;
  private readonly ownsClient: boolean;
  private readonly keyPrefix: string;
  private readonly maxValueSize: number;
  private readonly quota: Quota | undefined;
  private closed = false;
  /** Settles once the layout is current (checked, migrated if older) on first use; a failure is retried on the next call. */
  private layoutReady: Promise<void> | undefined;

  constructor(options: RedisStoreOptions) {
    this.keyPrefix = options.keyPrefix ?? "strata:";
    this.quota = validateQuota(options.quota);
    this.maxValueSize = options.maxValueSize ?? DEFAULT_MAX_VALUE_SIZE;
    if (options.client) {
      this.client = options.client;
      this.ownsClient = false;
    } else {
      if (!options.url) throw errors.invalidArgument("RedisStore needs a url or a client");
      this.client = new (ioredis().Redis)(options.url, {
        connectTimeout: options.connectTimeoutMs ?? 5_000,
        commandTimeout: options.commandTimeoutMs ?? 30_000,
        // While the server is away, fail fast with "unavailable" instead of queueing
        // for minutes; reconnect in the background so the store recovers by itself.
        maxRetriesPerRequest: 1,
        retryStrategy: (attempt) => Math.min(100 * attempt, 2_000),
        // A write whose reply was lost may have been applied: never send it twice.
        autoResendUnfulfilledCommands: false,
      });
      this.ownsClient = true;
      // Connection errors surface through the failing commands; without a listener
      // ioredis would print every reconnection attempt.
      this.client.on("error", () => {});
    }
  }


  async get(namespace: Namespace, key: string): Promise<StoredItem | undefined> {
    const base = this.base(namespace);
    checkEngineKey(key);
    const fields = await this.call(() => this.client.hmget(`${base}f:${key}`, "v", "c", "e", "ca", "ma", "j"));
    const [version, content, encoding, created, modified, original] = fields;
    if (version === null || version === undefined) return undefined;
    return toItem([key, version, content, encoding, created, modified, original]);
  }

  put(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, false);
  }

  /** `put` with the tree checked in the same Lua script, so no other write can run between the check and the put. */
  putFile(namespace: Namespace, key: string, value: FileData, options: PutOptions = {}): Promise<number> {
    return this.putOne(namespace, key, value, options, true);
  }

  putMany(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, false);
  }

  /** `putMany` with every entry's tree check in the one script. */
  putFiles(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>): Promise<number[]> {
    return this.putBatch(namespace, entries, true);
  }

  private async putOne(namespace: Namespace, key: string, value: FileData, options: PutOptions, asFile: boolean): Promise<number> {
    const base = this.base(namespace);
    const record = toEngineRecord(checkEngineKey(key), value, this.maxValueSize);
    const expected = options.expectedVersion;
    const mode = expected === undefined ? "any" : expected === null ? "absent" : "version";
    try {
      const [version] = (await this.run(SCRIPTS.put, [base, mode, String(expected ?? ""), ...this.putFlags(asFile), ...recordArgs(key, record)])) as number[];
      return Number(version);
    } catch (error) {
      throw scriptError(error, key, expected ?? null);
    }
  }

  private async putBatch(namespace: Namespace, entries: ReadonlyArray<readonly [string, FileData]>, asFiles: boolean): Promise<number[]> {
    const base = this.base(namespace);
    // All or nothing: every entry is validated before the one atomic script runs.
    const args = entries.flatMap(([key, value]) => recordArgs(key, toEngineRecord(checkEngineKey(key), value, this.maxValueSize)));
    if (asFiles) checkBatchConsistent(entries.map(([key]) => key));
    if (entries.length === 0) return [];
    let versions: number[];
    try {
      versions = (await this.run(SCRIPTS.put, [base, "any", "", ...this.putFlags(asFiles), ...args])) as number[];
    } catch (error) {
      throw scriptError(error, entries[0]![0], null);
    }
    // A key given twice gets its last version everywhere, as in the other stores' batches.
    const latest = new Map(entries.map(([key], i) => [key, Number(versions[i])]));
    return entries.map(([key]) => latest.get(key)!);
  }

  /** The PUT script's tree flag and quota limits. */
  private putFlags(checkTree: boolean): string[] {
    return [checkTree ? "1" : "", String(this.quota?.maxBytes ?? ""), String(this.quota?.maxFiles ?? "")];
  }

  async delete(namespace: Namespace, key: string, options: PutOptions = {}): Promise<boolean> {
    const base = this.base(namespace);
    checkEngineKey(key);
    const expected = options.expectedVersion;
    const mode = expected === undefined ? "any" : expected === null ? "absent" : "version";
    try {
      return Number(await this.run(SCRIPTS.delete, [base, key, mode, String(expected ?? "")])) === 1;
    } catch (error) {
      throw scriptError(error, key, expected ?? null);
    }
  }

  async deleteTree(namespace: Namespace, dir: string): Promise<string[]> {
    const base = this.base(namespace);
    const prefix = treePrefix(checkEngineKey(dir));
    // In chunks, so a huge tree never blocks the server for long; each chunk is atomic.
    const removed: string[] = [];
    for (;;) {
      const chunk = (await this.run(SCRIPTS.deleteTree, [base, ...lexRange(prefix), String(DELETE_BATCH)])) as string[];
      removed.push(...chunk);
      if (chunk.length < DELETE_BATCH) return removed;
    }
  }

  async list(namespace: Namespace, options: ListOptions = {}): Promise<ListPage> {
    const base = this.base(namespace);
    const limit = pageSize(options.limit);
    const [min, max] = lexRange(options.prefix ?? "", options.after);
    const flat = (await this.run(SCRIPTS.list, [base, min, max, String(limit + 1)])) as string[];
    const items: StoredKey[] = [];
    for (let i = 0; i < flat.length; i += 4) items.push(toKey(flat[i]!, flat.slice(i + 1, i + 4)));
    if (items.length <= limit) return { items };
    items.length = limit;
    return { items, next: items[limit - 1]!.key };
  }

  async listDirectory(namespace: Namespace, dir: string): Promise<DirectoryListing> {
    const base = this.base(namespace);
    const prefix = treePrefix(checkEngineKey(dir));
    const [flat, dirs] = (await this.run(SCRIPTS.listDirectory, [base, prefix])) as [string[], string[]];
    const files: StoredKey[] = [];
    for (let i = 0; i < flat.length; i += 2) {
      const meta = flat[i + 1]!;
      const first = meta.indexOf(" ");
      const second = meta.indexOf(" ", first + 1);
      files.push(toKey(prefix + flat[i]!, [meta.slice(0, first), meta.slice(first + 1, second), meta.slice(second + 1)]));
    }
    return { files, dirs };
  }

  /**
   * A needle of 3 bytes or more is looked up in the trigram index (built on
   * first use for records that predate it): the keys holding its rarest
   * trigrams, verified in Lua in key order. Shorter needles scan the prefix.
   */
  async *search(namespace: Namespace, substring: string, prefix: string): AsyncIterable<StoredItem> {
    const base = this.base(namespace);
    if (typeof substring !== "string" || typeof prefix !== "string") throw errors.invalidArgument("search needs a substring and a prefix");
    const needle = searchableNeedle(substring) ?? "";
    const codes = trigramCodes(needle);
    if (codes.length > 0) {
      const keys = await this.candidates(base, prefix, codes);
      for (let start = 0; start < keys.length; ) {
        const [examined, ...flat] = (await this.run(SCRIPTS.verify, [base, needle, String(SEARCH_BYTES), ...keys.slice(start, start + SEARCH_BATCH)])) as string[];
        for (let i = 0; i < flat.length; i += 7) yield toItem(flat.slice(i, i + 7));
        start += Number(examined);
      }
      return;
    }
    let after: string | undefined;
    for (;;) {
      const [min, max] = lexRange(prefix, after);
      const [last, ...flat] = (await this.run(SCRIPTS.search, [base, min, max, String(SEARCH_BATCH), needle, String(SEARCH_BYTES)])) as string[];
      for (let i = 0; i < flat.length; i += 7) yield toItem(flat.slice(i, i + 7));
      if (!last) return;
      after = last;
    }
  }

  /** The index's candidate keys under `prefix`, in key order; builds the namespace's index first when it is incomplete. */
  private async candidates(base: string, prefix: string, codes: string[]): Promise<string[]> {
    for (;;) {
      const keys = (await this.run(SCRIPTS.candidates, [base, prefix, ...codes])) as string[] | null;
      if (keys !== null) return keys.sort(byteOrder);
      // Built in short calls, so other clients are served between them; concurrent builders share the cursor.
      while ((await this.run(SCRIPTS.build, [base, String(BUILD_BATCH), String(BUILD_BYTES)])) !== "");
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (!this.ownsClient) return;
    try {
      await this.client.quit();
    } catch {
      this.client.disconnect();
    }
  }

  private base(namespace: Namespace): string {
    if (this.closed) throw storeClosed();
    return `${this.keyPrefix}{${namespaceKey(namespace)}}:`;
  }

  private run(code: Script, args: string[]): Promise<unknown> {
    return this.call(() => this.evaluate(code, args));
  }

  /** Runs a script by its hash, sending the source only when the server has not cached it (first use, or after a restart). */
  private async evaluate(code: Script, args: string[]): Promise<unknown> {
    try {
      // An array argument is flattened by ioredis; spreading a large batch would overflow the stack.
      return await this.client.evalsha(code.sha, 0, args);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith("NOSCRIPT")) throw error;
      return await this.client.eval(code.lua, 0, args);
    }
  }

  private async call<T>(command: () => Promise<T>): Promise<T> {
    if (this.closed) throw storeClosed();
    try {
      await this.ready();
      return await command();
    } catch (error) {
      throw storeError(error);
    }
  }

  private ready(): Promise<void> {
    this.layoutReady ??= this.openLayout().catch((error: unknown) => {
      this.layoutReady = undefined;
      throw error;
    });
    return this.layoutReady;
  }

  /** Brings the keys under the prefix to the current layout, or refuses a newer one (`unsupported`). */
  private async openLayout(): Promise<void> {
    try {
      await this.evaluate(SCRIPTS.open, [`${this.keyPrefix}schema`, this.keyPrefix]);
    } catch (error) {
      const newer = error instanceof Error ? /STRATA_NEWER (.*)$/s.exec(error.message) : null;
      if (!newer) throw storeError(error);
      const found = newer[1]!;
      throw newerLayout("Redis", /^\d+$/.test(found) ? Number(found) : JSON.stringify(found.slice(0, 40)), SCHEMA_VERSION);
    }
  }
}

function recordArgs(key: string, record: EngineRecord): string[] {
  return [key, record.content, record.encoding, record.created_at, record.modified_at, String(record.size), record.original ?? ""];
}

function toKey(key: string, [version, size, modified]: string[]): StoredKey {
  return { key, version: Number(version), size: Number(size), modified_at: modified ?? "" };
}

/** From key, version, content, encoding, created, modified, original ("" for none). */
function toItem(fields: ReadonlyArray<string | null | undefined>): StoredItem {
  const [key, version, content, encoding, created, modified, original] = fields.map((field) => field ?? "");
  const record: EngineRecord = {
    encoding: encoding as EngineRecord["encoding"],
    content: content!,
    original: original === "" ? null : original!,
    size: 0,
    created_at: created!,
    modified_at: modified!,
  };
  return { key: key!, value: fromEngineRecord(record), version: Number(version) };
}

/** The distinct byte trigrams of a needle as the index codes them (b1 * 65536 + b2 * 256 + b3), at most MAX_TRIGRAMS; none under 3 bytes. */
function trigramCodes(needle: string): string[] {
  const bytes = Buffer.from(needle);
  const codes = new Set<string>();
  for (let i = 2; i < bytes.length && codes.size < MAX_TRIGRAMS; i++) codes.add(String(bytes[i - 2]! * 65536 + bytes[i - 1]! * 256 + bytes[i]!));
  return [...codes];
}

/** Byte (code point) order of keys, the order of the namespace's sorted set. */
function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** ZRANGEBYLEX bounds for keys starting with `prefix`, after `after` when given. */
function lexRange(prefix: string, after?: string): [string, string] {
  const end = prefix === "" ? undefined : prefixEnd(prefix);
  let min = prefix === "" ? "-" : `[${prefix}`;
  if (after !== undefined && Buffer.compare(Buffer.from(after), Buffer.from(prefix)) >= 0) min = `(${after}`;
  return [min, end === undefined ? "+" : `(${end}`];
}

/** The typed error for a script's refusal (conflict, tree, quota); other errors pass through. */
function scriptError(error: unknown, key: string, expected: number | null): unknown {
  const cause = error instanceof StrataError ? error.cause : error;
  const message = cause instanceof Error ? cause.message : "";
  const conflict = /STRATA_CONFLICT ?(\d*)/.exec(message);
  if (conflict) return versionConflict(key, expected, conflict[1] ? Number(conflict[1]) : undefined);
  const tree = /STRATA_(ISDIR|NOTDIR) (.*)$/s.exec(message);
  if (tree) return tree[1] === "ISDIR" ? errors.isDirectory(tree[2]!) : errors.notADirectory(tree[2]!);
  const quota = /STRATA_QUOTA (.*)$/s.exec(message);
  if (quota) return errors.quotaExceeded(key, quota[1]!);
  return error;
}

const UNREACHABLE = /Connection is closed|Command timed out|Stream isn't writeable|max retries per request|ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENOTFOUND|LOADING|connect ETIMEDOUT|Socket closed/i;

/** A typed error for any failure; the driver's message is kept only as `cause`. */
function storeError(error: unknown): StrataError {
  if (error instanceof StrataError) return error;
  const message = error instanceof Error ? error.message : "";
  const name = error instanceof Error ? error.name : "";
  if (name === "MaxRetriesPerRequestError" || UNREACHABLE.test(message)) {
    return new StrataError("unavailable", "Redis is unavailable (connection lost or timed out); the store reconnects by itself", { cause: error });
  }
  if (/^OOM/.test(message)) return new StrataError("too_large", "Redis is out of memory (maxmemory reached)", { cause: error });
  return new StrataError("io_error", `Redis failed${name === "ReplyError" ? ` (${message.split(" ")[0]})` : ""}`, { cause: error });
}
