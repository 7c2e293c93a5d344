/**
 * strata/runtime — the OpenRath layer over the sandboxes: the provider
 * registry, capabilities, refcounted sandbox handles, typed payloads and
 * dispatch, the FIFO stream, and the persistent sandbox registry.
 *
 * Importing this module registers the built-in providers: local,
 * bubblewrap, docker and ssh.
 */
export * from "./errors.js";
export * from "./payloads.js";
export * from "./provider.js";
export * from "./handle.js";
export * from "./stream.js";
export * from "./registry.js";
export * from "./persistence.js";
export * from "./providers.js";
import { registerBuiltinProviders } from "./providers.js";
import { providers } from "./registry.js";

registerBuiltinProviders(providers);
