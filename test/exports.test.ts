/**
 * The public names of each entry point, pinned. An export added or removed by
 * accident fails here; a deliberate change edits the lists below in the same
 * commit. Values are checked on the loaded module (`Object.keys`), types by
 * the TypeScript checker over the entry files (a type leaves no trace at run
 * time). The subpath entries (`./backends/*`, `./stores/*`, `./sandboxes/*`)
 * are module paths: every export of the module is reachable there by design,
 * so they are not pinned.
 */
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { beforeAll, describe, expect, it } from "vitest";

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));

// ---------------------------------------------------------------- the lists

const CORE_VALUES = [
  "BackendRuntime",
  "BaseBackend",
  "DEFAULT_READ_LIMIT",
  "EMPTY_FILE_REMINDER",
  "MAX_GLOB_LENGTH",
  "MAX_LINE_LENGTH",
  "MAX_PATH_LENGTH",
  "MAX_PATTERN_LENGTH",
  "MAX_SEGMENT_BYTES",
  "MAX_TIMEOUT_SECONDS",
  "PermissionPolicy",
  "SECRETS_PRESET",
  "SECRET_PATTERNS",
  "StrataError",
  "ancestorsOf",
  "applyEdit",
  "baseName",
  "byteCount",
  "capMatches",
  "checkQuota",
  "compileGlob",
  "decodeText",
  "errors",
  "fileDataBytes",
  "fileDataFromBytes",
  "fileDataFromText",
  "fileDataInfo",
  "fileDataSize",
  "fileDataText",
  "formatRead",
  "grepText",
  "isFileData",
  "isReservedName",
  "isSandbox",
  "isSandboxBackend",
  "isStrataError",
  "isWithin",
  "joinPath",
  "maxCountOf",
  "normalizePath",
  "parentOf",
  "printable",
  "readOnly",
  "readWindow",
  "relativeTo",
  "renderLines",
  "renderWindow",
  "resolveBackend",
  "search",
  "searchRoot",
  "sortByPath",
  "sortMatches",
  "splitLines",
  "timeoutSeconds",
  "toErrorInfo",
  "toFileDataV2",
  "toSeedProtocol",
  "unwrap",
  "validateGlob",
  "validateGrepPattern",
  "validateQuota",
];

const CORE_TYPES = [
  "AskCallback",
  "Backend",
  "BackendFactory",
  "BackendProtocol",
  "BackendSpec",
  "BinaryContent",
  "Changed",
  "DeleteResult",
  "DownloadAnswer",
  "DownloadItem",
  "EditOptions",
  "EditOutcome",
  "EditResult",
  "Edited",
  "ErrorCode",
  "ErrorInfo",
  "ExecuteOptions",
  "ExecuteResponse",
  "Failure",
  "FileData",
  "FileDataV1",
  "FileDataV2",
  "FileDownloadResponse",
  "FileEncoding",
  "FileInfo",
  "FileOperationError",
  "FileUploadResponse",
  "FilesUpdate",
  "GlobMatcher",
  "GlobOptions",
  "GrepMatch",
  "GrepOptions",
  "GrepResult",
  "Listing",
  "LsOptions",
  "MkdirOptions",
  "Moved",
  "OperationOptions",
  "PermissionAction",
  "PermissionDecision",
  "PermissionOperation",
  "PermissionOptions",
  "PermissionRequest",
  "PermissionRule",
  "PermissionVerdict",
  "Quota",
  "ReadContent",
  "ReadOptions",
  "Result",
  "RuntimeStore",
  "Sandbox",
  "SandboxBackendProtocol",
  "SearchAnswer",
  "SearchLine",
  "SearchOptions",
  "SpawnOptions",
  "SpawnedProcess",
  "TextContent",
  "TextSearchOptions",
  "TextWindow",
  "TransferOptions",
  "UploadAnswer",
  "UploadItem",
  "Usage",
  "WriteOptions",
  "WriteResult",
];

/** The root entry: every name of core, then these. */
const ROOT_OWN_VALUES = [
  "AuditedBackend",
  "AuditedSandbox",
  "MemoryAuditLog",
  "StoreAuditLog",
  "audited",
  "BaseSandbox",
  "BubblewrapSandbox",
  "CompositeBackend",
  "DockerSandbox",
  "FilesystemBackend",
  "OverlayBackend",
  "OverlaySandbox",
  "LangGraphStore",
  "LocalSandbox",
  "MemoryStore",
  "PermissionedBackend",
  "PermissionedSandbox",
  "PostgresStore",
  "RedisStore",
  "SANDBOX_DEFAULTS",
  "SqliteStore",
  "SshSandbox",
  "StateBackend",
  "StoreBackend",
  "createStateBackend",
  "hasSnapshots",
  "storeBackendFactory",
  "withPermissions",
];

