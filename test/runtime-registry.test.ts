import { describe, expect, it } from "vitest";
import { StrataError } from "../core/errors.js";
import { BackendNotFound, ProviderRegistry, SandboxProviderBase, providers, type Capabilities, type OpenedSandbox } from "../runtime/index.js";

/**
 * Providers written for this test, not stand-ins for a real component: the
 * registry only ever asks a provider for its name and availability, and these
 * never open a sandbox.
 */
class FixedProvider extends SandboxProviderBase {
  static instances = 0;
  static available = true;
  constructor(name: string) {
    super(name);
    FixedProvider.instances += 1;
  }
  unavailableReason(): string | undefined {
    return FixedProvider.available ? undefined : "switched off by the test";
  }
  capabilities(): Capabilities {
    return { isolation: "process", commands: true, files: true, codeRun: true, streaming: true, coldStart: "not measured" };
  }
  protected create(): Promise<OpenedSandbox> {
    throw new StrataError("unsupported", "this test provider opens nothing");
  }
}

class NeverAvailable extends FixedProvider {
  static isAvailable(): boolean {
    return false;
  }
}

describe("provider registry", () => {
  it("registers, lists in order and returns one instance per name", () => {
    const registry = new ProviderRegistry();
    registry.register("alpha", FixedProvider);
    registry.register("beta", (name) => new FixedProvider(name));
    expect(registry.listNames()).toEqual(["alpha", "beta"]);
    const before = FixedProvider.instances;
    const first = registry.get("alpha");
    expect(registry.get("alpha")).toBe(first);
    expect(first.name).toBe("alpha");
    expect(registry.get("beta").name).toBe("beta");
    expect(FixedProvider.instances - before).toBe(2);
    expect(registry.getClass("alpha")).toBe(FixedProvider);
  });

  it("names the registered providers when a name is unknown", () => {
    const registry = new ProviderRegistry();
    registry.register("alpha", FixedProvider);
    registry.register("beta", FixedProvider);
    for (const call of [() => registry.get("gamma"), () => registry.getClass("gamma"), () => registry.setDefault("gamma")]) {
      const error = catchError(call);
      expect(error).toBeInstanceOf(BackendNotFound);
      expect(error.message).toContain("'gamma'");
      expect(error.message).toContain("alpha, beta");
    }
    expect(registry.isAvailable("gamma")).toBe(false);
  });

  it("refuses a second registration under the same name and bad names", () => {
    const registry = new ProviderRegistry();
    registry.register("alpha", FixedProvider);
    expect(() => registry.register("alpha", NeverAvailable)).toThrow(/already registered/);
    expect(registry.getClass("alpha")).toBe(FixedProvider);
    expect(() => registry.register("../x", FixedProvider)).toThrow(/Invalid provider name/);
    expect(() => registry.register("", FixedProvider)).toThrow(/Invalid provider name/);
  });

  it("reports availability from the static check, else from the instance", () => {
    const registry = new ProviderRegistry();
    registry.register("never", NeverAvailable);
    registry.register("switchable", FixedProvider);
    const before = FixedProvider.instances;
    expect(registry.isAvailable("never")).toBe(false);
    expect(FixedProvider.instances).toBe(before); // the static check needs no instance
    FixedProvider.available = false;
    try {
      expect(registry.isAvailable("switchable")).toBe(false);
      expect(registry.listAvailable()).toEqual([]);
    } finally {
      FixedProvider.available = true;
    }
    expect(registry.isAvailable("switchable")).toBe(true);
  });

  it("preferred() falls back to the first available provider", () => {
    const registry = new ProviderRegistry();
    registry.register("never", NeverAvailable);
    registry.register("fallback", FixedProvider);
    expect(registry.preferred(["missing", "never", "fallback"]).name).toBe("fallback");
    const error = catchError(() => registry.preferred(["missing", "never"]));
    expect(error).toBeInstanceOf(BackendNotFound);
    expect(error.message).toBe("None of the sandbox providers 'missing', 'never' is available; available: fallback");
  });

  it("opening an unavailable provider says why", async () => {
    const registry = new ProviderRegistry();
    registry.register("switchable", FixedProvider);
    FixedProvider.available = false;
    try {
      await expect(registry.get("switchable").open()).rejects.toThrow("Sandbox provider 'switchable' is not available: switched off by the test");
    } finally {
      FixedProvider.available = true;
    }
  });

  it("has a settable default", () => {
    const registry = new ProviderRegistry();
    registry.register("alpha", FixedProvider);
    expect(() => registry.current()).toThrow(BackendNotFound);
    registry.setDefault("alpha");
    expect(registry.current()).toBe(registry.get("alpha"));
  });

  it("supports the decorator form", () => {
    const registry = new ProviderRegistry();
    const decorate = registry.provider("decorated");
    const Decorated = decorate(class extends FixedProvider {});
    expect(registry.getClass("decorated")).toBe(Decorated);
  });

  it("registers the four built-in providers on import, with cheap availability checks", () => {
    expect(providers.listNames()).toEqual(expect.arrayContaining(["local", "bubblewrap", "docker", "ssh"]));
    expect(providers.isAvailable("local")).toBe(true);
    for (const name of providers.listNames()) {
      const capabilities = providers.get(name).capabilities();
      expect(["process", "namespace", "container", "remote"]).toContain(capabilities.isolation);
      expect(providers.get(name).supportedCalls().has("command.run")).toBe(true);
    }
  });
});

describe("capabilities", () => {
  it("report the isolation level of each built-in provider", () => {
    const isolation = Object.fromEntries(["local", "bubblewrap", "docker", "ssh"].map((name) => [name, providers.get(name).capabilities().isolation]));
    expect(isolation).toEqual({ local: "process", bubblewrap: "namespace", docker: "container", ssh: "remote" });
  });

  it("cold-start figures are measured ones from runtime/cold-start.json, or say 'not measured'", () => {
    for (const name of providers.listNames()) {
      const { coldStart } = providers.get(name).capabilities();
      if (coldStart === "not measured") continue;
      expect(coldStart.p50Ms).toBeGreaterThan(0);
      expect(coldStart.p95Ms).toBeGreaterThanOrEqual(coldStart.p50Ms);
      expect(coldStart.runs).toBeGreaterThan(0);
      expect(coldStart.measuredAt).toMatch(/^\d{4}-\d{2}-\d{2}$/);
      expect(coldStart.machine).not.toBe("");
    }
    expect(new FixedProvider("unmeasured").capabilities().coldStart).toBe("not measured");
  });
});

function catchError(call: () => unknown): Error {
  try {
    call();
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected an error");
}
