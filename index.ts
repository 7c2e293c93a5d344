/**
 * strata-workspace — everything for Node in one import. Browsers and edge
 * runtimes import `strata-workspace/core` and `strata-workspace/backends/state`
 * (no Node built-ins); the sandbox runtime is `strata-workspace/runtime`, the
 * test suite `strata-workspace/conformance`. Importing this loads no engine
 * package: pg, ioredis, dockerode, ssh2 and better-sqlite3 load when the class
 * that needs them is first used (stores/optional-package.ts).
 *
 * Public, by name: every name of `strata-workspace/core`, then the backends,
 * stores and sandboxes with their option types and the `Store` contract. The
 * helpers those modules share (store key checks, shell quoting, output
 * collection, internal constants) are not exported here; each module stays
 * reachable by its path (`strata-workspace/stores/store`, …).
 * test/exports.test.ts pins this list.
 */
export {
  BackendRuntime,
  BaseBackend,
  DEFAULT_READ_LIMIT,
  EMPTY_FILE_REMINDER,
  MAX_GLOB_LENGTH,
  MAX_LINE_LENGTH,
  MAX_PATH_LENGTH,
  MAX_PATTERN_LENGTH,
  MAX_SEGMENT_BYTES,
  MAX_TIMEOUT_SECONDS,
  StrataError,
  ancestorsOf,
  applyEdit,
  baseName,
  byteCount,
  capMatches,
  checkQuota,
  compileGlob,
  decodeText,
  errors,
  fileDataBytes,
  fileDataFromBytes,
  fileDataFromText,
  fileDataInfo,
  fileDataSize,
  fileDataText,
  formatRead,
  grepText,
  isFileData,
  isReservedName,
  isSandbox,
  isSandboxBackend,
  isStrataError,
  isWithin,
  joinPath,
  maxCountOf,
  normalizePath,
  parentOf,
  printable,
  readWindow,
  relativeTo,
  renderLines,
  renderWindow,
  resolveBackend,
  search,
  searchRoot,
  sortByPath,
  sortMatches,
  splitLines,
  timeoutSeconds,
  toErrorInfo,
  toFileDataV2,
  toSeedProtocol,
  unwrap,
  validateGlob,
  validateGrepPattern,
  validateQuota,
  type Backend,
  type BackendFactory,
  type BackendProtocol,
  type BackendSpec,
  type BinaryContent,
  type Changed,
  type DeleteResult,
  type DownloadAnswer,
  type DownloadItem,
  type EditOptions,
  type EditOutcome,
  type EditResult,
  type Edited,
  type ErrorCode,
  type ErrorInfo,
  type ExecuteOptions,
  type ExecuteResponse,
  type Failure,
  type FileData,
  type FileDataV1,
  type FileDataV2,
  type FileDownloadResponse,
  type FileEncoding,
  type FileInfo,
  type FileOperationError,
  type FileUploadResponse,
  type FilesUpdate,
  type GlobMatcher,
  type GrepMatch,
  type GlobOptions,
  type GrepOptions,
  type GrepResult,
  type Listing,
  type MkdirOptions,
  type Moved,
  type LsOptions,
  type OperationOptions,
  type Quota,
  type ReadContent,
  type ReadOptions,
  type Result,
  type RuntimeStore,
  type Sandbox,
  type SandboxBackendProtocol,
  type SearchAnswer,
  type SearchLine,
  type SearchOptions,
  type SpawnOptions,
  type SpawnedProcess,
  type TextContent,
  type TextSearchOptions,
  type TextWindow,
  type TransferOptions,
  type UploadAnswer,
  type UploadItem,
  type Usage,
  type WriteOptions,
  type WriteResult,
  PermissionPolicy,
  SECRETS_PRESET,
  SECRET_PATTERNS,
  readOnly,
  type AskCallback,
  type PermissionAction,
  type PermissionDecision,
  type PermissionOperation,
  type PermissionOptions,
  type PermissionRequest,
  type PermissionRule,
  type PermissionVerdict,
} from "./core/index.js";
export { StateBackend, createStateBackend, type FilesState, type StateBackendOptions, type StateRuntimeLike } from "./backends/state.js";
export type { FileChange, Restored, SnapshotPoint, Snapshots } from "./core/snapshots.js";
export {
  AuditedBackend,
  AuditedSandbox,
  MemoryAuditLog,
  StoreAuditLog,
  audited,
  type Audited,
  type AuditContext,
  type AuditLog,
  type AuditOptions,
  type AuditQuery,
  type AuditRecord,
  type AuditSink,
  type AuditStats,
} from "./backends/audit.js";
export { CompositeBackend, type CompositeBackendOptions } from "./backends/composite.js";
export { FilesystemBackend, type FilesystemBackendOptions } from "./backends/filesystem.js";
export { OverlayBackend, type OverlayBackendOptions, type OverlayCommit, type OverlayConflict, type VirtualFile } from "./backends/overlay.js";
export { PermissionedBackend, PermissionedSandbox, withPermissions } from "./backends/permissions.js";
export { StoreBackend, storeBackendFactory, type NamespaceSpec, type StoreBackendOptions } from "./backends/store.js";
export type {
  DirectoryListing,
  ListOptions,
  ListPage,
  Namespace,
  PutOptions,
  SnapshotStore,
  Store,
  StoreQuotaOptions,
  StoredItem,
  StoredKey,
} from "./stores/store.js";
export { hasSnapshots } from "./stores/store.js";
export { MemoryStore, type MemoryStoreOptions } from "./stores/memory.js";
export { SqliteStore, type SqliteStoreOptions } from "./stores/sqlite.js";
export { PostgresStore, type PostgresStoreOptions } from "./stores/postgres.js";
export { RedisStore, type RedisStoreOptions } from "./stores/redis.js";
export { LangGraphStore, type LangGraphStoreOptions } from "./stores/langgraph.js";
export {
  BaseSandbox,
  type BaseSandboxOptions,
  type ExecuteStream,
  type IsolationLevel,
  type NetworkAccess,
  type ResourceLimitOptions,
} from "./sandboxes/base.js";
export { SANDBOX_DEFAULTS } from "./sandboxes/defaults.js";
export { LocalSandbox, type LocalSandboxOptions } from "./sandboxes/local.js";
export { OverlaySandbox, type OverlaySandboxOptions } from "./sandboxes/overlay.js";
export { BubblewrapSandbox, type BubblewrapLimits, type BubblewrapSandboxOptions, type SandboxUser } from "./sandboxes/bubblewrap.js";
export { DockerSandbox, type DockerSandboxOptions } from "./sandboxes/docker.js";
export { SshSandbox, type SshSandboxOptions } from "./sandboxes/ssh.js";