const ROOT_OWN_TYPES = [
  "AuditContext",
  "AuditLog",
  "AuditOptions",
  "AuditQuery",
  "AuditRecord",
  "AuditSink",
  "AuditStats",
  "Audited",
  "FileChange",
  "Restored",
  "SnapshotPoint",
  "SnapshotStore",
  "Snapshots",
  "BaseSandboxOptions",
  "BubblewrapLimits",
  "BubblewrapSandboxOptions",
  "CompositeBackendOptions",
  "DirectoryListing",
  "DockerSandboxOptions",
  "ExecuteStream",
  "FilesState",
  "FilesystemBackendOptions",
  "OverlayBackendOptions",
  "OverlayCommit",
  "OverlayConflict",
  "OverlaySandboxOptions",
  "VirtualFile",
  "IsolationLevel",
  "LangGraphStoreOptions",
  "ListOptions",
  "ListPage",
  "LocalSandboxOptions",
  "MemoryStoreOptions",
  "Namespace",
  "NamespaceSpec",
  "NetworkAccess",
  "PostgresStoreOptions",
  "PutOptions",
  "RedisStoreOptions",
  "ResourceLimitOptions",
  "SandboxUser",
  "SqliteStoreOptions",
  "SshSandboxOptions",
  "StateBackendOptions",
  "StateRuntimeLike",
  "Store",
  "StoreBackendOptions",
  "StoreQuotaOptions",
  "StoredItem",
  "StoredKey",
];

const RUNTIME_VALUES = [
  "BackendNotFound",
  "BackendSandboxClosed",
  "BackendUnavailable",
  "BubblewrapProvider",
  "CODE_LANGUAGES",
  "CodeRunSchema",
  "CommandRunSchema",
  "DockerProvider",
  "FilesExistsSchema",
  "FilesListSchema",
  "FilesReadSchema",
  "FilesWriteSchema",
  "Future",
  "HandleError",
  "InvalidPayload",
  "InvalidSpec",
  "LocalProvider",
  "PAYLOAD_TYPES",
  "PayloadSchema",
  "PersistentSandboxRegistry",
  "ProviderError",
  "ProviderRegistrationError",
  "ProviderRegistry",
  "RuntimeError",
  "SandboxHandle",
  "SandboxProviderBase",
  "SandboxRegistryError",
  "SshProvider",
  "Stream",
  "StreamError",
  "StreamEvent",
  "StreamFailed",
  "UnsupportedBackendTool",
  "codeRun",
  "commandRun",
  "dispatchPayload",
  "filesExists",
  "filesList",
  "filesRead",
  "filesWrite",
  "isFailure",
  "parsePayload",
  "providers",
  "registerBuiltinProviders",
];

const RUNTIME_TYPES = [
  "Capabilities",
  "CodeLanguage",
  "CodeResult",
  "CodeRun",
  "ColdStart",
  "CommandResult",
  "CommandRun",
  "DispatchContext",
  "Dispatcher",
  "FileContent",
  "FileEntries",
  "FileWriteResult",
  "FilesExists",
  "FilesList",
  "FilesRead",
  "FilesWrite",
  "IsolationLevel",
  "LocalSandboxEntry",
  "OpenedSandbox",
  "Payload",
  "PayloadResult",
  "PayloadResults",
  "PayloadType",
  "PersistentSandboxRegistryOptions",
  "ProviderClass",
  "ProviderFactory",
  "ProviderSource",
  "PruneOptions",
  "ReattachOptions",
  "RemoteSandboxRecord",
  "ResultOf",
  "SandboxHandleOptions",
  "SandboxLease",
  "SandboxProvider",
  "SandboxSpec",
  "ToolExecutionFailure",
];

const CONFORMANCE_VALUES = [
  "HOSTILE_PATHS",
  "VALID_ODD_NAMES",
  "describeNative",
  "describeReliability",
  "rooted",
  "runConformance",
  "runStoreConformance",
];

const CONFORMANCE_TYPES = ["ConformanceCapabilities", "ConformanceTarget", "NativeOptions", "ReliabilityOptions", "StoreTarget"];

/** Helpers that are implementation details: no entry point may export them, as a value or as a type. */
const NEVER_PUBLIC = [
  "now",
  "failure",
  "errorString",
  "prefixEnd",
  "shellQuote",
  "get",
  "current",
  "register",
  "checkBatch",
  "textWindow",
  "checkOffset",
  "timeoutMessage",
];

interface Entry {
  /** The package specifier users write. */
  specifier: string;
  /** The source file, relative to the repository root. */
  file: string;
  load: () => Promise<Record<string, unknown>>;
  values: string[];
  types: string[];
}

const ENTRIES: Record<"root" | "core" | "runtime" | "conformance", Entry> = {
  root: {
    specifier: "strata-workspace",
    file: "index.ts",
    load: () => import("../index.js"),
    values: [...CORE_VALUES, ...ROOT_OWN_VALUES],
    types: [...CORE_TYPES, ...ROOT_OWN_TYPES],
  },
  core: { specifier: "strata-workspace/core", file: "core/index.ts", load: () => import("../core/index.js"), values: CORE_VALUES, types: CORE_TYPES },
  runtime: { specifier: "strata-workspace/runtime", file: "runtime/index.ts", load: () => import("../runtime/index.js"), values: RUNTIME_VALUES, types: RUNTIME_TYPES },
  conformance: {
    specifier: "strata-workspace/conformance",
    file: "conformance/index.ts",
    load: () => import("../conformance/index.js"),
    values: CONFORMANCE_VALUES,
    types: CONFORMANCE_TYPES,
  },
};

