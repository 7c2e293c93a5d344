/**
 * strata-workspace/runtime — the OpenRath layer over the sandboxes: the provider
 * registry, capabilities, refcounted sandbox handles, typed payloads and
 * dispatch, the FIFO stream, and the persistent sandbox registry.
 *
 * Importing this module registers the built-in providers: local,
 * bubblewrap, docker and ssh.
 *
 * Public, by name: the error classes, payload schemas, builders, result types
 * and dispatch, the provider interface and base class, handles, streams, the
 * registries (`providers`, `ProviderRegistry`) and the built-in provider
 * classes. The registry is used through its methods (`providers.get(…)`,
 * `providers.preferred(…)`); the failure builders, the spec parser and the
 * id validator stay inside their modules. test/exports.test.ts pins this list.
 */
export {
  BackendNotFound,
  BackendSandboxClosed,
  BackendUnavailable,
  HandleError,
  InvalidPayload,
  InvalidSpec,
  ProviderError,
  ProviderRegistrationError,
  RuntimeError,
  SandboxRegistryError,
  StreamError,
  StreamFailed,
  UnsupportedBackendTool,
} from "./errors.js";
export {
  CODE_LANGUAGES,
  CodeRunSchema,
  CommandRunSchema,
  FilesExistsSchema,
  FilesListSchema,
  FilesReadSchema,
  FilesWriteSchema,
  PAYLOAD_TYPES,
  PayloadSchema,
  codeRun,
  commandRun,
  dispatchPayload,
  filesExists,
  filesList,
  filesRead,
  filesWrite,
  isFailure,
  parsePayload,
  type CodeLanguage,
  type CodeResult,
  type CodeRun,
  type CommandResult,
  type CommandRun,
  type DispatchContext,
  type FileContent,
  type FileEntries,
  type FileWriteResult,
  type FilesExists,
  type FilesList,
  type FilesRead,
  type FilesWrite,
  type Payload,
  type PayloadResult,
  type PayloadResults,
  type PayloadType,
  type ResultOf,
  type ToolExecutionFailure,
} from "./payloads.js";
export {
  SandboxProviderBase,
  type Capabilities,
  type ColdStart,
  type IsolationLevel,
  type OpenedSandbox,
  type ReattachOptions,
  type SandboxProvider,
  type SandboxSpec,
} from "./provider.js";
export { SandboxHandle, type SandboxHandleOptions, type SandboxLease } from "./handle.js";
export { Future, Stream, StreamEvent, type Dispatcher } from "./stream.js";
export { ProviderRegistry, providers, type ProviderClass, type ProviderFactory, type ProviderSource } from "./registry.js";
export {
  PersistentSandboxRegistry,
  type LocalSandboxEntry,
  type PersistentSandboxRegistryOptions,
  type PruneOptions,
  type RemoteSandboxRecord,
} from "./persistence.js";
export { BubblewrapProvider, DockerProvider, LocalProvider, SshProvider, registerBuiltinProviders } from "./providers.js";
import { registerBuiltinProviders } from "./providers.js";
import { providers } from "./registry.js";

registerBuiltinProviders(providers);
