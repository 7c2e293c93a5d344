/**
 * strata-workspace/core — the contract. Pure TypeScript with no `node:` imports, so it
 * runs in browsers, edge runtimes, Deno and Bun.
 *
 * Public, by name: the native API (`Backend`, `Sandbox`) and its result and
 * option types; the seeds' protocol through `toSeedProtocol`; `BaseBackend`
 * and the driver types a third-party backend implements; the error class,
 * codes and wording; and the one implementation of each contract rule that a
 * backend or a tool layer calls so it answers like every other backend (paths,
 * read format, edit, glob, grep, file data, the numbers table, quotas). The
 * helpers these modules share among themselves stay inside them.
 * test/exports.test.ts pins this list.
 */
export {
  StrataError,
  errors,
  isStrataError,
  printable,
  toErrorInfo,
  type ErrorCode,
  type ErrorInfo,
  type FileOperationError,
} from "./errors.js";
export type {
  BinaryContent,
  Changed,
  DeleteResult,
  DownloadItem,
  EditOptions,
  EditResult,
  Edited,
  ExecuteOptions,
  ExecuteResponse,
  Failure,
  FileData,
  FileDataV1,
  FileDataV2,
  FileDownloadResponse,
  FileEncoding,
  FileInfo,
  FileUploadResponse,
  FilesUpdate,
  GrepMatch,
  GlobOptions,
  GrepOptions,
  GrepResult,
  Listing,
  MkdirOptions,
  Moved,
  LsOptions,
  OperationOptions,
  ReadContent,
  ReadOptions,
  Result,
  SearchOptions,
  SpawnOptions,
  SpawnedProcess,
  TextContent,
  TransferOptions,
  UploadItem,
  WriteOptions,
  WriteResult,
} from "./types.js";
export {
  BackendRuntime,
  isSandbox,
  resolveBackend,
  type Backend,
  type BackendFactory,
  type BackendSpec,
  type RuntimeStore,
  type Sandbox,
} from "./protocol.js";
export { isSandboxBackend, toSeedProtocol, type BackendProtocol, type SandboxBackendProtocol } from "./seed.js";
export { BaseBackend, unwrap, type DownloadAnswer, type TextWindow, type UploadAnswer } from "./base.js";
export {
  MAX_PATH_LENGTH,
  MAX_SEGMENT_BYTES,
  ancestorsOf,
  baseName,
  isReservedName,
  isWithin,
  joinPath,
  normalizePath,
  parentOf,
  relativeTo,
  sortByPath,
} from "./paths.js";
export { DEFAULT_READ_LIMIT, EMPTY_FILE_REMINDER, MAX_LINE_LENGTH, formatRead, renderLines, renderWindow, splitLines } from "./format.js";
export { applyEdit, type EditOutcome } from "./edit.js";
export { MAX_GLOB_LENGTH, compileGlob, searchRoot, validateGlob, type GlobMatcher } from "./glob.js";
export {
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
} from "./permissions.js";
export { MAX_PATTERN_LENGTH, capMatches, grepText, sortMatches, validateGrepPattern } from "./grep.js";
// `SearchOptions` is already the native API's (types.ts): the search's options are exported as `TextSearchOptions`.
export { search, type SearchAnswer, type SearchLine, type SearchOptions as TextSearchOptions } from "./search.js";
export {
  decodeText,
  fileDataBytes,
  fileDataFromBytes,
  fileDataFromText,
  fileDataInfo,
  fileDataSize,
  fileDataText,
  isFileData,
  toFileDataV2,
} from "./filedata.js";
export {
  MAX_TIMEOUT_SECONDS,
  byteCount,
  checkQuota,
  maxCountOf,
  readWindow,
  timeoutSeconds,
  validateQuota,
  type Quota,
  type Usage,
} from "./limits.js";