const sorted = (names: readonly string[]) => [...names].sort();

// ---------------------------------------------------------------- what the entries export

/** Every exported name of each entry file as the TypeScript checker sees it, split into values and type-only names. */
function compiledExports(): Record<string, { values: string[]; types: string[] }> {
  const configPath = join(ROOT, "tsconfig.json");
  const config = ts.readConfigFile(configPath, (path) => ts.sys.readFile(path));
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, ROOT);
  const files = Object.values(ENTRIES).map((entry) => join(ROOT, entry.file));
  const program = ts.createProgram(files, { ...parsed.options, noEmit: true });
  const checker = program.getTypeChecker();
  const out: Record<string, { values: string[]; types: string[] }> = {};
  for (const file of files) {
    const source = program.getSourceFile(file);
    const moduleSymbol = source && checker.getSymbolAtLocation(source);
    if (!moduleSymbol) throw new Error(`TypeScript could not read ${file}`);
    const values: string[] = [];
    const types: string[] = [];
    for (const symbol of checker.getExportsOfModule(moduleSymbol)) {
      const target = symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
      (target.flags & ts.SymbolFlags.Value ? values : types).push(symbol.name);
    }
    out[file] = { values: values.sort(), types: types.sort() };
  }
  return out;
}

describe("public names of each entry point", () => {
  let compiled: Record<string, { values: string[]; types: string[] }>;
  const loaded: Record<string, Record<string, unknown>> = {};

  beforeAll(async () => {
    for (const [name, entry] of Object.entries(ENTRIES)) loaded[name] = await entry.load();
    compiled = compiledExports();
  });

  it("the lists have no duplicates and no name in both values and types", () => {
    for (const entry of Object.values(ENTRIES)) {
      const all = [...entry.values, ...entry.types];
      expect(new Set(all).size, entry.specifier).toBe(all.length);
    }
  });

  it.each(Object.entries(ENTRIES))("%s: the values at run time are exactly the list", (name, entry) => {
    expect(Object.keys(loaded[name]!).sort()).toEqual(sorted(entry.values));
  });

  it.each(Object.entries(ENTRIES))("%s: the checker sees exactly the listed values and types", (_, entry) => {
    const found = compiled[join(ROOT, entry.file)]!;
    expect(found.values).toEqual(sorted(entry.values));
    expect(found.types).toEqual(sorted(entry.types));
  });

  it("no entry point exports an implementation helper", () => {
    for (const [name, entry] of Object.entries(ENTRIES)) {
      const found = compiled[join(ROOT, entry.file)]!;
      const exported = new Set([...Object.keys(loaded[name]!), ...found.values, ...found.types]);
      expect(NEVER_PUBLIC.filter((helper) => exported.has(helper)), entry.specifier).toEqual([]);
    }
  });

  it("the root entry re-exports every name of core, the very same bindings", () => {
    const root = loaded.root!;
    const core = loaded.core!;
    for (const name of Object.keys(core)) {
      expect(Object.hasOwn(root, name), name).toBe(true);
      expect(root[name], name).toBe(core[name]);
    }
    const rootTypes = new Set(compiled[join(ROOT, ENTRIES.root.file)]!.types);
    expect(compiled[join(ROOT, ENTRIES.core.file)]!.types.filter((type) => !rootTypes.has(type))).toEqual([]);
  });

  it("every name the README and docs import from an entry point is exported by it", () => {
    const bySpecifier = new Map(Object.entries(ENTRIES).map(([name, entry]) => [entry.specifier, name]));
    const pages = ["README.md", ...readdirSync(join(ROOT, "docs")).filter((f) => f.endsWith(".md")).map((f) => join("docs", f))];
    const missing: string[] = [];
    let imports = 0;
    for (const page of pages) {
      const text = readFileSync(join(ROOT, page), "utf8");
      for (const match of text.matchAll(/import\s*(?:type\s*)?\{([^}]*)\}\s*from\s*"(strata-workspace[^"]*)"/g)) {
        const entry = bySpecifier.get(match[2]!);
        if (entry === undefined) continue; // a module path (./backends/*, …): everything it exports is reachable
        const found = compiled[join(ROOT, ENTRIES[entry as keyof typeof ENTRIES].file)]!;
        const exported = new Set([...found.values, ...found.types]);
        for (const spec of match[1]!.split(",")) {
          const name = spec.trim().replace(/^type\s+/, "").split(/\s+as\s+/)[0]!;
          if (name === "") continue;
          imports++;
          if (!exported.has(name)) missing.push(`${page}: ${name} from "${match[2]}"`);
        }
      }
    }
    expect(imports).toBeGreaterThan(0);
    expect(missing).toEqual([]);
  });
});
