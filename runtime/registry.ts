import { BackendNotFound, ProviderRegistrationError } from "./errors.js";
import type { SandboxProvider } from "./provider.js";

/**
 * The provider registry (OpenRath's `rath.backend.registry`): providers are
 * registered under a name, instantiated once per process on first `get`, and
 * chosen by name, by preference order or as the default.
 */

/** A provider class: constructed with its registered name; a static `isAvailable` answers without constructing it. */
export interface ProviderClass<P extends SandboxProvider = SandboxProvider> {
  new (name: string): P;
  isAvailable?(): boolean;
}

/** A factory function, optionally carrying an `isAvailable` check of its own. */
export interface ProviderFactory<P extends SandboxProvider = SandboxProvider> {
  (name: string): P;
  isAvailable?(): boolean;
}

export type ProviderSource<P extends SandboxProvider = SandboxProvider> = ProviderClass<P> | ProviderFactory<P>;

const NAME = /^[a-z][a-z0-9_-]{0,63}$/;

/** A class is told from a factory by its prototype: only a provider class's prototype has `open`. */
function isProviderClass(source: ProviderSource): source is ProviderClass {
  return typeof (source.prototype as { open?: unknown } | undefined)?.open === "function";
}

export class ProviderRegistry {
  readonly #sources = new Map<string, ProviderSource>();
  readonly #instances = new Map<string, SandboxProvider>();
  #default: string | undefined;

  /** Registers a provider class or factory under `name`; a name can be registered once. */
  register<P extends SandboxProvider>(name: string, source: ProviderSource<P>): ProviderSource<P> {
    if (!NAME.test(name)) throw new ProviderRegistrationError("invalid_argument", `Invalid provider name '${name}': use lowercase letters, digits, '-' and '_'`);
    if (typeof source !== "function") throw new ProviderRegistrationError("invalid_argument", `Provider '${name}' must be a class or a factory function`);
    if (this.#sources.has(name)) throw new ProviderRegistrationError("already_exists", `Sandbox provider '${name}' is already registered`);
    this.#sources.set(name, source);
    return source;
  }

  /** Decorator form: `@registry.provider("name") class MyProvider …`. */
  provider(name: string) {
    return <C extends ProviderClass>(cls: C, _context?: ClassDecoratorContext): C => {
      this.register(name, cls);
      return cls;
    };
  }

  /** Registered names, in registration order. */
  listNames(): string[] {
    return [...this.#sources.keys()];
  }

  /** The one instance of `name` in this process. */
  get(name: string): SandboxProvider {
    let instance = this.#instances.get(name);
    if (!instance) {
      const source = this.getClass(name);
      instance = isProviderClass(source) ? new source(name) : source(name);
      this.#instances.set(name, instance);
    }
    return instance;
  }

  /** The registered class or factory. */
  getClass(name: string): ProviderSource {
    const source = this.#sources.get(name);
    if (!source) throw new BackendNotFound(name, this.listNames());
    return source;
  }

  /** Registered and usable here. Asks the static check when there is one; otherwise the (cheap) instance. */
  isAvailable(name: string): boolean {
    const source = this.#sources.get(name);
    if (!source) return false;
    return source.isAvailable ? source.isAvailable() : this.get(name).isAvailable();
  }

  /** Names of the registered providers that are available here. */
  listAvailable(): string[] {
    return this.listNames().filter((name) => this.isAvailable(name));
  }

  /** The first available provider among `names`. */
  preferred(names: readonly string[]): SandboxProvider {
    for (const name of names) if (this.isAvailable(name)) return this.get(name);
    const wanted = names.map((name) => `'${name}'`).join(", ");
    throw new BackendNotFound(names.join(","), this.listAvailable(), `None of the sandbox providers ${wanted || "(none given)"} is available`);
  }

  setDefault(name: string): void {
    this.getClass(name);
    this.#default = name;
  }

  /** The default provider. */
  current(): SandboxProvider {
    if (this.#default === undefined) throw new BackendNotFound("default", this.listNames(), "No default sandbox provider is set (call setDefault)");
    return this.get(this.#default);
  }
}

/** The process-wide registry; runtime/index.ts registers local, bubblewrap, docker and ssh in it. */
export const providers = new ProviderRegistry();

export const register = providers.register.bind(providers);
export const registerProvider = providers.provider.bind(providers);
export const listNames = providers.listNames.bind(providers);
export const get = providers.get.bind(providers);
export const getClass = providers.getClass.bind(providers);
export const isAvailable = providers.isAvailable.bind(providers);
export const preferred = providers.preferred.bind(providers);
export const setDefault = providers.setDefault.bind(providers);
export const current = providers.current.bind(providers);
